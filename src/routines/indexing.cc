#include "kusari/core/routines.h"

#include <algorithm>

#include "kernels/creation.h"
#include "kernels/indexing.h"
#include "routines/routine_util.h"

namespace kusari {

using routines::check_defined;

// --- joining, splitting, indexing ----------------------------------------------------------------

namespace {

Array slice_along(const Array& x, int axis, int64_t begin, int64_t end) {
  Shape s = x.shape();
  s[axis] = end - begin;
  return x.as_strided(s, x.strides(), x.offset() + begin * x.strides()[axis]);
}

}  // namespace

Array concatenate(const std::vector<Array>& xs, int axis_in) {
  KUSARI_CHECK(!xs.empty(), ValueError, "concatenate: need at least one array");
  const Array& first = xs[0];
  const int axis = normalize_axis(axis_in, first.ndim(), "concatenate");
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Array& x = xs[i];
    check_defined("concatenate", x);
    check_same_device("concatenate", {&first, &x});
    check_same_dtype("concatenate", {&first, &x});
    KUSARI_CHECK(x.ndim() == first.ndim(), ShapeError, "concatenate: array ", i, " has shape ", x.shape(),
                 " but array 0 has shape ", first.shape(), " (dimension counts differ)");
    for (int d = 0; d < x.ndim(); ++d) {
      KUSARI_CHECK(d == axis || x.shape()[d] == first.shape()[d], ShapeError, "concatenate: array ", i,
                   " has shape ", x.shape(), " but array 0 has shape ", first.shape(), "; only axis ", axis,
                   " may differ");
    }
    total += x.shape()[axis];
  }
  Shape s = first.shape();
  s[axis] = total;
  Array out = Array::empty(s, first.dtype(), first.device());
  int64_t at = 0;
  for (const Array& x : xs) {
    const int64_t n = x.shape()[axis];
    if (n > 0 && x.size() > 0) {
      Array dst = slice_along(out, axis, at, at + n);
      kernels::copy(out.device(), x, dst);
    }
    at += n;
  }
  return out;
}

Array stack(const std::vector<Array>& xs, int axis) {
  KUSARI_CHECK(!xs.empty(), ValueError, "stack: need at least one array");
  const int ax = normalize_axis(axis, xs[0].ndim() + 1, "stack");
  std::vector<Array> expanded;
  expanded.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    KUSARI_CHECK(xs[i].shape() == xs[0].shape(), ShapeError, "stack: array ", i, " has shape ", xs[i].shape(),
                 " but array 0 has shape ", xs[0].shape(), "; all must match");
    expanded.push_back(xs[i].expand_dims(ax));
  }
  return concatenate(expanded, ax);
}

std::vector<Array> split(const Array& x, int64_t sections, int axis_in) {
  const int axis = normalize_axis(axis_in, x.ndim(), "split");
  KUSARI_CHECK(sections > 0, ValueError, "split: the number of sections must be positive, got ", sections);
  const int64_t len = x.shape()[axis];
  KUSARI_CHECK(len % sections == 0, ValueError, "split: axis ", axis, " of length ", len,
               " does not divide into ", sections, " equal sections");
  std::vector<int64_t> idx;
  for (int64_t i = 1; i < sections; ++i) idx.push_back(i * (len / sections));
  return split_at(x, idx, axis);
}

std::vector<Array> split_at(const Array& x, const std::vector<int64_t>& indices, int axis_in) {
  const int axis = normalize_axis(axis_in, x.ndim(), "split");
  const int64_t len = x.shape()[axis];
  std::vector<Array> out;
  int64_t prev = 0;
  for (size_t i = 0; i <= indices.size(); ++i) {
    int64_t end = i < indices.size() ? std::clamp<int64_t>(indices[i], 0, len) : len;
    end = std::max(end, prev);
    out.push_back(slice_along(x, axis, prev, end));
    prev = end;
  }
  return out;
}

Array take(const Array& x, const Array& indices, int axis_in) {
  check_defined("take", x);
  check_same_device("take", {&x, &indices});
  KUSARI_CHECK(indices.dtype() == Dtype::kInt32 || indices.dtype() == Dtype::kInt64, DtypeError,
               "take: indices must be int32 or int64, got ", dtype_name(indices.dtype()));
  const int axis = normalize_axis(axis_in, x.ndim(), "take");
  Shape s;
  for (int d = 0; d < axis; ++d) s.push_back(x.shape()[d]);
  for (int64_t d : indices.shape()) s.push_back(d);
  for (int d = axis + 1; d < x.ndim(); ++d) s.push_back(x.shape()[d]);
  Array out = Array::empty(s, x.dtype(), x.device());
  if (out.size() > 0) kernels::take(x.device(), x, indices, axis, out);
  return out;
}

Array add_at_zeros(const Shape& shape, const Array& indices, int axis_in, const Array& values) {
  check_same_device("add_at", {&indices, &values});
  const int axis = normalize_axis(axis_in, shape.size(), "add_at");
  Array out = Array::zeros(shape, values.dtype(), values.device());
  Shape expected;
  for (int d = 0; d < axis; ++d) expected.push_back(shape[d]);
  for (int64_t d : indices.shape()) expected.push_back(d);
  for (int d = axis + 1; d < shape.size(); ++d) expected.push_back(shape[d]);
  KUSARI_CHECK(values.shape() == expected, ShapeError, "add_at: values of shape ", values.shape(),
               " do not match the expected ", expected);
  if (values.size() > 0) kernels::add_at(values.device(), out, indices, axis, values);
  return out;
}

}  // namespace kusari
