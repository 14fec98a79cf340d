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

}  // namespace kusari::functions
