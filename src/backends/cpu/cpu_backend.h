// The CPU backend: host memory and the CPU kernels (one .cc file per kernel family).
#pragma once

#include "kusari/core/array.h"
#include "kusari/core/device.h"
#include "kusari/core/kernels.h"
#include "kusari/core/random.h"

namespace kusari::cpu {

/// The CPU backend, created (and its kernel table filled) on first use.
Backend& cpu_backend();

// creation_kernels.cc
void fill(Array& out, Scalar value);
void arange(Array& out, double start, double step);
void copy(const Array& src, Array& dst);
void random_uniform(Array& out, double low, double high, Generator& gen);
void random_normal(Array& out, double mean, double stddev, Generator& gen);

// elementwise_kernels.cc
void unary(UnaryOp op, const Array& x, Array& out, double p0, double p1);
void binary(BinaryOp op, const Array& a, const Array& b, Array& out);
void where(const Array& cond, const Array& a, const Array& b, Array& out);

// reduction_kernels.cc
void reduce(ReduceOp op, const Array& x, Array& out);
void arg_reduce(ArgReduceOp op, const Array& x, int axis, Array& out);
void softmax(const Array& x, int axis, bool log, Array& out);

// matmul_kernels.cc
void matmul(const Array& a, const Array& b, Array& out);

// indexing_kernels.cc
void take(const Array& x, const Array& indices, int axis, Array& out);
void add_at(Array& out, const Array& indices, int axis, const Array& values);

// conv_kernels.cc (see Note [CPU convolution algorithms])
void conv2d_forward(const Array& x, const Array& w, const Array& b, const Conv2dParams& p, Array& y);
void conv2d_backward_data(const Array& w, const Array& gy, const Conv2dParams& p, Array& gx);
void conv2d_backward_filter(const Array& x, const Array& gy, const Conv2dParams& p, Array& gw);

// pool_kernels.cc
void pool2d_forward(const Array& x, const Pool2dParams& p, Array& y);
void pool2d_backward(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p, Array& gx);

/// Fills the convolution and pooling entries (defined in conv_kernels.cc).
void register_nn_kernels(KernelTable& table);
/// Fills the fused optimizer update entry (update_kernels.cc).
void register_update_kernels(KernelTable& table);

}  // namespace kusari::cpu
