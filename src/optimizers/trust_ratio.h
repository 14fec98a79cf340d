// Helpers of LARS and LAMB (Note [LARS and LAMB] in lars.cc): norms and trust ratios as 0-d
// arrays on the parameter's device.
#pragma once

#include "kusari/core/array.h"
#include "kusari/core/routines.h"

namespace kusari::optimizers::detail {

/// The L2 norm of `a` over all its elements, a 0-d array of a's dtype on a's device.
inline Array l2_norm(const Array& a) { return sqrt(sum(a * a)); }

/// `ratio` where both norms are positive, else 1 (a 0-d array like `ratio`).
inline Array trust_ratio(const Array& numerator_norm, const Array& denominator_norm,
                         const Array& ratio) {
  const Array both = logical_and(greater(numerator_norm, 0.0), greater(denominator_norm, 0.0));
  return where(both, ratio, 1.0);
}

}  // namespace kusari::optimizers::detail
