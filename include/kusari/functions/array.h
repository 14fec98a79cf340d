// Differentiable array manipulation: shapes, axes, joining, splitting, indexing, casting
// (Chainer's F.array family).
#pragma once

#include <vector>

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// A view with a new shape (one entry may be -1).
Variable reshape(const Variable& x, const Shape& shape);
/// Permutes axes (reverses them when none are given).
Variable transpose(const Variable& x, const Axes& axes = {});
Variable swapaxes(const Variable& x, int a, int b);
/// Broadcasts to `shape`; the gradient is summed back.
Variable broadcast_to(const Variable& x, const Shape& shape);
/// Removes length-1 axes (all when none are given).
Variable squeeze(const Variable& x, const Axes& axes = {});
Variable expand_dims(const Variable& x, int axis);
/// Flattens to 1-d.
Variable flatten(const Variable& x);
/// Converts the dtype; the gradient is converted back.
Variable cast(const Variable& x, Dtype dtype);
/// Copies to another device; the gradient is copied back (Chainer's F.copy).
Variable copy(const Variable& x, Device device);
/// Joins along an existing axis.
Variable concat(const std::vector<Variable>& xs, int axis = 1);
/// Joins along a new axis.
Variable stack(const std::vector<Variable>& xs, int axis = 0);
/// Splits into `sections` equal parts along axis.
std::vector<Variable> split_axis(const Variable& x, int64_t sections, int axis);
/// Splits at the given indices along axis.
std::vector<Variable> split_axis(const Variable& x, const std::vector<int64_t>& indices, int axis);
/// NumPy basic indexing (integers, slices, NewAxis, Ellipsis); the gradient is scattered back.
Variable get_item(const Variable& x, const std::vector<Index>& indices);
/// NumPy's take: the entries of x at `indices` (int32 or int64, any shape; negative ones count
/// from the end) along `axis`, which the indices' shape replaces. The gradient is added back at
/// the indices (repeated indices sum), and can itself be differentiated.
Variable take(const Variable& x, const Array& indices, int axis = 0);
/// cond ? a : b (cond is a bool array, not differentiated).
Variable where(const Array& cond, const Variable& a, const Variable& b);

/// Resizes images x (N, C, H, W) to (N, C, out_h, out_w) by bilinear interpolation (Chainer's
/// resize_images, mode 'bilinear'). With align_corners (Chainer's default) the corner pixels of
/// input and output coincide: output pixel i samples input coordinate i (H - 1) / (out_h - 1);
/// without, pixel centres do: (i + 0.5) H / out_h - 0.5, clamped to the image. Written as two
/// products with interpolation matrices, so it is differentiable on every device.
Variable resize_images(const Variable& x, const Shape& output_shape, bool align_corners = true);

/// The sampling grid of a spatial transformer (Jaderberg et al.; Chainer's
/// spatial_transformer_grid): for affine parameters theta (B, 2, 3) and output_shape (H, W), the
/// (B, 2, H, W) source coordinates theta [x_t; y_t; 1] of the target pixels, whose coordinates
/// x_t, y_t run from -1 to 1 across the output (channel 0 is x, channel 1 is y).
Variable spatial_transformer_grid(const Variable& theta, const Shape& output_shape);
/// Samples x (B, C, H, W) at the coordinates of grid (B, 2, H_out, W_out) (as
/// spatial_transformer_grid makes them: -1 and 1 are the centres of the first and last pixels) by
/// bilinear interpolation, with zeros outside the image (Chainer's spatial_transformer_sampler).
/// Differentiable with respect to x and grid; written with take and elementwise functions, so it
/// runs on every device.
Variable spatial_transformer_sampler(const Variable& x, const Variable& grid);

}  // namespace kusari::functions
