#include "kusari/core/shape.h"

#include <cstdint>
#include <sstream>

namespace kusari {

std::string Shape::to_string() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < n_; ++i) {
    if (i) os << ", ";
    os << d_[i];
  }
  if (n_ == 1) os << ",";
  os << ")";
  return os.str();
}

Strides contiguous_strides(const Shape& shape) {
  Strides s;
  s.resize(shape.size());
  // Saturating: only an array with a zero-length axis can have a product of the other lengths
  // beyond int64 (every other size is checked against memory first), and its strides never
  // address an element. Found by the IDX fuzzer: a header of shape (0, 4294967295, ...).
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    if (__builtin_mul_overflow(acc, std::max<int64_t>(shape[i], 1), &acc)) acc = INT64_MAX;
  }
  return s;
}

int normalize_axis(int64_t axis, int ndim, const char* fn) {
  KUSARI_CHECK(axis >= -ndim && axis < ndim, ValueError, fn, ": axis ", axis, " is out of range for an array of ",
               ndim, " dimension", ndim == 1 ? "" : "s", " (expected ", -ndim, " <= axis < ", ndim, ")");
  return static_cast<int>(axis < 0 ? axis + ndim : axis);
}

Axes normalize_axes(const Axes& axes, int ndim, const char* fn, bool empty_is_all) {
  Axes out;
  if (axes.empty() && empty_is_all) {
    for (int i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int64_t a : axes) out.push_back(normalize_axis(a, ndim, fn));
  std::sort(out.begin(), out.end());
  for (int i = 1; i < out.size(); ++i) {
    KUSARI_CHECK(out[i] != out[i - 1], ValueError, fn, ": axis ", out[i], " appears twice in ", axes);
  }
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* fn) {
  int n = std::max(a.size(), b.size());
  Shape out;
  out.resize(n);
  for (int i = 0; i < n; ++i) {
    int ia = i - (n - a.size());
    int ib = i - (n - b.size());
    int64_t da = ia >= 0 ? a[ia] : 1;
    int64_t db = ib >= 0 ? b[ib] : 1;
    KUSARI_CHECK(da == db || da == 1 || db == 1, ShapeError, fn, ": shapes ", a, " and ", b,
                 " cannot be broadcast together (axis ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace kusari
