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
//     are 32 x 8 threads: x along 32 consecutive channels (a warp reads 32 neighbours, so loads
//     coalesce), y along rows; a grid column of blocks shares the channels and splits the rows.
// No thread divides per element, except the planar reduction over planes smaller than a block,
// which walks a flat index with 32-bit division.
// The reductions write per-(channel, split) partials to a small workspace; a second kernel, one
// thread per channel, merges them and finishes the statistics (and the running averages).
// Channels-minor data whose C is a multiple of a 16-byte pack (8 bfloat16 or float16, 4 float32,
// 2 float64 channels) and whose arrays are 16-byte aligned takes the pack kernels instead: see
// Note [Batch norm packs]. The one-element kernels stay for the rest.
#include <algorithm>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/primitives/kernel_util.cuh"
#include "backends/cuda/primitives/reduce.cuh"
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

// --- 16-byte packs -------------------------------------------------------------------------------

// Note [Batch norm packs]
// The one-element channels-minor kernels move 2 bytes per thread and load for 16-bit data, so a
// warp asks for 64 bytes at a time and a multiprocessor has too few bytes in flight to cover the
// memory latency: on an H200 they reached about 45% of the copy bandwidth on ResNet-50's
// channels-last bfloat16 shapes. The pack kernels give each thread a fixed run of channels, one
// 16-byte pack wide (so its per-channel constants stay in registers for the whole kernel), and
// walk rows: blocks are (px, ry) threads, px along the packs of a row (at most 64; a warp then
// covers whole rows or 32 packs of one row, 512 contiguous bytes), ry = 256 / px along rows, and
// each thread issues the loads of kRowsInFlight rows before using any (4 for the passes that
// read one array, 2 for those that read three, so that 16-bit data keeps two blocks per
// multiprocessor within the registers). The reductions keep one
// partial per channel and thread, merge the block's rows in shared memory, and write the same
// per-(channel, split) partials as the one-element kernels, so the finishing kernels are shared.
// An earlier try with 16-byte packs and four rows in flight (docs/benchmarks.md) was slower; it
// kept one channel per thread along the rows and split the pack across threads.

/// 16 bytes of T, loaded or stored at once.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = static_cast<int>(16 / sizeof(T));
  T v[kSize];
};

template <typename T>
__device__ __forceinline__ Pack<T> load_pack(const T* p, int64_t i) {
  return *reinterpret_cast<const Pack<T>*>(p + i);
}

template <typename T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T>& v) {
  *reinterpret_cast<Pack<T>*>(p + i) = v;
}

constexpr int kPackBlock = 256;
constexpr int kMaxPacksPerRowTile = 64;

/// The pack kernels' block and its grid's x (tiles of a row's packs).
struct PackGeometry {
  int px = 1, ry = 1;
  unsigned tiles = 1;
  int64_t packs = 0;
};

template <typename T>
PackGeometry pack_geometry(const BatchNormShape& s) {
  PackGeometry g;
  g.packs = s.channels / Pack<T>::kSize;
  g.px = static_cast<int>(std::min<int64_t>(g.packs, kMaxPacksPerRowTile));
  g.ry = std::max(1, kPackBlock / g.px);
  g.tiles = static_cast<unsigned>((g.packs + g.px - 1) / g.px);
  return g;
}

/// True when the pack kernels apply: channels-minor, whole packs per row, aligned arrays.
template <typename T>
bool packs_apply(const BatchNormShape& s, std::initializer_list<const void*> arrays) {
  if (s.inner != 1 || s.channels % Pack<T>::kSize != 0) return false;
  for (const void* a : arrays) {
    if (a != nullptr && reinterpret_cast<uintptr_t>(a) % 16 != 0) return false;
  }
  return true;
}

// --- statistics ----------------------------------------------------------------------------------

// The terms each reduction sums: the statistics sum x - shift and its square; the backward sums
// g and g * (x - mean), g being gy masked by a fused relu's output.
template <typename T, typename S>
struct StatTerms {
  using Elem = T;
  static constexpr int kRowsInFlight = 4;
  const T* x;
  __device__ __forceinline__ void add(int64_t i, S shift, S& a, S& b) const {
    const S v = load_as<S>(x, i) - shift;
    a += v;
    b += v * v;
  }
  /// The terms of kRows packs at i, i + stride, ...: one pack of channels per row.
  template <int kRows>
  __device__ __forceinline__ void add_packs(int64_t i, int64_t stride, const S* shift, S* a,
                                            S* b) const {
    constexpr int V = Pack<T>::kSize;
    Pack<T> xs[kRows];
#pragma unroll
    for (int u = 0; u < kRows; ++u) xs[u] = load_pack(x, i + u * stride);
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const S v = static_cast<S>(to_compute(xs[u].v[j])) - shift[j];
        a[j] += v;
        b[j] += v * v;
      }
    }
  }
};

/// The backward's operands: x, gy and, after a fused relu, its output y, whose sign masks gy.
template <typename T, typename S>
struct GradOperands {
  const T* x;
  const T* gy;
  const T* relu_y;
  /// gy masked by the relu, and x, at element i.
  __device__ __forceinline__ S g(int64_t i) const {
    const S v = load_as<S>(gy, i);
    return relu_y != nullptr && !(load_as<S>(relu_y, i) > S(0)) ? S(0) : v;
  }
  __device__ __forceinline__ S xv(int64_t i) const { return load_as<S>(x, i); }

  /// The packs of kRows rows at i, i + stride, ..., all loads issued before any is used.
  template <int kRows>
  struct Rows {
    Pack<T> x[kRows], gy[kRows], y[kRows];
    __device__ __forceinline__ S g(int u, int j, bool relu) const {
      const S v = static_cast<S>(to_compute(gy[u].v[j]));
      return relu && !(static_cast<S>(to_compute(y[u].v[j])) > S(0)) ? S(0) : v;
    }
    __device__ __forceinline__ S xv(int u, int j) const {
      return static_cast<S>(to_compute(x[u].v[j]));
    }
  };
  template <int kRows>
  __device__ __forceinline__ Rows<kRows> load_rows(int64_t i, int64_t stride) const {
    Rows<kRows> r;
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      r.x[u] = load_pack(x, i + u * stride);
      r.gy[u] = load_pack(gy, i + u * stride);
      if (relu_y != nullptr) r.y[u] = load_pack(relu_y, i + u * stride);
    }
    return r;
  }
};

template <typename T, typename S>
struct GradTerms {
  using Elem = T;
  static constexpr int kRowsInFlight = 2;
  GradOperands<T, S> in;
  __device__ __forceinline__ void add(int64_t i, S mean, S& a, S& b) const {
    const S g = in.g(i);
    a += g;
    b += g * (in.xv(i) - mean);
  }
  template <int kRows>
  __device__ __forceinline__ void add_packs(int64_t i, int64_t stride, const S* mean, S* a,
                                            S* b) const {
    const auto r = in.template load_rows<kRows>(i, stride);
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
#pragma unroll
      for (int j = 0; j < Pack<T>::kSize; ++j) {
        const S g = r.g(u, j, in.relu_y != nullptr);
        a[j] += g;
        b[j] += g * (r.xv(u, j) - mean[j]);
      }
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
  S center;
  if constexpr (kMoments) {
    center = load_as<S>(terms.x, c * s.inner);
  } else {
    center = center_of[c];
  }
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

template <typename S, typename Terms, bool kMoments>
__global__ void rows_partials(BatchNormShape s, Terms terms, const S* center_of, S* partial,
                              int splits) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kRowsX + threadIdx.x;
  const int split = blockIdx.y;
  const bool active = c < s.channels;
  S center = S(0);
  if constexpr (kMoments) {
    if (active) center = load_as<S>(terms.x, c);
  } else {
    if (active) center = center_of[c];
  }
  S a = S(0), b = S(0), n = S(0);
  const int64_t r0 = s.outer * split / splits, r1 = s.outer * (split + 1) / splits;
  if (active) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsY) {
      terms.add(r * s.channels + c, center, a, b);
      n += S(1);
    }
  }
  __shared__ S sh[3][kRowsY][kRowsX];
  sh[0][threadIdx.y][threadIdx.x] = a;
  sh[1][threadIdx.y][threadIdx.x] = b;
  sh[2][threadIdx.y][threadIdx.x] = n;
  __syncthreads();
  if (threadIdx.y != 0 || !active) return;
  S* out = partial + (c * splits + split) * 3;
  if constexpr (kMoments) {
    Moments<S> m = from_sums(sh[2][0][threadIdx.x], sh[0][0][threadIdx.x], sh[1][0][threadIdx.x]);
    for (int y = 1; y < kRowsY; ++y) {
      m = merge(m, from_sums(sh[2][y][threadIdx.x], sh[0][y][threadIdx.x], sh[1][y][threadIdx.x]));
    }
    out[0] = m.n;
    out[1] = m.mean;
    out[2] = m.m2;
  } else {
    for (int y = 1; y < kRowsY; ++y) {
      a += sh[0][y][threadIdx.x];
      b += sh[1][y][threadIdx.x];
    }
    out[0] = a;
    out[1] = b;
  }
}


/// The channels-minor reduction on packs (Note [Batch norm packs]); writes the same partials as
/// rows_partials. Dynamic shared memory: 2 * blockDim.x * blockDim.y * V + blockDim.y values of S.
template <typename S, typename Terms, bool kMoments>
__global__ void __launch_bounds__(kPackBlock, 2) pack_partials(BatchNormShape s, Terms terms, const S* center_of, S* partial,
                              int splits, int64_t packs) {
  using T = typename Terms::Elem;
  constexpr int V = Pack<T>::kSize;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = p < packs;
  const int64_t c0 = p * V;
  S center[V], a[V], b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    a[j] = b[j] = S(0);
    if constexpr (kMoments) {
      center[j] = active ? load_as<S>(terms.x, c0 + j) : S(0);
    } else {
      center[j] = active ? center_of[c0 + j] : S(0);
    }
  }
  S n = S(0);
  const int split = blockIdx.y;
  const int64_t r1 = s.outer * (split + 1) / splits;
  int64_t r = s.outer * split / splits + threadIdx.y;
  const int64_t step = blockDim.y;
  constexpr int U = Terms::kRowsInFlight;
  if (active) {
    for (; r + (U - 1) * step < r1; r += U * step) {
      terms.template add_packs<U>(r * s.channels + c0, step * s.channels, center, a, b);
      n += S(U);
    }
    for (; r < r1; r += step) {
      terms.template add_packs<1>(r * s.channels + c0, 0, center, a, b);
      n += S(1);
    }
  }
  // Shared memory: sa[y][slot], sb[y][slot] with slot = x * V + j, then sn[y].
  extern __shared__ unsigned char pack_shared[];
  S* sa = reinterpret_cast<S*>(pack_shared);
  const int slots = blockDim.x * V;
  S* sb = sa + blockDim.y * slots;
  S* sn = sb + blockDim.y * slots;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    sa[threadIdx.y * slots + threadIdx.x * V + j] = a[j];
    sb[threadIdx.y * slots + threadIdx.x * V + j] = b[j];
  }
  if (threadIdx.x == 0) sn[threadIdx.y] = n;
  __syncthreads();
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int threads = blockDim.x * blockDim.y;
  for (int slot = tid; slot < slots; slot += threads) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * slots + slot;
    if (c >= s.channels) break;
    S* out = partial + (c * splits + split) * 3;
    if constexpr (kMoments) {
      Moments<S> m = from_sums(sn[0], sa[slot], sb[slot]);
      for (int y = 1; y < static_cast<int>(blockDim.y); ++y) {
        m = merge(m, from_sums(sn[y], sa[y * slots + slot], sb[y * slots + slot]));
      }
      out[0] = m.n;
      out[1] = m.mean;
      out[2] = m.m2;
    } else {
      S ta = S(0), tb = S(0);
      for (int y = 0; y < static_cast<int>(blockDim.y); ++y) {
        ta += sa[y * slots + slot];
        tb += sb[y * slots + slot];
      }
      out[0] = ta;
      out[1] = tb;
    }
  }
}

// The finishing kernels give each channel a warp: the lanes merge a stride of its splits, then
// the warp merges the lanes (a channel can have hundreds of splits, see reduction_splits).
constexpr int kFinishWarps = 4;

template <typename T, typename S>
__global__ void finish_statistics(BatchNormShape s, const T* x, const S* partial, int splits, S eps,
                                  S* mean, S* var, S* inv_std, S* running_mean, S* running_var,
                                  S decay, S var_adjust) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFinishWarps + threadIdx.x / 32;
  if (c >= s.channels) return;  // whole warps leave together
  const int lane = threadIdx.x % 32;
  const S* p = partial + c * splits * 3;
  Moments<S> m{S(0), S(0), S(0)};
  for (int k = lane; k < splits; k += 32) m = merge(m, Moments<S>{p[k * 3], p[k * 3 + 1], p[k * 3 + 2]});
  for (int off = 16; off > 0; off /= 2) m = merge(m, shfl_down(m, off));
  if (lane != 0) return;
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
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFinishWarps + threadIdx.x / 32;
  if (c >= channels) return;
  const int lane = threadIdx.x % 32;
  const S* p = partial + c * splits * 3;
  S a = S(0), b = S(0);
  for (int k = lane; k < splits; k += 32) {
    a += p[k * 3];
    b += p[k * 3 + 1];
  }
  for (int off = 16; off > 0; off /= 2) {
    a += __shfl_down_sync(0xffffffffu, a, off);
    b += __shfl_down_sync(0xffffffffu, b, off);
  }
  if (lane != 0) return;
  gbeta[c] = a;
  ggamma[c] = b * inv_std[c];
}

/// The finishing kernels' grid: a warp per channel.
unsigned finish_grid(int64_t channels) {
  return static_cast<unsigned>((channels + kFinishWarps - 1) / kFinishWarps);
}

// How many splits each channel's reduction gets: enough blocks to fill the GPU a few times,
// and no block with too little work: a few thousand elements for the planar kernel's 256
// threads, 16 rows per thread for the channels-minor one. (The channels-minor kernel once had
// the planar rule, 4096 rows per split: ResNet-50's 64-channel channels-last batch norms then
// ran on fewer blocks than the GPU has multiprocessors.)
int reduction_splits(const BatchNormShape& s, int device, bool rows) {
  const int64_t per_channel = s.outer * s.inner;
  const int64_t column_blocks = rows ? (s.channels + kRowsX - 1) / kRowsX : s.channels;
  const int64_t wanted_blocks = static_cast<int64_t>(sm_count(device)) * (rows ? 8 : 4);
  int64_t splits = (wanted_blocks + column_blocks - 1) / column_blocks;
  splits = std::min<int64_t>(splits, std::max<int64_t>(1, per_channel / (rows ? kRowsY * 16 : 4096)));
  splits = std::min<int64_t>(splits, s.outer);
  return static_cast<int>(std::clamp<int64_t>(splits, 1, 65535));
}

// Runs the partial reduction of `terms` into a fresh workspace; returns it and sets *splits.
// `packs`: the pack kernel applies (Note [Batch norm packs]).
template <typename S, bool kMoments, typename Terms>
Array reduce_partials(const Array& like, const BatchNormShape& s, const Terms& terms,
                      const S* center, bool packs, int* splits_out) {
  const int device = like.device().index();
  cudaStream_t stream = prepare(like);
  if (packs) {
    using T = typename Terms::Elem;
    const PackGeometry g = pack_geometry<T>(s);
    const int64_t wanted = static_cast<int64_t>(sm_count(device)) * (2048 / kPackBlock);
    int64_t splits = (wanted + g.tiles - 1) / g.tiles;
    splits = std::min<int64_t>(splits, std::max<int64_t>(1, s.outer / (g.ry * 16)));
    const int split_count = static_cast<int>(std::clamp<int64_t>(splits, 1, 65535));
    *splits_out = split_count;
    Array work = Array::empty({s.channels * split_count * 3}, dtype_of<S>, like.device());
    const size_t shared =
        (2 * static_cast<size_t>(g.px) * g.ry * Pack<T>::kSize + g.ry) * sizeof(S);
    pack_partials<S, Terms, kMoments>
        <<<dim3(g.tiles, static_cast<unsigned>(split_count)), dim3(g.px, g.ry), shared, stream>>>(
            s, terms, center, work.data<S>(), split_count, g.packs);
    KUSARI_CUDA_CHECK_LAUNCH();
    return work;
  }
  const bool rows = s.inner == 1;
  const int splits = reduction_splits(s, device, rows);
  *splits_out = splits;
  Array work = Array::empty({s.channels * splits * 3}, dtype_of<S>, like.device());
  S* wp = work.data<S>();
  if (rows) {
    const dim3 grid(static_cast<unsigned>((s.channels + kRowsX - 1) / kRowsX),
                    static_cast<unsigned>(splits));
    rows_partials<S, Terms, kMoments>
        <<<grid, dim3(kRowsX, kRowsY), 0, stream>>>(s, terms, center, wp, splits);
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
    Array work = reduce_partials<S, true>(x, s, StatTerms<T, S>{xp}, nullptr,
                                          packs_apply<T>(s, {xp}), &splits);
    cudaStream_t stream = compute_stream(x.device().index());
    finish_statistics<T, S><<<finish_grid(s.channels), kFinishWarps * 32, 0, stream>>>(
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
        GradTerms<T, S> terms{{static_cast<const T*>(x.raw_data()),
                              static_cast<const T*>(gy.raw_data()),
                              relu_y ? static_cast<const T*>(relu_y->raw_data()) : nullptr}};
        int splits = 1;
        Array work = reduce_partials<S, false>(x, s, terms, mean.data<S>(),
                                               packs_apply<T>(s, {terms.in.x, terms.in.gy, terms.in.relu_y}),
                                               &splits);
        cudaStream_t stream = compute_stream(x.device().index());
        finish_grad_sums<S><<<finish_grid(s.channels), kFinishWarps * 32, 0, stream>>>(
            s.channels, work.data<S>(), splits, inv_std.data<S>(), gbeta.data<S>(),
            ggamma.data<S>());
        KUSARI_CUDA_CHECK_LAUNCH();
      });
  return true;
}

// --- elementwise passes --------------------------------------------------------------------------

/// y = act((x - mean) * scale + shift (+ residual)).
template <typename T, typename S>
struct NormalizeOp {
  using Elem = T;
  static constexpr int kRowsInFlight = 4;
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
  __device__ __forceinline__ S value(S xv, S rv, const Channel& k) const {
    S v = (xv - k.mu) * k.scale + k.shift;
    if (residual != nullptr) v += rv;
    if (relu) v = v > S(0) ? v : S(0);
    return v;
  }
  __device__ __forceinline__ void apply(int64_t i, const Channel& k) const {
    const S v = value(load_as<S>(x, i), residual != nullptr ? load_as<S>(residual, i) : S(0), k);
    y[i] = from_compute<T>(static_cast<compute_t<T>>(v));
  }
  /// kRows packs at i, i + stride, ...; k: the constants of the pack's channels.
  template <int kRows>
  __device__ __forceinline__ void apply_packs(int64_t i, int64_t stride, const Channel* k) const {
    constexpr int V = Pack<T>::kSize;
    Pack<T> xs[kRows], rs[kRows];
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      xs[u] = load_pack(x, i + u * stride);
      if (residual != nullptr) rs[u] = load_pack(residual, i + u * stride);
    }
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const S rv = residual != nullptr ? static_cast<S>(to_compute(rs[u].v[j])) : S(0);
        const S v = value(static_cast<S>(to_compute(xs[u].v[j])), rv, k[j]);
        out.v[j] = from_compute<T>(static_cast<compute_t<T>>(v));
      }
      store_pack(y, i + u * stride, out);
    }
  }
};

/// gx = a * (g - b - (x - mean) * d).
template <typename T, typename S>
struct BackwardDataOp {
  using Elem = T;
  static constexpr int kRowsInFlight = 2;
  GradOperands<T, S> in;
  T* gx;
  T* gm;  // the masked gy (may be null)
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
  __device__ __forceinline__ static S value(S g, S xv, const Channel& k) {
    return k.a * (g - k.b - (xv - k.mu) * k.d);
  }
  __device__ __forceinline__ void apply(int64_t i, const Channel& k) const {
    gx[i] = from_compute<T>(static_cast<compute_t<T>>(value(in.g(i), in.xv(i), k)));
    if (gm != nullptr) {
      const bool off = in.relu_y != nullptr && !(load_as<S>(in.relu_y, i) > S(0));
      gm[i] = off ? from_compute<T>(compute_t<T>(0)) : in.gy[i];
    }
  }
  template <int kRows>
  __device__ __forceinline__ void apply_packs(int64_t i, int64_t stride, const Channel* k) const {
    const auto r = in.template load_rows<kRows>(i, stride);
#pragma unroll
    for (int u = 0; u < kRows; ++u) {
      Pack<T> out;
#pragma unroll
      for (int j = 0; j < Pack<T>::kSize; ++j) {
        const S v = value(r.g(u, j, in.relu_y != nullptr), r.xv(u, j), k[j]);
        out.v[j] = from_compute<T>(static_cast<compute_t<T>>(v));
      }
      store_pack(gx, i + u * stride, out);
      if (gm != nullptr) {
        Pack<T> masked;
#pragma unroll
        for (int j = 0; j < Pack<T>::kSize; ++j) {
          const bool off = in.relu_y != nullptr && !(static_cast<S>(to_compute(r.y[u].v[j])) > S(0));
          masked.v[j] = off ? from_compute<T>(compute_t<T>(0)) : r.gy[u].v[j];
        }
        store_pack(gm, i + u * stride, masked);
      }
    }
  }
};

template <typename Op>
__global__ void planar_elementwise(BatchNormShape s, Op op) {
  const int64_t plane = blockIdx.x;
  const auto k = op.channel(plane % s.channels);
  const int64_t base = plane * s.inner;
  for (int64_t i = threadIdx.x; i < s.inner; i += blockDim.x) op.apply(base + i, k);
}

template <typename Op>
__global__ void rows_elementwise(BatchNormShape s, Op op) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kRowsX + threadIdx.x;
  if (c >= s.channels) return;
  const auto k = op.channel(c);
  const int64_t step = static_cast<int64_t>(gridDim.y) * kRowsY;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRowsY + threadIdx.y; r < s.outer;
       r += step) {
    op.apply(r * s.channels + c, k);
  }
}

template <typename Op>
__global__ void __launch_bounds__(kPackBlock, 2) pack_elementwise(BatchNormShape s, Op op, int64_t packs) {
  using T = typename Op::Elem;
  constexpr int V = Pack<T>::kSize;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= packs) return;
  const int64_t c0 = p * V;
  typename Op::Channel k[V];
#pragma unroll
  for (int j = 0; j < V; ++j) k[j] = op.channel(c0 + j);
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  constexpr int U = Op::kRowsInFlight;
  for (; r + (U - 1) * step < s.outer; r += U * step) {
    op.template apply_packs<U>(r * s.channels + c0, step * s.channels, k);
  }
  for (; r < s.outer; r += step) op.template apply_packs<1>(r * s.channels + c0, 0, k);
}

template <typename Op>
void launch_elementwise(const Array& like, const BatchNormShape& s, const Op& op, bool packs) {
  const int device = like.device().index();
  cudaStream_t stream = prepare(like);
  if (packs) {
    const PackGeometry g = pack_geometry<typename Op::Elem>(s);
    const int64_t wanted = static_cast<int64_t>(sm_count(device)) * (2048 / kPackBlock);
    const int64_t row_blocks = std::clamp<int64_t>(
        (wanted + g.tiles - 1) / g.tiles, 1,
        std::min<int64_t>(65535, (s.outer + int64_t{g.ry} * Op::kRowsInFlight - 1) /
                                     (int64_t{g.ry} * Op::kRowsInFlight)));
    pack_elementwise<<<dim3(g.tiles, static_cast<unsigned>(row_blocks)), dim3(g.px, g.ry), 0,
                       stream>>>(s, op, g.packs);
  } else if (s.inner == 1) {
    const int64_t column_blocks = (s.channels + kRowsX - 1) / kRowsX;
    const int64_t wanted = static_cast<int64_t>(sm_count(device)) * 8;
    const int64_t row_blocks =
        std::clamp<int64_t>((wanted + column_blocks - 1) / column_blocks, 1,
                            std::min<int64_t>(65535, (s.outer + kRowsY - 1) / kRowsY));
    const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(row_blocks));
    rows_elementwise<<<grid, dim3(kRowsX, kRowsY), 0, stream>>>(s, op);
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
    launch_elementwise(x, s, op, packs_apply<T>(s, {op.x, op.residual, op.y}));
  });
  return true;
}

bool batch_norm_backward_data(const Array& x, const Array& gy, const Array* relu_y,
                              const BatchNormShape& s, const Array& mean, const Array& inv_std,
                              const Array& gamma, const Array& gbeta, const Array& ggamma,
                              double inv_m, Array& gx, Array* gm) {
  if (!fits_kernels(s) || s.outer * s.channels >= (int64_t{1} << 31)) return false;
  visit_device_dtype<common::kFloatingDtypes>(x.dtype(), "batch_norm_backward_data", [&](auto tag) {
    using T = decltype(tag);
    using S = stat_t<T>;
    BackwardDataOp<T, S> op{{static_cast<const T*>(x.raw_data()),
                            static_cast<const T*>(gy.raw_data()),
                            relu_y ? static_cast<const T*>(relu_y->raw_data()) : nullptr},
                            static_cast<T*>(gx.raw_data()),
                            gm ? static_cast<T*>(gm->raw_data()) : nullptr,
                            mean.data<S>(),
                            inv_std.data<S>(),
                            gamma.data<S>(),
                            gbeta.data<S>(),
                            ggamma.data<S>(),
                            static_cast<S>(inv_m)};
    launch_elementwise(x, s, op, packs_apply<T>(s, {op.in.x, op.in.gy, op.in.relu_y, op.gx, op.gm}));
  });
  return true;
}

// --- layer and RMS normalization (Note [Fused layer normalization]) --------------------------
//
// Note [Layer norm kernel geometry]
// Forward and the gx pass give each row a block (128 threads for rows up to 1024 elements, 256
// above; the row stays in L1 between its passes): the threads stride along the row, and
// group_allreduce folds their sums. The parameters' gradients are column sums over the rows:
// 32 x 8 blocks whose x runs along 32 consecutive columns (coalesced) and y along rows, a grid
// column of `splits` blocks sharing the rows, partials into a workspace, and one thread per column
// adding a column's partials in a fixed order (so the result does not change between runs).

constexpr int kNormColsX = 32;
constexpr int kNormRowsY = 8;

inline int row_norm_block(int64_t cols) { return cols <= 1024 ? 128 : 256; }

template <typename T, typename S>
__global__ void row_norm_forward_kernel(const T* x, const S* gamma, const S* beta, int64_t cols, S eps, bool rms,
                                        T* y, S* mean, S* rstd) {
  __shared__ S smem[256 / kWarpSize];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  T* yr = y + row * cols;
  const int group = blockDim.x;
  const auto add = [](S a, S b) { return a + b; };
  S m = S(0);
  if (!rms) {
    S sum = S(0);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += static_cast<S>(to_compute(xr[j]));
    m = group_allreduce(sum, add, group, smem) / static_cast<S>(cols);
  }
  S q = S(0);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const S d = static_cast<S>(to_compute(xr[j])) - m;
    q += d * d;
  }
  q = group_allreduce(q, add, group, smem);
  const S r = S(1) / sqrt(q / static_cast<S>(cols) + eps);
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = m;
    rstd[row] = r;
  }
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    S v = (static_cast<S>(to_compute(xr[j])) - m) * r;
    if (gamma != nullptr) v *= gamma[j];
    if (beta != nullptr) v += beta[j];
    yr[j] = from_compute<T>(static_cast<compute_t<T>>(v));
  }
}

template <typename T, typename S>
__global__ void row_norm_backward_data_kernel(const T* x, const T* gy, const S* gamma, const S* mean,
                                              const S* rstd, int64_t cols, bool rms, T* gx) {
  __shared__ S smem[256 / kWarpSize];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * cols;
  const T* gyr = gy + row * cols;
  T* gxr = gx + row * cols;
  const S m = mean != nullptr ? mean[row] : S(0), r = rstd[row];
  const auto add = [](S a, S b) { return a + b; };
  S sum_g = S(0), sum_gx = S(0);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const S xh = (static_cast<S>(to_compute(xr[j])) - m) * r;
    S g = static_cast<S>(to_compute(gyr[j]));
    if (gamma != nullptr) g *= gamma[j];
    sum_g += g;
    sum_gx += g * xh;
  }
  const S inv_cols = S(1) / static_cast<S>(cols);
  const S a = rms ? S(0) : group_allreduce(sum_g, add, static_cast<int>(blockDim.x), smem) * inv_cols;
  const S b = group_allreduce(sum_gx, add, static_cast<int>(blockDim.x), smem) * inv_cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const S xh = (static_cast<S>(to_compute(xr[j])) - m) * r;
    S g = static_cast<S>(to_compute(gyr[j]));
    if (gamma != nullptr) g *= gamma[j];
    gxr[j] = from_compute<T>(static_cast<compute_t<T>>(r * (g - a - xh * b)));
  }
}

// Partial column sums of gy * x_hat and gy over a split of the rows: work[split][0 or 1][col].
template <typename T, typename S>
__global__ void row_norm_param_partials(const T* x, const T* gy, const S* mean, const S* rstd, int64_t rows,
                                        int64_t cols, S* work) {
  __shared__ S sg[kNormRowsY][kNormColsX + 1];
  __shared__ S sb[kNormRowsY][kNormColsX + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kNormColsX + threadIdx.x;
  S acc_g = S(0), acc_b = S(0);
  if (c < cols) {
    const int64_t step = static_cast<int64_t>(gridDim.y) * kNormRowsY;
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * kNormRowsY + threadIdx.y; r < rows; r += step) {
      const S m = mean != nullptr ? mean[r] : S(0);
      const S xh = (static_cast<S>(to_compute(x[r * cols + c])) - m) * rstd[r];
      const S g = static_cast<S>(to_compute(gy[r * cols + c]));
      acc_g += g * xh;
      acc_b += g;
    }
  }
  sg[threadIdx.y][threadIdx.x] = acc_g;
  sb[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    S tg = S(0), tb = S(0);
#pragma unroll
    for (int k = 0; k < kNormRowsY; ++k) {
      tg += sg[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    work[(static_cast<int64_t>(blockIdx.y) * 2) * cols + c] = tg;
    work[(static_cast<int64_t>(blockIdx.y) * 2 + 1) * cols + c] = tb;
  }
}

template <typename S>
__global__ void row_norm_param_finish(const S* work, int splits, int64_t cols, S* ggamma, S* gbeta) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  S tg = S(0), tb = S(0);
  for (int k = 0; k < splits; ++k) {
    tg += work[(static_cast<int64_t>(k) * 2) * cols + c];
    tb += work[(static_cast<int64_t>(k) * 2 + 1) * cols + c];
  }
  if (ggamma != nullptr) ggamma[c] = tg;
  if (gbeta != nullptr) gbeta[c] = tb;
}

bool row_norm_forward(const Array& x, const Array* gamma, const Array* beta, const kernels::RowNormParams& p,
                      Array& y, Array& mean, Array& rstd) {
  if (p.rows >= (int64_t{1} << 31)) return false;
  visit_device_dtype<common::kFloatingDtypes>(x.dtype(), "row_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    using S = stat_t<T>;
    cudaStream_t stream = prepare(x);
    row_norm_forward_kernel<T, S><<<static_cast<unsigned>(p.rows), row_norm_block(p.cols), 0, stream>>>(
        static_cast<const T*>(x.raw_data()), gamma ? gamma->data<S>() : nullptr, beta ? beta->data<S>() : nullptr,
        p.cols, static_cast<S>(p.eps), p.rms, static_cast<T*>(y.raw_data()), p.rms ? nullptr : mean.data<S>(),
        rstd.data<S>());
    KUSARI_CUDA_CHECK_LAUNCH();
  });
  return true;
}

bool row_norm_backward(const Array& x, const Array& gy, const Array* gamma, const Array& mean, const Array& rstd,
                       const kernels::RowNormParams& p, Array& gx, Array* ggamma, Array* gbeta) {
  if (p.rows >= (int64_t{1} << 31)) return false;
  visit_device_dtype<common::kFloatingDtypes>(x.dtype(), "row_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    using S = stat_t<T>;
    cudaStream_t stream = prepare(x);
    const T* xp = static_cast<const T*>(x.raw_data());
    const T* gyp = static_cast<const T*>(gy.raw_data());
    const S* mp = p.rms ? nullptr : mean.data<S>();
    row_norm_backward_data_kernel<T, S><<<static_cast<unsigned>(p.rows), row_norm_block(p.cols), 0, stream>>>(
        xp, gyp, gamma ? gamma->data<S>() : nullptr, mp, rstd.data<S>(), p.cols, p.rms,
        static_cast<T*>(gx.raw_data()));
    KUSARI_CUDA_CHECK_LAUNCH();
    if (ggamma == nullptr && gbeta == nullptr) return;
    const int device = x.device().index();
    const int64_t column_blocks = (p.cols + kNormColsX - 1) / kNormColsX;
    const int64_t wanted = static_cast<int64_t>(sm_count(device)) * 8;
    int64_t splits = (wanted + column_blocks - 1) / column_blocks;
    splits = std::clamp<int64_t>(std::min<int64_t>(splits, (p.rows + kNormRowsY * 4 - 1) / (kNormRowsY * 4)), 1,
                                 65535);
    Array work = Array::empty({splits * 2 * p.cols}, dtype_of<S>, x.device());
    row_norm_param_partials<T, S>
        <<<dim3(static_cast<unsigned>(column_blocks), static_cast<unsigned>(splits)), dim3(kNormColsX, kNormRowsY), 0,
           stream>>>(xp, gyp, mp, rstd.data<S>(), p.rows, p.cols, work.data<S>());
    KUSARI_CUDA_CHECK_LAUNCH();
    row_norm_param_finish<S><<<static_cast<unsigned>((p.cols + 255) / 256), 256, 0, stream>>>(
        work.data<S>(), static_cast<int>(splits), p.cols, ggamma ? ggamma->data<S>() : nullptr,
        gbeta ? gbeta->data<S>() : nullptr);
    KUSARI_CUDA_CHECK_LAUNCH();
  });
  return true;
}

}  // namespace

void register_cuda_normalization_kernels() {
  kernels::row_norm_forward.set(DeviceType::kCUDA, &row_norm_forward);
  kernels::row_norm_backward.set(DeviceType::kCUDA, &row_norm_backward);
  kernels::batch_norm_statistics.set(DeviceType::kCUDA, &batch_norm_statistics);
  kernels::batch_norm_normalize.set(DeviceType::kCUDA, &batch_norm_normalize);
  kernels::batch_norm_backward_reduce.set(DeviceType::kCUDA, &batch_norm_backward_reduce);
  kernels::batch_norm_backward_data.set(DeviceType::kCUDA, &batch_norm_backward_data);
}

}  // namespace kusari::cuda
