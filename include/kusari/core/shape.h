// Shapes and strides: small vectors of int64 stored inline (no heap), at most kMaxNdim entries.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "kusari/core/error.h"

namespace kusari {

/// The most dimensions an Array can have.
inline constexpr int kMaxNdim = 8;

/// A list of at most kMaxNdim int64 values; used for shapes, strides and axis lists.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }
  template <typename It>
  Shape(It first, It last) {
    assign(first, last);
  }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  int64_t* begin() { return d_.data(); }
  int64_t* end() { return d_.data() + n_; }
  const int64_t* data() const { return d_.data(); }
  int64_t back() const { return d_[n_ - 1]; }

  void push_back(int64_t v) {
    KUSARI_CHECK(n_ < kMaxNdim, ShapeError, "shape: more than ", kMaxNdim, " dimensions are not supported");
    d_[n_++] = v;
  }
  void pop_back() { --n_; }
  void resize(int n, int64_t v = 0) {
    KUSARI_CHECK(n >= 0 && n <= kMaxNdim, ShapeError, "shape: ", n, " dimensions are not supported (max ",
                 kMaxNdim, ")");
    for (int i = n_; i < n; ++i) d_[i] = v;
    n_ = static_cast<int8_t>(n);
  }
  void insert(int pos, int64_t v) {
    push_back(0);
    for (int i = n_ - 1; i > pos; --i) d_[i] = d_[i - 1];
    d_[pos] = v;
  }
  void erase(int pos) {
    for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
    --n_;
  }

  /// Product of the entries (1 for an empty shape; 0 when an entry is 0, however large the
  /// others are).
  int64_t numel() const {
    for (int i = 0; i < n_; ++i) {
      if (d_[i] == 0) return 0;
    }
    int64_t p = 1;
    for (int i = 0; i < n_; ++i) p *= d_[i];
    return p;
  }

  std::vector<int64_t> to_vector() const { return std::vector<int64_t>(begin(), end()); }
  std::string to_string() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  template <typename It>
  void assign(It first, It last) {
    n_ = 0;
    for (; first != last; ++first) push_back(static_cast<int64_t>(*first));
  }

  std::array<int64_t, kMaxNdim> d_{};
  int8_t n_ = 0;
};

/// Strides, in elements (not bytes), one per dimension.
using Strides = Shape;

/// A list of axes.
using Axes = Shape;

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.to_string(); }

/// C-order (row-major) strides of a contiguous array of `shape`.
Strides contiguous_strides(const Shape& shape);

/// Maps a possibly negative axis into [0, ndim); throws ValueError naming `fn` when out of range.
int normalize_axis(int64_t axis, int ndim, const char* fn);

/// Normalises, sorts and checks for duplicates; an empty list means "all axes" when `empty_is_all`.
Axes normalize_axes(const Axes& axes, int ndim, const char* fn, bool empty_is_all);

/// The NumPy broadcast of two shapes; throws ShapeError naming `fn`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* fn);

}  // namespace kusari
