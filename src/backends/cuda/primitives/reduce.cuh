// Warp and block reductions for CUDA kernels: the shuffle trees of the reductions and softmax
// (Note [GPU reductions]), for any kernel that folds values across threads (fused kernels
// included). Every tree has a fixed shape, so a result does not change from run to run.
#pragma once

#include <cuda_runtime.h>

namespace kusari::cuda {

/// Threads of a warp.
inline constexpr int kWarpSize = 32;

/// v of the lane `offset` places above (a scalar type; overload it, next to the type, for
/// structs: group_reduce finds overloads by argument-dependent lookup).
template <typename A>
__device__ __forceinline__ A shfl_down(A v, int offset) {
  return __shfl_down_sync(0xffffffffu, v, offset);
}
/// v of the warp's first lane.
template <typename A>
__device__ __forceinline__ A shfl_first(A v) {
  return __shfl_sync(0xffffffffu, v, 0);
}

/// Folds v over the 32 lanes of a warp; the result is valid in lane 0.
template <typename A, typename F>
__device__ __forceinline__ A warp_reduce(A v, const F& combine) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off >>= 1) v = combine(v, shfl_down(v, off));
  return v;
}

/// Reduces v over each group of `group` consecutive threads (1, or a power of two >= 32 dividing
/// blockDim.x); the result is valid in the group's first thread. Every thread of the block must
/// call it (it may synchronise the block). smem holds blockDim.x / 32 values.
template <typename A, typename F>
__device__ __forceinline__ A group_reduce(A v, const F& combine, int group, A* smem) {
  if (group == 1) return v;
  v = warp_reduce(v, combine);
  if (group == kWarpSize) return v;
  const int warp = threadIdx.x / kWarpSize;
  __syncthreads();  // smem may still be read from a previous call
  if (threadIdx.x % kWarpSize == 0) smem[warp] = v;
  __syncthreads();
  if (threadIdx.x % group == 0) {
    A r = smem[warp];
    for (int w = 1; w < group / kWarpSize; ++w) r = combine(r, smem[warp + w]);
    v = r;
  }
  return v;
}

/// group_reduce whose result every thread of the group receives.
template <typename A, typename F>
__device__ __forceinline__ A group_allreduce(A v, const F& combine, int group, A* smem) {
  v = group_reduce(v, combine, group, smem);
  if (group == kWarpSize) return shfl_first(v);
  __syncthreads();
  if (threadIdx.x % group == 0) smem[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  return smem[(threadIdx.x / group) * (group / kWarpSize)];
}

}  // namespace kusari::cuda
