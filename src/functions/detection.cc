#include "kusari/functions/detection.h"

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

}  // namespace kusari::functions
