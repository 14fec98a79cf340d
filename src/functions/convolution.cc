#include "kusari/functions/convolution.h"

#include "functions/function_util.h"
#include "kusari/core/routines.h"

namespace kusari::functions {
namespace {

// Note [Convolution gradients]
// With conv(x, W) linear in each argument and deconv(x, W) its adjoint in x
// (<conv(x, W), g> = <x, deconv(g, W)>), every gradient is again one of three operations:
//   y = conv(x, W) + b:    gx = deconv(gy, W)   gW = conv_grad_w(x, gy)   gb = sum of gy over N, H,
//   W y = deconv(x, W) + b:  gx = conv(gy, W)     gW = conv_grad_w(gy, x)   gb likewise
// where conv_grad_w(x, gy) = d<conv(x, W), gy>/dW is a recorded function of its own. Being
// bilinear in (x, gy), its gradients for an incoming ggW are d/dx = deconv(gy, ggW) and
// d/dgy = conv(x, ggW). All three are written with each other, so gradients of any order are
// recorded. Gradients of x through deconv pass x's spatial size as `outsize`, because with
// stride > 1 several input sizes give the same output size.

Conv2dParams make_params(IntPair stride, IntPair pad, IntPair dilate, int64_t groups) {
  Conv2dParams p;
  p.stride[0] = stride.h;
  p.stride[1] = stride.w;
  p.pad[0] = pad.h;
  p.pad[1] = pad.w;
  p.dilation[0] = dilate.h;
  p.dilation[1] = dilate.w;
  p.groups = groups;
  return p;
}

void check_params(const char* fn, const Conv2dParams& p) {
  for (int i = 0; i < 2; ++i) {
    KUSARI_CHECK(p.stride[i] > 0, ValueError, fn, ": stride must be positive, got ", p.stride[i]);
    KUSARI_CHECK(p.pad[i] >= 0, ValueError, fn, ": pad must be non-negative, got ", p.pad[i]);
    KUSARI_CHECK(p.dilation[i] > 0, ValueError, fn, ": dilate must be positive, got ",
                 p.dilation[i]);
  }
  KUSARI_CHECK(p.groups > 0, ValueError, fn, ": groups must be positive, got ", p.groups);
}

/// Ranks, dtypes and devices of x, W and the optional b.
void check_operands(const char* fn, const Variable& x, const Variable& W, const Variable& b,
                    const char* w_layout) {
  KUSARI_CHECK(x.defined() && W.defined(), ValueError, fn, ": x and W must be defined");
  KUSARI_CHECK(x.ndim() == 4, ShapeError, fn, ": expected x of shape (N, C, H, W), got ",
               x.shape());
  KUSARI_CHECK(W.ndim() == 4, ShapeError, fn, ": expected W of shape ", w_layout, ", got ",
               W.shape());
  KUSARI_CHECK(!b.defined() || b.ndim() == 1, ShapeError, fn, ": expected a 1-d b, got shape ",
               b.shape());
  detail::check_floating(fn, x);
  const Array& bd = b.defined() ? b.data() : W.data();
  check_same_dtype(fn, {&x.data(), &W.data(), &bd});
  check_same_device(fn, {&x.data(), &W.data(), &bd});
}

Variable conv_impl(const Variable& x, const Variable& W, const Variable& b, const Conv2dParams& p);
Variable deconv_impl(const Variable& x, const Variable& W, const Variable& b, const Conv2dParams& p,
                     std::optional<IntPair> outsize);

/// d<conv(x, W), gy>/dW for a W of shape w_shape (see Note [Convolution gradients]).
Variable conv_grad_w(const Variable& x, const Variable& gy, const Shape& w_shape,
                     const Conv2dParams& p) {
  Array gw = kusari::conv2d_backward_filter(x.data(), gy.data(), w_shape, p);
  return record("convolution_2d_grad_w", {x, gy}, std::move(gw), [p](BackwardContext& ctx) {
    const Variable& ggw = ctx.output_grad();
    Variable x = ctx.input(0), gy = ctx.input(1);
    if (ctx.needs_input_grad(0)) {
      ctx.set_input_grad(0,
                         deconv_impl(gy, ggw, Variable(), p, IntPair(x.shape()[2], x.shape()[3])));
    }
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, conv_impl(x, ggw, Variable(), p));
  });
}

/// The gradient of a bias added over the channel axis of an NCHW output.
Variable bias_grad(const Variable& gy) {
  return sum(gy, {0, 2, 3});
}

Variable conv_impl(const Variable& x, const Variable& W, const Variable& b, const Conv2dParams& p) {
  const char* fn = "convolution_2d";
  check_params(fn, p);
  check_operands(fn, x, W, b, "(out_channels, in_channels / groups, kH, kW)");
  const int64_t c = x.shape()[1], o = W.shape()[0];
  KUSARI_CHECK(c % p.groups == 0, ShapeError, fn, ": x of shape ", x.shape(), " has ", c,
               " channels, which groups=", p.groups, " does not divide");
  KUSARI_CHECK(o % p.groups == 0, ShapeError, fn, ": W of shape ", W.shape(), " has ", o,
               " output channels, which groups=", p.groups, " does not divide");
  KUSARI_CHECK(W.shape()[1] * p.groups == c, ShapeError, fn, ": x of shape ", x.shape(), " has ", c,
               " channels but W of shape ", W.shape(), " with groups=", p.groups, " expects ",
               W.shape()[1] * p.groups);
  KUSARI_CHECK(!b.defined() || b.shape()[0] == o, ShapeError, fn, ": b of shape ", b.shape(),
               " does not match the ", o, " output channels of W ", W.shape());
  Array y = kusari::conv2d(x.data(), W.data(), b.defined() ? b.data() : Array(), p);
  auto rule = [p](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    Variable x = ctx.input(0), W = ctx.input(1);
    if (ctx.needs_input_grad(0)) {
      // x's gradient added into the one x already has, in the same pass (Note [Accumulating into
      // an input's gradient]), when the engine offers it in gy's layout.
      Array acc = ctx.input_grad_accumulator(0);
      if (acc.defined() && acc.memory_format() == gy.data().memory_format()) {
        kusari::conv2d_backward_data_accumulate(W.data(), gy.data(), p, acc);
        ctx.set_input_grad_accumulated(0);
      } else {
        ctx.set_input_grad(0,
                           deconv_impl(gy, W, Variable(), p, IntPair(x.shape()[2], x.shape()[3])));
      }
    }
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, conv_grad_w(x, gy, W.shape(), p));
    if (ctx.num_inputs() > 2 && ctx.needs_input_grad(2)) ctx.set_input_grad(2, bias_grad(gy));
  };
  return b.defined() ? record(fn, {x, W, b}, std::move(y), rule)
                     : record(fn, {x, W}, std::move(y), rule);
}

Variable deconv_impl(const Variable& x, const Variable& W, const Variable& b, const Conv2dParams& p,
                     std::optional<IntPair> outsize) {
  const char* fn = "deconvolution_2d";
  check_params(fn, p);
  check_operands(fn, x, W, b, "(in_channels, out_channels / groups, kH, kW)");
  const int64_t n = x.shape()[0], c = x.shape()[1];
  KUSARI_CHECK(W.shape()[0] == c, ShapeError, fn, ": x of shape ", x.shape(), " has ", c,
               " channels but W of shape ", W.shape(), " expects ", W.shape()[0]);
  KUSARI_CHECK(c % p.groups == 0, ShapeError, fn, ": x of shape ", x.shape(), " has ", c,
               " channels, which groups=", p.groups, " does not divide");
  const int64_t o = W.shape()[1] * p.groups;
  KUSARI_CHECK(!b.defined() || b.shape()[0] == o, ShapeError, fn, ": b of shape ", b.shape(),
               " does not match the ", o, " output channels of W ", W.shape(),
               " with groups=", p.groups);
  int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t in = x.shape()[2 + i], k = W.shape()[2 + i];
    const int64_t dk = p.dilation[i] * (k - 1) + 1;
    out[i] =
        outsize ? (i == 0 ? outsize->h : outsize->w) : p.stride[i] * (in - 1) + dk - 2 * p.pad[i];
    KUSARI_CHECK(out[i] > 0, ShapeError, fn, ": the output size ", out[i], " along axis ", 2 + i,
                 " is not positive (x ", x.shape(), ", W ", W.shape(), ", stride ", p.stride[i],
                 ", pad ", p.pad[i], ")");
    if (outsize) {
      const int64_t back = conv_out_size(out[i], k, p.stride[i], p.pad[i], p.dilation[i]);
      KUSARI_CHECK(back == in, ValueError, fn, ": outsize ", *outsize, " does not fit x ",
                   x.shape(), ": a convolution with W ", W.shape(), ", stride ", p.stride[i],
                   ", pad ", p.pad[i], " maps size ", out[i], " to ", back, " along axis ", 2 + i,
                   ", not ", in);
    }
  }
  Array y = kusari::conv2d_backward_data(W.data(), x.data(), {n, o, out[0], out[1]}, p);
  if (b.defined()) y = kusari::add(y, b.data().reshape({1, o, 1, 1}));
  auto rule = [p](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    Variable x = ctx.input(0), W = ctx.input(1);
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, conv_impl(gy, W, Variable(), p));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, conv_grad_w(gy, x, W.shape(), p));
    if (ctx.num_inputs() > 2 && ctx.needs_input_grad(2)) ctx.set_input_grad(2, bias_grad(gy));
  };
  return b.defined() ? record(fn, {x, W, b}, std::move(y), rule)
                     : record(fn, {x, W}, std::move(y), rule);
}

}  // namespace

Variable convolution_2d(const Variable& x, const Variable& W, const Variable& b, IntPair stride,
                        IntPair pad, IntPair dilate, int64_t groups) {
  return conv_impl(x, W, b, make_params(stride, pad, dilate, groups));
}

Variable deconvolution_2d(const Variable& x, const Variable& W, const Variable& b, IntPair stride,
                          IntPair pad, std::optional<IntPair> outsize, IntPair dilate,
                          int64_t groups) {
  return deconv_impl(x, W, b, make_params(stride, pad, dilate, groups), outsize);
}

}  // namespace kusari::functions
