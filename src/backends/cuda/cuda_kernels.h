// The CUDA kernels of the kernel table (one file per family, matching src/backends/cpu/), as
// plain host functions. Each launches on the compute stream of its arrays' device and returns
// without waiting (Note [One compute stream per device]).
#pragma once

#include "kusari/core/array.h"
#include "kusari/core/kernels.h"
#include "kusari/core/random.h"

namespace kusari::cuda {

// creation_kernels.cu
void fill(Array& out, Scalar value);
void arange(Array& out, double start, double step);
void copy(const Array& src, Array& dst);
void random_uniform(Array& out, double low, double high, Generator& gen);
void random_normal(Array& out, double mean, double stddev, Generator& gen);

// elementwise_kernels.cu
void unary(UnaryOp op, const Array& x, Array& out, double p0, double p1);
void binary(BinaryOp op, const Array& a, const Array& b, Array& out);
void where(const Array& cond, const Array& a, const Array& b, Array& out);

// reduction_kernels.cu
void reduce(ReduceOp op, const Array& x, Array& out);
void arg_reduce(ArgReduceOp op, const Array& x, int axis, Array& out);
void softmax(const Array& x, int axis, bool log, Array& out);

// matmul_kernels.cu (cuBLAS; see Note [cuBLAS operand layout])
void matmul(const Array& a, const Array& b, Array& out);

// indexing_kernels.cu
void take(const Array& x, const Array& indices, int axis, Array& out);
void add_at(Array& out, const Array& indices, int axis, const Array& values);

// conv_kernels.cc (cuDNN; see Note [cuDNN convolution plans])
void conv2d_forward(const Array& x, const Array& w, const Array& b, const Conv2dParams& p,
                    Array& y);
void conv2d_backward_data(const Array& w, const Array& gy, const Conv2dParams& p, Array& gx);
void conv2d_backward_filter(const Array& x, const Array& gy, const Conv2dParams& p, Array& gw);

// pool_kernels.cu
void pool2d_forward(const Array& x, const Pool2dParams& p, Array& y);
void pool2d_backward(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p,
                     Array& gx);

// update_kernels.cu
void update_parameter(UpdateRule rule, Array& param, const Array& grad, Array* state, int n_state,
                      const double* hyper, int n_hyper, const Array* skip);
void count_nonfinite(const Array* arrays, int n, Array& out);

}  // namespace kusari::cuda
