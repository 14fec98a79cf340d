// Differentiable arithmetic, elementwise math, reductions and matrix products (Chainer's
// F.math family). Binary functions broadcast like NumPy; the gradient of a broadcast operand is
// summed back to its shape.
#pragma once

#include <optional>

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

Variable add(const Variable& a, const Variable& b);
Variable sub(const Variable& a, const Variable& b);
Variable mul(const Variable& a, const Variable& b);
Variable div(const Variable& a, const Variable& b);
Variable add(const Variable& a, Scalar b);
Variable mul(const Variable& a, Scalar b);
/// b - a
Variable rsub(const Variable& a, Scalar b);
/// b / a
Variable rdiv(const Variable& a, Scalar b);
Variable neg(const Variable& x);
/// x ** p for a scalar exponent.
Variable pow(const Variable& x, Scalar p);
/// base ** x for a scalar base.
Variable pow(Scalar base, const Variable& x);
/// a ** b elementwise (a > 0 where b's gradient is needed).
Variable pow(const Variable& a, const Variable& b);
Variable abs(const Variable& x);
Variable exp(const Variable& x);
Variable log(const Variable& x);
Variable sqrt(const Variable& x);
Variable square(const Variable& x);
/// Elementwise maximum / minimum of two variables (the gradient goes to the larger / smaller).
Variable maximum(const Variable& a, const Variable& b);
Variable minimum(const Variable& a, const Variable& b);
/// Clips to [x_min, x_max]; the gradient passes where x is inside the interval.
Variable clip(const Variable& x, double x_min, double x_max);

/// Sum over axes (all when empty).
Variable sum(const Variable& x, const Axes& axes = {}, bool keepdims = false);
/// Mean over axes (all when empty).
Variable mean(const Variable& x, const Axes& axes = {}, bool keepdims = false);
/// Maximum over axes; the gradient goes to the (first) maximal elements.
Variable max(const Variable& x, const Axes& axes = {}, bool keepdims = false);
Variable min(const Variable& x, const Axes& axes = {}, bool keepdims = false);
/// log(sum(exp(x))) over axes (all when empty), computed stably; the gradient is softmax(x).
Variable logsumexp(const Variable& x, const Axes& axes = {}, bool keepdims = false);
/// Sums x down to `shape` (the adjoint of broadcast_to).
Variable sum_to(const Variable& x, const Shape& shape);
/// Matrix product (NumPy matmul semantics, batched over leading axes); optional transposes.
Variable matmul(const Variable& a, const Variable& b, bool transa = false, bool transb = false);

}  // namespace kusari::functions

namespace kusari {

// Operators on Variables (found by argument-dependent lookup).
Variable operator+(const Variable& a, const Variable& b);
Variable operator-(const Variable& a, const Variable& b);
Variable operator*(const Variable& a, const Variable& b);
Variable operator/(const Variable& a, const Variable& b);
Variable operator-(const Variable& x);
Variable operator+(const Variable& a, Scalar b);
Variable operator-(const Variable& a, Scalar b);
Variable operator*(const Variable& a, Scalar b);
Variable operator/(const Variable& a, Scalar b);
Variable operator+(Scalar a, const Variable& b);
Variable operator-(Scalar a, const Variable& b);
Variable operator*(Scalar a, const Variable& b);
Variable operator/(Scalar a, const Variable& b);

}  // namespace kusari
