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
#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/primitives/kernel_util.cuh"

namespace kusari::cuda {
namespace {

/// The sizes of one pooling: x (planes = n * c, h, w) and y (planes, oh, ow).
struct PoolGeometry {
  int64_t planes, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
  bool count_include_pad;
};

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

/// The flat index in its plane of the window's maximum, -1 for an empty window.
template <typename T>
__device__ __forceinline__ int64_t window_argmax(const T* plane, const PoolGeometry& g,
                                                 const Window& win) {
  using C = compute_t<T>;
  int64_t best = -1;
  C best_value = C(0);
  for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
    for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) {
      const C v = to_compute(plane[iy * g.w + ix]);
      if (best < 0 || v > best_value || (v != v && !(best_value != best_value))) {
        best = iy * g.w + ix;
        best_value = v;
      }
    }
  }
  return best;
}

/// Smallest integer >= a / b for b > 0.
__device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) {
  return a <= 0 ? -((-a) / b) : (a + b - 1) / b;
}

// --- kernels -------------------------------------------------------------------------------------

// y (planes, oh, ow) = pool(x (planes, h, w)).
template <typename T>
__global__ void pool_forward_kernel(PoolGeometry g, bool is_max, const T* x, T* y) {
  using C = compute_t<T>;
  const int64_t total = g.planes * g.oh * g.ow;
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    const int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh, plane = e / (g.oh * g.ow);
    const T* xs = x + plane * g.h * g.w;
    const Window win = window(g, oy, ox);
    if (is_max) {
      const int64_t at = window_argmax(xs, g, win);
      y[e] = at >= 0 ? xs[at] : from_compute<T>(-static_cast<C>(INFINITY));
    } else {
      C sum = C(0);
      for (int64_t iy = win.y_lo; iy < win.y_hi; ++iy) {
        for (int64_t ix = win.x_lo; ix < win.x_hi; ++ix) sum += to_compute(xs[iy * g.w + ix]);
      }
      y[e] = from_compute<T>(win.divisor > 0 ? sum / static_cast<C>(win.divisor) : C(0));
    }
  }
}

// argmax (planes, oh, ow) = flat index in its plane of each window's maximum (-1: empty).
template <typename T>
__global__ void pool_argmax_kernel(PoolGeometry g, const T* x, int64_t* argmax) {
  const int64_t total = g.planes * g.oh * g.ow;
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    const int64_t ox = e % g.ow, oy = (e / g.ow) % g.oh, plane = e / (g.oh * g.ow);
    argmax[e] = window_argmax(x + plane * g.h * g.w, g, window(g, oy, ox));
  }
}

// gx (planes, h, w) = sum of gy (planes, oh, ow) over the windows whose maximum is this element
// (max pooling, with argmax) or over the windows that cover it, divided by their divisors.
template <typename T>
__global__ void pool_backward_kernel(PoolGeometry g, bool is_max, const int64_t* argmax,
                                     const T* gy, T* gx) {
  using C = compute_t<T>;
  const int64_t total = g.planes * g.h * g.w;
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    const int64_t ix = e % g.w, iy = (e / g.w) % g.h, plane = e / (g.h * g.w);
    // The windows whose taps include (iy, ix).
    const int64_t oy_lo = max(ceil_div(iy + g.ph - g.kh + 1, g.sh), int64_t{0});
    const int64_t oy_hi = min((iy + g.ph) / g.sh, g.oh - 1);
    const int64_t ox_lo = max(ceil_div(ix + g.pw - g.kw + 1, g.sw), int64_t{0});
    const int64_t ox_hi = min((ix + g.pw) / g.sw, g.ow - 1);
    const int64_t at = iy * g.w + ix;
    const T* gys = gy + plane * g.oh * g.ow;
    C sum = C(0);
    for (int64_t oy = oy_lo; oy <= oy_hi; ++oy) {
      for (int64_t ox = ox_lo; ox <= ox_hi; ++ox) {
        const int64_t o = oy * g.ow + ox;
        if (is_max) {
          if (argmax[plane * g.oh * g.ow + o] == at) sum += to_compute(gys[o]);
        } else {
          const int64_t divisor = window(g, oy, ox).divisor;
          if (divisor > 0) sum += to_compute(gys[o]) / static_cast<C>(divisor);
        }
      }
    }
    gx[e] = from_compute<T>(sum);
  }
}

// --- launchers -----------------------------------------------------------------------------------

PoolGeometry geometry(const Shape& x, const Shape& y, const Pool2dParams& p) {
  return PoolGeometry{x[0] * x[1], x[2],       x[3],       y[2],
                      y[3],        p.ksize[0], p.ksize[1], p.stride[0],
                      p.stride[1], p.pad[0],   p.pad[1],   p.count_include_pad};
}

}  // namespace

void pool2d_forward(const Array& x_in, const Pool2dParams& p, Array& y) {
  if (!y.is_contiguous()) {
    // A channels-last output (Note [Memory formats]): computed in NCHW, then copied.
    Array nchw = Array::empty(y.shape(), y.dtype(), y.device());
    pool2d_forward(x_in, p, nchw);
    copy(nchw, y);
    return;
  }
  const Array x = x_in.contiguous();
  const PoolGeometry g = geometry(x.shape(), y.shape(), p);
  const int device = x.device().index();
  cudaStream_t stream = prepare(x);
  visit_device_dtype<common::kFloatingDtypes>(x.dtype(), "pooling_2d", [&](auto tag) {
    using T = decltype(tag);
    pool_forward_kernel<T><<<grid_for(y.size(), device), kBlockSize, 0, stream>>>(
        g, p.kind == PoolKind::kMax, static_cast<const T*>(x.raw_data()),
        static_cast<T*>(y.raw_data()));
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

void pool2d_backward(const Array& x_in, const Array& y, const Array& gy_in, const Pool2dParams& p,
                     Array& gx) {
  if (!gx.is_contiguous()) {
    // A channels-last output (Note [Memory formats]): computed in NCHW, then copied.
    Array nchw = Array::empty(gx.shape(), gx.dtype(), gx.device());
    pool2d_backward(x_in, y, gy_in, p, nchw);
    copy(nchw, gx);
    return;
  }
  const bool is_max = p.kind == PoolKind::kMax;
  const Array x = is_max ? x_in.contiguous() : Array(), gy = gy_in.contiguous();
  const PoolGeometry g = geometry(gx.shape(), gy.shape(), p);
  const int device = gx.device().index();
  cudaStream_t stream = prepare(gx);
  visit_device_dtype<common::kFloatingDtypes>(gy.dtype(), "pooling_2d (gradient)", [&](auto tag) {
    using T = decltype(tag);
    Array argmax;
    if (is_max) {
      argmax = Array::empty(gy.shape(), Dtype::kInt64, gy.device());
      pool_argmax_kernel<T><<<grid_for(gy.size(), device), kBlockSize, 0, stream>>>(
          g, static_cast<const T*>(x.raw_data()), static_cast<int64_t*>(argmax.raw_data()));
      KUSARI_CUDA_CHECK_LAUNCH();
    }
    pool_backward_kernel<T><<<grid_for(gx.size(), device), kBlockSize, 0, stream>>>(
        g, is_max, is_max ? static_cast<const int64_t*>(argmax.raw_data()) : nullptr,
        static_cast<const T*>(gy.raw_data()), static_cast<T*>(gx.raw_data()));
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

}  // namespace kusari::cuda
