// Float and double overloads of the C library's math, callable from host and device code, so
// that templated kernel code calls expf for float (not exp on a promoted double) on both
// backends. See Note [Shared backend code].
#pragma once

#include <cmath>
#include <type_traits>

#include "backends/common/host_device.h"

namespace kusari::common::math {

#define KUSARI_COMMON_MATH_1(name)                                           \
  KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE float name(float v) { return ::name##f(v); } \
  KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE double name(double v) { return ::name(v); }
KUSARI_COMMON_MATH_1(exp)
KUSARI_COMMON_MATH_1(log)
KUSARI_COMMON_MATH_1(log1p)
KUSARI_COMMON_MATH_1(expm1)
KUSARI_COMMON_MATH_1(sqrt)
KUSARI_COMMON_MATH_1(sin)
KUSARI_COMMON_MATH_1(cos)
KUSARI_COMMON_MATH_1(tanh)
KUSARI_COMMON_MATH_1(floor)
KUSARI_COMMON_MATH_1(ceil)
KUSARI_COMMON_MATH_1(erf)
KUSARI_COMMON_MATH_1(fabs)
#undef KUSARI_COMMON_MATH_1
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE float pow(float a, float b) { return ::powf(a, b); }
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE double pow(double a, double b) { return ::pow(a, b); }

/// v < 0, without a warning for unsigned types.
template <typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE bool negative(C v) {
  if constexpr (std::is_unsigned_v<C> || std::is_same_v<C, bool>) {
    return false;
  } else {
    return v < C(0);
  }
}
template <typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE bool isnan(C v) {
  return v != v;
}
template <typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE bool isinf(C v) {
  return !(v != v) && math::fabs(v) == static_cast<C>(INFINITY);
}
template <typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE bool isfinite(C v) {
  return !math::isnan(v) && !math::isinf(v);
}

}  // namespace kusari::common::math
