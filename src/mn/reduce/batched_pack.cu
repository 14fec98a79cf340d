// The pack / unpack kernels of the NCCL communicators (Note [Batched packing]): one launch copies
// every array of a set into the flat wire buffer, casting, and one copies it back, scaled.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "backends/cuda/primitives/kernel_util.cuh"
#include "backends/cuda/runtime/cuda_backend.h"
#include "mn/reduce/batched_pack.h"

namespace kusari::mn::detail {
namespace {

constexpr int kThreads = 256;

// Device element types of the floating dtypes, and their arithmetic type (float, or double for
// float64 so that a float64 wire stays exact).
template <typename T>
__device__ __forceinline__ double to_double(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<double>(__half2float(v));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<double>(__bfloat162float(v));
  } else {
    return static_cast<double>(v);
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return static_cast<float>(v);
  }
}

/// Rounds to nearest even, like the CPU's conversions.
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return static_cast<T>(v);
  }
}

/// dst = src * scale, through float (or double when either side is double).
template <typename Dst, typename Src>
__device__ __forceinline__ Dst convert(Src v, double scale, bool scaled) {
  if constexpr (std::is_same_v<Dst, double> || std::is_same_v<Src, double>) {
    const double x = to_double(v);
    const double y = scaled ? x * scale : x;
    if constexpr (std::is_same_v<Dst, double>) {
      return y;
    } else {
      return from_float<Dst>(static_cast<float>(y));
    }
  } else {
    const float x = to_float(v);
    return from_float<Dst>(scaled ? x * static_cast<float>(scale) : x);
  }
}

/// Copies n elements from `in` to `out` with the threads of one block: 16 bytes per thread and
/// step when both are 16-byte aligned (then the last n % (16 / sizeof(T)) elements one by one),
/// else one element at a time.
template <typename T>
__device__ __forceinline__ void copy_range(T* out, const T* in, int64_t n) {
  constexpr int64_t kPerVector = 16 / static_cast<int64_t>(sizeof(T));
  int64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(out) | reinterpret_cast<uintptr_t>(in)) & 15) == 0) {
    const int64_t vectors = n / kPerVector;
    const uint4* vin = reinterpret_cast<const uint4*>(in);
    uint4* vout = reinterpret_cast<uint4*>(out);
    for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) vout[i] = vin[i];
    done = vectors * kPerVector;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) out[i] = in[i];
}

// One thread block per table block: the block names its entry and an element range of it. The
// entry's dtype is read once per thread block, so the per-element loop has no branch.
template <typename Wire, typename Src>
__device__ __forceinline__ void pack_range(const PackEntry& e, const PackBlock& c, Wire* buffer) {
  const Src* in = static_cast<const Src*>(e.data);
  Wire* out = buffer + e.offset;
  if constexpr (std::is_same_v<Wire, Src>) {
    copy_range(out + c.begin, in + c.begin, c.end - c.begin);
  } else {
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
      out[i] = convert<Wire>(in[i], 1.0, false);
    }
  }
}

template <typename Wire, typename Dst>
__device__ __forceinline__ void unpack_range(const PackEntry& e, const PackBlock& c,
                                             const Wire* buffer, double scale) {
  Dst* out = static_cast<Dst*>(e.data);
  const Wire* in = buffer + e.offset;
  const bool scaled = scale != 1.0;
  if constexpr (std::is_same_v<Wire, Dst>) {
    if (!scaled) {
      copy_range(out + c.begin, in + c.begin, c.end - c.begin);
      return;
    }
  }
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    out[i] = convert<Dst>(in[i], scale, scaled);
  }
}

template <typename Wire>
__global__ void pack_kernel(const PackEntry* entries, const PackBlock* blocks, Wire* buffer) {
  const PackBlock c = blocks[blockIdx.x];
  const PackEntry e = entries[c.entry];
  switch (static_cast<Dtype>(e.dtype)) {
    case Dtype::kFloat16:
      pack_range<Wire, __half>(e, c, buffer);
      break;
    case Dtype::kBFloat16:
      pack_range<Wire, __nv_bfloat16>(e, c, buffer);
      break;
    case Dtype::kFloat32:
      pack_range<Wire, float>(e, c, buffer);
      break;
    case Dtype::kFloat64:
      pack_range<Wire, double>(e, c, buffer);
      break;
    default:
      break;  // the host only builds tables of floating arrays
  }
}

template <typename Wire>
__global__ void unpack_kernel(const PackEntry* entries, const PackBlock* blocks, const Wire* buffer,
                              double scale) {
  const PackBlock c = blocks[blockIdx.x];
  const PackEntry e = entries[c.entry];
  switch (static_cast<Dtype>(e.dtype)) {
    case Dtype::kFloat16:
      unpack_range<Wire, __half>(e, c, buffer, scale);
      break;
    case Dtype::kBFloat16:
      unpack_range<Wire, __nv_bfloat16>(e, c, buffer, scale);
      break;
    case Dtype::kFloat32:
      unpack_range<Wire, float>(e, c, buffer, scale);
      break;
    case Dtype::kFloat64:
      unpack_range<Wire, double>(e, c, buffer, scale);
      break;
    default:
      break;
  }
}

void check_grid(int64_t num_blocks) {
  KUSARI_CHECK(num_blocks <= std::numeric_limits<int32_t>::max(), ValueError,
               "gradient packing: ", num_blocks, " blocks exceed the CUDA grid limit");
}

}  // namespace

void launch_pack(const PackEntry* entries, const PackBlock* blocks, int64_t num_blocks,
                 void* buffer, Dtype wire, cudaStream_t stream) {
  if (num_blocks == 0) return;
  check_grid(num_blocks);
  cuda::visit_device_dtype<common::kFloatingDtypes>(wire, "gradient packing (the wire dtype)", [&](auto tag) {
    using Wire = decltype(tag);
    pack_kernel<Wire><<<static_cast<unsigned>(num_blocks), kThreads, 0, stream>>>(
        entries, blocks, static_cast<Wire*>(buffer));
  });
  KUSARI_CUDA_CHECK(cudaGetLastError());
}

void launch_unpack(const PackEntry* entries, const PackBlock* blocks, int64_t num_blocks,
                   const void* buffer, Dtype wire, double scale, cudaStream_t stream) {
  if (num_blocks == 0) return;
  check_grid(num_blocks);
  cuda::visit_device_dtype<common::kFloatingDtypes>(wire, "gradient packing (the wire dtype)", [&](auto tag) {
    using Wire = decltype(tag);
    unpack_kernel<Wire><<<static_cast<unsigned>(num_blocks), kThreads, 0, stream>>>(
        entries, blocks, static_cast<const Wire*>(buffer), scale);
  });
  KUSARI_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kusari::mn::detail
