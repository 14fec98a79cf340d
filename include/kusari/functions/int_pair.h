// IntPair: the "int or pair of ints" argument of Chainer's 2-d functions (ksize, stride, pad, ...).
#pragma once

#include <cstdint>
#include <ostream>

namespace kusari::functions {

/// A (height, width) pair of integers that also accepts one integer for both axes, like Chainer's
/// `int or (int, int)` arguments: `stride = 2` means {2, 2}, `stride = {2, 1}` strides rows by 2.
struct IntPair {
  /// The value along the height axis (axis 2 of NCHW).
  int64_t h = 0;
  /// The value along the width axis (axis 3 of NCHW).
  int64_t w = 0;

  /// The same value for both axes.
  IntPair(int64_t both) : h(both), w(both) {}  // NOLINT: implicit, so that `stride = 2` reads well
  /// Separate values for height and width.
  IntPair(int64_t h_, int64_t w_) : h(h_), w(w_) {}

  /// Equal when both values are.
  bool operator==(const IntPair&) const = default;
};

/// Prints "(h, w)".
inline std::ostream& operator<<(std::ostream& os, const IntPair& p) {
  return os << "(" << p.h << ", " << p.w << ")";
}

}  // namespace kusari::functions
