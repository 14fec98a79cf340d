// Checks shared by the routines of every family (src/routines/*.cc).
#pragma once

#include <initializer_list>

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

/// The memory format of an elementwise output of `shape` (Note [Memory formats]): channels-last
/// when the shape is 4-d and every operand of that full shape is channels-last (broadcast
/// operands, of another shape or with a zero stride, do not vote), else contiguous.
inline MemoryFormat output_format(const Shape& shape, std::initializer_list<const Array*> operands) {
  if (shape.size() != 4) return MemoryFormat::kContiguous;
  bool any = false;
  for (const Array* a : operands) {
    if (a->shape() != shape) continue;
    bool broadcast = false;
    for (int d = 0; d < 4; ++d) broadcast = broadcast || (a->strides()[d] == 0 && shape[d] > 1);
    if (broadcast) continue;
    if (a->memory_format() != MemoryFormat::kChannelsLast) return MemoryFormat::kContiguous;
    any = true;
  }
  return any ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
}

}  // namespace kusari::routines
