// Kernels: elementwise ops of one and two operands, where, and the fused ReLU gradient.
// See Note [Kernel families].
#pragma once

#include "kernels/kernel.h"
#include "kusari/core/array.h"
#include "kusari/core/op_types.h"

namespace kusari::kernels {

/// out = op(x; p0, p1); out has x's shape (bool for the predicates).
inline constinit Kernel<void(UnaryOp op, const Array& x, Array& out, double p0, double p1)> unary{"unary"};
/// out = op(a, b); a and b are views with out's shape (broadcast axes have stride 0).
inline constinit Kernel<void(BinaryOp op, const Array& a, const Array& b, Array& out)> binary{"binary"};
/// out = cond ? a : b; cond is bool; all views of out's shape.
inline constinit Kernel<void(const Array& cond, const Array& a, const Array& b, Array& out)> where{"where"};
/// out = gy where y > 0, else 0, in one pass (the gradient of relu through its output y). gy
/// and y are views of out's shape with out's dtype. May decline (Note [Kernel families]); the
/// routine relu_grad then computes where(y > 0, gy, 0).
inline constinit Kernel<bool(const Array& gy, const Array& y, Array& out)> relu_grad{"relu_grad"};

}  // namespace kusari::kernels
