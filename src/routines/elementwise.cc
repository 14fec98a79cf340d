#include "kusari/core/routines.h"

#include "backends/common/scalar_ops.h"
#include "kernels/elementwise.h"
#include "routines/routine_util.h"

namespace kusari {

using routines::check_defined;
using routines::check_scalar_kind;

namespace {

using common::unary_op_needs_float;

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::kIdentity: return "identity";
    case UnaryOp::kNeg: return "negative";
    case UnaryOp::kAbs: return "abs";
    case UnaryOp::kSign: return "sign";
    case UnaryOp::kExp: return "exp";
    case UnaryOp::kLog: return "log";
    case UnaryOp::kLog1p: return "log1p";
    case UnaryOp::kExpm1: return "expm1";
    case UnaryOp::kSqrt: return "sqrt";
    case UnaryOp::kRsqrt: return "rsqrt";
    case UnaryOp::kSquare: return "square";
    case UnaryOp::kReciprocal: return "reciprocal";
    case UnaryOp::kSin: return "sin";
    case UnaryOp::kCos: return "cos";
    case UnaryOp::kTanh: return "tanh";
    case UnaryOp::kSigmoid: return "sigmoid";
    case UnaryOp::kRelu: return "relu";
    case UnaryOp::kFloor: return "floor";
    case UnaryOp::kCeil: return "ceil";
    case UnaryOp::kErf: return "erf";
    case UnaryOp::kSoftplus: return "softplus";
    case UnaryOp::kLeakyRelu: return "leaky_relu";
    case UnaryOp::kElu: return "elu";
    case UnaryOp::kGelu: return "gelu";
    case UnaryOp::kGeluTanh: return "gelu";
    case UnaryOp::kSilu: return "silu";
    case UnaryOp::kGeluDerivative: return "gelu_derivative";
    case UnaryOp::kGeluTanhDerivative: return "gelu_derivative";
    case UnaryOp::kSiluDerivative: return "silu_derivative";
    case UnaryOp::kAddScalar: return "add";
    case UnaryOp::kMulScalar: return "multiply";
    case UnaryOp::kRSubScalar: return "subtract";
    case UnaryOp::kRDivScalar: return "divide";
    case UnaryOp::kPowScalar: return "power";
    case UnaryOp::kRPowScalar: return "power";
    case UnaryOp::kMaxScalar: return "maximum";
    case UnaryOp::kMinScalar: return "minimum";
    case UnaryOp::kClip: return "clip";
    case UnaryOp::kEqScalar: return "equal";
    case UnaryOp::kNeScalar: return "not_equal";
    case UnaryOp::kLtScalar: return "less";
    case UnaryOp::kLeScalar: return "less_equal";
    case UnaryOp::kGtScalar: return "greater";
    case UnaryOp::kGeScalar: return "greater_equal";
    case UnaryOp::kIsNan: return "isnan";
    case UnaryOp::kIsInf: return "isinf";
    case UnaryOp::kIsFinite: return "isfinite";
    case UnaryOp::kLogicalNot: return "logical_not";
  }
  return "unary";
}

bool unary_op_is_arithmetic(UnaryOp op) {
  return !unary_op_is_predicate(op) && op != UnaryOp::kIdentity;
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "add";
    case BinaryOp::kSub: return "subtract";
    case BinaryOp::kMul: return "multiply";
    case BinaryOp::kDiv: return "divide";
    case BinaryOp::kPow: return "power";
    case BinaryOp::kMaximum: return "maximum";
    case BinaryOp::kMinimum: return "minimum";
    case BinaryOp::kEq: return "equal";
    case BinaryOp::kNe: return "not_equal";
    case BinaryOp::kLt: return "less";
    case BinaryOp::kLe: return "less_equal";
    case BinaryOp::kGt: return "greater";
    case BinaryOp::kGe: return "greater_equal";
    case BinaryOp::kLogicalAnd: return "logical_and";
    case BinaryOp::kLogicalOr: return "logical_or";
  }
  return "binary";
}

}  // namespace

// --- elementwise, one operand ------------------------------------------------------------------

Array unary(UnaryOp op, const Array& x, double p0, double p1) {
  const char* fn = unary_op_name(op);
  check_defined(fn, x);
  if (unary_op_needs_float(op)) check_floating(fn, x);
  KUSARI_CHECK(!(x.dtype() == Dtype::kBool && unary_op_is_arithmetic(op)), DtypeError, fn,
               ": not defined for bool arrays; convert with astype() first");
  Array out = Array::empty(x.shape(), unary_op_is_predicate(op) ? Dtype::kBool : x.dtype(), x.device(),
                           x.memory_format());
  if (out.size() > 0) kernels::unary(x.device(), op, x, out, p0, p1);
  return out;
}

Array negative(const Array& x) { return unary(UnaryOp::kNeg, x); }
Array abs(const Array& x) { return unary(UnaryOp::kAbs, x); }
Array sign(const Array& x) { return unary(UnaryOp::kSign, x); }
Array exp(const Array& x) { return unary(UnaryOp::kExp, x); }
Array log(const Array& x) { return unary(UnaryOp::kLog, x); }
Array log1p(const Array& x) { return unary(UnaryOp::kLog1p, x); }
Array expm1(const Array& x) { return unary(UnaryOp::kExpm1, x); }
Array sqrt(const Array& x) { return unary(UnaryOp::kSqrt, x); }
Array rsqrt(const Array& x) { return unary(UnaryOp::kRsqrt, x); }
Array square(const Array& x) { return unary(UnaryOp::kSquare, x); }
Array reciprocal(const Array& x) { return unary(UnaryOp::kReciprocal, x); }
Array sin(const Array& x) { return unary(UnaryOp::kSin, x); }
Array cos(const Array& x) { return unary(UnaryOp::kCos, x); }
Array tanh(const Array& x) { return unary(UnaryOp::kTanh, x); }
Array sigmoid(const Array& x) { return unary(UnaryOp::kSigmoid, x); }
Array relu(const Array& x) { return unary(UnaryOp::kRelu, x); }
Array floor(const Array& x) { return unary(UnaryOp::kFloor, x); }
Array ceil(const Array& x) { return unary(UnaryOp::kCeil, x); }
Array erf(const Array& x) { return unary(UnaryOp::kErf, x); }
Array softplus(const Array& x, double beta) {
  KUSARI_CHECK(beta != 0.0, ValueError, "softplus: beta must be non-zero");
  return unary(UnaryOp::kSoftplus, x, beta);
}
Array leaky_relu(const Array& x, double slope) { return unary(UnaryOp::kLeakyRelu, x, slope); }
Array elu(const Array& x, double alpha) { return unary(UnaryOp::kElu, x, alpha); }
Array gelu(const Array& x, bool tanh_approximation) {
  return unary(tanh_approximation ? UnaryOp::kGeluTanh : UnaryOp::kGelu, x);
}
Array gelu_derivative(const Array& x, bool tanh_approximation) {
  return unary(tanh_approximation ? UnaryOp::kGeluTanhDerivative : UnaryOp::kGeluDerivative, x);
}
Array silu(const Array& x) { return unary(UnaryOp::kSilu, x); }
Array silu_derivative(const Array& x) { return unary(UnaryOp::kSiluDerivative, x); }
Array clip(const Array& x, double lo, double hi) {
  KUSARI_CHECK(lo <= hi, ValueError, "clip: x_min (", lo, ") must not exceed x_max (", hi, ")");
  return unary(UnaryOp::kClip, x, lo, hi);
}
Array power(const Array& x, Scalar exponent) {
  check_defined("power", x);
  if (!is_floating(x.dtype())) {
    check_scalar_kind("power", x, exponent);
    return power(x, Array::full(x.shape(), exponent, x.dtype(), x.device()));
  }
  return unary(UnaryOp::kPowScalar, x, exponent.to_double());
}
Array power(Scalar base, const Array& x) { return unary(UnaryOp::kRPowScalar, x, base.to_double()); }
Array isnan(const Array& x) { return unary(UnaryOp::kIsNan, x); }
Array isinf(const Array& x) { return unary(UnaryOp::kIsInf, x); }
Array isfinite(const Array& x) { return unary(UnaryOp::kIsFinite, x); }
Array logical_not(const Array& x) { return unary(UnaryOp::kLogicalNot, x); }

// --- elementwise, two operands ----------------------------------------------------------------

Array binary(BinaryOp op, const Array& a, const Array& b, const char* fn) {
  if (!fn) fn = binary_op_name(op);
  check_defined(fn, a);
  check_defined(fn, b);
  check_same_device(fn, {&a, &b});
  check_same_dtype(fn, {&a, &b});
  KUSARI_CHECK(binary_op_is_predicate(op) || a.dtype() != Dtype::kBool, DtypeError, fn,
               ": not defined for bool arrays; convert with astype() first");
  Shape shape = a.shape() == b.shape() ? a.shape() : broadcast_shapes(a.shape(), b.shape(), fn);
  Array out = Array::empty(shape, binary_op_is_predicate(op) ? Dtype::kBool : a.dtype(), a.device(),
                           routines::output_format(shape, {&a, &b}));
  if (out.size() == 0) return out;
  const Array ab = a.shape() == shape ? a : a.broadcast_to(shape);
  const Array bb = b.shape() == shape ? b : b.broadcast_to(shape);
  kernels::binary(a.device(), op, ab, bb, out);
  return out;
}

Array add(const Array& a, const Array& b) { return binary(BinaryOp::kAdd, a, b, "add"); }

// Note [Elementwise kernels write in place]
// add_to and multiply_to hand the kernels an output that is also their first operand. That is
// safe for every elementwise kernel of the table: each output element is computed from the
// operand elements at the same index only, read before it is written, by one thread (CPU: one
// loop iteration; CUDA: one thread, which for the vectorised contiguous path reads the whole
// vector before writing it), and no kernel declares its pointers __restrict__. What is not safe is
// an operand that overlaps the output at other indices (a shifted view, or a stride-0 broadcast
// of one of the output's elements): add_to refuses an operand sharing the output's memory unless
// it is the output itself.
void add_to(Array& out, const Array& b) {
  const char* fn = "add_to";
  check_defined(fn, out);
  check_defined(fn, b);
  check_same_device(fn, {&out, &b});
  check_same_dtype(fn, {&out, &b});
  KUSARI_CHECK(out.dtype() != Dtype::kBool, DtypeError, fn, ": not defined for bool arrays; convert with astype() first");
  KUSARI_CHECK(b.shape() == out.shape() || broadcast_shapes(out.shape(), b.shape(), fn) == out.shape(), ShapeError,
               fn, ": cannot add an array of shape ", b.shape(), " into one of shape ", out.shape(),
               " (the operand must broadcast to the output's shape)");
  KUSARI_CHECK(b.same_view(out) || !b.shares_memory_with(out), ValueError, fn,
               ": the operand overlaps the output without being it; pass a copy");
  if (out.size() == 0) return;
  const Array bb = b.shape() == out.shape() ? b : b.broadcast_to(out.shape());
  kernels::binary(out.device(), BinaryOp::kAdd, out, bb, out);
}

void multiply_to(Array& out, Scalar b) {
  const char* fn = "multiply_to";
  check_defined(fn, out);
  KUSARI_CHECK(out.dtype() != Dtype::kBool, DtypeError, fn, ": not defined for bool arrays; convert with astype() first");
  check_scalar_kind(fn, out, b);
  if (out.size() > 0) kernels::unary(out.device(), UnaryOp::kMulScalar, out, out, b.to_double(), 0.0);
}
Array subtract(const Array& a, const Array& b) { return binary(BinaryOp::kSub, a, b, "subtract"); }
Array multiply(const Array& a, const Array& b) { return binary(BinaryOp::kMul, a, b, "multiply"); }
Array divide(const Array& a, const Array& b) { return binary(BinaryOp::kDiv, a, b, "divide"); }
Array power(const Array& a, const Array& b) { return binary(BinaryOp::kPow, a, b, "power"); }
Array maximum(const Array& a, const Array& b) { return binary(BinaryOp::kMaximum, a, b, "maximum"); }
Array minimum(const Array& a, const Array& b) { return binary(BinaryOp::kMinimum, a, b, "minimum"); }
Array maximum(const Array& a, Scalar b) {
  check_scalar_kind("maximum", a, b);
  return unary(UnaryOp::kMaxScalar, a, b.to_double());
}
Array minimum(const Array& a, Scalar b) {
  check_scalar_kind("minimum", a, b);
  return unary(UnaryOp::kMinScalar, a, b.to_double());
}
Array equal(const Array& a, const Array& b) { return binary(BinaryOp::kEq, a, b, "equal"); }
Array not_equal(const Array& a, const Array& b) { return binary(BinaryOp::kNe, a, b, "not_equal"); }
Array less(const Array& a, const Array& b) { return binary(BinaryOp::kLt, a, b, "less"); }
Array less_equal(const Array& a, const Array& b) { return binary(BinaryOp::kLe, a, b, "less_equal"); }
Array greater(const Array& a, const Array& b) { return binary(BinaryOp::kGt, a, b, "greater"); }
Array greater_equal(const Array& a, const Array& b) { return binary(BinaryOp::kGe, a, b, "greater_equal"); }
Array equal(const Array& a, Scalar b) { return unary(UnaryOp::kEqScalar, a, b.to_double()); }
Array not_equal(const Array& a, Scalar b) { return unary(UnaryOp::kNeScalar, a, b.to_double()); }
Array less(const Array& a, Scalar b) { return unary(UnaryOp::kLtScalar, a, b.to_double()); }
Array less_equal(const Array& a, Scalar b) { return unary(UnaryOp::kLeScalar, a, b.to_double()); }
Array greater(const Array& a, Scalar b) { return unary(UnaryOp::kGtScalar, a, b.to_double()); }
Array greater_equal(const Array& a, Scalar b) { return unary(UnaryOp::kGeScalar, a, b.to_double()); }
Array logical_and(const Array& a, const Array& b) { return binary(BinaryOp::kLogicalAnd, a, b, "logical_and"); }
Array logical_or(const Array& a, const Array& b) { return binary(BinaryOp::kLogicalOr, a, b, "logical_or"); }

Array where(const Array& cond, const Array& a, const Array& b) {
  check_defined("where", cond);
  check_same_device("where", {&cond, &a, &b});
  check_same_dtype("where", {&a, &b});
  KUSARI_CHECK(cond.dtype() == Dtype::kBool, DtypeError, "where: the condition must be bool, got ",
               dtype_name(cond.dtype()));
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Array out = Array::empty(shape, a.dtype(), a.device(), routines::output_format(shape, {&cond, &a, &b}));
  if (out.size() > 0) {
    kernels::where(a.device(), cond.broadcast_to(shape), a.broadcast_to(shape), b.broadcast_to(shape), out);
  }
  return out;
}

Array where(const Array& cond, const Array& a, Scalar b) {
  check_scalar_kind("where", a, b);
  return where(cond, a, Array::full({}, b, a.dtype(), a.device()));
}

Array where(const Array& cond, Scalar a, const Array& b) {
  check_scalar_kind("where", b, a);
  return where(cond, Array::full({}, a, b.dtype(), b.device()), b);
}

Array relu_grad(const Array& gy, const Array& y) {
  const char* fn = "relu_grad";
  check_defined(fn, gy);
  check_defined(fn, y);
  check_same_device(fn, {&gy, &y});
  check_same_dtype(fn, {&gy, &y});
  KUSARI_CHECK(gy.dtype() != Dtype::kBool, DtypeError, fn, ": not defined for bool arrays; convert with astype() first");
  const Shape shape = gy.shape() == y.shape() ? gy.shape() : broadcast_shapes(gy.shape(), y.shape(), fn);
  Array out = Array::empty(shape, gy.dtype(), gy.device(), routines::output_format(shape, {&gy, &y}));
  if (out.size() == 0) return out;
  const Array gb = gy.shape() == shape ? gy : gy.broadcast_to(shape);
  const Array yb = y.shape() == shape ? y : y.broadcast_to(shape);
  if (kernels::relu_grad.try_run(out.device(), gb, yb, out)) return out;
  // The kernel declined (or the backend has none): the same values from a compare and a where.
  return where(greater(y, Scalar(0.0)), gy, Scalar(0));
}

Array operator+(const Array& a, const Array& b) { return add(a, b); }
Array operator-(const Array& a, const Array& b) { return subtract(a, b); }
Array operator*(const Array& a, const Array& b) { return multiply(a, b); }
Array operator/(const Array& a, const Array& b) { return divide(a, b); }
Array operator-(const Array& a) { return negative(a); }
Array operator+(const Array& a, Scalar b) {
  check_scalar_kind("add", a, b);
  return unary(UnaryOp::kAddScalar, a, b.to_double());
}
Array operator-(const Array& a, Scalar b) {
  check_scalar_kind("subtract", a, b);
  return unary(UnaryOp::kAddScalar, a, -b.to_double());
}
Array operator*(const Array& a, Scalar b) {
  check_scalar_kind("multiply", a, b);
  return unary(UnaryOp::kMulScalar, a, b.to_double());
}
Array operator/(const Array& a, Scalar b) {
  check_scalar_kind("divide", a, b);
  if (!is_floating(a.dtype())) return divide(a, Array::full({}, b, a.dtype(), a.device()));
  return unary(UnaryOp::kMulScalar, a, 1.0 / b.to_double());
}
Array operator+(Scalar a, const Array& b) { return b + a; }
Array operator-(Scalar a, const Array& b) {
  check_scalar_kind("subtract", b, a);
  return unary(UnaryOp::kRSubScalar, b, a.to_double());
}
Array operator*(Scalar a, const Array& b) { return b * a; }
Array operator/(Scalar a, const Array& b) {
  check_scalar_kind("divide", b, a);
  if (!is_floating(b.dtype())) return divide(Array::full({}, a, b.dtype(), b.device()), b);
  return unary(UnaryOp::kRDivScalar, b, a.to_double());
}

}  // namespace kusari
