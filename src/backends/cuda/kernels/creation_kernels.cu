// CUDA kernels: fill, arange, copy (strided, with dtype conversion) and random numbers.
#include <cstring>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "kernels/creation.h"
#include "backends/common/philox.h"
#include "backends/cuda/primitives/kernel_util.cuh"

namespace kusari::cuda {
namespace {

// --- kernels -------------------------------------------------------------------------------------

// out (n,) contiguous = value, as raw bits U of the element's size.
template <typename U>
__global__ void fill_contiguous_kernel(int64_t n, U* out, U value, bool vec) {
  int64_t head = 0;
  if (vec) {
    const int64_t nv = n / kVec;
    Vec<U> pack;
#pragma unroll
    for (int j = 0; j < kVec; ++j) pack.v[j] = value;
    Vec<U>* o = reinterpret_cast<Vec<U>*>(out);
    for (int64_t i = grid_start(); i < nv; i += grid_step()) o[i] = pack;
    head = nv * kVec;
  }
  for (int64_t i = head + grid_start(); i < n; i += grid_step()) out[i] = value;
}

// out (any strides) = value.
template <typename U, typename Index>
__global__ void fill_strided_kernel(int64_t n, StridedIndexer<1> ix, U* out, U value) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    int64_t off[1];
    ix.offsets<Index>(i, off);
    out[off[0]] = value;
  }
}

// out[i * stride] = start + i * step, rounded like the CPU (no fused multiply-add).
template <typename T>
__global__ void arange_kernel(int64_t n, T* out, int64_t stride, double start, double step) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    out[i * stride] = from_double<T>(__dadd_rn(start, __dmul_rn(static_cast<double>(i), step)));
  }
}

// dst = src for one element size (raw bits), any strides.
template <typename U, typename Index>
__global__ void copy_strided_kernel(int64_t n, StridedIndexer<2> ix, U* dst, const U* src) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    int64_t off[2];
    ix.offsets<Index>(i, off);
    dst[off[0]] = src[off[1]];
  }
}

// Note [Dtype conversion on the GPU]
// A conversion kernel per (source, destination) pair would be 56 kernels per index type; instead
// one kernel reads the source into a Value (int64 for bool and integers, double for floats) and
// writes the destination from it, switching on the two dtypes (uniform across the grid, so the
// branches cost a few instructions next to the memory traffic). Every value reaches its target
// exactly as the CPU's convert<From, To> does: integers and floats widen losslessly into the
// Value, and the store rounds once (16-bit floats through float32, like the CPU).
struct Value {
  bool is_float;
  int64_t i;
  double d;
};

__device__ __forceinline__ Value load_value(Dtype dtype, const void* base, int64_t off) {
  switch (dtype) {
    case Dtype::kBool:
      return {false, static_cast<const bool*>(base)[off] ? 1 : 0, 0.0};
    case Dtype::kUInt8:
      return {false, static_cast<const uint8_t*>(base)[off], 0.0};
    case Dtype::kInt32:
      return {false, static_cast<const int32_t*>(base)[off], 0.0};
    case Dtype::kInt64:
      return {false, static_cast<const int64_t*>(base)[off], 0.0};
    case Dtype::kFloat16:
      return {true, 0, __half2float(static_cast<const __half*>(base)[off])};
    case Dtype::kBFloat16:
      return {true, 0, __bfloat162float(static_cast<const __nv_bfloat16*>(base)[off])};
    case Dtype::kFloat32:
      return {true, 0, static_cast<const float*>(base)[off]};
    case Dtype::kFloat64:
      return {true, 0, static_cast<const double*>(base)[off]};
  }
  return {false, 0, 0.0};
}

template <typename T>
__device__ __forceinline__ T value_as(const Value& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_float ? v.d != 0.0 : v.i != 0;
  } else if constexpr (is_float_v<T>) {
    if (v.is_float) return from_double<T>(v.d);
    return from_compute<T>(static_cast<compute_t<T>>(v.i));
  } else {
    if (v.is_float) return from_double<T>(v.d);
    return static_cast<T>(v.i);
  }
}

__device__ __forceinline__ void store_value(Dtype dtype, void* base, int64_t off, const Value& v) {
  switch (dtype) {
    case Dtype::kBool:
      static_cast<bool*>(base)[off] = value_as<bool>(v);
      break;
    case Dtype::kUInt8:
      static_cast<uint8_t*>(base)[off] = value_as<uint8_t>(v);
      break;
    case Dtype::kInt32:
      static_cast<int32_t*>(base)[off] = value_as<int32_t>(v);
      break;
    case Dtype::kInt64:
      static_cast<int64_t*>(base)[off] = value_as<int64_t>(v);
      break;
    case Dtype::kFloat16:
      static_cast<__half*>(base)[off] = value_as<__half>(v);
      break;
    case Dtype::kBFloat16:
      static_cast<__nv_bfloat16*>(base)[off] = value_as<__nv_bfloat16>(v);
      break;
    case Dtype::kFloat32:
      static_cast<float*>(base)[off] = value_as<float>(v);
      break;
    case Dtype::kFloat64:
      static_cast<double*>(base)[off] = value_as<double>(v);
      break;
  }
}

// dst = convert(src) between two different dtypes, any strides.
template <typename Index>
__global__ void convert_kernel(int64_t n, StridedIndexer<2> ix, Dtype dst_dtype, void* dst,
                               Dtype src_dtype, const void* src) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    int64_t off[2];
    ix.offsets<Index>(i, off);
    store_value(dst_dtype, dst, off[0], load_value(src_dtype, src, off[1]));
  }
}

// Note [Philox on the GPU]
// The same Philox4x32-10 as the CPU's: one function for both (src/backends/common/philox.h). With
// the element-to-counter mapping of Note [Random streams] (block start + i / k, word i % k), a
// seed gives bit-identical uniform numbers on the CPU and the GPU; the arithmetic after the
// words uses explicit round-to-nearest double operations (__dadd_rn, __dmul_rn), which nvcc never
// fuses, so it rounds exactly like the CPU. Normal numbers also go through log, sqrt and cos,
// whose last bits differ between CUDA's and glibc's libm (float results are almost always equal;
// double results agree to about 1e-15).
using common::philox4x32;
using common::unit_double;
using common::unit_float;

// out (n,) = low + range * u for T of at most 32 bits: 4 values per Philox block.
template <typename T>
__global__ void uniform32_kernel(int64_t n, T* out, uint64_t start, uint32_t key0, uint32_t key1,
                                 double low, double range) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t blk = grid_start(); blk < blocks; blk += grid_step()) {
    const common::Philox4 r = philox4x32(start + static_cast<uint64_t>(blk), key0, key1);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = blk * 4 + j;
      if (i < n) {
        const double u = static_cast<double>(unit_float(r.v[j]));
        out[i] = from_compute<T>(static_cast<float>(__dadd_rn(low, __dmul_rn(range, u))));
      }
    }
  }
}

// out (n,) float64 = low + range * u: 2 values per Philox block.
__global__ void uniform64_kernel(int64_t n, double* out, uint64_t start, uint32_t key0,
                                 uint32_t key1, double low, double range) {
  const int64_t blocks = (n + 1) / 2;
  for (int64_t blk = grid_start(); blk < blocks; blk += grid_step()) {
    const common::Philox4 r = philox4x32(start + static_cast<uint64_t>(blk), key0, key1);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t i = blk * 2 + j;
      if (i < n) out[i] = __dadd_rn(low, __dmul_rn(range, unit_double(r.v[2 * j], r.v[2 * j + 1])));
    }
  }
}

// out (n,) = mean + stddev * N(0, 1): one Box-Muller pair per Philox block.
template <typename T>
__global__ void normal_kernel(int64_t n, T* out, uint64_t start, uint32_t key0, uint32_t key1,
                              double mean, double stddev) {
  constexpr double kTwoPi = 2.0 * 3.14159265358979323846;
  const int64_t blocks = (n + 1) / 2;
  for (int64_t blk = grid_start(); blk < blocks; blk += grid_step()) {
    const common::Philox4 r = philox4x32(start + static_cast<uint64_t>(blk), key0, key1);
    const double u1 = __dsub_rn(1.0, unit_double(r.v[0], r.v[1]));
    const double u2 = unit_double(r.v[2], r.v[3]);
    const double radius = ::sqrt(__dmul_rn(-2.0, ::log(u1)));
    const double angle = __dmul_rn(kTwoPi, u2);
    const double scale = __dmul_rn(stddev, radius);
    const int64_t i0 = blk * 2;
    out[i0] = from_double<T>(__dadd_rn(mean, __dmul_rn(scale, ::cos(angle))));
    if (i0 + 1 < n) out[i0 + 1] = from_double<T>(__dadd_rn(mean, __dmul_rn(scale, ::sin(angle))));
  }
}

// --- launchers -----------------------------------------------------------------------------------

template <typename U>
void launch_fill(Array& out, U bits) {
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  const int64_t n = out.size();
  const StridedIndexer<1> ix = make_indexer<1>(out.shape(), {&out});
  U* o = static_cast<U*>(out.raw_data());
  if (ix.contiguous()) {
    if (bits == U(0)) {
      KUSARI_CUDA_CHECK(cudaMemsetAsync(o, 0, static_cast<size_t>(n) * sizeof(U), stream));
      return;
    }
    fill_contiguous_kernel<U>
        <<<grid_for(n, device), kBlockSize, 0, stream>>>(n, o, bits, vec_aligned<U>(o));
  } else if (fits_uint32(n)) {
    fill_strided_kernel<U, uint32_t>
        <<<grid_for(n, device), kBlockSize, 0, stream>>>(n, ix, o, bits);
  } else {
    fill_strided_kernel<U, int64_t><<<grid_for(n, device), kBlockSize, 0, stream>>>(n, ix, o, bits);
  }
  KUSARI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fill(Array& out, Scalar value) {
  common::visit_dtype(out.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    // The value as the CPU stores it, then its bits.
    const T v = static_cast<T>(value.template to<compute_t<T>>());
    visit_itemsize(sizeof(T), [&](auto utag) {
      using U = decltype(utag);
      U bits;
      std::memcpy(&bits, &v, sizeof(U));
      launch_fill<U>(out, bits);
    });
  });
}

void arange(Array& out, double start, double step) {
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  const int64_t n = out.size();
  const int64_t stride = out.strides().empty() ? 1 : out.strides()[0];
  visit_device_dtype(out.dtype(), "arange", [&](auto tag) {
    using T = decltype(tag);
    arange_kernel<T><<<grid_for(n, device), kBlockSize, 0, stream>>>(
        n, static_cast<T*>(out.raw_data()), stride, start, step);
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

void copy(const Array& src, Array& dst) {
  KUSARI_ASSERT(src.shape() == dst.shape(), "copy: ", src.shape(), " vs ", dst.shape());
  KUSARI_CHECK(src.device() == dst.device(), DeviceError, "copy: source on ", src.device(),
               " but destination on ", dst.device());
  const int device = dst.device().index();
  cudaStream_t stream = prepare(dst);
  const int64_t n = dst.size();
  const StridedIndexer<2> ix = make_indexer<2>(dst.shape(), {&dst, &src});
  const unsigned grid = grid_for(n, device);
  if (src.dtype() == dst.dtype()) {
    if (ix.contiguous()) {
      KUSARI_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(),
                                        static_cast<size_t>(n) * dst.itemsize(),
                                        cudaMemcpyDeviceToDevice, stream));
      return;
    }
    visit_itemsize(dst.itemsize(), [&](auto utag) {
      using U = decltype(utag);
      U* d = static_cast<U*>(dst.raw_data());
      const U* s = static_cast<const U*>(src.raw_data());
      if (fits_uint32(n)) {
        copy_strided_kernel<U, uint32_t><<<grid, kBlockSize, 0, stream>>>(n, ix, d, s);
      } else {
        copy_strided_kernel<U, int64_t><<<grid, kBlockSize, 0, stream>>>(n, ix, d, s);
      }
    });
  } else if (fits_uint32(n)) {
    convert_kernel<uint32_t><<<grid, kBlockSize, 0, stream>>>(n, ix, dst.dtype(), dst.raw_data(),
                                                              src.dtype(), src.raw_data());
  } else {
    convert_kernel<int64_t><<<grid, kBlockSize, 0, stream>>>(n, ix, dst.dtype(), dst.raw_data(),
                                                             src.dtype(), src.raw_data());
  }
  KUSARI_CUDA_CHECK_LAUNCH();
}

namespace {
constexpr const char* kRandomInCapture =
    "the generator's counter advances on the host, so every replay would draw the same numbers "
    "(e.g. the same dropout mask); draw them outside the captured function or train without "
    "dropout in a graph";
}  // namespace

void random_uniform(Array& out, double low, double high, Generator& gen) {
  KUSARI_ASSERT(out.is_contiguous());
  const int device = out.device().index();
  check_not_capturing(device, "drawing random numbers", kRandomInCapture);
  cudaStream_t stream = prepare(out);
  const int64_t n = out.size();
  const auto key = gen.key();
  const double range = high - low;
  common::visit_floating_dtype(out.dtype(), "uniform", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    if constexpr (std::is_same_v<T, double>) {
      const int64_t blocks = (n + 1) / 2;
      const uint64_t start = gen.advance(static_cast<uint64_t>(blocks));
      uniform64_kernel<<<grid_for(blocks, device), kBlockSize, 0, stream>>>(
          n, static_cast<double*>(out.raw_data()), start, key[0], key[1], low, range);
    } else {
      const int64_t blocks = (n + 3) / 4;
      const uint64_t start = gen.advance(static_cast<uint64_t>(blocks));
      uniform32_kernel<T><<<grid_for(blocks, device), kBlockSize, 0, stream>>>(
          n, static_cast<T*>(out.raw_data()), start, key[0], key[1], low, range);
    }
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

void random_normal(Array& out, double mean, double stddev, Generator& gen) {
  KUSARI_ASSERT(out.is_contiguous());
  const int device = out.device().index();
  check_not_capturing(device, "drawing random numbers", kRandomInCapture);
  cudaStream_t stream = prepare(out);
  const int64_t n = out.size();
  const auto key = gen.key();
  const int64_t blocks = (n + 1) / 2;
  const uint64_t start = gen.advance(static_cast<uint64_t>(blocks));
  common::visit_floating_dtype(out.dtype(), "normal", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    normal_kernel<T><<<grid_for(blocks, device), kBlockSize, 0, stream>>>(
        n, static_cast<T*>(out.raw_data()), start, key[0], key[1], mean, stddev);
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

void register_cuda_creation_kernels() {
  kernels::fill.set(DeviceType::kCUDA, &fill);
  kernels::arange.set(DeviceType::kCUDA, &arange);
  kernels::copy.set(DeviceType::kCUDA, &copy);
  kernels::random_uniform.set(DeviceType::kCUDA, &random_uniform);
  kernels::random_normal.set(DeviceType::kCUDA, &random_normal);
}

}  // namespace kusari::cuda
