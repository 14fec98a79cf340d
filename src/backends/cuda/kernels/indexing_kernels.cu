// CUDA kernels: take (gather along an axis) and add_at (its transpose, a scatter-add).
//
// Both read indices on the GPU and check them there (Note [Device-side argument errors]): the
// launcher reads the error words back after the kernel, which costs one stream synchronisation
// per call, and throws the CPU's IndexError. add_at adds with atomics, so when several indices
// repeat, floating-point sums may differ in the last bits from the CPU's ordered sum (and from
// run to run).
#include "backends/cuda/kernels/cuda_kernels.h"
#include "kernels/indexing.h"
#include "backends/cuda/primitives/kernel_util.cuh"

namespace kusari::cuda {
namespace {

// --- kernels -------------------------------------------------------------------------------------

/// Records the first bad index in the error words {flag, value}.
__device__ __forceinline__ void report_bad_index(int64_t* words, int64_t index) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(words), 0ull, 1ull) == 0ull) words[1] = index;
}

// out (outer, ni, inner) = x (outer, len, inner)[:, idx, :], raw bits U; idx (ni,) of type I.
template <typename U, typename I>
__global__ void take_kernel(int64_t total, int64_t ni, int64_t inner, int64_t len, const U* x,
                            const I* idx, U* out, int64_t* error_words) {
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    const int64_t k = e % inner, j = (e / inner) % ni, o = e / (inner * ni);
    int64_t i = static_cast<int64_t>(idx[j]);
    if (i < -len || i >= len) {
      report_bad_index(error_words, i);
      out[e] = U(0);
      continue;
    }
    if (i < 0) i += len;
    out[e] = x[(o * len + i) * inner + k];
  }
}

/// *p += v atomically in T's arithmetic (16-bit floats round once per addition, like the CPU).
template <typename T>
__device__ __forceinline__ void atomic_add(T* p, T v) {
  if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    // No byte atomics: add into the byte's lane of its aligned 32-bit word with compare-and-swap.
    const uintptr_t addr = reinterpret_cast<uintptr_t>(p);
    unsigned int* word = reinterpret_cast<unsigned int*>(addr & ~uintptr_t{3});
    const unsigned int shift = static_cast<unsigned int>(addr & 3u) * 8u;
    unsigned int old = *word, assumed;
    do {
      assumed = old;
      const unsigned int byte = ((assumed >> shift) + v) & 0xffu;
      old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
    } while (old != assumed);
  } else {
    atomicAdd(p, v);
  }
}

// out (outer, len, inner) [:, idx, :] += values (outer, ni, inner); idx (ni,) of type I.
template <typename T, typename I>
__global__ void add_at_kernel(int64_t total, int64_t ni, int64_t inner, int64_t len,
                              const T* values, const I* idx, T* out, int64_t* error_words) {
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    const int64_t k = e % inner, j = (e / inner) % ni, o = e / (inner * ni);
    int64_t i = static_cast<int64_t>(idx[j]);
    if (i < -len || i >= len) {
      report_bad_index(error_words, i);
      continue;
    }
    if (i < 0) i += len;
    atomic_add(out + (o * len + i) * inner + k, values[e]);
  }
}

// --- launchers -----------------------------------------------------------------------------------

/// Sizes of the axis split (outer, len, inner) of `shape` at `axis`.
void split_axis(const Shape& shape, int axis, int64_t& outer, int64_t& len, int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[d];
  for (int d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  len = shape[axis];
}

/// The integer dtypes of indices (the routines check the dtype; the visitor names it anyway).
inline constexpr common::DtypeSet kIndexDtypes = common::dtype_bit(Dtype::kInt32) | common::dtype_bit(Dtype::kInt64);

}  // namespace

void take(const Array& x_in, const Array& indices_in, int axis, Array& out) {
  KUSARI_ASSERT(out.is_contiguous());
  const Array x = x_in.contiguous(), indices = indices_in.contiguous();
  int64_t outer, len, inner;
  split_axis(x.shape(), axis, outer, len, inner);
  const int64_t ni = indices.size();
  const int64_t total = outer * ni * inner;
  if (total == 0) return;
  const int device = x.device().index();
  cudaStream_t stream = prepare(x);
  ErrorWords errors = error_words(device);
  common::visit_dtype<kIndexDtypes>(indices.dtype(), "take", [&](auto itag) {
    using I = decltype(itag);
    visit_itemsize(x.itemsize(), [&](auto utag) {
      using U = decltype(utag);
      take_kernel<U, I><<<grid_for(total, device), kBlockSize, 0, stream>>>(
          total, ni, inner, len, static_cast<const U*>(x.raw_data()),
          static_cast<const I*>(indices.raw_data()), static_cast<U*>(out.raw_data()), errors.words);
    });
  });
  KUSARI_CUDA_CHECK_LAUNCH();
  int64_t bad = 0;
  if (errors.fetch(&bad)) {
    KUSARI_THROW(IndexError, "take: index ", bad, " is out of bounds for an axis of length ", len);
  }
}

void add_at(Array& out, const Array& indices_in, int axis, const Array& values_in) {
  KUSARI_ASSERT(out.is_contiguous());
  KUSARI_CHECK(out.dtype() != Dtype::kBool, DtypeError, "add_at: not supported for dtype bool");
  const Array values = values_in.contiguous(), indices = indices_in.contiguous();
  int64_t outer, len, inner;
  split_axis(out.shape(), axis, outer, len, inner);
  const int64_t ni = indices.size();
  const int64_t total = outer * ni * inner;
  if (total == 0) return;
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  ErrorWords errors = error_words(device);
  common::visit_dtype<kIndexDtypes>(indices.dtype(), "add_at", [&](auto itag) {
    using I = decltype(itag);
    visit_device_dtype(out.dtype(), "add_at", [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        add_at_kernel<T, I><<<grid_for(total, device), kBlockSize, 0, stream>>>(
            total, ni, inner, len, static_cast<const T*>(values.raw_data()),
            static_cast<const I*>(indices.raw_data()), static_cast<T*>(out.raw_data()),
            errors.words);
      }
    });
  });
  KUSARI_CUDA_CHECK_LAUNCH();
  int64_t bad = 0;
  if (errors.fetch(&bad)) {
    KUSARI_THROW(IndexError, "add_at: index ", bad, " is out of bounds for an axis of length ",
                 len);
  }
}

void register_cuda_indexing_kernels() {
  kernels::take.set(DeviceType::kCUDA, &take);
  kernels::add_at.set(DeviceType::kCUDA, &add_at);
}

}  // namespace kusari::cuda
