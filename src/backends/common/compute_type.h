// The type each element type computes in, shared by the CPU and CUDA kernels.
#pragma once

#include <type_traits>

#include "kusari/core/half.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kusari::common {

/// The type arithmetic on an element type is done in: float for the 16-bit floats (kusari's host
/// storage types and, under nvcc, CUDA's __half and __nv_bfloat16), the type itself otherwise.
template <typename T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<Half> {
  using type = float;
};
template <>
struct ComputeType<BFloat16> {
  using type = float;
};
#if defined(__CUDACC__)
template <>
struct ComputeType<__half> {
  using type = float;
};
template <>
struct ComputeType<__nv_bfloat16> {
  using type = float;
};
#endif
template <typename T>
using compute_t = typename ComputeType<T>::type;

/// True for the element types that compute in a floating type.
template <typename T>
inline constexpr bool is_float_v = std::is_floating_point_v<compute_t<T>>;

}  // namespace kusari::common
