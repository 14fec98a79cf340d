#include "kusari/functions/pooling.h"

#include <cmath>
#include <limits>
#include <memory>
#include <mutex>

#include "functions/function_util.h"
#include "kusari/core/routines.h"
#include "kusari/functions/array.h"
#include "kusari/functions/convolution.h"

namespace kusari::functions {
namespace {

// Note [Pooling gradients]
// Both poolings are linear maps of x once the window maxima are fixed, so their gradients are
// linear maps of gy, recorded as functions of their own whose backward is the adjoint again:
//   average pooling: y = A x, gx = A^T gy (the pool2d_backward kernel); the gradient of A^T is A,
//     which is average_pooling_2d itself.
//   max pooling: y = S x, where S picks the first maximum of each window of x; gx = S^T gy (the
//     kernel scatters gy to those positions); the gradient of S^T gathers ggx at the same
//     positions, and the gradient of that gather is S^T again. x is a constant for both (the
//     positions do not change under small perturbations of x), so only gy carries a gradient.
// The gather runs only in double backprop, so it is written with array routines instead of a
// kernel of its own: x is padded with -inf, and one strided view per window tap (kH * kW of
// them) gives every window's value at that tap. A running strict ">" over the taps in row-major
// order finds the same first maximum as the kernel (see Note [CPU pooling]); a tap landing in
// the padding gathers the 0 that ggx is padded with.

Pool2dParams make_params(PoolKind kind, IntPair ksize, std::optional<IntPair> stride, IntPair pad,
                         bool cover_all) {
  const IntPair s = stride.value_or(ksize);
  Pool2dParams p;
  p.kind = kind;
  p.ksize[0] = ksize.h;
  p.ksize[1] = ksize.w;
  p.stride[0] = s.h;
  p.stride[1] = s.w;
  p.pad[0] = pad.h;
  p.pad[1] = pad.w;
  p.cover_all = cover_all;
  p.count_include_pad = true;
  return p;
}

void check_input(const char* fn, const Variable& x) {
  KUSARI_CHECK(x.defined(), ValueError, fn, ": x must be defined");
  KUSARI_CHECK(x.ndim() == 4, ShapeError, fn, ": expected x of shape (N, C, H, W), got ",
               x.shape());
  detail::check_floating(fn, x);
}

/// What the max-pooling gradient functions share: x, y and the window maxima, found on first use.
struct MaxPoolState {
  Array x, y;
  Pool2dParams p;
  std::once_flag argmax_once;
  Array argmax;  // int64, y's shape: the row-major window tap of each maximum

  /// An array of `a`'s dtype and device holding `a` surrounded by `fill`, large enough for every
  /// window (a cover_all window may reach past the padded border).
  Array padded(const Array& a, Scalar fill) const {
    const int64_t h = a.shape()[2], w = a.shape()[3];
    const int64_t ph = std::max(h + 2 * p.pad[0], (y.shape()[2] - 1) * p.stride[0] + p.ksize[0]);
    const int64_t pw = std::max(w + 2 * p.pad[1], (y.shape()[3] - 1) * p.stride[1] + p.ksize[1]);
    Array out = Array::full({a.shape()[0], a.shape()[1], ph, pw}, fill, a.dtype(), a.device());
    out.at({Slice(), Slice(), Slice(p.pad[0], p.pad[0] + h), Slice(p.pad[1], p.pad[1] + w)})
        .assign(a);
    return out;
  }

  /// Every window's value at tap (i, j) of a padded array: a view of y's shape.
  Array tap(const Array& padded_array, int64_t i, int64_t j) const {
    const int64_t oh = y.shape()[2], ow = y.shape()[3];
    return padded_array.at({Slice(), Slice(), Slice(i, i + (oh - 1) * p.stride[0] + 1, p.stride[0]),
                            Slice(j, j + (ow - 1) * p.stride[1] + 1, p.stride[1])});
  }

  const Array& window_argmax() {
    std::call_once(argmax_once, [this] {
      const Array xp = padded(x, -std::numeric_limits<double>::infinity());
      Array best = tap(xp, 0, 0);
      Array arg = Array::zeros(y.shape(), Dtype::kInt64, y.device());
      for (int64_t k = 1; k < p.ksize[0] * p.ksize[1]; ++k) {
        const Array v = tap(xp, k / p.ksize[1], k % p.ksize[1]);
        const Array better = kusari::greater(v, best);
        best = kusari::where(better, v, best);
        arg = kusari::where(better, Scalar(k), arg);
      }
      argmax = arg;
    });
    return argmax;
  }
};

Variable max_pool_gather(const std::shared_ptr<MaxPoolState>& state, const Variable& ggx);

/// gx = S^T gy: gy routed to the first maximum of each window (see Note [Pooling gradients]).
Variable max_pool_grad(const std::shared_ptr<MaxPoolState>& state, const Variable& gy) {
  Array gx = kusari::pool2d_backward(state->x, state->y, gy.data(), state->p);
  return record("max_pooling_2d_grad", {gy}, std::move(gx), [state](BackwardContext& ctx) {
    ctx.set_input_grad(0, max_pool_gather(state, ctx.output_grad()));
  });
}

/// ggy = S ggx: ggx at the first maximum of each window.
Variable max_pool_gather(const std::shared_ptr<MaxPoolState>& state, const Variable& ggx) {
  const Array& arg = state->window_argmax();
  const Array gp = state->padded(ggx.data(), 0.0);
  Array out = Array::zeros(state->y.shape(), ggx.dtype(), ggx.device());
  const int64_t kw = state->p.ksize[1];
  for (int64_t k = 0; k < state->p.ksize[0] * kw; ++k) {
    out = kusari::where(kusari::equal(arg, Scalar(k)), state->tap(gp, k / kw, k % kw), out);
  }
  return record("max_pooling_2d_grad_grad", {ggx}, std::move(out), [state](BackwardContext& ctx) {
    ctx.set_input_grad(0, max_pool_grad(state, ctx.output_grad()));
  });
}

Variable average_pool_impl(const Variable& x, const Pool2dParams& p);

/// gx = A^T gy for an input of x's shape (see Note [Pooling gradients]).
Variable average_pool_grad(const Array& x, const Variable& gy, const Pool2dParams& p) {
  // The kernel reads only the shapes of x and y; gy stands in for y.
  Array gx = kusari::pool2d_backward(x, gy.data(), gy.data(), p);
  return record("average_pooling_2d_grad", {gy}, std::move(gx), [p](BackwardContext& ctx) {
    ctx.set_input_grad(0, average_pool_impl(ctx.output_grad(), p));
  });
}

Variable average_pool_impl(const Variable& x, const Pool2dParams& p) {
  const char* fn = "average_pooling_2d";
  check_input(fn, x);
  Array y = kusari::pool2d(x.data(), p);
  return record(fn, {x}, std::move(y), [p](BackwardContext& ctx) {
    ctx.set_input_grad(0, average_pool_grad(ctx.input(0).data(), ctx.output_grad(), p));
  });
}

}  // namespace

Variable max_pooling_2d(const Variable& x, IntPair ksize, std::optional<IntPair> stride,
                        IntPair pad, bool cover_all) {
  const char* fn = "max_pooling_2d";
  check_input(fn, x);
  const Pool2dParams p = make_params(PoolKind::kMax, ksize, stride, pad, cover_all);
  Array y = kusari::pool2d(x.data(), p);
  return record(
      fn, {x}, std::move(y),
      [p](BackwardContext& ctx) {
        auto state = std::make_shared<MaxPoolState>();
        state->x = ctx.input(0).data();
        state->y = ctx.output().data();
        state->p = p;
        ctx.set_input_grad(0, max_pool_grad(state, ctx.output_grad()));
      },
      kRetainOutput);
}

Variable average_pooling_2d(const Variable& x, IntPair ksize, std::optional<IntPair> stride,
                            IntPair pad) {
  return average_pool_impl(x, make_params(PoolKind::kAverage, ksize, stride, pad, false));
}

// (Note [Composed Chainer functions] in activation.cc.) A transposed convolution of each channel
// with a window of ones: deconvolution adds every input pixel into its window of the output.
Variable unpooling_2d(const Variable& x, IntPair ksize, std::optional<IntPair> stride, IntPair pad,
                      std::optional<IntPair> outsize, bool cover_all) {
  KUSARI_CHECK(x.ndim() == 4, ShapeError, "unpooling_2d: x must be (N, C, H, W), got shape ", x.shape());
  KUSARI_CHECK(is_floating(x.dtype()), DtypeError, "unpooling_2d: x must be floating, got ",
               dtype_name(x.dtype()));
  const IntPair s = stride.value_or(ksize);
  KUSARI_CHECK(ksize.h > 0 && ksize.w > 0 && s.h > 0 && s.w > 0 && pad.h >= 0 && pad.w >= 0, ValueError,
               "unpooling_2d: ksize ", ksize.h, "x", ksize.w, " and stride ", s.h, "x", s.w,
               " must be positive and pad ", pad.h, "x", pad.w, " non-negative");
  const int64_t c = x.shape()[1];
  // The output of the whole windows; cover_all (or a smaller outsize) cuts the last ones off, as
  // Chainer's col2im drops what falls outside, and a larger outsize (up to stride - 1 more) is
  // the transposed convolution's own.
  const IntPair full{s.h * (x.shape()[2] - 1) + ksize.h - 2 * pad.h, s.w * (x.shape()[3] - 1) + ksize.w - 2 * pad.w};
  const IntPair out = outsize.value_or(IntPair{full.h - (cover_all ? s.h - 1 : 0), full.w - (cover_all ? s.w - 1 : 0)});
  KUSARI_CHECK(out.h > 0 && out.w > 0 && out.h < full.h + s.h && out.w < full.w + s.w, ValueError,
               "unpooling_2d: the output size ", out.h, "x", out.w, " does not suit x ", x.shape(), " with ksize ",
               ksize.h, "x", ksize.w, ", stride ", s.h, "x", s.w, " and pad ", pad.h, "x", pad.w,
               " (expected 1 to ", full.h + s.h - 1, " rows and 1 to ", full.w + s.w - 1, " columns)");
  const Variable ones(Array::ones({c, 1, ksize.h, ksize.w}, x.dtype(), x.device()));
  const IntPair made{std::max(out.h, full.h), std::max(out.w, full.w)};
  Variable y = deconvolution_2d(x, ones, Variable(), s, pad, made, 1, c);
  if (made.h == out.h && made.w == out.w) return y;
  return get_item(y, {Slice(), Slice(), Slice(0, out.h), Slice(0, out.w)});
}

}  // namespace kusari::functions
