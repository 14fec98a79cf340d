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

Window window(const PoolGeometry& g, int64_t oy, int64_t ox, bool count_include_pad) {
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

/// The flat index in its plane of the window's maximum (see Note [CPU pooling]), -1 when empty.
template <typename T>
int64_t window_argmax(const T* plane, const PoolGeometry& g, const Window& win) {
  int64_t best = -1;
  T best_value = T(0);
  for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
    for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) {
      const T v = plane[iy * g.w + ix];
      if (best < 0 || v > best_value || (std::isnan(v) && !std::isnan(best_value))) {
        best = iy * g.w + ix;
        best_value = v;
      }
    }
  }
  return best;
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
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Window win = window(g, oy, ox, p.count_include_pad);
          if (is_max) {
            const int64_t at = window_argmax(xs, g, win);
            ys[oy * g.ow + ox] = at >= 0 ? xs[at] : -std::numeric_limits<T>::infinity();
          } else {
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

template <typename T>
void backward_impl(const Array& x_in, const Array& gy_in, const Pool2dParams& p, Array& gx) {
  // Average pooling needs only the shapes, not x.
  const bool is_max = p.kind == PoolKind::kMax;
  const Array x = is_max ? x_in.contiguous() : Array(), gy = gy_in.contiguous();
  const PoolGeometry g = geometry(gx.shape(), gy.shape(), p);
  const T* xp = is_max ? x.data<const T>() : nullptr;
  const T* gyp = gy.data<const T>();
  T* gxp = gx.data<T>();
  parallel_for(g.planes, g.oh * g.ow * g.kh * g.kw, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const T* xs = is_max ? xp + plane * g.h * g.w : nullptr;
      const T* gys = gyp + plane * g.oh * g.ow;
      T* gxs = gxp + plane * g.h * g.w;
      std::fill(gxs, gxs + g.h * g.w, T(0));
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const Window win = window(g, oy, ox, p.count_include_pad);
          const T grad = gys[oy * g.ow + ox];
          if (is_max) {
            const int64_t at = window_argmax(xs, g, win);
            if (at >= 0) gxs[at] += grad;
          } else if (win.divisor > 0) {
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

/// True when v replaces the running maximum m (see Note [CPU pooling]): larger, or a NaN over a
/// number.
template <typename T>
inline bool beats(T v, T m) {
  return v > m || (v != v && m == m);
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

template <typename T>
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
    std::vector<T> best(is_max ? c : 0);
    std::vector<int64_t> at(is_max ? c : 0);
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
            const int64_t first = (win.y_lo * g.w + win.x_lo) * c;
            for (int64_t k = 0; k < c; ++k) {
              best[k] = xs[first + k];
              at[k] = first + k;
            }
            for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
              for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) {
                const int64_t off = (iy * g.w + ix) * c;
                for (int64_t k = 0; k < c; ++k) {
                  const T v = xs[off + k];
                  if (beats(v, best[k])) {
                    best[k] = v;
                    at[k] = off + k;
                  }
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
