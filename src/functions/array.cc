#include "kusari/functions/array.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "functions/function_util.h"
#include "kusari/core/routines.h"
#include "kusari/functions/math.h"

namespace kusari::functions {

Variable reshape(const Variable& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return record("reshape", {x}, x.data().reshape(shape), [](BackwardContext& ctx) {
    ctx.set_input_grad(0, reshape(ctx.output_grad(), ctx.input(0).shape()));
  });
}

Variable transpose(const Variable& x, const Axes& axes) {
  Array y = x.data().transpose(axes);
  // The inverse permutation, for the gradient.
  Axes perm;
  if (axes.empty()) {
    for (int i = x.ndim() - 1; i >= 0; --i) perm.push_back(i);
  } else {
    for (int64_t a : axes) perm.push_back(normalize_axis(a, x.ndim(), "transpose"));
  }
  Axes inverse;
  inverse.resize(perm.size());
  for (int i = 0; i < perm.size(); ++i) inverse[static_cast<int>(perm[i])] = i;
  return record("transpose", {x}, std::move(y), [inverse](BackwardContext& ctx) {
    ctx.set_input_grad(0, transpose(ctx.output_grad(), inverse));
  });
}

Variable swapaxes(const Variable& x, int a, int b) {
  a = normalize_axis(a, x.ndim(), "swapaxes");
  b = normalize_axis(b, x.ndim(), "swapaxes");
  Axes perm;
  for (int i = 0; i < x.ndim(); ++i) perm.push_back(i);
  std::swap(perm[a], perm[b]);
  return transpose(x, perm);
}

Variable broadcast_to(const Variable& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return record("broadcast_to", {x}, x.data().broadcast_to(shape), [](BackwardContext& ctx) {
    ctx.set_input_grad(0, sum_to(ctx.output_grad(), ctx.input(0).shape()));
  });
}

Variable squeeze(const Variable& x, const Axes& axes) {
  Array y = x.data().squeeze(axes);
  if (y.shape() == x.shape()) return x;
  return reshape(x, y.shape());
}

Variable expand_dims(const Variable& x, int axis) { return reshape(x, x.data().expand_dims(axis).shape()); }

Variable flatten(const Variable& x) { return reshape(x, {x.size()}); }

Variable cast(const Variable& x, Dtype dtype) {
  if (x.dtype() == dtype) return x;
  return record("cast", {x}, x.data().astype(dtype), [](BackwardContext& ctx) {
    ctx.set_input_grad(0, cast(ctx.output_grad(), ctx.input(0).dtype()));
  });
}

Variable copy(const Variable& x, Device device) {
  return record("copy", {x}, x.data().to_device(device).contiguous(), [](BackwardContext& ctx) {
    ctx.set_input_grad(0, copy(ctx.output_grad(), ctx.input(0).device()));
  });
}

Variable concat(const std::vector<Variable>& xs, int axis_in) {
  KUSARI_CHECK(!xs.empty(), ValueError, "concat: need at least one variable");
  const int axis = normalize_axis(axis_in, xs[0].ndim(), "concat");
  std::vector<Array> arrays;
  arrays.reserve(xs.size());
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    arrays.push_back(xs[i].data());
    at += xs[i].shape()[axis];
    if (i + 1 < xs.size()) offsets.push_back(at);
  }
  Array y = kusari::concatenate(arrays, axis);
  return record_multi("concat", xs, {std::move(y)}, [axis, offsets](BackwardContext& ctx) {
           std::vector<Variable> parts = split_axis(ctx.output_grad(), offsets, axis);
           for (int i = 0; i < ctx.num_inputs(); ++i) {
             if (ctx.needs_input_grad(i)) ctx.set_input_grad(i, parts[i]);
           }
         })[0];
}

Variable stack(const std::vector<Variable>& xs, int axis) {
  KUSARI_CHECK(!xs.empty(), ValueError, "stack: need at least one variable");
  const int ax = normalize_axis(axis, xs[0].ndim() + 1, "stack");
  std::vector<Variable> expanded;
  expanded.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    KUSARI_CHECK(xs[i].shape() == xs[0].shape(), ShapeError, "stack: variable ", i, " has shape ", xs[i].shape(),
                 " but variable 0 has shape ", xs[0].shape(), "; all must match");
    expanded.push_back(expand_dims(xs[i], ax));
  }
  return concat(expanded, ax);
}

std::vector<Variable> split_axis(const Variable& x, const std::vector<int64_t>& indices, int axis_in) {
  const int axis = normalize_axis(axis_in, x.ndim(), "split_axis");
  std::vector<Array> parts = kusari::split_at(x.data(), indices, axis);
  return record_multi("split_axis", {x}, std::move(parts), [axis](BackwardContext& ctx) {
    std::vector<Variable> grads;
    grads.reserve(static_cast<size_t>(ctx.num_outputs()));
    for (int i = 0; i < ctx.num_outputs(); ++i) grads.push_back(ctx.output_grad(i));
    ctx.set_input_grad(0, concat(grads, axis));
  });
}

std::vector<Variable> split_axis(const Variable& x, int64_t sections, int axis_in) {
  const int axis = normalize_axis(axis_in, x.ndim(), "split_axis");
  KUSARI_CHECK(sections > 0, ValueError, "split_axis: sections must be positive, got ", sections);
  const int64_t len = x.shape()[axis];
  KUSARI_CHECK(len % sections == 0, ValueError, "split_axis: axis ", axis, " of length ", len,
               " does not divide into ", sections, " equal sections");
  std::vector<int64_t> idx;
  for (int64_t i = 1; i < sections; ++i) idx.push_back(i * (len / sections));
  return split_axis(x, idx, axis);
}

namespace {

// The gradient of get_item: gy written into the indexed region of zeros of x's shape.
Variable scatter_item(const Variable& gy, const Shape& x_shape, const std::vector<Index>& indices) {
  Array gx = Array::zeros(x_shape, gy.dtype(), gy.device());
  Array region = gx.at(indices);
  region.assign(gy.data());
  return record("get_item_grad", {gy}, std::move(gx), [indices](BackwardContext& ctx) {
    ctx.set_input_grad(0, get_item(ctx.output_grad(), indices));
  });
}

}  // namespace

Variable get_item(const Variable& x, const std::vector<Index>& indices) {
  return record("get_item", {x}, x.data().at(indices), [indices](BackwardContext& ctx) {
    ctx.set_input_grad(0, scatter_item(ctx.output_grad(), ctx.input(0).shape(), indices));
  });
}

namespace {

// take's gradient, differentiable in turn (its gradient is take).
Variable take_grad(const Variable& g, const Array& indices, int axis, const Shape& shape) {
  return record("take_grad", {g}, kusari::add_at_zeros(shape, indices, axis, g.data()),
                [indices, axis](BackwardContext& ctx) { ctx.set_input_grad(0, take(ctx.output_grad(), indices, axis)); });
}

}  // namespace

Variable take(const Variable& x, const Array& indices, int axis) {
  const char* fn = "take";
  KUSARI_CHECK(x.defined(), ValueError, fn, ": x is undefined");
  KUSARI_CHECK(indices.dtype() == int32 || indices.dtype() == int64, DtypeError, fn, ": indices must be int32 or "
               "int64, got ", dtype_name(indices.dtype()));
  KUSARI_CHECK(indices.device() == x.device(), DeviceError, fn, ": x is on ", x.device(), " but the indices are on ",
               indices.device());
  KUSARI_CHECK(axis >= -x.ndim() && axis < x.ndim(), ShapeError, fn, ": axis ", axis, " is out of range for x of "
               "shape ", x.shape());
  const int ax = axis < 0 ? axis + x.ndim() : axis;
  return record(fn, {x}, kusari::take(x.data(), indices, ax), [indices, ax](BackwardContext& ctx) {
    ctx.set_input_grad(0, take_grad(ctx.output_grad(), indices, ax, ctx.input(0).shape()));
  });
}

Variable where(const Array& cond, const Variable& a, const Variable& b) {
  return record("where", {a, b}, kusari::where(cond, a.data(), b.data()), [cond](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    Variable zero = detail::zero_like(gy);
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, sum_to(where(cond, gy, zero), ctx.input(0).shape()));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, sum_to(where(cond, zero, gy), ctx.input(1).shape()));
  });
}

namespace {

/// The (out, in) matrix of 1-d linear interpolation weights (Note on resize_images in array.h).
std::vector<double> interpolation_matrix(int64_t in, int64_t out, bool align_corners) {
  std::vector<double> a(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    double u;
    if (align_corners) {
      u = out > 1 ? static_cast<double>(i) * static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
    } else {
      u = (static_cast<double>(i) + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5;
      u = std::clamp(u, 0.0, static_cast<double>(in - 1));
    }
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(u)), in - 1);
    const int64_t i1 = std::min(i0 + 1, in - 1);
    const double w1 = u - static_cast<double>(i0);
    a[static_cast<size_t>(i * in + i0)] += 1.0 - w1;
    a[static_cast<size_t>(i * in + i1)] += w1;
  }
  return a;
}

}  // namespace

Variable resize_images(const Variable& x, const Shape& output_shape, bool align_corners) {
  KUSARI_CHECK(x.ndim() == 4, ShapeError, "resize_images: x must be (N, C, H, W), got shape ", x.shape());
  detail::check_floating("resize_images", x);
  KUSARI_CHECK(output_shape.size() == 2 && output_shape[0] > 0 && output_shape[1] > 0, ValueError,
               "resize_images: output_shape must be (out_h, out_w) with positive sizes, got ", output_shape);
  const int64_t h = x.shape()[2], w = x.shape()[3], oh = output_shape[0], ow = output_shape[1];
  KUSARI_CHECK(h > 0 && w > 0, ValueError, "resize_images: x ", x.shape(), " has no pixels to interpolate");
  const Variable ah(Array::from_vector(interpolation_matrix(h, oh, align_corners), Shape{oh, h}, x.device())
                        .astype(x.dtype()));
  const Variable awt(Array::from_vector(interpolation_matrix(w, ow, align_corners), Shape{ow, w}, x.device())
                         .astype(x.dtype())
                         .transpose());
  return matmul(matmul(ah, x), awt);
}

// Note [Spatial transformer]
// The grid is one batched product of theta with the (3, H W) target coordinates. The sampler
// follows Chainer's: x is padded with one pixel of zeros on every side, a coordinate u in
// [-1, 1] becomes (u + 1) (W - 1) / 2 + 1 in the padded image, clipped to [0, W + 1], and its
// four neighbours u0 = min(floor(u), W), u0 + 1 (likewise v) are gathered from x laid out as
// (B H_pad W_pad, C) rows with take, weighted by the bilinear weights, which are differentiable
// functions of the grid. So a sample outside the image fades to zero over one pixel, the
// gradient with respect to x is take's (added back at the four neighbours), and the gradient
// with respect to the grid is the weights' derivative: piecewise constant in each coordinate,
// with kinks at whole pixels, and zero where a coordinate was clipped.
Variable spatial_transformer_grid(const Variable& theta, const Shape& output_shape) {
  const char* fn = "spatial_transformer_grid";
  detail::check_floating(fn, theta);
  KUSARI_CHECK(theta.ndim() == 3 && theta.shape()[1] == 2 && theta.shape()[2] == 3, ShapeError, fn,
               ": theta must be (batch, 2, 3) affine parameters, got shape ", theta.shape());
  KUSARI_CHECK(output_shape.size() == 2 && output_shape[0] > 0 && output_shape[1] > 0, ShapeError, fn,
               ": output_shape must be two positive sizes (H, W), got ", output_shape);
  const int64_t b = theta.shape()[0], h = output_shape[0], w = output_shape[1];
  std::vector<double> base(static_cast<size_t>(3 * h * w));
  const auto coordinate = [](int64_t i, int64_t n) {
    return n > 1 ? -1.0 + 2.0 * static_cast<double>(i) / static_cast<double>(n - 1) : -1.0;  // NumPy's linspace
  };
  for (int64_t i = 0; i < h; ++i) {
    for (int64_t j = 0; j < w; ++j) {
      const size_t at = static_cast<size_t>(i * w + j);
      base[at] = coordinate(j, w);
      base[static_cast<size_t>(h * w) + at] = coordinate(i, h);
      base[static_cast<size_t>(2 * h * w) + at] = 1.0;
    }
  }
  Array t = Array::from_vector(base, Shape{1, 3, h * w}, Device::cpu())
                .astype(theta.dtype())
                .to_device(theta.device())
                .broadcast_to({b, 3, h * w});
  return reshape(matmul(theta, Variable(t)), {b, 2, h, w});
}

Variable spatial_transformer_sampler(const Variable& x, const Variable& grid) {
  const char* fn = "spatial_transformer_sampler";
  detail::check_floating(fn, x);
  detail::check_floating(fn, grid);
  KUSARI_CHECK(x.ndim() == 4, ShapeError, fn, ": x must be (batch, channels, H, W), got shape ", x.shape());
  KUSARI_CHECK(grid.ndim() == 4 && grid.shape()[1] == 2 && grid.shape()[0] == x.shape()[0], ShapeError, fn,
               ": grid must be (batch, 2, H_out, W_out) with x's batch ", x.shape()[0], ", got shape ", grid.shape());
  KUSARI_CHECK(grid.dtype() == x.dtype(), DtypeError, fn, ": grid is ", dtype_name(grid.dtype()), " but x is ",
               dtype_name(x.dtype()));
  KUSARI_CHECK(grid.device() == x.device(), DeviceError, fn, ": grid is on ", grid.device(), " but x is on ",
               x.device());
  const int64_t b = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t ho = grid.shape()[2], wo = grid.shape()[3], hp = h + 2, wp = w + 2;
  const Device device = x.device();
  // Coordinates in the padded image, clipped (differentiable in the grid).
  Variable u = get_item(grid, {Slice(), int64_t{0}}), v = get_item(grid, {Slice(), int64_t{1}});  // (B, Ho, Wo)
  u = clip(add(mul(add(u, 1.0), static_cast<double>(w - 1) / 2.0), 1.0), 0.0, static_cast<double>(w + 1));
  v = clip(add(mul(add(v, 1.0), static_cast<double>(h - 1) / 2.0), 1.0), 0.0, static_cast<double>(h + 1));
  const Array u0 = kusari::minimum(kusari::floor(u.data()), static_cast<double>(w)), u1 = u0 + 1.0;
  const Array v0 = kusari::minimum(kusari::floor(v.data()), static_cast<double>(h)), v1 = v0 + 1.0;
  // The four neighbours' rows in x padded and laid out as (B Hp Wp, C).
  Variable zeros_h(Array::zeros({b, c, 1, w}, x.dtype(), device)), zeros_w(Array::zeros({b, c, hp, 1}, x.dtype(), device));
  Variable padded = concat({zeros_w, concat({zeros_h, x, zeros_h}, 2), zeros_w}, 3);  // (B, C, Hp, Wp)
  Variable rows = reshape(transpose(padded, {0, 2, 3, 1}), {b * hp * wp, c});
  const Array batch_base =
      (Array::arange(b, int64, device) * (hp * wp)).reshape({b, 1, 1}).broadcast_to({b, ho, wo});
  const auto gather = [&](const Array& vi, const Array& ui) {
    const Array index = (batch_base + vi.astype(int64) * wp + ui.astype(int64)).reshape({b * ho * wo});
    return transpose(reshape(take(rows, index, 0), {b, ho, wo, c}), {0, 3, 1, 2});  // (B, C, Ho, Wo)
  };
  const auto weight = [&](const Variable& a) { return expand_dims(a, 1); };  // (B, 1, Ho, Wo), broadcast over C
  Variable du1 = sub(Variable(u1), u), du0 = sub(u, Variable(u0));  // u1 - u, u - u0
  Variable dv1 = sub(Variable(v1), v), dv0 = sub(v, Variable(v0));
  const Shape out{b, c, ho, wo};
  const auto term = [&](const Variable& wu, const Variable& wv, const Array& vi, const Array& ui) {
    return mul(broadcast_to(weight(mul(wu, wv)), out), gather(vi, ui));
  };
  return add(add(term(du1, dv1, v0, u0), term(du0, dv1, v0, u1)), add(term(du1, dv0, v1, u0), term(du0, dv0, v1, u1)));
}

}  // namespace kusari::functions
