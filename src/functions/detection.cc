#include "kusari/functions/detection.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "functions/function_util.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"

namespace kusari::functions {
namespace {

/// Column `c` of boxes (R, 4), as (R, 1).
Variable column(const Variable& boxes, int64_t c) { return get_item(boxes, {Slice(), Slice(c, c + 1)}); }

void check_boxes(const char* fn, const char* name, const Variable& boxes) {
  detail::check_floating(fn, boxes);
  KUSARI_CHECK(boxes.ndim() == 2 && boxes.shape()[1] == 4, ShapeError, fn, ": ", name,
               " must be (R, 4) boxes (y_min, x_min, y_max, x_max), got shape ", boxes.shape());
}

/// (centre y, centre x, height, width) of boxes (R, 4), each (R, 1).
struct Centred {
  Variable y, x, h, w;
};

/// Adds f times the weights of a bilinear sample at coordinate v of an axis of `size` pixels to
/// row[0..size) (Note [RoI Align as two products]: Chainer's boundary rules).
void add_sample_weights(double v, int64_t size, double f, double* row) {
  if (v < -1.0 || v > static_cast<double>(size)) return;
  if (v <= 0) v = 0;
  int64_t low = static_cast<int64_t>(v), high = low + 1;
  if (low >= size - 1) {
    low = high = size - 1;
    v = static_cast<double>(low);
  }
  const double l = v - static_cast<double>(low);
  row[low] += f * (1.0 - l);
  row[high] += f * l;
}

/// Appends the (bins, size) means of the sample weights of each bin of [start, start + length)
/// with `grid` samples per bin.
void append_bin_weights(double start, double length, int64_t bins, int64_t grid, int64_t size,
                        std::vector<double>& out) {
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(bins * size), 0.0);
  const double bin = length / static_cast<double>(bins);
  for (int64_t b = 0; b < bins; ++b) {
    double* row = out.data() + at + static_cast<size_t>(b * size);
    for (int64_t g = 0; g < grid; ++g) {
      const double v = start + static_cast<double>(b) * bin + (static_cast<double>(g) + 0.5) * bin / static_cast<double>(grid);
      add_sample_weights(v, size, 1.0 / static_cast<double>(grid), row);
    }
  }
}

Centred centred(const Variable& boxes) {
  const Variable h = sub(column(boxes, 2), column(boxes, 0)), w = sub(column(boxes, 3), column(boxes, 1));
  return {add(column(boxes, 0), mul(h, 0.5)), add(column(boxes, 1), mul(w, 0.5)), h, w};
}

}  // namespace

Variable bbox_iou(const Variable& a, const Variable& b) {
  check_boxes("bbox_iou", "a", a);
  check_boxes("bbox_iou", "b", b);
  KUSARI_CHECK(a.dtype() == b.dtype(), DtypeError, "bbox_iou: a and b must have one dtype, got ",
               dtype_name(a.dtype()), " and ", dtype_name(b.dtype()));
  const int64_t n = a.shape()[0], m = b.shape()[0];
  // (N, 1, 2) against (1, M, 2): the corners of each intersection.
  const Variable a_tl = reshape(get_item(a, {Slice(), Slice(0, 2)}), {n, 1, 2});
  const Variable a_br = reshape(get_item(a, {Slice(), Slice(2, 4)}), {n, 1, 2});
  const Variable b_tl = reshape(get_item(b, {Slice(), Slice(0, 2)}), {1, m, 2});
  const Variable b_br = reshape(get_item(b, {Slice(), Slice(2, 4)}), {1, m, 2});
  const Variable tl = maximum(broadcast_to(a_tl, {n, m, 2}), broadcast_to(b_tl, {n, m, 2}));
  const Variable br = minimum(broadcast_to(a_br, {n, m, 2}), broadcast_to(b_br, {n, m, 2}));
  const Variable zero(Array::zeros({n, m, 2}, a.dtype(), a.device()));
  const Variable sides = maximum(sub(br, tl), zero);
  const Variable inter = mul(get_item(sides, {Slice(), Slice(), 0}), get_item(sides, {Slice(), Slice(), 1}));
  const Centred ca = centred(a), cb = centred(b);
  const Variable area_a = broadcast_to(mul(ca.h, ca.w), {n, m});
  const Variable area_b = broadcast_to(reshape(mul(cb.h, cb.w), {1, m}), {n, m});
  return div(inter, sub(add(area_a, area_b), inter));
}

Variable bbox_to_loc(const Variable& src, const Variable& dst) {
  check_boxes("bbox_to_loc", "src", src);
  check_boxes("bbox_to_loc", "dst", dst);
  KUSARI_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), ValueError,
               "bbox_to_loc: src and dst must have one shape and dtype, got ", src.shape(), " ",
               dtype_name(src.dtype()), " and ", dst.shape(), " ", dtype_name(dst.dtype()));
  const Centred s = centred(src), d = centred(dst);
  return concat({div(sub(d.y, s.y), s.h), div(sub(d.x, s.x), s.w), log(div(d.h, s.h)), log(div(d.w, s.w))}, 1);
}

Variable loc_to_bbox(const Variable& src, const Variable& loc) {
  check_boxes("loc_to_bbox", "src", src);
  check_boxes("loc_to_bbox", "loc", loc);
  KUSARI_CHECK(src.shape() == loc.shape() && src.dtype() == loc.dtype(), ValueError,
               "loc_to_bbox: src and loc must have one shape and dtype, got ", src.shape(), " ",
               dtype_name(src.dtype()), " and ", loc.shape(), " ", dtype_name(loc.dtype()));
  const Centred s = centred(src);
  const Variable y = add(mul(column(loc, 0), s.h), s.y), x = add(mul(column(loc, 1), s.w), s.x);
  const Variable half_h = mul(mul(exp(column(loc, 2)), s.h), 0.5), half_w = mul(mul(exp(column(loc, 3)), s.w), 0.5);
  return concat({sub(y, half_h), sub(x, half_w), add(y, half_h), add(x, half_w)}, 1);
}

namespace {

/// A RoI function of the form Wy X Wx^T (Note [RoI Align as two products]): checks the
/// arguments, then runs one pair of products per run of RoIs of the same image. `weights(box, wy,
/// wx)` appends the RoI's (out_h, H) and (out_w, W) matrices for a box already scaled to x's pixels.
Variable roi_separable(const char* fn, const Variable& x, const Array& rois, const Array& roi_indices,
                       const Shape& outsize, double spatial_scale,
                       const std::function<void(const double* box, std::vector<double>& wy, std::vector<double>& wx)>&
                           weights) {
  KUSARI_CHECK(x.ndim() == 4, ShapeError, fn, ": x must be (N, C, H, W), got shape ", x.shape());
  detail::check_floating(fn, x);
  KUSARI_CHECK(rois.ndim() == 2 && rois.shape()[1] == 4 && is_floating(rois.dtype()), ShapeError, fn,
               ": rois must be floating (R, 4) boxes (y_min, x_min, y_max, x_max), got ", rois.dtype(), " ",
               rois.shape());
  KUSARI_CHECK(roi_indices.ndim() == 1 && roi_indices.shape()[0] == rois.shape()[0] && is_integral(roi_indices.dtype()),
               ShapeError, fn, ": roi_indices must be integer (R,) with R = ", rois.shape()[0], " (the rows of rois), got ",
               roi_indices.dtype(), " ", roi_indices.shape());
  KUSARI_CHECK(outsize.size() == 2 && outsize[0] > 0 && outsize[1] > 0, ValueError, fn,
               ": outsize must be (out_h, out_w) with positive sizes, got ", outsize);
  KUSARI_CHECK(spatial_scale > 0 && std::isfinite(spatial_scale), ValueError, fn,
               ": spatial_scale must be positive, got ", spatial_scale);
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t oh = outsize[0], ow = outsize[1], r = rois.shape()[0];
  KUSARI_CHECK(h > 0 && w > 0, ValueError, fn, ": x ", x.shape(), " has no pixels to sample");
  if (r == 0) return Variable(Array::zeros({0, c, oh, ow}, x.dtype(), x.device()));
  std::vector<double> boxes = rois.astype(float64).to_device(Device::cpu()).to_vector<double>();
  const std::vector<int64_t> images = roi_indices.astype(int64).to_device(Device::cpu()).to_vector<int64_t>();
  for (int64_t i = 0; i < r; ++i) {
    KUSARI_CHECK(images[static_cast<size_t>(i)] >= 0 && images[static_cast<size_t>(i)] < n, IndexError, fn,
                 ": roi_indices[", i, "] is ", images[static_cast<size_t>(i)], " but x holds ", n, " images");
    for (int k = 0; k < 4; ++k) {
      double& v = boxes[static_cast<size_t>(4 * i + k)];
      KUSARI_CHECK(std::isfinite(v), ValueError, fn, ": rois[", i, "] is not finite");
      v *= spatial_scale;
    }
  }
  std::vector<Variable> parts;
  for (int64_t a = 0; a < r;) {
    int64_t b = a;
    while (b < r && images[static_cast<size_t>(b)] == images[static_cast<size_t>(a)]) ++b;
    const int64_t k = b - a;
    std::vector<double> wy, wx;
    for (int64_t i = a; i < b; ++i) weights(boxes.data() + 4 * i, wy, wx);
    KUSARI_ASSERT(static_cast<int64_t>(wy.size()) == k * oh * h && static_cast<int64_t>(wx.size()) == k * ow * w);
    const Variable wy_v(Array::from_vector(wy, Shape{k * oh, h}, x.device()).astype(x.dtype()));
    const Variable wx_v(Array::from_vector(wx, Shape{k, 1, ow, w}, x.device()).astype(x.dtype()));
    // (k oh, H) @ (C, H, W) -> (C, k oh, W) -> (k, C, oh, W) @ (k, 1, W, ow) -> (k, C, oh, ow)
    Variable t = matmul(wy_v, get_item(x, {Index(images[static_cast<size_t>(a)])}));
    t = transpose(reshape(t, {c, k, oh, w}), {1, 0, 2, 3});
    parts.push_back(matmul(t, wx_v, false, true));
    a = b;
  }
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

/// Appends the (bins, size) matrix of the means over Fast R-CNN's integer bins of [start, start +
/// length): bin b covers pixels [floor(b L / bins), ceil((b + 1) L / bins)) + start, clipped to the
/// axis (an empty bin gives a row of zeros).
void append_pooling_weights(int64_t start, int64_t length, int64_t bins, int64_t size, std::vector<double>& out) {
  const size_t at = out.size();
  out.resize(at + static_cast<size_t>(bins * size), 0.0);
  const double bin = static_cast<double>(length) / static_cast<double>(bins);
  for (int64_t b = 0; b < bins; ++b) {
    const int64_t lo = std::clamp(static_cast<int64_t>(std::floor(static_cast<double>(b) * bin)) + start, int64_t{0}, size);
    const int64_t hi =
        std::clamp(static_cast<int64_t>(std::ceil(static_cast<double>(b + 1) * bin)) + start, int64_t{0}, size);
    double* row = out.data() + at + static_cast<size_t>(b * size);
    for (int64_t i = lo; i < hi; ++i) row[i] = 1.0 / static_cast<double>(hi - lo);
  }
}

}  // namespace

Variable roi_average_align_2d(const Variable& x, const Array& rois, const Array& roi_indices, const Shape& outsize,
                              double spatial_scale, std::optional<int64_t> sampling_ratio) {
  KUSARI_CHECK(!sampling_ratio || *sampling_ratio > 0, ValueError,
               "roi_average_align_2d: sampling_ratio must be positive (or absent: adaptive), got ",
               sampling_ratio.value_or(0));
  const int64_t h = x.ndim() == 4 ? x.shape()[2] : 0, w = x.ndim() == 4 ? x.shape()[3] : 0;
  const int64_t oh = outsize.size() == 2 ? outsize[0] : 1, ow = outsize.size() == 2 ? outsize[1] : 1;
  return roi_separable("roi_average_align_2d", x, rois, roi_indices, outsize, spatial_scale,
                       [&](const double* box, std::vector<double>& wy, std::vector<double>& wx) {
                         const double rh = std::max(box[2] - box[0], 1.0), rw = std::max(box[3] - box[1], 1.0);
                         const int64_t gh = sampling_ratio ? *sampling_ratio
                                                           : static_cast<int64_t>(std::ceil(rh / static_cast<double>(oh)));
                         const int64_t gw = sampling_ratio ? *sampling_ratio
                                                           : static_cast<int64_t>(std::ceil(rw / static_cast<double>(ow)));
                         append_bin_weights(box[0], rh, oh, gh, h, wy);
                         append_bin_weights(box[1], rw, ow, gw, w, wx);
                       });
}

Variable roi_average_pooling_2d(const Variable& x, const Array& rois, const Array& roi_indices, const Shape& outsize,
                                double spatial_scale) {
  const int64_t h = x.ndim() == 4 ? x.shape()[2] : 0, w = x.ndim() == 4 ? x.shape()[3] : 0;
  const int64_t oh = outsize.size() == 2 ? outsize[0] : 1, ow = outsize.size() == 2 ? outsize[1] : 1;
  return roi_separable("roi_average_pooling_2d", x, rois, roi_indices, outsize, spatial_scale,
                       [&](const double* box, std::vector<double>& wy, std::vector<double>& wx) {
                         // Fast R-CNN's rounding: the box's corners to whole pixels (half away from 0).
                         const auto y0 = static_cast<int64_t>(std::round(box[0]));
                         const auto x0 = static_cast<int64_t>(std::round(box[1]));
                         const int64_t rh = std::max<int64_t>(static_cast<int64_t>(std::round(box[2])) - y0, 1);
                         const int64_t rw = std::max<int64_t>(static_cast<int64_t>(std::round(box[3])) - x0, 1);
                         append_pooling_weights(y0, rh, oh, h, wy);
                         append_pooling_weights(x0, rw, ow, w, wx);
                       });
}

Array non_maximum_suppression(const Array& bbox, double thresh, const Array& score, std::optional<int64_t> limit,
                              const Array& label) {
  const char* fn = "non_maximum_suppression";
  KUSARI_CHECK(bbox.ndim() == 2 && bbox.shape()[1] == 4 && is_floating(bbox.dtype()), ShapeError, fn,
               ": bbox must be floating (R, 4) boxes (y_min, x_min, y_max, x_max), got ", bbox.dtype(), " ",
               bbox.shape());
  const int64_t r = bbox.shape()[0];
  const bool has_score = score.defined(), has_label = label.defined();
  KUSARI_CHECK(!has_score || (score.ndim() == 1 && score.shape()[0] == r), ShapeError, fn,
               ": score must be (R,) with R = ", r, " (the rows of bbox), got shape ", score.shape());
  KUSARI_CHECK(!has_label || (label.ndim() == 1 && label.shape()[0] == r && is_integral(label.dtype())), ShapeError, fn,
               ": label must be integer (R,) with R = ", r, " (the rows of bbox), got ", label.dtype(), " ", label.shape());
  KUSARI_CHECK(!std::isnan(thresh), ValueError, fn, ": thresh is NaN");
  KUSARI_CHECK(!limit || *limit >= 0, ValueError, fn, ": limit must be at least 0, got ", limit.value_or(0));
  const std::vector<double> boxes = bbox.astype(float64).to_device(Device::cpu()).to_vector<double>();
  std::vector<int64_t> order(static_cast<size_t>(r));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (has_score) {
    const std::vector<double> s = score.astype(float64).to_device(Device::cpu()).to_vector<double>();
    std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return s[static_cast<size_t>(i)] > s[static_cast<size_t>(j)]; });
  }
  std::vector<int64_t> classes;
  if (has_label) classes = label.astype(int64).to_device(Device::cpu()).to_vector<int64_t>();
  const auto area = [&](int64_t i) {
    const double* b = boxes.data() + 4 * i;
    return (b[2] - b[0]) * (b[3] - b[1]);
  };
  std::vector<int32_t> kept;
  for (int64_t i : order) {
    if (limit && static_cast<int64_t>(kept.size()) >= *limit) break;
    const double* bi = boxes.data() + 4 * i;
    bool suppressed = false;
    for (int32_t j : kept) {
      if (has_label && classes[static_cast<size_t>(i)] != classes[static_cast<size_t>(j)]) continue;
      const double* bj = boxes.data() + 4 * j;
      const double ih = std::min(bi[2], bj[2]) - std::max(bi[0], bj[0]);
      const double iw = std::min(bi[3], bj[3]) - std::max(bi[1], bj[1]);
      const double inter = ih > 0 && iw > 0 ? ih * iw : 0.0;
      if (inter / (area(i) + area(j) - inter) >= thresh) {
        suppressed = true;
        break;
      }
    }
    if (!suppressed) kept.push_back(static_cast<int32_t>(i));
  }
  return Array::from_vector(kept, Shape{static_cast<int64_t>(kept.size())}, bbox.device());
}

}  // namespace kusari::functions
