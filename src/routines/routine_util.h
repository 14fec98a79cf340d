// Checks shared by the routines of every family (src/routines/*.cc).
#pragma once

#include "kusari/core/array.h"
#include "kusari/core/error.h"
#include "kusari/core/scalar.h"

namespace kusari::routines {

/// Throws ValueError naming `fn` when x is undefined (default-constructed).
inline void check_defined(const char* fn, const Array& x) {
  KUSARI_CHECK(x.defined(), ValueError, fn, ": the array is undefined (default-constructed)");
}

/// A scalar combined with an integer array must be an integer (no silent truncation).
inline void check_scalar_kind(const char* fn, const Array& x, Scalar s) {
  KUSARI_CHECK(is_floating(x.dtype()) || !s.is_float(), DtypeError, fn, ": cannot combine a ", dtype_name(x.dtype()),
               " array with the floating-point scalar ", s, "; convert the array with astype() first");
}

}  // namespace kusari::routines
