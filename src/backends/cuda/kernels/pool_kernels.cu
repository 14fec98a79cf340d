// CUDA kernels: 2-d max and average pooling, forward and backward.
//
// Note [GPU pooling]
// The semantics are the CPU's (Note [CPU pooling]): windows start at out * stride - pad, taps in
// the padding are ignored by max pooling and counted by average pooling when count_include_pad,
// the maximum is the first one in row-major window order (a NaN wins), and an empty window
// (cover_all with a large pad) gives -inf and no gradient. The forward pass has a thread per
// output. The backward pass has a thread per input element that gathers from the windows that
// cover it, in the CPU's (oy, ox) order, so there are no atomics and the sums round exactly like
// the CPU's scatter; max pooling first stores each window's argmax (recomputed from x, like the
// CPU) in a scratch array. 16-bit floats are computed in float32 and rounded once.
//
// Note [GPU pooling layouts]
// Every kernel is instantiated for NCHW and for channels-last (NHWC) memory, and the output (y,
// or gx) decides which; an input in the other layout is converted to it first, so a channels-last
// network runs its pooling without a layout copy. Threads enumerate the output in its memory
// order: in NHWC the channel is the fastest index, so the 32 threads of a warp read 32 adjacent
// channels of the same tap (one coalesced load per tap) and write 32 adjacent outputs; in NCHW
// they walk along a row. The window arithmetic, the tap order and the argmax (stored as the
// tap's row-major index iy * w + ix in its plane, whatever the layout) are shared, so the two
// layouts give identical results, equal to the CPU's.
// cuDNN's NHWC pooling is not used: it does not promise the first-maximum tie-break nor NaN
// propagation nor Chainer's cover_all divisor, which these kernels must match on every backend,
// and pooling is memory-bound (each output reads kh * kw taps that neighbouring outputs reuse
// from cache), so a coalesced hand-written kernel already runs at the speed the memory allows.
//
// Note [Channels-last max pooling on packs]
// In NHWC with the channel count a multiple of the 16-byte pack (8 bfloat16 or float16, 4
// float32, 2 float64), max pooling runs on packs instead: a thread takes one pack of channels of
// one pixel, so the window and index arithmetic, which dominated the one-element kernels above,
// is done once per 8 (or 4, 2) elements, and each tap is one 16-byte load. The backward pass
// first stores each window's argmax as the tap's index inside the window (one byte per output,
// 255 for an empty window) instead of the plane index in 64 bits, an eighth of the bytes, and the
// gather loads a window's gradient pack only when one of its channels picked this tap. The
// arithmetic is the one-element kernels' (same tap order, first maximum, NaN wins, the gathered
// sum in the same (oy, ox) order), so the results are identical; positions are 32-bit (the
// launchers fall back to the one-element kernels for larger arrays, misaligned views, channel
// counts off the pack, average pooling, and windows of more than 254 taps). In ResNet-50's
// bfloat16 step at batch 256 on an H200 the max pooling forward, argmax and backward kernels
// took 1.36, 1.43 and 3.49 ms before this; with the pack kernels the whole step went from 44.0
// to 39.1 ms (docs/benchmarks.md).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/primitives/kernel_util.cuh"

namespace kusari::cuda {
namespace {

/// The sizes of one pooling: x (n, c, h, w) and y (n, c, oh, ow), planes = n * c.
struct PoolGeometry {
  int64_t planes, c, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};

// Note [Pooling index arithmetic]
// The kernels split flat positions into (plane, row, col) with divisions. A 64-bit integer
// division is a long instruction sequence on the GPU, and the backward pass divides per tap, so
// every kernel is also instantiated with 32-bit unsigned indices (I = uint32_t), used when every
// position of x and y fits; the results are the same.

/// Where element (plane = n * c + ch, row, col) of an (n, c, rows, cols) array lies in memory:
/// NCHW or, with kNhwc, channels-last; computed in the index type I.
template <bool kNhwc, typename I>
__device__ __forceinline__ int64_t offset(int64_t plane, int64_t c, int64_t rows, int64_t cols,
                                          int64_t row, int64_t col) {
  const I p = static_cast<I>(plane), cc = static_cast<I>(c), r = static_cast<I>(rows),
          w = static_cast<I>(cols), y = static_cast<I>(row), x = static_cast<I>(col);
  if constexpr (kNhwc) {
    return static_cast<int64_t>((((p / cc) * r + y) * w + x) * cc + p % cc);
  } else {
    return static_cast<int64_t>((p * r + y) * w + x);
  }
}

/// The (plane, row, col) of the element at memory position e of an (n, c, rows, cols) array.
template <bool kNhwc, typename I>
__device__ __forceinline__ void position(int64_t e_in, int64_t c_in, int64_t rows_in,
                                         int64_t cols_in, int64_t& plane, int64_t& row,
                                         int64_t& col) {
  const I e = static_cast<I>(e_in), c = static_cast<I>(c_in), rows = static_cast<I>(rows_in),
          cols = static_cast<I>(cols_in);
  if constexpr (kNhwc) {
    const I ch = e % c, pixel = e / c;
    const I rest = pixel / cols;
    col = static_cast<int64_t>(pixel - rest * cols);
    row = static_cast<int64_t>(rest % rows);
    plane = static_cast<int64_t>((rest / rows) * c + ch);
  } else {
    const I rest = e / cols;
    col = static_cast<int64_t>(e - rest * cols);
    row = static_cast<int64_t>(rest % rows);
    plane = static_cast<int64_t>(rest / rows);
  }
}

/// The input taps [y_lo, y_hi) x [x_lo, x_hi) of window (oy, ox) and its average divisor.
struct Window {
  int64_t y_lo, y_hi, x_lo, x_hi;
  int64_t divisor;
};

__device__ __forceinline__ Window window(const PoolGeometry& g, int64_t oy, int64_t ox) {
  const int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  Window win;
  win.y_lo = max(y0, int64_t{0});
  win.y_hi = min(y0 + g.kh, g.h);
  win.x_lo = max(x0, int64_t{0});
  win.x_hi = min(x0 + g.kw, g.w);
  if (g.count_include_pad) {
    const int64_t prow = max(min(y0 + g.kh, g.h + g.ph) - y0, int64_t{0});
    const int64_t pcol = max(min(x0 + g.kw, g.w + g.pw) - x0, int64_t{0});
    win.divisor = prow * pcol;
  } else {
    win.divisor = max(win.y_hi - win.y_lo, int64_t{0}) * max(win.x_hi - win.x_lo, int64_t{0});
  }
  return win;
}

/// The row-major index (iy * w + ix) in its plane of the window's maximum, -1 for an empty
/// window; x0 points at the plane's element (0, 0), whose rows are row_step apart and whose
/// columns are col_step apart.
template <typename T>
__device__ __forceinline__ int64_t window_argmax(const T* x0, int64_t row_step, int64_t col_step,
                                                 const PoolGeometry& g, const Window& win) {
  using C = compute_t<T>;
  int64_t best = -1;
  C best_value = C(0);
  for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
    for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) {
      const C v = to_compute(x0[iy * row_step + ix * col_step]);
      if (best < 0 || v > best_value || (v != v && !(best_value != best_value))) {
        best = iy * g.w + ix;
        best_value = v;
      }
    }
  }
  return best;
}

/// The plane's element (0, 0) of x and the steps between its rows and its columns.
template <bool kNhwc, typename I, typename T>
__device__ __forceinline__ const T* plane_origin(const T* x, const PoolGeometry& g, int64_t plane,
                                                 int64_t& row_step, int64_t& col_step) {
  row_step = kNhwc ? g.w * g.c : g.w;
  col_step = kNhwc ? g.c : 1;
  return x + offset<kNhwc, I>(plane, g.c, g.h, g.w, 0, 0);
}

/// Smallest integer >= a / b for b > 0.
__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return a <= 0 ? -((-a) / b) : (a + b - 1) / b;
}

// --- kernels -------------------------------------------------------------------------------------

// y (n, c, oh, ow) = pool(x (n, c, h, w)), both NCHW or both NHWC (kNhwc).
template <typename T, bool kNhwc, typename I>
__global__ void pool_forward_kernel(PoolGeometry g, bool is_max, const T* x, T* y) {
  using C = compute_t<T>;
  const int64_t total = g.planes * g.oh * g.ow;
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    int64_t plane, oy, ox;
    position<kNhwc, I>(e, g.c, g.oh, g.ow, plane, oy, ox);
    int64_t rs, cs;
    const T* xs = plane_origin<kNhwc, I>(x, g, plane, rs, cs);
    const Window win = window(g, oy, ox);
    if (is_max) {
      const int64_t at = window_argmax(xs, rs, cs, g, win);
      y[e] = at >= 0 ? xs[(at / g.w) * rs + (at % g.w) * cs]
                     : from_compute<T>(-static_cast<C>(INFINITY));
    } else {
      C sum = C(0);
      for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
        for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) sum += to_compute(xs[iy * rs + ix * cs]);
      }
      y[e] = from_compute<T>(win.divisor > 0 ? sum / static_cast<C>(win.divisor) : C(0));
    }
  }
}

// argmax (y's shape and layout) = the row-major index in its plane of each window's maximum
// (-1: empty).
template <typename T, bool kNhwc, typename I>
__global__ void pool_argmax_kernel(PoolGeometry g, const T* x, int64_t* argmax) {
  const int64_t total = g.planes * g.oh * g.ow;
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    int64_t plane, oy, ox;
    position<kNhwc, I>(e, g.c, g.oh, g.ow, plane, oy, ox);
    int64_t rs, cs;
    const T* xs = plane_origin<kNhwc, I>(x, g, plane, rs, cs);
    argmax[e] = window_argmax(xs, rs, cs, g, window(g, oy, ox));
  }
}

// gx (n, c, h, w) = sum of gy (n, c, oh, ow) over the windows whose maximum is this element
// (max pooling, with argmax) or over the windows that cover it, divided by their divisors; gx,
// gy and argmax all NCHW or all NHWC (kNhwc).
template <typename T, bool kNhwc, typename I>
__global__ void pool_backward_kernel(PoolGeometry g, bool is_max, const int64_t* argmax,
                                     const T* gy, T* gx) {
  using C = compute_t<T>;
  const int64_t total = g.planes * g.h * g.w;
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    int64_t plane, iy, ix;
    position<kNhwc, I>(e, g.c, g.h, g.w, plane, iy, ix);
    // The windows whose taps include (iy, ix).
    const int64_t oy_lo = max(ceil_div(iy + g.ph - g.kh + 1, g.sh), int64_t{0});
    const int64_t oy_hi = min((iy + g.ph) / g.sh, g.oh - 1);
    const int64_t ox_lo = max(ceil_div(ix + g.pw - g.kw + 1, g.sw), int64_t{0});
    const int64_t ox_hi = min((ix + g.pw) / g.sw, g.ow - 1);
    const int64_t at = iy * g.w + ix;
    C sum = C(0);
    for (int64_t oy = oy_lo; oy <= oy_hi; ++oy) {
      for (int64_t ox = ox_lo; ox <= ox_hi; ++ox) {
        const int64_t o = offset<kNhwc, I>(plane, g.c, g.oh, g.ow, oy, ox);
        if (is_max) {
          if (argmax[o] == at) sum += to_compute(gy[o]);
        } else {
          const int64_t divisor = window(g, oy, ox).divisor;
          if (divisor > 0) sum += to_compute(gy[o]) / static_cast<C>(divisor);
        }
      }
    }
    gx[e] = from_compute<T>(sum);
  }
}

// --- channels-last max pooling on packs (Note [Channels-last max pooling on packs]) ------------

/// The elements of T in one 16-byte pack.
template <typename T>
constexpr int kPack = static_cast<int>(16 / sizeof(T));

template <typename T, int V>
struct alignas(sizeof(T) * V) PackOf {
  T v[V];
};

template <int V>
struct alignas(V) TapsOf {
  uint8_t t[V];
};

/// A window's argmax tap index when the window is empty.
constexpr uint8_t kNoTap = 255;

/// 32-bit copies of the geometry for the pack kernels.
struct PackGeometry {
  int n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};

/// Where pack e of an NHWC (n, rows, cols, groups packs) array lies.
struct PackPosition {
  int n, row, col, group;
};

__device__ __forceinline__ PackPosition pack_position(int e, int groups, int rows, int cols) {
  PackPosition at;
  at.group = e % groups;
  int pixel = e / groups;
  at.col = pixel % cols;
  pixel /= cols;
  at.row = pixel % rows;
  at.n = pixel / rows;
  return at;
}

// Over outputs (n, oy, ox, pack of channels), NHWC: the window maximum into y and/or the tap
// index of the first maximum into taps (either may be null).
template <typename T, int V>
__global__ void max_pool_pack_kernel(PackGeometry g, const T* x, T* y, uint8_t* taps) {
  using C = compute_t<T>;
  const int groups = g.c / V;
  const int total = g.n * g.oh * g.ow * groups;
  for (int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); e < total;
       e += static_cast<int>(gridDim.x * blockDim.x)) {
    const PackPosition at_out = pack_position(e, groups, g.oh, g.ow);
    const int n = at_out.n, oy = at_out.row, ox = at_out.col, group = at_out.group;
    const int y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
    const int y_lo = max(y0, 0), y_hi = min(y0 + g.kh, g.h);
    const int x_lo = max(x0, 0), x_hi = min(x0 + g.kw, g.w);
    PackOf<T, V> best;
    TapsOf<V> at;
    C best_value[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      best.v[j] = from_compute<T>(-static_cast<C>(INFINITY));
      at.t[j] = kNoTap;
      best_value[j] = C(0);
    }
    for (int iy = y_lo; iy < y_hi; ++iy) {
      const T* row = x + (static_cast<size_t>(n * g.h + iy) * g.w) * g.c + group * V;
      for (int ix = x_lo; ix < x_hi; ++ix) {
        const PackOf<T, V> p = *reinterpret_cast<const PackOf<T, V>*>(row + static_cast<size_t>(ix) * g.c);
        const auto tap = static_cast<uint8_t>((iy - y0) * g.kw + (ix - x0));
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const C v = to_compute(p.v[j]);
          if (at.t[j] == kNoTap || v > best_value[j] ||
              (v != v && !(best_value[j] != best_value[j]))) {
            best_value[j] = v;
            best.v[j] = p.v[j];
            at.t[j] = tap;
          }
        }
      }
    }
    if (y != nullptr) *reinterpret_cast<PackOf<T, V>*>(y + static_cast<size_t>(e) * V) = best;
    if (taps != nullptr) *reinterpret_cast<TapsOf<V>*>(taps + static_cast<size_t>(e) * V) = at;
  }
}

// Over inputs (n, iy, ix, pack of channels), NHWC: gx = the sum of gy over the windows whose
// first maximum is this tap, in the windows' (oy, ox) order.
template <typename T, int V>
__global__ void max_pool_backward_pack_kernel(PackGeometry g, const uint8_t* taps, const T* gy,
                                              T* gx) {
  using C = compute_t<T>;
  const int groups = g.c / V;
  const int total = g.n * g.h * g.w * groups;
  for (int e = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); e < total;
       e += static_cast<int>(gridDim.x * blockDim.x)) {
    const PackPosition at_in = pack_position(e, groups, g.h, g.w);
    const int n = at_in.n, iy = at_in.row, ix = at_in.col, group = at_in.group;
    const int oy_lo = max(static_cast<int>(ceil_div(iy + g.ph - g.kh + 1, g.sh)), 0);
    const int oy_hi = min((iy + g.ph) / g.sh, g.oh - 1);
    const int ox_lo = max(static_cast<int>(ceil_div(ix + g.pw - g.kw + 1, g.sw)), 0);
    const int ox_hi = min((ix + g.pw) / g.sw, g.ow - 1);
    C sum[V];
#pragma unroll
    for (int j = 0; j < V; ++j) sum[j] = C(0);
    for (int oy = oy_lo; oy <= oy_hi; ++oy) {
      for (int ox = ox_lo; ox <= ox_hi; ++ox) {
        const size_t o = (static_cast<size_t>(n * g.oh + oy) * g.ow + ox) * g.c + group * V;
        const TapsOf<V> at = *reinterpret_cast<const TapsOf<V>*>(taps + o);
        const auto tap = static_cast<uint8_t>((iy - (oy * g.sh - g.ph)) * g.kw + (ix - (ox * g.sw - g.pw)));
        bool any = false;
#pragma unroll
        for (int j = 0; j < V; ++j) any |= at.t[j] == tap;
        if (!any) continue;
        const PackOf<T, V> grad = *reinterpret_cast<const PackOf<T, V>*>(gy + o);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          if (at.t[j] == tap) sum[j] += to_compute(grad.v[j]);
        }
      }
    }
    PackOf<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_compute<T>(sum[j]);
    *reinterpret_cast<PackOf<T, V>*>(gx + static_cast<size_t>(e) * V) = out;
  }
}

// --- launchers -----------------------------------------------------------------------------------

PoolGeometry geometry(const Shape& x, const Shape& y, const Pool2dParams& p) {
  return PoolGeometry{x[0] * x[1],        x[1],       x[2],        x[3],        y[2],     y[3],
                      p.ksize[0],         p.ksize[1], p.stride[0], p.stride[1], p.pad[0], p.pad[1],
                      p.count_include_pad};
}

/// True when pooling into `out` should run the NHWC loops: out is dense channels-last and is
/// either not C-contiguous or ambiguous (length-1 axes) with `in` channels-last, so that `in`
/// needs no conversion.
bool use_nhwc(const Array& out, const Array& in) {
  return out.is_contiguous(MemoryFormat::kChannelsLast) &&
         (!out.is_contiguous() || in.memory_format() == MemoryFormat::kChannelsLast);
}

/// True when every position of a and b fits the kernels' 32-bit indices (Note [Pooling index
/// arithmetic]); the products inside offset() stay below the larger array's size.
bool small_indices(const Array& a, const Array& b) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  return a.size() < kLimit && b.size() < kLimit;
}

/// True when max pooling of x into y (both NHWC) can run the pack kernels (Note [Channels-last
/// max pooling on packs]) with elements of `bytes` bytes.
bool use_packs(bool nhwc, bool is_max, const PoolGeometry& g, size_t bytes,
               std::initializer_list<const void*> pointers, int64_t largest) {
  const auto pack = static_cast<int64_t>(16 / bytes);
  if (!nhwc || !is_max || g.c % pack != 0 || g.kh * g.kw > 254) return false;
  if (largest >= (int64_t{1} << 31)) return false;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

PackGeometry pack_geometry(const PoolGeometry& g) {
  auto i = [](int64_t v) { return static_cast<int>(v); };
  return PackGeometry{i(g.planes / g.c), i(g.c),  i(g.h),  i(g.w),  i(g.oh), i(g.ow),
                      i(g.kh),           i(g.kw), i(g.sh), i(g.sw), i(g.ph), i(g.pw)};
}

}  // namespace

void pool2d_forward(const Array& x_in, const Pool2dParams& p, Array& y) {
  // Note [GPU pooling layouts]: y decides the layout.
  const bool nhwc = use_nhwc(y, x_in);
  if (!nhwc && !y.is_contiguous()) {
    // An output of other strides: computed in NCHW, then copied.
    Array nchw = Array::empty(y.shape(), y.dtype(), y.device());
    pool2d_forward(x_in, p, nchw);
    copy(nchw, y);
    return;
  }
  const MemoryFormat format = nhwc ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
  const Array x = x_in.to_memory_format(format);
  const PoolGeometry g = geometry(x.shape(), y.shape(), p);
  const int device = x.device().index();
  cudaStream_t stream = prepare(x);
  visit_device_dtype<common::kFloatingDtypes>(x.dtype(), "pooling_2d", [&](auto tag) {
    using T = decltype(tag);
    if (use_packs(nhwc, p.kind == PoolKind::kMax, g, sizeof(T), {x.raw_data(), y.raw_data()},
                  std::max(x.size(), y.size()))) {
      max_pool_pack_kernel<T, kPack<T>><<<grid_for(y.size() / kPack<T>, device), kBlockSize, 0, stream>>>(
          pack_geometry(g), static_cast<const T*>(x.raw_data()), static_cast<T*>(y.raw_data()), nullptr);
      return;
    }
    auto kernel = small_indices(x, y)
                      ? (nhwc ? pool_forward_kernel<T, true, uint32_t> : pool_forward_kernel<T, false, uint32_t>)
                      : (nhwc ? pool_forward_kernel<T, true, int64_t> : pool_forward_kernel<T, false, int64_t>);
    kernel<<<grid_for(y.size(), device), kBlockSize, 0, stream>>>(
        g, p.kind == PoolKind::kMax, static_cast<const T*>(x.raw_data()),
        static_cast<T*>(y.raw_data()));
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

void pool2d_backward(const Array& x_in, const Array& y, const Array& gy_in, const Pool2dParams& p,
                     Array& gx) {
  const bool nhwc = use_nhwc(gx, gy_in);
  if (!nhwc && !gx.is_contiguous()) {
    // An output of other strides: computed in NCHW, then copied.
    Array nchw = Array::empty(gx.shape(), gx.dtype(), gx.device());
    pool2d_backward(x_in, y, gy_in, p, nchw);
    copy(nchw, gx);
    return;
  }
  const MemoryFormat format = nhwc ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
  const bool is_max = p.kind == PoolKind::kMax;
  const Array x = is_max ? x_in.to_memory_format(format) : Array();
  const Array gy = gy_in.to_memory_format(format);
  const PoolGeometry g = geometry(gx.shape(), gy.shape(), p);
  const bool small = small_indices(gx, gy);
  const int device = gx.device().index();
  cudaStream_t stream = prepare(gx);
  visit_device_dtype<common::kFloatingDtypes>(gy.dtype(), "pooling_2d (gradient)", [&](auto tag) {
    using T = decltype(tag);
    if (is_max && use_packs(nhwc, is_max, g, sizeof(T), {x.raw_data(), gy.raw_data(), gx.raw_data()},
                            std::max(gx.size(), gy.size()))) {
      // One byte per window: the tap of its first maximum (the pool's blocks are 512-byte aligned).
      Array taps = Array::empty({gy.size()}, Dtype::kUInt8, gy.device());
      const PackGeometry pg = pack_geometry(g);
      max_pool_pack_kernel<T, kPack<T>><<<grid_for(gy.size() / kPack<T>, device), kBlockSize, 0, stream>>>(
          pg, static_cast<const T*>(x.raw_data()), nullptr, static_cast<uint8_t*>(taps.raw_data()));
      KUSARI_CUDA_CHECK_LAUNCH();
      max_pool_backward_pack_kernel<T, kPack<T>><<<grid_for(gx.size() / kPack<T>, device), kBlockSize, 0, stream>>>(
          pg, static_cast<const uint8_t*>(taps.raw_data()), static_cast<const T*>(gy.raw_data()),
          static_cast<T*>(gx.raw_data()));
      return;
    }
    Array argmax;
    if (is_max) {
      // In gy's layout, like the windows it indexes.
      argmax = Array::empty(gy.shape(), Dtype::kInt64, gy.device(), format);
      auto argmax_kernel =
          small ? (nhwc ? pool_argmax_kernel<T, true, uint32_t> : pool_argmax_kernel<T, false, uint32_t>)
                : (nhwc ? pool_argmax_kernel<T, true, int64_t> : pool_argmax_kernel<T, false, int64_t>);
      argmax_kernel<<<grid_for(gy.size(), device), kBlockSize, 0, stream>>>(
          g, static_cast<const T*>(x.raw_data()), static_cast<int64_t*>(argmax.raw_data()));
      KUSARI_CUDA_CHECK_LAUNCH();
    }
    auto kernel =
        small ? (nhwc ? pool_backward_kernel<T, true, uint32_t> : pool_backward_kernel<T, false, uint32_t>)
              : (nhwc ? pool_backward_kernel<T, true, int64_t> : pool_backward_kernel<T, false, int64_t>);
    kernel<<<grid_for(gx.size(), device), kBlockSize, 0, stream>>>(
        g, is_max, is_max ? static_cast<const int64_t*>(argmax.raw_data()) : nullptr,
        static_cast<const T*>(gy.raw_data()), static_cast<T*>(gx.raw_data()));
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

}  // namespace kusari::cuda
