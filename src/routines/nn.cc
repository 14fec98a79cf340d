#include "kusari/core/routines.h"

#include "kernels/nn.h"
#include "routines/routine_util.h"

namespace kusari {

using routines::check_defined;

// --- neural-network kernels ------------------------------------------------------------------------

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation, bool cover_all) {
  const int64_t dk = k + (k - 1) * (dilation - 1);
  // Floor division (as in Chainer): a window larger than the padded input gives a size <= 0,
  // where C++'s truncation would round -1 / stride up to a size of 1.
  const int64_t span = in + pad * 2 - dk + (cover_all ? stride - 1 : 0);
  const int64_t steps = span >= 0 ? span / stride : -((-span + stride - 1) / stride);
  return steps + 1;
}

namespace {

void check_conv_params(const char* fn, const Conv2dParams& p) {
  for (int i = 0; i < 2; ++i) {
    KUSARI_CHECK(p.stride[i] > 0, ValueError, fn, ": stride must be positive, got ", p.stride[i]);
    KUSARI_CHECK(p.pad[i] >= 0, ValueError, fn, ": pad must be non-negative, got ", p.pad[i]);
    KUSARI_CHECK(p.dilation[i] > 0, ValueError, fn, ": dilation must be positive, got ", p.dilation[i]);
  }
  KUSARI_CHECK(p.groups > 0, ValueError, fn, ": groups must be positive, got ", p.groups);
}

// The gradient routines get shapes from a backward rule; the kernels index by them, so they must
// describe one convolution: x (N, C, H, W), W (O, C/groups, kH, kW), gy (N, O, outH, outW).
void check_conv_shapes(const char* fn, const Shape& x, const Shape& w, const Shape& gy, const Conv2dParams& p) {
  const int64_t oh = conv_out_size(x[2], w[2], p.stride[0], p.pad[0], p.dilation[0]);
  const int64_t ow = conv_out_size(x[3], w[3], p.stride[1], p.pad[1], p.dilation[1]);
  KUSARI_CHECK(x[1] == w[1] * p.groups && w[0] % p.groups == 0 && gy[0] == x[0] && gy[1] == w[0] && gy[2] == oh &&
                   gy[3] == ow,
               ShapeError, fn, ": shapes x ", x, ", W ", w, ", gy ", gy, " with groups=", p.groups,
               " do not describe one convolution (expected gy of shape (", x[0], ", ", w[0], ", ", oh, ", ", ow,
               ") and x with ", w[1] * p.groups, " channels)");
}

/// The checks of a gradient-of-x computation: W and gy on one device with one dtype, and 4-d
/// shapes that describe one convolution with an x of `x_shape`.
void check_backward_data_args(const char* fn, const Array& w, const Array& gy, const Shape& x_shape,
                              const Conv2dParams& p) {
  check_conv_params(fn, p);
  check_same_device(fn, {&w, &gy});
  check_same_dtype(fn, {&w, &gy});
  KUSARI_CHECK(x_shape.size() == 4 && gy.ndim() == 4 && w.ndim() == 4, ShapeError, fn, ": expected 4-d shapes, got x ",
               x_shape, ", gy ", gy.shape(), ", W ", w.shape());
  check_conv_shapes(fn, x_shape, w.shape(), gy.shape(), p);
}

/// kChannelsLast when a or b is channels-last, else kContiguous.
MemoryFormat channels_last_if_any(const Array& a, const Array& b) {
  constexpr MemoryFormat kCL = MemoryFormat::kChannelsLast;
  const bool cl = a.memory_format() == kCL || b.memory_format() == kCL;
  return cl ? kCL : MemoryFormat::kContiguous;
}

}  // namespace

Array conv2d(const Array& x, const Array& w, const Array& b, const Conv2dParams& p) {
  const char* fn = "convolution_2d";
  check_conv_params(fn, p);
  check_same_device(fn, {&x, &w, &b});
  check_same_dtype(fn, {&x, &w, &b});
  check_floating(fn, x);
  KUSARI_CHECK(x.ndim() == 4 && w.ndim() == 4, ShapeError, fn, ": expected 4-d x (N, C, H, W) and W (O, C/groups, kH, kW), got ",
               x.shape(), " and ", w.shape());
  KUSARI_CHECK(x.shape()[1] == w.shape()[1] * p.groups, ShapeError, fn, ": x has ", x.shape()[1],
               " channels but W ", w.shape(), " with groups=", p.groups, " expects ", w.shape()[1] * p.groups);
  KUSARI_CHECK(w.shape()[0] % p.groups == 0, ShapeError, fn, ": ", w.shape()[0], " output channels do not divide into ",
               p.groups, " groups");
  KUSARI_CHECK(!b.defined() || (b.ndim() == 1 && b.shape()[0] == w.shape()[0]), ShapeError, fn, ": bias of shape ",
               b.shape(), " does not match ", w.shape()[0], " output channels");
  const int64_t oh = conv_out_size(x.shape()[2], w.shape()[2], p.stride[0], p.pad[0], p.dilation[0]);
  const int64_t ow = conv_out_size(x.shape()[3], w.shape()[3], p.stride[1], p.pad[1], p.dilation[1]);
  KUSARI_CHECK(oh > 0 && ow > 0, ShapeError, fn, ": the kernel ", w.shape(), " (with pad and dilation) is larger than the input ",
               x.shape());
  // Note [Memory formats]: the output is channels-last when x or W is (PyTorch's rule).
  Array y = Array::empty({x.shape()[0], w.shape()[0], oh, ow}, x.dtype(), x.device(),
                         channels_last_if_any(x, w));
  if (y.size() > 0) kernels::conv2d_forward(x.device(), x, w, b, p, y);
  return y;
}

Array conv2d_backward_data(const Array& w, const Array& gy, const Shape& x_shape, const Conv2dParams& p) {
  const char* fn = "convolution_2d (gradient of x)";
  check_backward_data_args(fn, w, gy, x_shape, p);
  Array gx = Array::empty(x_shape, gy.dtype(), gy.device(), gy.memory_format());
  if (gx.size() > 0) kernels::conv2d_backward_data(gy.device(), w, gy, p, gx, false);
  return gx;
}

void conv2d_backward_data_accumulate(const Array& w, const Array& gy, const Conv2dParams& p, Array& gx) {
  const char* fn = "convolution_2d (gradient of x, accumulated)";
  KUSARI_CHECK(gx.defined(), ValueError, fn, ": gx must be defined");
  check_backward_data_args(fn, w, gy, gx.shape(), p);
  check_same_device(fn, {&gy, &gx});
  check_same_dtype(fn, {&gy, &gx});
  KUSARI_CHECK(!gx.shares_memory_with(w) && !gx.shares_memory_with(gy), ValueError, fn,
               ": gx overlaps W or gy; accumulate into a separate array");
  if (gx.size() > 0 && gy.size() > 0) kernels::conv2d_backward_data(gy.device(), w, gy, p, gx, true);
}

Array conv2d_backward_filter(const Array& x, const Array& gy, const Shape& w_shape, const Conv2dParams& p) {
  const char* fn = "convolution_2d (gradient of W)";
  check_conv_params(fn, p);
  check_same_device(fn, {&x, &gy});
  check_same_dtype(fn, {&x, &gy});
  KUSARI_CHECK(w_shape.size() == 4 && gy.ndim() == 4 && x.ndim() == 4, ShapeError, fn, ": expected 4-d shapes, got x ",
               x.shape(), ", gy ", gy.shape(), ", W ", w_shape);
  check_conv_shapes(fn, x.shape(), w_shape, gy.shape(), p);
  // Channels-last when x or gy is (gy is when x or W was).
  Array gw = Array::empty(w_shape, gy.dtype(), gy.device(), channels_last_if_any(x, gy));
  if (gw.size() > 0) kernels::conv2d_backward_filter(gy.device(), x, gy, p, gw);
  return gw;
}

Array pool2d(const Array& x, const Pool2dParams& p) {
  const char* fn = p.kind == PoolKind::kMax ? "max_pooling_2d" : "average_pooling_2d";
  check_floating(fn, x);
  KUSARI_CHECK(x.ndim() == 4, ShapeError, fn, ": expected 4-d x (N, C, H, W), got ", x.shape());
  for (int i = 0; i < 2; ++i) {
    KUSARI_CHECK(p.ksize[i] > 0 && p.stride[i] > 0 && p.pad[i] >= 0, ValueError, fn,
                 ": ksize and stride must be positive and pad non-negative, got ksize ", p.ksize[i], ", stride ",
                 p.stride[i], ", pad ", p.pad[i]);
    KUSARI_CHECK(p.pad[i] * 2 < p.ksize[i] + (p.cover_all ? p.stride[i] : 0) || p.kind == PoolKind::kAverage, ValueError, fn,
                 ": pad ", p.pad[i], " is too large for window ", p.ksize[i]);
  }
  const int64_t oh = conv_out_size(x.shape()[2], p.ksize[0], p.stride[0], p.pad[0], 1, p.cover_all);
  const int64_t ow = conv_out_size(x.shape()[3], p.ksize[1], p.stride[1], p.pad[1], 1, p.cover_all);
  KUSARI_CHECK(oh > 0 && ow > 0, ShapeError, fn, ": window (", p.ksize[0], ", ", p.ksize[1],
               ") is larger than the padded input ", x.shape());
  Array y = Array::empty({x.shape()[0], x.shape()[1], oh, ow}, x.dtype(), x.device(), x.memory_format());
  if (y.size() > 0) kernels::pool2d_forward(x.device(), x, p, y);
  return y;
}

Array pool2d_backward(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p) {
  const char* fn = p.kind == PoolKind::kMax ? "max_pooling_2d (gradient)" : "average_pooling_2d (gradient)";
  check_same_device(fn, {&x, &y, &gy});
  check_same_dtype(fn, {&x, &gy});
  KUSARI_CHECK(gy.shape() == y.shape(), ShapeError, fn, ": gy of shape ", gy.shape(), " does not match y ", y.shape());
  KUSARI_CHECK(x.ndim() == 4 && y.ndim() == 4, ShapeError, fn, ": expected 4-d x and y, got ", x.shape(), " and ",
               y.shape());
  const Shape expected{x.shape()[0], x.shape()[1],
                       conv_out_size(x.shape()[2], p.ksize[0], p.stride[0], p.pad[0], 1, p.cover_all),
                       conv_out_size(x.shape()[3], p.ksize[1], p.stride[1], p.pad[1], 1, p.cover_all)};
  KUSARI_CHECK(y.shape() == expected, ShapeError, fn, ": y of shape ", y.shape(), " is not the pooling of x ", x.shape(),
               " (expected ", expected, ")");
  Array gx = Array::empty(x.shape(), gy.dtype(), gy.device(), x.memory_format());
  if (gx.size() > 0) kernels::pool2d_backward(x.device(), x, y, gy, p, gx);
  return gx;
}

}  // namespace kusari
