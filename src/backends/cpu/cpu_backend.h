// The CPU backend: host memory and the CPU kernels (one .cc file per kernel family).
#pragma once

#include "backends/common/dtype_visit.h"
#include "kusari/core/array.h"
#include "kusari/core/device.h"
#include "kusari/core/op_types.h"
#include "kusari/core/random.h"

namespace kusari::cpu {

/// The CPU backend, created (and its kernels registered) on first use.
Backend& cpu_backend();

/// dst = src, converting dtype (creation_kernels.cc); the 16-bit paths of other kernels round
/// their float32 results with it.
void copy(const Array& src, Array& dst);

// Each family's kernel file fills that family's slots (Note [Kernel families]); the backend's
// constructor calls them all.
void register_cpu_creation_kernels();     // creation_kernels.cc
void register_cpu_elementwise_kernels();  // elementwise_kernels.cc
void register_cpu_reduction_kernels();    // reduction_kernels.cc
void register_cpu_linalg_kernels();       // linalg_kernels.cc
void register_cpu_indexing_kernels();     // indexing_kernels.cc
void register_cpu_nn_kernels();           // conv_kernels.cc (convolution and pooling)
void register_cpu_update_kernels();       // update_kernels.cc
void register_cpu_normalization_kernels();  // normalization_kernels.cc (batch, layer and RMS normalization)
void register_cpu_attention_kernels();    // attention_kernels.cc (blocked scaled dot-product attention)

// The kernels used across the CPU family files (declared here because they are).
void pool2d_forward(const Array& x, const Pool2dParams& p, Array& y);
void pool2d_backward(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p, Array& gx);

}  // namespace kusari::cpu
