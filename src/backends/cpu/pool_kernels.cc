// CPU kernels: 2-d max and average pooling, forward and backward, by hand over OpenMP.
//
// Note [CPU pooling]
// Each (image, channel) plane is independent, so the N * C planes are split over threads with
// parallel_for and every thread writes only its own planes (the backward pass needs no atomics).
// A window starts at out * stride - pad and spans ksize taps; taps outside the input are padding:
//   - max pooling ignores them (they act as -inf). The maximum is the first in row-major window
//     order that nothing later exceeds, and a NaN wins over numbers so that it propagates. The
//     backward pass recomputes that position from x and routes gy there, so y is not read. A
//     window that holds no input element at all (possible only with cover_all and a large pad)
//     yields -inf and passes no gradient.
//   - average pooling sums the input taps and divides by the window size counted up to the
//     padded border when count_include_pad (Chainer: zero padding takes part in the average), or
//     by the number of input taps otherwise. The backward pass spreads gy / divisor over the taps.
// The NCHW max pooling runs tap by tap over a whole output row (row_argmax), so that its innermost
// loop is a branch-free pass that vectorises: with random data a branch per comparison would
// mispredict half the time, which made the per-window loop four times slower.
// float16 and bfloat16 are converted to float32, computed there and rounded once.
//
// Channels-last arrays (Note [Memory formats]) have loops of their own over NHWC memory, so no
// layout is copied: the output (y, or gx) decides the layout, and an input in the other layout
// (say gy from a contiguous op) is converted to it first. The outer loop runs over (image,
// output pixel) in the forward pass and over images in the backward pass (each thread owns its
// images' gx), and the innermost loop runs over the channels, which are adjacent in memory and
// vectorise. Per channel the taps are visited in the same row-major order, and the running
// maximum, the sums and the scattered gradients are formed in the same order as in the NCHW
// loops, so both layouts give bit-identical values and gradients.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/loops.h"
#include "kusari/core/error.h"

namespace kusari::cpu {
namespace {

/// The sizes of one pooling: x (n, c, h, w) and y (n, c, oh, ow).
struct PoolGeometry {
  int64_t planes, n, c, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
};

PoolGeometry geometry(const Shape& x, const Shape& y, const Pool2dParams& p) {
  PoolGeometry g;
  g.planes = x[0] * x[1];
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.oh = y[2];
  g.ow = y[3];
  g.kh = p.ksize[0];
  g.kw = p.ksize[1];
  g.sh = p.stride[0];
  g.sw = p.stride[1];
  g.ph = p.pad[0];
  g.pw = p.pad[1];
  return g;
}

/// The taps of one window: rows [y_lo, y_hi) and columns [x_lo, x_hi) of the input, and the
/// divisor of an average over it.
struct Window {
  int64_t y_lo, y_hi, x_lo, x_hi;
  int64_t divisor;
};

inline Window window(const PoolGeometry& g, int64_t oy, int64_t ox, bool count_include_pad) {
  const int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  Window win;
  win.y_lo = std::max<int64_t>(y0, 0);
  win.y_hi = std::min(y0 + g.kh, g.h);
  win.x_lo = std::max<int64_t>(x0, 0);
  win.x_hi = std::min(x0 + g.kw, g.w);
  const int64_t rows = std::max<int64_t>(win.y_hi - win.y_lo, 0);
  const int64_t cols = std::max<int64_t>(win.x_hi - win.x_lo, 0);
  if (count_include_pad) {
    // Taps up to the padded border (a cover_all window may reach past it).
    const int64_t prow = std::max<int64_t>(std::min(y0 + g.kh, g.h + g.ph) - y0, 0);
    const int64_t pcol = std::max<int64_t>(std::min(x0 + g.kw, g.w + g.pw) - x0, 0);
    win.divisor = prow * pcol;
  } else {
    win.divisor = rows * cols;
  }
  return win;
}

/// True when v replaces the running maximum m (see Note [CPU pooling]): larger, or a NaN over a
/// number.
template <typename T>
inline bool beats(T v, T m) {
  return v > m || (v != v && m == m);
}

/// One tap over a row of windows: for ox in [lo, hi), the window's running maximum best[ox] (and,
/// when idx is not null, its position idx[ox], -1 while the window is empty) meets
/// row[ox * stride + shift] at position base + ox * stride + shift. Bitwise operators instead of
/// branches and a compile-time stride (kStride > 0; 0: `stride`) let the compiler vectorise it;
/// I is int32_t whenever a plane's positions fit, so that the values and positions have the same
/// width in the vector registers.
template <int kStride, typename T, typename I>
inline void tap_row(const T* __restrict row, int64_t stride, int64_t shift, int64_t lo, int64_t hi,
                    I base, T* __restrict best, I* __restrict idx) {
  const int64_t s = kStride > 0 ? kStride : stride;
  if (idx == nullptr) {
    for (int64_t ox = lo; ox < hi; ++ox) {
      const T v = row[ox * s + shift], b = best[ox];
      best[ox] = ((v > b) | ((v != v) & (b == b))) ? v : b;
    }
    return;
  }
  // Positions in I's width too: 64-bit index arithmetic would halve the vector lanes.
  const I is = static_cast<I>(s), start = static_cast<I>(base + shift);
  for (I ox = static_cast<I>(lo); ox < static_cast<I>(hi); ++ox) {
    const T v = row[ox * is + shift], b = best[ox];
    const bool take = (idx[ox] < 0) | (v > b) | ((v != v) & (b == b));
    best[ox] = take ? v : b;
    idx[ox] = take ? start + ox * is : idx[ox];
  }
}

/// The maxima of the windows of output row oy of one NCHW plane (see Note [CPU pooling]):
/// best[ox], and when idx is not null its flat index in the plane idx[ox] (-inf and -1 for an
/// empty window). The loops run tap by tap over the whole row (tap_row), and every window still
/// sees its taps in row-major order, so the first maximum is the one the Note describes.
template <typename T, typename I>
void row_argmax(const T* plane, const PoolGeometry& g, int64_t oy, T* best, I* idx) {
  const int64_t w = g.w, ow = g.ow, sw = g.sw, pw = g.pw;
  std::fill(best, best + ow, -std::numeric_limits<T>::infinity());
  if (idx) std::fill(idx, idx + ow, I{-1});
  const int64_t y0 = oy * g.sh - g.ph;
  for (int64_t iy = std::max<int64_t>(y0, 0); iy < std::min(y0 + g.kh, g.h); ++iy) {
    const T* row = plane + iy * w;
    for (int64_t j = 0; j < g.kw; ++j) {
      // The outputs whose tap j lands inside the row: 0 <= ox * sw - pw + j < w.
      const int64_t lo_num = pw - j, hi_num = w - 1 + pw - j;
      const int64_t lo = lo_num <= 0 ? 0 : (lo_num + sw - 1) / sw;
      const int64_t hi = hi_num < 0 ? 0 : std::min(hi_num / sw + 1, ow);
      const int64_t shift = j - pw;
      const I base = static_cast<I>(iy * w);
      if (sw == 1) {
        tap_row<1>(row, sw, shift, lo, hi, base, best, idx);
      } else if (sw == 2) {
        tap_row<2>(row, sw, shift, lo, hi, base, best, idx);
      } else {
        tap_row<0>(row, sw, shift, lo, hi, base, best, idx);
      }
    }
  }
}

template <typename T>
void forward_impl(const Array& x_in, const Pool2dParams& p, Array& y) {
  const Array x = x_in.contiguous();
  const PoolGeometry g = geometry(x.shape(), y.shape(), p);
  const T* xp = x.data<const T>();
  T* yp = y.data<T>();
  const bool is_max = p.kind == PoolKind::kMax;
  parallel_for(g.planes, g.oh * g.ow * g.kh * g.kw, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const T* xs = xp + plane * g.h * g.w;
      T* ys = yp + plane * g.oh * g.ow;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        if (is_max) {
          row_argmax(xs, g, oy, ys + oy * g.ow, static_cast<int32_t*>(nullptr));
          continue;
        }
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Window win = window(g, oy, ox, p.count_include_pad);
          {
            T sum = 0;
            for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
              for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) sum += xs[iy * g.w + ix];
            }
            ys[oy * g.ow + ox] = win.divisor > 0 ? sum / static_cast<T>(win.divisor) : T(0);
          }
        }
      }
    }
  });
}

template <typename T, typename I>
void backward_impl(const Array& x_in, const Array& gy_in, const Pool2dParams& p, Array& gx) {
  // Average pooling needs only the shapes, not x.
  const bool is_max = p.kind == PoolKind::kMax;
  const Array x = is_max ? x_in.contiguous() : Array(), gy = gy_in.contiguous();
  const PoolGeometry g = geometry(gx.shape(), gy.shape(), p);
  const T* xp = is_max ? x.data<const T>() : nullptr;
  const T* gyp = gy.data<const T>();
  T* gxp = gx.data<T>();
  parallel_for(g.planes, g.oh * g.ow * g.kh * g.kw, [&](int64_t begin, int64_t end) {
    std::vector<T> best(is_max ? g.ow : 0);
    std::vector<I> idx(is_max ? g.ow : 0);
    for (int64_t plane = begin; plane < end; ++plane) {
      const T* xs = is_max ? xp + plane * g.h * g.w : nullptr;
      const T* gys = gyp + plane * g.oh * g.ow;
      T* gxs = gxp + plane * g.h * g.w;
      std::fill(gxs, gxs + g.h * g.w, T(0));
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        if (is_max) {
          row_argmax(xs, g, oy, best.data(), idx.data());
          for (int64_t ox = 0; ox < g.ow; ++ox) {
            if (idx[ox] >= 0) gxs[idx[ox]] += gys[oy * g.ow + ox];
          }
          continue;
        }
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Window win = window(g, oy, ox, p.count_include_pad);
          const T grad = gys[oy * g.ow + ox];
          if (win.divisor > 0) {
            const T share = grad / static_cast<T>(win.divisor);
            for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
              for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) gxs[iy * g.w + ix] += share;
            }
          }
        }
      }
    }
  });
}

/// backward_impl with 32-bit positions when a plane's (or, NHWC, an image's) fit.
template <typename T>
void backward_impl(const Array& x, const Array& gy, const Pool2dParams& p, Array& gx) {
  const Shape& s = gx.shape();
  if (s[1] * s[2] * s[3] < std::numeric_limits<int32_t>::max()) {
    backward_impl<T, int32_t>(x, gy, p, gx);
  } else {
    backward_impl<T, int64_t>(x, gy, p, gx);
  }
}

template <typename T>
void forward_nhwc_impl(const Array& x_in, const Pool2dParams& p, Array& y) {
  const Array x = x_in.to_memory_format(MemoryFormat::kChannelsLast);
  const PoolGeometry g = geometry(x.shape(), y.shape(), p);
  const T* xp = x.data<const T>();
  T* yp = y.data<T>();
  const int64_t c = g.c;
  const bool is_max = p.kind == PoolKind::kMax;
  parallel_for(g.n * g.oh * g.ow, g.kh * g.kw * c, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t ox = item % g.ow, oy = (item / g.ow) % g.oh, n = item / (g.ow * g.oh);
      const T* xs = xp + n * g.h * g.w * c;
      T* ys = yp + item * c;  // NHWC: ((n * oh + oy) * ow + ox) * c
      const Window win = window(g, oy, ox, p.count_include_pad);
      if (is_max) {
        if (win.y_lo >= win.y_hi || win.x_lo >= win.x_hi) {
          std::fill(ys, ys + c, -std::numeric_limits<T>::infinity());
          continue;
        }
        const T* first = xs + (win.y_lo * g.w + win.x_lo) * c;
        std::copy(first, first + c, ys);
        bool at_first = true;
        for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
          for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) {
            if (at_first) {
              at_first = false;
              continue;
            }
            const T* tap = xs + (iy * g.w + ix) * c;
            for (int64_t k = 0; k < c; ++k) ys[k] = beats(tap[k], ys[k]) ? tap[k] : ys[k];
          }
        }
      } else {
        std::fill(ys, ys + c, T(0));
        for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
          for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) {
            const T* tap = xs + (iy * g.w + ix) * c;
            for (int64_t k = 0; k < c; ++k) ys[k] += tap[k];
          }
        }
        if (win.divisor > 0) {
          const T d = static_cast<T>(win.divisor);
          for (int64_t k = 0; k < c; ++k) ys[k] = ys[k] / d;
        } else {
          std::fill(ys, ys + c, T(0));
        }
      }
    }
  });
}

template <typename T, typename I>
void backward_nhwc_impl(const Array& x_in, const Array& gy_in, const Pool2dParams& p, Array& gx) {
  constexpr MemoryFormat kCL = MemoryFormat::kChannelsLast;
  const bool is_max = p.kind == PoolKind::kMax;
  const Array x = is_max ? x_in.to_memory_format(kCL) : Array(), gy = gy_in.to_memory_format(kCL);
  const PoolGeometry g = geometry(gx.shape(), gy.shape(), p);
  const T* xp = is_max ? x.data<const T>() : nullptr;
  const T* gyp = gy.data<const T>();
  T* gxp = gx.data<T>();
  const int64_t c = g.c, image = g.h * g.w * c;
  parallel_for(g.n, g.oh * g.ow * g.kh * g.kw * c, [&](int64_t begin, int64_t end) {
    std::vector<T> best_v(is_max ? c : 0);
    std::vector<I> at_v(is_max ? c : 0);
    T* __restrict best = best_v.data();
    I* __restrict at = at_v.data();
    for (int64_t n = begin; n < end; ++n) {
      const T* xs = is_max ? xp + n * image : nullptr;
      T* gxs = gxp + n * image;
      std::fill(gxs, gxs + image, T(0));
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Window win = window(g, oy, ox, p.count_include_pad);
          const T* gys = gyp + ((n * g.oh + oy) * g.ow + ox) * c;
          if (win.y_lo >= win.y_hi || win.x_lo >= win.x_hi) continue;
          if (is_max) {
            // at[k]: the offset in the image of channel k's maximum (its first tap to start).
            const I first = static_cast<I>((win.y_lo * g.w + win.x_lo) * c);
            for (int64_t k = 0; k < c; ++k) {
              best[k] = xs[first + k];
              at[k] = first + static_cast<I>(k);
            }
            for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
              for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) {
                const I off = static_cast<I>((iy * g.w + ix) * c);
                const T* __restrict tap = xs + off;
                for (int64_t k = 0; k < c; ++k) {
                  // beats(), with bitwise operators: selects, not branches, that vectorise.
                  const T v = tap[k], b = best[k];
                  const bool better = (v > b) | ((v != v) & (b == b));
                  best[k] = better ? v : b;
                  at[k] = better ? off + static_cast<I>(k) : at[k];
                }
              }
            }
            for (int64_t k = 0; k < c; ++k) gxs[at[k]] += gys[k];
          } else if (win.divisor > 0) {
            const T d = static_cast<T>(win.divisor);
            for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
              for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) {
                T* tap = gxs + (iy * g.w + ix) * c;
                for (int64_t k = 0; k < c; ++k) tap[k] += gys[k] / d;
              }
            }
          }
        }
      }
    }
  });
}

/// backward_nhwc_impl with 32-bit positions when an image's fit.
template <typename T>
void backward_nhwc_impl(const Array& x, const Array& gy, const Pool2dParams& p, Array& gx) {
  const Shape& s = gx.shape();
  if (s[1] * s[2] * s[3] < std::numeric_limits<int32_t>::max()) {
    backward_nhwc_impl<T, int32_t>(x, gy, p, gx);
  } else {
    backward_nhwc_impl<T, int64_t>(x, gy, p, gx);
  }
}

/// True when pooling into `out` should run the NHWC loops: out is dense channels-last and is
/// either not C-contiguous or ambiguous (length-1 axes) with `in` channels-last, so that `in`
/// needs no conversion.
bool use_nhwc(const Array& out, const Array& in) {
  return out.is_contiguous(MemoryFormat::kChannelsLast) &&
         (!out.is_contiguous() || in.memory_format() == MemoryFormat::kChannelsLast);
}

}  // namespace

void pool2d_forward(const Array& x, const Pool2dParams& p, Array& y) {
  if (use_nhwc(y, x)) {
    switch (x.dtype()) {
      case Dtype::kFloat32:
        return forward_nhwc_impl<float>(x, p, y);
      case Dtype::kFloat64:
        return forward_nhwc_impl<double>(x, p, y);
      case Dtype::kFloat16:
      case Dtype::kBFloat16: {
        Array y32 =
            Array::empty(y.shape(), Dtype::kFloat32, y.device(), MemoryFormat::kChannelsLast);
        forward_nhwc_impl<float>(x.astype(Dtype::kFloat32), p, y32);
        copy(y32, y);
        return;
      }
      default:
        KUSARI_THROW(DtypeError, "pooling_2d: not supported for dtype ", dtype_name(x.dtype()));
    }
  }
  if (!y.is_contiguous()) {
    // An output of other strides: computed in NCHW, then copied.
    Array nchw = Array::empty(y.shape(), y.dtype(), y.device());
    pool2d_forward(x, p, nchw);
    copy(nchw, y);
    return;
  }
  switch (x.dtype()) {
    case Dtype::kFloat32:
      return forward_impl<float>(x, p, y);
    case Dtype::kFloat64:
      return forward_impl<double>(x, p, y);
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      Array y32 = Array::empty(y.shape(), Dtype::kFloat32, y.device());
      forward_impl<float>(x.astype(Dtype::kFloat32), p, y32);
      copy(y32, y);
      return;
    }
    default:
      KUSARI_THROW(DtypeError, "pooling_2d: not supported for dtype ", dtype_name(x.dtype()));
  }
}

void pool2d_backward(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p,
                     Array& gx) {
  if (use_nhwc(gx, gy)) {
    switch (gy.dtype()) {
      case Dtype::kFloat32:
        return backward_nhwc_impl<float>(x, gy, p, gx);
      case Dtype::kFloat64:
        return backward_nhwc_impl<double>(x, gy, p, gx);
      case Dtype::kFloat16:
      case Dtype::kBFloat16: {
        Array gx32 =
            Array::empty(gx.shape(), Dtype::kFloat32, gx.device(), MemoryFormat::kChannelsLast);
        const Array x32 = p.kind == PoolKind::kMax ? x.astype(Dtype::kFloat32) : x;
        backward_nhwc_impl<float>(x32, gy.astype(Dtype::kFloat32), p, gx32);
        copy(gx32, gx);
        return;
      }
      default:
        KUSARI_THROW(DtypeError, "pooling_2d (gradient): not supported for dtype ",
                     dtype_name(gy.dtype()));
    }
  }
  if (!gx.is_contiguous()) {
    // An output of other strides: computed in NCHW, then copied.
    Array nchw = Array::empty(gx.shape(), gx.dtype(), gx.device());
    pool2d_backward(x, y, gy, p, nchw);
    copy(nchw, gx);
    return;
  }
  switch (gy.dtype()) {
    case Dtype::kFloat32:
      return backward_impl<float>(x, gy, p, gx);
    case Dtype::kFloat64:
      return backward_impl<double>(x, gy, p, gx);
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      Array gx32 = Array::empty(gx.shape(), Dtype::kFloat32, gx.device());
      const Array x32 = p.kind == PoolKind::kMax ? x.astype(Dtype::kFloat32) : x;
      backward_impl<float>(x32, gy.astype(Dtype::kFloat32), p, gx32);
      copy(gx32, gx);
      return;
    }
    default:
      KUSARI_THROW(DtypeError, "pooling_2d (gradient): not supported for dtype ",
                   dtype_name(gy.dtype()));
  }
}

}  // namespace kusari::cpu
