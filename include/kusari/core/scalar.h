// A number of any dtype, passed by value to fills and scalar operations.
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

#include "kusari/core/dtype.h"

namespace kusari {

/// A scalar that remembers whether it was given as an integer, a float or a bool.
class Scalar {
 public:
  enum class Kind : int8_t { kBool, kInt, kFloat };

  Scalar() : kind_(Kind::kInt), i_(0) {}
  Scalar(bool v) : kind_(Kind::kBool), i_(v ? 1 : 0) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(Kind::kInt), i_(static_cast<int64_t>(v)) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(Kind::kFloat), f_(static_cast<double>(v)) {}  // NOLINT
  Scalar(Half v) : kind_(Kind::kFloat), f_(static_cast<float>(v)) {}      // NOLINT
  Scalar(BFloat16 v) : kind_(Kind::kFloat), f_(static_cast<float>(v)) {}  // NOLINT

  Kind kind() const { return kind_; }
  bool is_float() const { return kind_ == Kind::kFloat; }

  double to_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  int64_t to_int64() const { return kind_ == Kind::kFloat ? static_cast<int64_t>(f_) : i_; }

  /// The value converted to the C++ type T.
  template <typename T>
  T to() const {
    if constexpr (std::is_same_v<T, bool>) {
      return kind_ == Kind::kFloat ? f_ != 0.0 : i_ != 0;
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(to_int64());
    } else {
      return static_cast<T>(to_double());
    }
  }

  Scalar operator-() const { return kind_ == Kind::kFloat ? Scalar(-f_) : Scalar(-i_); }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double f_;
  };
};

inline std::ostream& operator<<(std::ostream& os, const Scalar& s) {
  if (s.kind() == Scalar::Kind::kFloat) return os << s.to_double();
  if (s.kind() == Scalar::Kind::kBool) return os << (s.to_int64() ? "true" : "false");
  return os << s.to_int64();
}

}  // namespace kusari
