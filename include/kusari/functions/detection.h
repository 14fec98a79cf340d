// Bounding boxes for object detection (ChainerCV's conventions, which PFDet used): a box is
// (y_min, x_min, y_max, x_max) in pixels, and a box's offset from a reference box ("loc") is
// (dy, dx, dh, dw) = ((y - y_ref) / h_ref, (x - x_ref) / w_ref, log(h / h_ref), log(w / w_ref))
// of the centres (y, x) and sizes (h, w). Written with differentiable functions, so they run on
// every device and carry gradients (a loss on decoded boxes reaches the predicted offsets).
#pragma once

#include "kusari/autograd/variable.h"

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

}  // namespace kusari::functions
