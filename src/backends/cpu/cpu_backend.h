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

/// Fills the convolution and pooling entries (conv_kernels.cc, pool_kernels.cc).
void register_nn_kernels(KernelTable& table);
/// Fills the fused optimizer update entry (update_kernels.cc).
void register_update_kernels(KernelTable& table);

}  // namespace kusari::cpu
