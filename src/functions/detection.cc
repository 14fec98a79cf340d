#include "kusari/functions/detection.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
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

/// The checked arguments of a RoI function: x's geometry, the output size and the RoIs' boxes
/// scaled to x's pixels, with their images.
struct RoiBatch {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0, r = 0;
  std::vector<double> boxes;    // (r, 4), scaled by spatial_scale
  std::vector<int64_t> images;  // (r,)
};

RoiBatch check_rois(const char* fn, const Variable& x, const Array& rois, const Array& roi_indices,
                    const Shape& outsize, double spatial_scale) {
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
  RoiBatch b;
  b.n = x.shape()[0], b.c = x.shape()[1], b.h = x.shape()[2], b.w = x.shape()[3];
  b.oh = outsize[0], b.ow = outsize[1], b.r = rois.shape()[0];
  KUSARI_CHECK(b.h > 0 && b.w > 0, ValueError, fn, ": x ", x.shape(), " has no pixels to sample");
  if (b.r == 0) return b;
  b.boxes = rois.astype(float64).to_device(Device::cpu()).to_vector<double>();
  b.images = roi_indices.astype(int64).to_device(Device::cpu()).to_vector<int64_t>();
  for (int64_t i = 0; i < b.r; ++i) {
    KUSARI_CHECK(b.images[static_cast<size_t>(i)] >= 0 && b.images[static_cast<size_t>(i)] < b.n,
                 IndexError, fn, ": roi_indices[", i, "] is ", b.images[static_cast<size_t>(i)],
                 " but x holds ", b.n, " images");
    for (int k = 0; k < 4; ++k) {
      double& v = b.boxes[static_cast<size_t>(4 * i + k)];
      KUSARI_CHECK(std::isfinite(v), ValueError, fn, ": rois[", i, "] is not finite");
      v *= spatial_scale;
    }
  }
  return b;
}

/// Calls f(first, end) for each run [first, end) of consecutive RoIs of one image.
template <typename F>
void for_each_image_run(const RoiBatch& b, F&& f) {
  for (int64_t first = 0; first < b.r;) {
    int64_t end = first;
    while (end < b.r && b.images[static_cast<size_t>(end)] == b.images[static_cast<size_t>(first)])
      ++end;
    f(first, end);
    first = end;
  }
}

/// (k rows_y, H) @ x[image] (C, H, W) @ (k, 1, rows_x, W)^T: the (k, C, rows_y, rows_x) products
/// of Note [RoI Align as two products] for a run of k RoIs of one image.
Variable two_products(const Variable& x, int64_t image, int64_t k, const std::vector<double>& wy,
                      int64_t rows_y, const std::vector<double>& wx, int64_t rows_x) {
  const int64_t c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const Variable wy_v(Array::from_vector(wy, Shape{k * rows_y, h}, x.device()).astype(x.dtype()));
  const Variable wx_v(Array::from_vector(wx, Shape{k, 1, rows_x, w}, x.device()).astype(x.dtype()));
  // (k rows_y, H) @ (C, H, W) -> (C, k rows_y, W) -> (k, C, rows_y, W) @ (k, 1, W, rows_x)
  Variable t = matmul(wy_v, get_item(x, {Index(image)}));
  t = transpose(reshape(t, {c, k, rows_y, w}), {1, 0, 2, 3});
  return matmul(t, wx_v, false, true);
}

/// A RoI function of the form Wy X Wx^T (Note [RoI Align as two products]): checks the
/// arguments, then runs one pair of products per run of RoIs of the same image. `weights(box, wy,
/// wx)` appends the RoI's (out_h, H) and (out_w, W) matrices for a box already scaled to x's
/// pixels.
Variable roi_separable(const char* fn, const Variable& x, const Array& rois,
                       const Array& roi_indices, const Shape& outsize, double spatial_scale,
                       const std::function<void(const double* box, std::vector<double>& wy,
                                                std::vector<double>& wx)>& weights) {
  const RoiBatch b = check_rois(fn, x, rois, roi_indices, outsize, spatial_scale);
  if (b.r == 0) return Variable(Array::zeros({0, b.c, b.oh, b.ow}, x.dtype(), x.device()));
  std::vector<Variable> parts;
  for_each_image_run(b, [&](int64_t first, int64_t end) {
    std::vector<double> wy, wx;
    for (int64_t i = first; i < end; ++i) weights(b.boxes.data() + 4 * i, wy, wx);
    const int64_t k = end - first;
    KUSARI_ASSERT(static_cast<int64_t>(wy.size()) == k * b.oh * b.h &&
                  static_cast<int64_t>(wx.size()) == k * b.ow * b.w);
    parts.push_back(two_products(x, b.images[static_cast<size_t>(first)], k, wy, b.oh, wx, b.ow));
  });
  return parts.size() == 1 ? parts[0] : concat(parts, 0);
}

/// The samples of one axis of one RoI for a max RoI function (Note [RoI max functions]): for each
/// of `bins` bins, `count` rows of weights over the axis's `size` pixels, each valid or not.
struct AxisSamples {
  int64_t count = 0;
  std::vector<double> rows;    // (bins, count, size)
  std::vector<uint8_t> valid;  // (bins, count)
};

// Note [RoI max functions]
// roi_max_align_2d and roi_max_pooling_2d take, per bin, the maximum of a set of samples that is
// separable: sample (i, j) of a bin is row i of the bin's y samples and row j of its x samples
// (a bilinear interpolation's weights, or one pixel's indicator), and it is valid when both rows
// are. So all samples of a run of RoIs come from the two products of Note [RoI Align as two
// products] with the sample rows in place of the bins' means: (k, C, out_h * Gy, out_w * Gx),
// Gy and Gx the run's largest sample counts per bin (a RoI with fewer has invalid rows added).
// The output is the first valid maximum of each bin (Chainer's argmax) picked by a one-hot array:
// out = sum(samples * onehot), so the gradient reaches x through that sample alone, as Chainer's
// kernels route it. A bin without a valid sample is 0.
using MaxSampler = std::function<void(const double* box, AxisSamples& y, AxisSamples& x)>;

/// Appends the run's padded rows of one axis: (k, bins, g, size) weights and (k, bins, g) validity.
void pad_samples(const std::vector<AxisSamples>& per_roi, int64_t bins, int64_t g, int64_t size,
                 std::vector<double>& rows, std::vector<uint8_t>& valid) {
  for (const AxisSamples& s : per_roi) {
    for (int64_t b = 0; b < bins; ++b) {
      for (int64_t i = 0; i < g; ++i) {
        const bool real = i < s.count;
        const size_t src = static_cast<size_t>((b * s.count + i) * size);
        for (int64_t p = 0; p < size; ++p)
          rows.push_back(real ? s.rows[src + static_cast<size_t>(p)] : 0.0);
        valid.push_back(real ? s.valid[static_cast<size_t>(b * s.count + i)] : 0);
      }
    }
  }
}

Variable roi_separable_max(const char* fn, const Variable& x, const Array& rois,
                           const Array& roi_indices, const Shape& outsize, double spatial_scale,
                           const MaxSampler& sampler) {
  const RoiBatch b = check_rois(fn, x, rois, roi_indices, outsize, spatial_scale);
  if (b.r == 0) return Variable(Array::zeros({0, b.c, b.oh, b.ow}, x.dtype(), x.device()));
  std::vector<Variable> parts;
  for_each_image_run(b, [&](int64_t first, int64_t end) {
    const int64_t k = end - first;
    std::vector<AxisSamples> ys(static_cast<size_t>(k)), xs(static_cast<size_t>(k));
    int64_t gy = 1, gx = 1;
    for (int64_t i = 0; i < k; ++i) {
      sampler(b.boxes.data() + 4 * (first + i), ys[static_cast<size_t>(i)],
              xs[static_cast<size_t>(i)]);
      gy = std::max(gy, ys[static_cast<size_t>(i)].count);
      gx = std::max(gx, xs[static_cast<size_t>(i)].count);
    }
    std::vector<double> wy, wx;
    std::vector<uint8_t> vy, vx;
    pad_samples(ys, b.oh, gy, b.h, wy, vy);
    pad_samples(xs, b.ow, gx, b.w, wx, vx);
    // (k, C, oh gy, ow gx) -> (k, C, oh, ow, gy gx)
    Variable s =
        two_products(x, b.images[static_cast<size_t>(first)], k, wy, b.oh * gy, wx, b.ow * gx);
    s = reshape(transpose(reshape(s, {k, b.c, b.oh, gy, b.ow, gx}), {0, 1, 2, 4, 3, 5}),
                {k, b.c, b.oh, b.ow, gy * gx});
    // The validity of each sample, (k, 1, oh, ow, gy gx).
    const Array valid_y = Array::from_vector(std::vector<int32_t>(vy.begin(), vy.end()),
                                             Shape{k, 1, b.oh, 1, gy, 1}, x.device());
    const Array valid_x = Array::from_vector(std::vector<int32_t>(vx.begin(), vx.end()),
                                             Shape{k, 1, 1, b.ow, 1, gx}, x.device());
    const Array valid =
        kusari::logical_and(kusari::not_equal(valid_y, 0), kusari::not_equal(valid_x, 0))
            .reshape({k, 1, b.oh, b.ow, gy * gx});
    const Shape full{k, b.c, b.oh, b.ow, gy * gx};
    const Array candidates = kusari::where(valid.broadcast_to(full), s.data(),
                                           Scalar(-std::numeric_limits<double>::infinity()));
    const Array first_max = kusari::argmax(candidates, 4, true);  // (k, C, oh, ow, 1)
    const Array positions =
        Array::arange(gy * gx, int64, x.device()).reshape({1, 1, 1, 1, gy * gx});
    const Array onehot =
        kusari::logical_and(
            kusari::equal(positions.broadcast_to(full), first_max.astype(int64).broadcast_to(full)),
            valid.broadcast_to(full))
            .astype(x.dtype());
    parts.push_back(sum(mul(s, Variable(onehot)), {4}));
  });
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

namespace {

/// The bilinear samples of one axis for roi_max_align_2d: `count` per bin.
void align_samples(double start, double length, int64_t bins, int64_t count, int64_t size,
                   AxisSamples& out) {
  out.count = count;
  out.rows.assign(static_cast<size_t>(bins * count * size), 0.0);
  out.valid.assign(static_cast<size_t>(bins * count), 0);
  const double bin = length / static_cast<double>(bins);
  for (int64_t b = 0; b < bins; ++b) {
    for (int64_t g = 0; g < count; ++g) {
      const double v = start + static_cast<double>(b) * bin +
                       (static_cast<double>(g) + 0.5) * bin / static_cast<double>(count);
      const size_t at = static_cast<size_t>(b * count + g);
      out.valid[at] = v >= -1.0 && v <= static_cast<double>(size);
      add_sample_weights(v, size, 1.0, out.rows.data() + at * static_cast<size_t>(size));
    }
  }
}

/// The pixels of one axis for RoI max pooling: bin b holds the pixels [floor(b L / bins),
/// ceil((b + 1) L / bins)) + start clipped to the axis, as indicator rows; `count` is the RoI's
/// largest bin.
void pooling_samples(int64_t start, int64_t length, int64_t bins, int64_t size, AxisSamples& out) {
  const double bin = static_cast<double>(length) / static_cast<double>(bins);
  std::vector<std::pair<int64_t, int64_t>> spans;
  int64_t count = 1;
  for (int64_t b = 0; b < bins; ++b) {
    const int64_t lo = std::clamp(
        static_cast<int64_t>(std::floor(static_cast<double>(b) * bin)) + start, int64_t{0}, size);
    const int64_t hi =
        std::clamp(static_cast<int64_t>(std::ceil(static_cast<double>(b + 1) * bin)) + start,
                   int64_t{0}, size);
    spans.emplace_back(lo, hi);
    count = std::max(count, hi - lo);
  }
  out.count = count;
  out.rows.assign(static_cast<size_t>(bins * count * size), 0.0);
  out.valid.assign(static_cast<size_t>(bins * count), 0);
  for (int64_t b = 0; b < bins; ++b) {
    const auto [lo, hi] = spans[static_cast<size_t>(b)];
    for (int64_t p = lo; p < hi; ++p) {
      const size_t at = static_cast<size_t>(b * count + (p - lo));
      out.valid[at] = 1;
      out.rows[at * static_cast<size_t>(size) + static_cast<size_t>(p)] = 1.0;
    }
  }
}

/// The RoI max pooling sampler; `inclusive` counts both corner pixels (roi_pooling_2d).
MaxSampler pooling_sampler(const Variable& x, const Shape& outsize, bool inclusive) {
  const int64_t h = x.ndim() == 4 ? x.shape()[2] : 0, w = x.ndim() == 4 ? x.shape()[3] : 0;
  const int64_t oh = outsize.size() == 2 ? outsize[0] : 1,
                ow = outsize.size() == 2 ? outsize[1] : 1;
  const int64_t extra = inclusive ? 1 : 0;
  return [=](const double* box, AxisSamples& ys, AxisSamples& xs) {
    // Fast R-CNN's rounding: the box's corners to whole pixels (half away from 0).
    const auto y0 = static_cast<int64_t>(std::round(box[0]));
    const auto x0 = static_cast<int64_t>(std::round(box[1]));
    const int64_t rh = std::max<int64_t>(static_cast<int64_t>(std::round(box[2])) - y0 + extra, 1);
    const int64_t rw = std::max<int64_t>(static_cast<int64_t>(std::round(box[3])) - x0 + extra, 1);
    pooling_samples(y0, rh, oh, h, ys);
    pooling_samples(x0, rw, ow, w, xs);
  };
}

}  // namespace

Variable roi_max_align_2d(const Variable& x, const Array& rois, const Array& roi_indices,
                          const Shape& outsize, double spatial_scale,
                          std::optional<int64_t> sampling_ratio) {
  KUSARI_CHECK(!sampling_ratio || *sampling_ratio > 0, ValueError,
               "roi_max_align_2d: sampling_ratio must be positive (or absent: adaptive), got ",
               sampling_ratio.value_or(0));
  const int64_t h = x.ndim() == 4 ? x.shape()[2] : 0, w = x.ndim() == 4 ? x.shape()[3] : 0;
  const int64_t oh = outsize.size() == 2 ? outsize[0] : 1,
                ow = outsize.size() == 2 ? outsize[1] : 1;
  return roi_separable_max(
      "roi_max_align_2d", x, rois, roi_indices, outsize, spatial_scale,
      [&](const double* box, AxisSamples& ys, AxisSamples& xs) {
        const double rh = std::max(box[2] - box[0], 1.0), rw = std::max(box[3] - box[1], 1.0);
        const int64_t gh = sampling_ratio
                               ? *sampling_ratio
                               : static_cast<int64_t>(std::ceil(rh / static_cast<double>(oh)));
        const int64_t gw = sampling_ratio
                               ? *sampling_ratio
                               : static_cast<int64_t>(std::ceil(rw / static_cast<double>(ow)));
        align_samples(box[0], rh, oh, gh, h, ys);
        align_samples(box[1], rw, ow, gw, w, xs);
      });
}

Variable roi_max_pooling_2d(const Variable& x, const Array& rois, const Array& roi_indices,
                            const Shape& outsize, double spatial_scale) {
  return roi_separable_max("roi_max_pooling_2d", x, rois, roi_indices, outsize, spatial_scale,
                           pooling_sampler(x, outsize, false));
}

Variable roi_pooling_2d(const Variable& x, const Array& rois, int64_t outh, int64_t outw,
                        double spatial_scale) {
  KUSARI_CHECK(rois.ndim() == 2 && rois.shape()[1] == 5 && is_floating(rois.dtype()), ShapeError,
               "roi_pooling_2d: rois must be floating (R, 5) rows (image index, x_min, y_min, "
               "x_max, y_max), got ",
               rois.dtype(), " ", rois.shape());
  // (image, x_min, y_min, x_max, y_max) -> boxes (y_min, x_min, y_max, x_max) and indices
  const Array host = rois.astype(float64).to_device(Device::cpu());
  const Array boxes =
      kusari::take(host, Array::from_vector(std::vector<int64_t>{2, 1, 4, 3}, Shape{4}), 1);
  const Array images = host.at({Slice(), Index(0)}).astype(int64);
  return roi_separable_max("roi_pooling_2d", x, boxes, images, Shape{outh, outw}, spatial_scale,
                           pooling_sampler(x, Shape{outh, outw}, true));
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
