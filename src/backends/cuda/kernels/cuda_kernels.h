// The CUDA kernels, one file per family matching src/backends/cpu/ (Note [Kernel families]).
// Each kernel launches on the compute stream of its arrays' device and returns without waiting
// (Note [One compute stream per device]).
#pragma once

#include "kusari/core/array.h"
#include "kusari/core/op_types.h"

namespace kusari::cuda {

/// dst = src, converting dtype (creation_kernels.cu); the 16-bit paths of other kernels round
/// their float32 results with it.
void copy(const Array& src, Array& dst);

// Each family's kernel file fills that family's slots; CudaBackend's constructor calls them all.
void register_cuda_creation_kernels();     // creation_kernels.cu
void register_cuda_elementwise_kernels();  // elementwise_kernels.cu
void register_cuda_reduction_kernels();    // reduction_kernels.cu
void register_cuda_linalg_kernels();       // libs/cublas_linalg.cu (cuBLAS; Note [cuBLAS operand layout])
void register_cuda_indexing_kernels();     // indexing_kernels.cu
void register_cuda_nn_kernels();           // libs/cudnn_conv.cc (cuDNN) with pool_kernels.cu
void register_cuda_update_kernels();       // update_kernels.cu
void register_cuda_normalization_kernels();  // normalization_kernels.cu (batch normalization)
void register_cuda_image_kernels();        // image_kernels.cu (the input pipeline's normalisation)
void register_cuda_attention_kernels();    // libs/cudnn_attention.cc (cuDNN's fused attention)

// The kernels used across the CUDA family files (declared here because they are).
void binary(BinaryOp op, const Array& a, const Array& b, Array& out);  // elementwise_kernels.cu
void pool2d_forward(const Array& x, const Pool2dParams& p, Array& y);
void pool2d_backward(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p, Array& gx);

}  // namespace kusari::cuda
