// CUDA kernels: batch normalization in one reduction and one elementwise pass each way
// (Note [Fused batch normalization]). The data arrays are dense (outer, C, inner) views checked by
// the routine.
//
// Note [Batch norm kernel geometry]
// Two shapes of loop cover the layouts:
//   planar (inner > 1, C-ordered NCHW): each (n, c) plane is `inner` contiguous elements. The
//     elementwise kernels give a block to a plane (threads along it), so the channel is known per
//     block; the reductions give a channel a 2-d grid of (channel, split) blocks, each summing a
//     range of its planes.
//   channels-minor (inner == 1: channels-last, or (N, C)): rows of C contiguous channels. Blocks
//     are 32 x 8 threads: x along consecutive channels, each thread V of them read and written
//     as one pack of V * sizeof(T) bytes (up to 16), so a warp moves up to 512 contiguous bytes
//     per load and keeps more bytes in flight; V is the widest power of two that divides C,
//     leaves no thread of a warp idle (C >= 32 V) and keeps the arrays' alignment, else 1; y along
//     rows; a grid column of blocks shares the channels and splits the rows.
// No thread divides per element, except the planar reduction over planes smaller than a block,
// which walks a flat index with 32-bit division.
// The reductions write per-(channel, split) partials to a small workspace; a second kernel, one
// thread per channel, merges them and finishes the statistics (and the running averages).
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/primitives/kernel_util.cuh"
#include "kernels/normalization.h"

namespace kusari::cuda {
namespace {

using kernels::BatchNormShape;

/// The statistics' type: double for double data, float otherwise.
template <typename T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename S, typename T>
__device__ __forceinline__ S load_as(const T* p, int64_t i) {
  return static_cast<S>(to_compute(p[i]));
}

/// V consecutive elements, loaded and stored as one access.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, typename T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, int64_t i) {
  return *reinterpret_cast<const Pack<T, V>*>(p + i);
}

template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p + i) = v;
}

/// A partial statistic: count, mean and sum of squared deviations (of x - shift).
template <typename S>
struct Moments {
  S n, mean, m2;
};

/// Chan et al.'s pairwise merge.
template <typename S>
__device__ __forceinline__ Moments<S> merge(Moments<S> a, Moments<S> b) {
  const S n = a.n + b.n;
  if (n == S(0)) return a;
  const S delta = b.mean - a.mean;
  const S fb = b.n / n;
  return {n, a.mean + delta * fb, a.m2 + b.m2 + delta * delta * a.n * fb};
}

/// The moments of a thread's shifted sums s1 = sum(v), s2 = sum(v^2) over n values.
template <typename S>
__device__ __forceinline__ Moments<S> from_sums(S n, S s1, S s2) {
  if (n == S(0)) return {S(0), S(0), S(0)};
  const S mean = s1 / n;
  return {n, mean, s2 > s1 * mean ? s2 - s1 * mean : S(0)};
}

template <typename S>
__device__ __forceinline__ Moments<S> shfl_down(Moments<S> m, int offset) {
  return {__shfl_down_sync(0xffffffffu, m.n, offset), __shfl_down_sync(0xffffffffu, m.mean, offset),
          __shfl_down_sync(0xffffffffu, m.m2, offset)};
}

/// Merges the moments of a whole (1-d) block into thread 0's.
template <typename S>
__device__ Moments<S> block_merge(Moments<S> m) {
  __shared__ Moments<S> warp_results[32];
  for (int off = 16; off > 0; off /= 2) m = merge(m, shfl_down(m, off));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = m;
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    m = lane < warps ? warp_results[lane] : Moments<S>{S(0), S(0), S(0)};
    for (int off = 16; off > 0; off /= 2) m = merge(m, shfl_down(m, off));
  }
  return m;
}

/// Sums a pair over a whole (1-d) block into thread 0's.
template <typename S>
__device__ void block_sum2(S& a, S& b) {
  __shared__ S sa[32], sb[32];
  for (int off = 16; off > 0; off /= 2) {
    a += __shfl_down_sync(0xffffffffu, a, off);
    b += __shfl_down_sync(0xffffffffu, b, off);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    sa[warp] = a;
    sb[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + 31) / 32;
    a = lane < warps ? sa[lane] : S(0);
    b = lane < warps ? sb[lane] : S(0);
    for (int off = 16; off > 0; off /= 2) {
      a += __shfl_down_sync(0xffffffffu, a, off);
      b += __shfl_down_sync(0xffffffffu, b, off);
    }
  }
}

constexpr int kPlanarBlock = 256;
constexpr int kRowsX = 32, kRowsY = 8;

// --- statistics ----------------------------------------------------------------------------------

// The terms each reduction sums: the statistics sum x - shift and its square; the backward sums
// g and g * (x - mean), g being gy masked by a fused relu's output.
template <typename T, typename S>
struct StatTerms {
  const T* x;
  __device__ __forceinline__ void add(int64_t i, S shift, S& a, S& b) const {
    const S v = load_as<S>(x, i) - shift;
    a += v;
    b += v * v;
  }
  template <int V>
  __device__ __forceinline__ void add_pack(int64_t i, const S* shift, S* a, S* b) const {
    const Pack<T, V> xv = load_pack<V>(x, i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const S v = static_cast<S>(to_compute(xv.v[j])) - shift[j];
      a[j] += v;
      b[j] += v * v;
    }
  }
};

template <typename T, typename S>
struct GradTerms {
  const T* x;
  const T* gy;
  const T* relu_y;
  __device__ __forceinline__ void add(int64_t i, S mean, S& a, S& b) const {
    S g = load_as<S>(gy, i);
    if (relu_y != nullptr && !(load_as<S>(relu_y, i) > S(0))) g = S(0);
    a += g;
    b += g * (load_as<S>(x, i) - mean);
  }
  template <int V>
  __device__ __forceinline__ void add_pack(int64_t i, const S* mean, S* a, S* b) const {
    const Pack<T, V> gv = load_pack<V>(gy, i), xv = load_pack<V>(x, i);
    Pack<T, V> yv;
    if (relu_y != nullptr) yv = load_pack<V>(relu_y, i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      S g = static_cast<S>(to_compute(gv.v[j]));
      if (relu_y != nullptr && !(static_cast<S>(to_compute(yv.v[j])) > S(0))) g = S(0);
      a[j] += g;
      b[j] += g * (static_cast<S>(to_compute(xv.v[j])) - mean[j]);
    }
  }
};

// partial[(c * splits + split) * 2 + {0, 1}] = the block's two sums for channel c; `center` is
// the per-channel value subtracted (the shift of the statistics, the mean of the backward).
template <typename S, typename Terms, bool kMoments>
__global__ void planar_partials(BatchNormShape s, Terms terms, const S* center_of, S* partial,
                                int splits) {
  const int64_t c = blockIdx.x;
  const int split = blockIdx.y;
  // The statistics' shift is the channel's first element; the backward's center its mean.
  const S center = kMoments ? load_as<S>(terms.x, c * s.inner) : center_of[c];
  S a = S(0), b = S(0), n = S(0);
  const int64_t o0 = s.outer * split / splits, o1 = s.outer * (split + 1) / splits;
  if (s.inner >= kPlanarBlock / 2) {
    for (int64_t o = o0; o < o1; ++o) {
      const int64_t base = (o * s.channels + c) * s.inner;
      for (int64_t i = threadIdx.x; i < s.inner; i += blockDim.x) {
        terms.add(base + i, center, a, b);
        n += S(1);
      }
    }
  } else {
    const uint32_t inner = static_cast<uint32_t>(s.inner);
    const uint32_t count = static_cast<uint32_t>((o1 - o0) * s.inner);
    for (uint32_t j = threadIdx.x; j < count; j += blockDim.x) {
      const uint32_t o = j / inner, i = j - o * inner;
      terms.add(((o0 + o) * s.channels + c) * s.inner + i, center, a, b);
      n += S(1);
    }
  }
  S* out = partial + (c * splits + split) * 3;
  if constexpr (kMoments) {
    Moments<S> m = block_merge(from_sums(n, a, b));
    if (threadIdx.x == 0) {
      out[0] = m.n;
      out[1] = m.mean;
      out[2] = m.m2;
    }
  } else {
    block_sum2(a, b);
    if (threadIdx.x == 0) {
      out[0] = a;
      out[1] = b;
    }
  }
}

// Blocks of bx x by threads (blockDim), each thread V channels (Note [Batch norm kernel geometry]).
template <typename S, int V, typename Terms, bool kMoments>
__global__ void rows_partials(BatchNormShape s, Terms terms, const S* center_of, S* partial,
                              int splits) {
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kRowsX + tx) * V;
  const int split = blockIdx.y;
  const bool active = c < s.channels;
  S center[V], a[V], b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    center[j] = !active ? S(0) : kMoments ? load_as<S>(terms.x, c + j) : center_of[c + j];
    a[j] = S(0);
    b[j] = S(0);
  }
  S n = S(0);
  const int64_t r0 = s.outer * split / splits, r1 = s.outer * (split + 1) / splits;
  if (active) {
    // Four rows' loads in flight per thread: a thread's sums are a chain of dependent adds, and
    // one load at a time would leave the memory system mostly idle.
    int64_t r = r0 + ty;
    for (; r + 3 * kRowsY < r1; r += 4 * kRowsY) {
      terms.template add_pack<V>(r * s.channels + c, center, a, b);
      terms.template add_pack<V>((r + kRowsY) * s.channels + c, center, a, b);
      terms.template add_pack<V>((r + 2 * kRowsY) * s.channels + c, center, a, b);
      terms.template add_pack<V>((r + 3 * kRowsY) * s.channels + c, center, a, b);
      n += S(4);
    }
    for (; r < r1; r += kRowsY) {
      terms.template add_pack<V>(r * s.channels + c, center, a, b);
      n += S(1);
    }
  }
  // sh[k][y][x]: the thread's sums (k = 2j, 2j + 1) and its count (k = 2V).
  __shared__ S sh[2 * V + 1][kRowsY][kRowsX];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sh[2 * j][ty][tx] = a[j];
    sh[2 * j + 1][ty][tx] = b[j];
  }
  sh[2 * V][ty][tx] = n;
  __syncthreads();
  if (ty != 0 || !active) return;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    S* out = partial + ((c + j) * splits + split) * 3;
    if constexpr (kMoments) {
      Moments<S> m = from_sums(sh[2 * V][0][tx], sh[2 * j][0][tx], sh[2 * j + 1][0][tx]);
      for (int y = 1; y < kRowsY; ++y) {
        m = merge(m, from_sums(sh[2 * V][y][tx], sh[2 * j][y][tx], sh[2 * j + 1][y][tx]));
      }
      out[0] = m.n;
      out[1] = m.mean;
      out[2] = m.m2;
    } else {
      S ta = sh[2 * j][0][tx], tb = sh[2 * j + 1][0][tx];
      for (int y = 1; y < kRowsY; ++y) {
        ta += sh[2 * j][y][tx];
        tb += sh[2 * j + 1][y][tx];
      }
      out[0] = ta;
      out[1] = tb;
    }
  }
}

template <typename T, typename S>
__global__ void finish_statistics(BatchNormShape s, const T* x, const S* partial, int splits, S eps,
                                  S* mean, S* var, S* inv_std, S* running_mean, S* running_var,
                                  S decay, S var_adjust) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= s.channels) return;
  const S* p = partial + c * splits * 3;
  Moments<S> m{p[0], p[1], p[2]};
  for (int k = 1; k < splits; ++k) m = merge(m, Moments<S>{p[k * 3], p[k * 3 + 1], p[k * 3 + 2]});
  const S mu = load_as<S>(x, c * s.inner) + m.mean;
  const S v = m.n > S(0) ? m.m2 / m.n : S(0);
  mean[c] = mu;
  var[c] = v;
  if constexpr (std::is_same_v<S, double>) {
    inv_std[c] = rsqrt(v + eps);
  } else {
    inv_std[c] = rsqrtf(v + eps);
  }
  if (running_mean) running_mean[c] = decay * running_mean[c] + (S(1) - decay) * mu;
  if (running_var) running_var[c] = decay * running_var[c] + (S(1) - decay) * v * var_adjust;
}

template <typename S>
__global__ void finish_grad_sums(int64_t channels, const S* partial, int splits, const S* inv_std,
                                 S* gbeta, S* ggamma) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const S* p = partial + c * splits * 3;
  S a = S(0), b = S(0);
  for (int k = 0; k < splits; ++k) {
    a += p[k * 3];
    b += p[k * 3 + 1];
  }
  gbeta[c] = a;
  ggamma[c] = b * inv_std[c];
}

// How many splits each channel's reduction gets: enough blocks to fill the GPU a few times,
// and no block with less than a few thousand elements.
int reduction_splits(const BatchNormShape& s, int device, int64_t column_blocks) {
  const int64_t per_channel = s.outer * s.inner;
  const int64_t wanted_blocks = static_cast<int64_t>(sm_count(device)) * 4;
  int64_t splits = (wanted_blocks + column_blocks - 1) / column_blocks;
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, per_channel / 4096));
  splits = std::min<int64_t>(splits, s.outer);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, 65535));
}

// The pack width of the channels-minor kernels for these arrays (Note [Batch norm kernel
// geometry]): the widest V up to 16 / sizeof(T) with C a multiple of V, C >= 32 V, and every
// array aligned to V elements; 1 when none is.
template <typename T, size_t N>
int rows_pack(const BatchNormShape& s, const std::array<const void*, N>& arrays) {
  for (int v = static_cast<int>(16 / sizeof(T)); v > 1; v /= 2) {
    if (s.channels % v != 0 || s.channels < int64_t{kRowsX} * v) continue;
    bool aligned = true;
    for (const void* p : arrays) {
      aligned = aligned && reinterpret_cast<uintptr_t>(p) % (sizeof(T) * v) == 0;
    }
    if (aligned) return v;
  }
  return 1;
}

// Calls f(std::integral_constant<int, V>) for the pack width `pack` of T's kernels.
template <typename T, typename F>
void with_pack(int pack, F&& f) {
  constexpr int kWide = static_cast<int>(16 / sizeof(T));
  switch (pack) {
    case 2:
      if constexpr (kWide >= 2) f(std::integral_constant<int, 2>{});
      return;
    case 4:
      if constexpr (kWide >= 4) f(std::integral_constant<int, 4>{});
      return;
    case 8:
      if constexpr (kWide >= 8) f(std::integral_constant<int, 8>{});
      return;
    default:
      f(std::integral_constant<int, 1>{});
  }
}

// Runs the partial reduction of `terms` into a fresh workspace; returns it and sets *splits.
// `pack` is the channels-minor pack width (rows_pack).
template <typename S, bool kMoments, typename T, typename Terms>
Array reduce_partials(const Array& like, const BatchNormShape& s, const Terms& terms,
                      const S* center, int pack, int* splits_out) {
  const int device = like.device().index();
  cudaStream_t stream = prepare(like);
  const bool rows = s.inner == 1;
  const int64_t column_blocks = rows ? (s.channels / pack + kRowsX - 1) / kRowsX : s.channels;
  const int splits = reduction_splits(s, device, column_blocks);
  *splits_out = splits;
  Array work = Array::empty({s.channels * splits * 3}, dtype_of<S>, like.device());
  S* wp = work.data<S>();
  if (rows) {
    const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(splits));
    with_pack<T>(pack, [&](auto v) {
      rows_partials<S, decltype(v)::value, Terms, kMoments>
          <<<grid, dim3(kRowsX, kRowsY), 0, stream>>>(s, terms, center, wp, splits);
    });
  } else {
    const dim3 grid(static_cast<unsigned>(s.channels), static_cast<unsigned>(splits));
    planar_partials<S, Terms, kMoments>
        <<<grid, kPlanarBlock, 0, stream>>>(s, terms, center, wp, splits);
  }
  KUSARI_CUDA_CHECK_LAUNCH();
  return work;
}

bool fits_kernels(const BatchNormShape& s) {
  // Grid x carries the channels of the planar kernels; 32-bit flat indices cover a split.
  return s.channels < (int64_t{1} << 31) && s.outer * s.inner < (int64_t{1} << 32) - 1;
}

bool batch_norm_statistics(const Array& x, const BatchNormShape& s,
                           const kernels::BatchNormStatsParams& p, Array& mean, Array& var,
                           Array& inv_std) {
  if (!fits_kernels(s)) return false;
  visit_device_dtype<common::kFloatingDtypes>(x.dtype(), "batch_norm_statistics", [&](auto tag) {
    using T = decltype(tag);
    using S = stat_t<T>;
    const T* xp = static_cast<const T*>(x.raw_data());
    int splits = 1;
    Array work =
        reduce_partials<S, true, T>(x, s, StatTerms<T, S>{xp}, nullptr,
                                    rows_pack<T>(s, std::array<const void*, 1>{xp}), &splits);
    cudaStream_t stream = compute_stream(x.device().index());
    const unsigned grid = static_cast<unsigned>((s.channels + 127) / 128);
    finish_statistics<T, S><<<grid, 128, 0, stream>>>(
        s, xp, work.data<S>(), splits, static_cast<S>(p.eps), mean.data<S>(), var.data<S>(),
        inv_std.data<S>(), p.running_mean ? p.running_mean->data<S>() : nullptr,
        p.running_var ? p.running_var->data<S>() : nullptr, static_cast<S>(p.decay),
        static_cast<S>(p.var_adjust));
    KUSARI_CUDA_CHECK_LAUNCH();
  });
  return true;
}

bool batch_norm_backward_reduce(const Array& x, const Array& gy, const Array* relu_y,
                                const BatchNormShape& s, const Array& mean, const Array& inv_std,
                                Array& gbeta, Array& ggamma) {
  if (!fits_kernels(s)) return false;
  visit_device_dtype<common::kFloatingDtypes>(
      x.dtype(), "batch_norm_backward_reduce", [&](auto tag) {
        using T = decltype(tag);
        using S = stat_t<T>;
        GradTerms<T, S> terms{static_cast<const T*>(x.raw_data()),
                              static_cast<const T*>(gy.raw_data()),
                              relu_y ? static_cast<const T*>(relu_y->raw_data()) : nullptr};
        int splits = 1;
        Array work = reduce_partials<S, false, T>(
            x, s, terms, mean.data<S>(),
            rows_pack<T>(s, std::array<const void*, 3>{terms.x, terms.gy, terms.relu_y}), &splits);
        cudaStream_t stream = compute_stream(x.device().index());
        const unsigned grid = static_cast<unsigned>((s.channels + 127) / 128);
        finish_grad_sums<S><<<grid, 128, 0, stream>>>(s.channels, work.data<S>(), splits,
                                                      inv_std.data<S>(), gbeta.data<S>(),
                                                      ggamma.data<S>());
        KUSARI_CUDA_CHECK_LAUNCH();
      });
  return true;
}

// --- elementwise passes --------------------------------------------------------------------------

/// y = act((x - mean) * scale + shift (+ residual)).
template <typename T, typename S>
struct NormalizeOp {
  const T* x;
  const T* residual;
  T* y;
  const S* mean;
  const S* inv_std;
  const S* gamma;
  const S* beta;
  bool relu;

  struct Channel {
    S mu, scale, shift;
  };
  __device__ __forceinline__ Channel channel(int64_t c) const {
    return {mean[c], inv_std[c] * gamma[c], beta[c]};
  }
  __device__ __forceinline__ void apply(int64_t i, const Channel& k) const {
    S v = (load_as<S>(x, i) - k.mu) * k.scale + k.shift;
    if (residual != nullptr) v += load_as<S>(residual, i);
    if (relu) v = v > S(0) ? v : S(0);
    y[i] = from_compute<T>(static_cast<compute_t<T>>(v));
  }
  template <int V>
  __device__ __forceinline__ void apply_pack(int64_t i, const Channel* k) const {
    const Pack<T, V> xv = load_pack<V>(x, i);
    Pack<T, V> rv, out;
    if (residual != nullptr) rv = load_pack<V>(residual, i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      S v = (static_cast<S>(to_compute(xv.v[j])) - k[j].mu) * k[j].scale + k[j].shift;
      if (residual != nullptr) v += static_cast<S>(to_compute(rv.v[j]));
      if (relu) v = v > S(0) ? v : S(0);
      out.v[j] = from_compute<T>(static_cast<compute_t<T>>(v));
    }
    store_pack<V>(y, i, out);
  }
  std::array<const void*, 4> arrays() const {
    return {x, residual, y};
  }
};

/// gx = a * (g - b - (x - mean) * d).
template <typename T, typename S>
struct BackwardDataOp {
  const T* x;
  const T* gy;
  const T* relu_y;
  T* gx;
  const S* mean;
  const S* inv_std;
  const S* gamma;
  const S* gbeta;
  const S* ggamma;
  S inv_m;

  struct Channel {
    S mu, a, b, d;
  };
  __device__ __forceinline__ Channel channel(int64_t c) const {
    const S istd = inv_std[c];
    return {mean[c], gamma[c] * istd, gbeta[c] * inv_m, istd * ggamma[c] * inv_m};
  }
  __device__ __forceinline__ void apply(int64_t i, const Channel& k) const {
    S g = load_as<S>(gy, i);
    if (relu_y != nullptr && !(load_as<S>(relu_y, i) > S(0))) g = S(0);
    const S v = k.a * (g - k.b - (load_as<S>(x, i) - k.mu) * k.d);
    gx[i] = from_compute<T>(static_cast<compute_t<T>>(v));
  }
  template <int V>
  __device__ __forceinline__ void apply_pack(int64_t i, const Channel* k) const {
    const Pack<T, V> gv = load_pack<V>(gy, i), xv = load_pack<V>(x, i);
    Pack<T, V> yv, out;
    if (relu_y != nullptr) yv = load_pack<V>(relu_y, i);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      S g = static_cast<S>(to_compute(gv.v[j]));
      if (relu_y != nullptr && !(static_cast<S>(to_compute(yv.v[j])) > S(0))) g = S(0);
      const S v = k[j].a * (g - k[j].b - (static_cast<S>(to_compute(xv.v[j])) - k[j].mu) * k[j].d);
      out.v[j] = from_compute<T>(static_cast<compute_t<T>>(v));
    }
    store_pack<V>(gx, i, out);
  }
  std::array<const void*, 4> arrays() const {
    return {x, gy, relu_y, gx};
  }
};

template <typename Op>
__global__ void planar_elementwise(BatchNormShape s, Op op) {
  const int64_t plane = blockIdx.x;
  const auto k = op.channel(plane % s.channels);
  const int64_t base = plane * s.inner;
  for (int64_t i = threadIdx.x; i < s.inner; i += blockDim.x) op.apply(base + i, k);
}

template <int V, typename Op>
__global__ void rows_elementwise(BatchNormShape s, Op op) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kRowsX + threadIdx.x) * V;
  if (c >= s.channels) return;
  typename Op::Channel k[V];
#pragma unroll
  for (int j = 0; j < V; ++j) k[j] = op.channel(c + j);
  const int64_t step = static_cast<int64_t>(gridDim.y) * kRowsY;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRowsY + threadIdx.y; r < s.outer;
       r += step) {
    op.template apply_pack<V>(r * s.channels + c, k);
  }
}

template <typename T, typename Op>
void launch_elementwise(const Array& like, const BatchNormShape& s, const Op& op) {
  const int device = like.device().index();
  cudaStream_t stream = prepare(like);
  if (s.inner == 1) {
    const int pack = rows_pack<T>(s, op.arrays());
    const int64_t column_blocks = (s.channels / pack + kRowsX - 1) / kRowsX;
    const int64_t wanted = static_cast<int64_t>(sm_count(device)) * 8;
    const int64_t row_blocks =
        std::clamp<int64_t>((wanted + column_blocks - 1) / column_blocks, 1,
                            std::min<int64_t>(65535, (s.outer + kRowsY - 1) / kRowsY));
    const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(row_blocks));
    with_pack<T>(pack, [&](auto v) {
      rows_elementwise<decltype(v)::value><<<grid, dim3(kRowsX, kRowsY), 0, stream>>>(s, op);
    });
  } else {
    const int block = static_cast<int>(std::min<int64_t>(kPlanarBlock, (s.inner + 31) / 32 * 32));
    planar_elementwise<<<static_cast<unsigned>(s.outer * s.channels), block, 0, stream>>>(s, op);
  }
  KUSARI_CUDA_CHECK_LAUNCH();
}

bool batch_norm_normalize(const Array& x, const BatchNormShape& s, const Array& mean,
                          const Array& inv_std, const Array& gamma, const Array& beta,
                          const Array* residual, bool relu, Array& y) {
  if (!fits_kernels(s) || s.outer * s.channels >= (int64_t{1} << 31)) return false;
  visit_device_dtype<common::kFloatingDtypes>(x.dtype(), "batch_norm_normalize", [&](auto tag) {
    using T = decltype(tag);
    using S = stat_t<T>;
    NormalizeOp<T, S> op{static_cast<const T*>(x.raw_data()),
                         residual ? static_cast<const T*>(residual->raw_data()) : nullptr,
                         static_cast<T*>(y.raw_data()),
                         mean.data<S>(),
                         inv_std.data<S>(),
                         gamma.data<S>(),
                         beta.data<S>(),
                         relu};
    launch_elementwise<T>(x, s, op);
  });
  return true;
}

bool batch_norm_backward_data(const Array& x, const Array& gy, const Array* relu_y,
                              const BatchNormShape& s, const Array& mean, const Array& inv_std,
                              const Array& gamma, const Array& gbeta, const Array& ggamma,
                              double inv_m, Array& gx) {
  if (!fits_kernels(s) || s.outer * s.channels >= (int64_t{1} << 31)) return false;
  visit_device_dtype<common::kFloatingDtypes>(x.dtype(), "batch_norm_backward_data", [&](auto tag) {
    using T = decltype(tag);
    using S = stat_t<T>;
    BackwardDataOp<T, S> op{static_cast<const T*>(x.raw_data()),
                            static_cast<const T*>(gy.raw_data()),
                            relu_y ? static_cast<const T*>(relu_y->raw_data()) : nullptr,
                            static_cast<T*>(gx.raw_data()),
                            mean.data<S>(),
                            inv_std.data<S>(),
                            gamma.data<S>(),
                            gbeta.data<S>(),
                            ggamma.data<S>(),
                            static_cast<S>(inv_m)};
    launch_elementwise<T>(x, s, op);
  });
  return true;
}

}  // namespace

void register_cuda_normalization_kernels() {
  kernels::batch_norm_statistics.set(DeviceType::kCUDA, &batch_norm_statistics);
  kernels::batch_norm_normalize.set(DeviceType::kCUDA, &batch_norm_normalize);
  kernels::batch_norm_backward_reduce.set(DeviceType::kCUDA, &batch_norm_backward_reduce);
  kernels::batch_norm_backward_data.set(DeviceType::kCUDA, &batch_norm_backward_data);
}

}  // namespace kusari::cuda
