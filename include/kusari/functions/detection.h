// Bounding boxes for object detection (ChainerCV's conventions, which PFDet used): a box is
// (y_min, x_min, y_max, x_max) in pixels, and a box's offset from a reference box ("loc") is
// (dy, dx, dh, dw) = ((y - y_ref) / h_ref, (x - x_ref) / w_ref, log(h / h_ref), log(w / w_ref))
// of the centres (y, x) and sizes (h, w). Written with differentiable functions, so they run on
// every device and carry gradients (a loss on decoded boxes reaches the predicted offsets).
#pragma once

#include <cstdint>
#include <optional>

#include "kusari/autograd/variable.h"
#include "kusari/core/shape.h"

namespace kusari::functions {

/// The intersection over union of every box of a (N, 4) with every box of b (M, 4): (N, M).
/// Boxes that do not overlap give 0; a pair of empty boxes divides 0 by 0 (NaN), as ChainerCV's
/// bbox_iou does.
Variable bbox_iou(const Variable& a, const Variable& b);

/// The offsets (R, 4) that move the reference boxes src (R, 4) onto dst (R, 4) (ChainerCV's
/// bbox2loc; Faster R-CNN's regression targets).
Variable bbox_to_loc(const Variable& src, const Variable& dst);

/// The boxes (R, 4) that the offsets loc (R, 4) make of the reference boxes src (R, 4)
/// (ChainerCV's loc2bbox): bbox_to_loc's inverse.
Variable loc_to_bbox(const Variable& src, const Variable& loc);

/// RoI Align (Chainer's roi_average_align_2d, Mask R-CNN's RoIAlign): for each region of
/// interest rois[r] = (y_min, x_min, y_max, x_max) in input pixels times 1 / spatial_scale, on
/// image roi_indices[r] of x (N, C, H, W), the (C, out_h, out_w) map of its bins, each the mean of
/// sampling_ratio x sampling_ratio bilinear samples (absent: ceil(roi size / bins) per axis, as
/// Chainer). Returns (R, C, out_h, out_w); differentiable in x (not in the boxes).
///
/// Note [RoI Align as two products]
/// A sample at (y, x) weighs the four pixels around it by hy hx, hy lx, ly hx, ly lx: the
/// product of a weight that depends on y alone and one that depends on x alone (Chainer's rules:
/// a coordinate below -1 or beyond the size contributes nothing, one in [-1, 0] counts as 0, one
/// past the last pixel as the last pixel). The mean over a bin's samples is therefore
/// sum_ij Wy[oh, i] x[i, j] Wx[ow, j], with Wy (out_h, H) and Wx (out_w, W) the means of the
/// per-axis weights: RoI Align is Wy X Wx^T, the form of resize_images. The small matrices are
/// made on the host from the boxes (one copy of rois from a GPU), and the products run on the
/// device, batched over the RoIs of one image; the gradient is the products' (GEMMs again).
Variable roi_average_align_2d(const Variable& x, const Array& rois, const Array& roi_indices, const Shape& outsize,
                              double spatial_scale, std::optional<int64_t> sampling_ratio = std::nullopt);

/// RoI average pooling (Chainer's roi_average_pooling_2d, Fast R-CNN's bins): each RoI's corners
/// are scaled by spatial_scale and rounded to whole pixels; bin (i, j) of out_h x out_w is the mean
/// of the pixels [floor(i h / out_h), ceil((i + 1) h / out_h)) x (the same across) from the RoI's
/// corner, clipped to the image (an empty bin is 0). Returns (R, C, out_h, out_w); differentiable
/// in x. A mean over a rectangle is Wy X Wx^T as well (Note [RoI Align as two products]).
Variable roi_average_pooling_2d(const Variable& x, const Array& rois, const Array& roi_indices, const Shape& outsize,
                                double spatial_scale);

/// RoI max align (Chainer's roi_max_align_2d): as roi_average_align_2d, each bin's bilinear
/// samples, but their maximum instead of their mean. Samples outside the image (a coordinate below
/// -1 or beyond the size) do not count; a bin with none is 0. Differentiable in x: the gradient
/// goes to the first maximal sample of each bin, as Chainer's argmax (Note [RoI max functions]).
Variable roi_max_align_2d(const Variable& x, const Array& rois, const Array& roi_indices,
                          const Shape& outsize, double spatial_scale,
                          std::optional<int64_t> sampling_ratio = std::nullopt);

/// RoI max pooling (Chainer's roi_max_pooling_2d, Fast R-CNN's RoI pooling): the bins of
/// roi_average_pooling_2d, each the maximum of its pixels (an empty bin is 0). Differentiable in
/// x, through the first maximal pixel of each bin.
Variable roi_max_pooling_2d(const Variable& x, const Array& rois, const Array& roi_indices,
                            const Shape& outsize, double spatial_scale);

/// Chainer's roi_pooling_2d, Fast R-CNN's original form: rois (R, 5) are (image index, x_min,
/// y_min, x_max, y_max), and a RoI spans round(max) - round(min) + 1 pixels per axis (the corner
/// pixels both included); otherwise roi_max_pooling_2d.
Variable roi_pooling_2d(const Variable& x, const Array& rois, int64_t outh, int64_t outw,
                        double spatial_scale);

/// The boxes (R, 4) to keep after non-maximum suppression (ChainerCV's non_maximum_suppression):
/// visiting boxes from the highest score down (in the given order without `score`), a box
/// is kept unless its IoU with a box kept already is at least `thresh`. With `label` (R,) integer
/// classes, boxes of different classes never suppress each other (NMS batched per class, as
/// detectors run it). At most `limit` indices (all when absent). Returns the kept indices (int32,
/// on the boxes' device), highest score first. Runs on the host (boxes on a GPU are copied there:
/// R boxes, usually a few thousand).
Array non_maximum_suppression(const Array& bbox, double thresh, const Array& score = Array(),
                              std::optional<int64_t> limit = std::nullopt, const Array& label = Array());

}  // namespace kusari::functions
