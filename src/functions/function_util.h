// Helpers shared by the differentiable functions.
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/core/routines.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"

namespace kusari::functions::detail {

/// `shape` with the given (normalised) axes set to 1.
inline Shape keepdims_shape(const Shape& shape, const Axes& axes) {
  Shape s = shape;
  for (int64_t a : axes) s[static_cast<int>(a)] = 1;
  return s;
}

/// A 0-d zero of x's dtype and device, as a constant Variable.
inline Variable zero_like(const Variable& x) {
  return Variable(Array::zeros({}, x.dtype(), x.device()));
}

/// gy where cond holds, 0 elsewhere (cond is a constant mask; differentiable in gy).
inline Variable masked(const Variable& gy, const Array& cond) {
  return where(cond, gy, zero_like(gy));
}

/// Throws DtypeError naming `fn` unless x has a floating dtype.
inline void check_floating(const char* fn, const Variable& x) {
  KUSARI_CHECK(is_floating(x.dtype()), DtypeError, fn, ": expected a floating-point input, got ",
               dtype_name(x.dtype()));
}

/// gy where y > 0, else 0 (ReLU's gradient from its output y), differentiably in gy: its own
/// gradient is the same mask applied to the incoming gradient. One fused kernel.
Variable relu_grad(const Variable& gy, const Array& y);

}  // namespace kusari::functions::detail
