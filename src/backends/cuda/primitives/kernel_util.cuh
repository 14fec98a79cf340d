// Shared pieces of the CUDA kernels: device element types, conversions that match the CPU
// kernels bit for bit, strided indexing, launch geometry and dtype dispatch. Included by the .cu
// files of the backend only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "backends/common/axis_order.h"
#include "backends/common/compute_type.h"
#include "backends/common/dtype_visit.h"
#include "backends/common/math.h"
#include "backends/cuda/runtime/cuda_backend.h"
#include "kusari/core/array.h"

namespace kusari::cuda {

// --- element types -------------------------------------------------------------------------------

// Note [Device element types]
// kusari::Half and kusari::BFloat16 are host storage types; on the GPU the same 16 bits are read
// as __half and __nv_bfloat16. Arithmetic on them happens in float32 (compute_t), and results are
// rounded to nearest even like the CPU's conversions. Every other dtype is its own C++ type.
template <typename T>
struct DeviceStorage {
  using type = T;
};
template <>
struct DeviceStorage<Half> {
  using type = __half;
};
template <>
struct DeviceStorage<BFloat16> {
  using type = __nv_bfloat16;
};
/// The device type of a kusari element type.
template <typename T>
using device_t = typename DeviceStorage<T>::type;

// The compute types are the CPU's (src/backends/common/compute_type.h): float for __half and
// __nv_bfloat16.
using common::compute_t;
using common::is_float_v;

template <typename T>
__device__ __forceinline__ compute_t<T> to_compute(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return v;
  }
}

/// Rounds a compute value back to T (16-bit floats: to nearest even, like the CPU).
template <typename T>
__device__ __forceinline__ T from_compute(compute_t<T> v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

/// Stores a double as T the way the CPU's static_cast<T>(static_cast<compute_t<T>>(v)) does
/// (16-bit floats go through float32, so both round twice the same way).
template <typename T>
__device__ __forceinline__ T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    // x86 converts through a 32-bit integer and keeps the low byte; do the same.
    return static_cast<uint8_t>(static_cast<int32_t>(v));
  } else if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    return from_compute<T>(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// --- math in the compute type --------------------------------------------------------------------

// The math of the compute types, shared with the CPU kernels (src/backends/common/math.h).
namespace dmath = ::kusari::common::math;

// --- launch geometry -----------------------------------------------------------------------------

/// Threads per block of the elementwise kernels.
inline constexpr int kBlockSize = 256;

/// Blocks for a grid-stride loop over n items: enough to fill the GPU a few times over, fewer
/// for small n.
inline unsigned grid_for(int64_t n, int device, int block = kBlockSize) {
  const int64_t wanted = (n + block - 1) / block;
  const int64_t cap = static_cast<int64_t>(sm_count(device)) * (2048 / block) * 4;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(wanted, cap)));
}

/// Makes the array's GPU current and returns its compute stream.
inline cudaStream_t prepare(const Array& a) {
  const int device = a.device().index();
  set_device(device);
  return compute_stream(device);
}

/// Throws DeviceError if the last launch failed (bad configuration, missing kernel image).
#define KUSARI_CUDA_CHECK_LAUNCH() KUSARI_CUDA_CHECK(cudaGetLastError())

/// The first element of a grid-stride loop and its step.
__device__ __forceinline__ int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// --- strided indexing ----------------------------------------------------------------------------

// Note [Strided indexing on the GPU]
// An elementwise kernel sees N arrays of one shape (broadcast operands have stride 0). The host
// compacts their geometry like the CPU's StridedLoop (Note [Strided loops]): length-1 axes are
// dropped and an axis is merged into its inner neighbour when every operand allows it, so a
// contiguous or simply broadcast case has one axis. make_indexer first puts the axes in the
// output's stride order (Note [Axis order of strided loops]), so channels-last operands merge
// into one contiguous axis too; the reductions build their geometry with compact_geometry
// directly and keep C order. The result travels to the kernel by value.
// A thread turns its flat index into N element offsets with one division per remaining axis;
// `Index` is uint32_t when the element count fits (32-bit division is several times faster than
// 64-bit) and int64_t otherwise.
template <int N>
struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxNdim] = {};
  int64_t strides[N][kMaxNdim] = {};  // in elements

  template <typename Index>
  __device__ __forceinline__ void offsets(int64_t flat, int64_t (&off)[N]) const {
    if (ndim == 1) {
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] = flat * strides[k][0];
      return;
    }
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    Index i = static_cast<Index>(flat);
    for (int d = ndim - 1; d >= 0; --d) {
      const Index size = static_cast<Index>(sizes[d]);
      const Index q = i / size;
      const int64_t r = static_cast<int64_t>(i - q * size);
      i = q;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
    }
  }

  /// True when every operand is contiguous in flat order (offset == flat index).
  bool contiguous() const {
    if (ndim != 1) return false;
    for (int k = 0; k < N; ++k) {
      if (strides[k][0] != 1) return false;
    }
    return true;
  }
};

/// Compacts the geometry of N operands over `nd` axes (sizes, strides[k] in elements): drops
/// length-1 axes and merges neighbours, see Note [Strided indexing on the GPU].
template <int N>
StridedIndexer<N> compact_geometry(int nd_in, const int64_t* sizes_in,
                                   const std::array<const int64_t*, N>& strides_in,
                                   bool order_by_output = false) {
  StridedIndexer<N> ix;
  int nd = 0;
  int64_t sizes[kMaxNdim];
  int64_t strides[N][kMaxNdim];
  for (int d = 0; d < nd_in; ++d) {
    if (sizes_in[d] == 1) continue;
    sizes[nd] = sizes_in[d];
    for (int k = 0; k < N; ++k) strides[k][nd] = strides_in[k][d];
    ++nd;
  }
  if (order_by_output) common::order_axes_by_output<N>(nd, sizes, strides);
  if (nd == 0) {
    ix.ndim = 1;
    ix.sizes[0] = 1;
    for (int k = 0; k < N; ++k) ix.strides[k][0] = 1;
    return ix;
  }
  // Merge from the innermost axis outwards.
  int out = 0;
  ix.sizes[0] = sizes[nd - 1];
  for (int k = 0; k < N; ++k) ix.strides[k][0] = strides[k][nd - 1];
  for (int d = nd - 2; d >= 0; --d) {
    bool mergeable = true;
    for (int k = 0; k < N; ++k) {
      if (strides[k][d] != ix.strides[k][out] * ix.sizes[out]) {
        mergeable = false;
        break;
      }
    }
    if (mergeable) {
      ix.sizes[out] *= sizes[d];
    } else {
      ++out;
      ix.sizes[out] = sizes[d];
      for (int k = 0; k < N; ++k) ix.strides[k][out] = strides[k][d];
    }
  }
  // Collected innermost first; store outermost first.
  ix.ndim = out + 1;
  for (int a = 0, b = out; a < b; ++a, --b) {
    std::swap(ix.sizes[a], ix.sizes[b]);
    for (int k = 0; k < N; ++k) std::swap(ix.strides[k][a], ix.strides[k][b]);
  }
  return ix;
}

/// The compacted geometry of `arrays` (views of `shape`), see Note [Strided indexing on the GPU].
template <int N>
StridedIndexer<N> make_indexer(const Shape& shape, const std::array<const Array*, N>& arrays) {
  std::array<const int64_t*, N> strides;
  for (int k = 0; k < N; ++k) strides[k] = arrays[k]->strides().data();
  return compact_geometry<N>(shape.size(), shape.data(), strides, /*order_by_output=*/true);
}

/// True when 32-bit index arithmetic covers n elements.
inline bool fits_uint32(int64_t n) {
  return n < (int64_t{1} << 32) - 1;
}

// --- vectorised access ---------------------------------------------------------------------------

/// Elements per vector access in the contiguous kernels.
inline constexpr int kVec = 4;

template <typename T>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

/// True when p can be read as Vec<T> (the allocation is aligned; a view's offset may not be).
template <typename T>
inline bool vec_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kVec) == 0;
}

// --- dtype dispatch ------------------------------------------------------------------------------

/// Calls f(T{}) with T the device element type of `d` (the backends' one dtype visitor,
/// src/backends/common/dtype_visit.h, with Note [Device element types]'s storage types).
template <common::DtypeSet Set = common::kAllDtypes, typename F>
decltype(auto) visit_device_dtype(Dtype d, const char* fn, F&& f) {
  return common::visit_dtype<Set, DeviceStorage>(d, fn, static_cast<F&&>(f));
}

/// Calls f(T{}) with T an unsigned integer type of the dtype's size (for copies of raw bits).
template <typename F>
decltype(auto) visit_itemsize(size_t itemsize, F&& f) {
  switch (itemsize) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint64_t{});
  }
}

}  // namespace kusari::cuda
