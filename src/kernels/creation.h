// Kernels: fill, arange, copy and random numbers. See Note [Kernel families].
#pragma once

#include "kernels/kernel.h"
#include "kusari/core/array.h"
#include "kusari/core/random.h"
#include "kusari/core/scalar.h"

namespace kusari::kernels {

/// out[...] = value.
inline constinit Kernel<void(Array& out, Scalar value)> fill{"fill"};
/// out[i] = start + i * step (out is 1-d).
inline constinit Kernel<void(Array& out, double start, double step)> arange{"arange"};
/// dst = src, converting dtype; same shape, any strides.
inline constinit Kernel<void(const Array& src, Array& dst)> copy{"copy"};
/// Uniform [low, high) numbers from the generator (out is contiguous; Note [Random streams]).
inline constinit Kernel<void(Array& out, double low, double high, Generator& gen)> random_uniform{"uniform"};
/// Normal numbers of mean and stddev from the generator (out is contiguous).
inline constinit Kernel<void(Array& out, double mean, double stddev, Generator& gen)> random_normal{"normal"};

}  // namespace kusari::kernels
