#include "kusari/core/routines.h"

#include <cmath>
#include <string>

#include "core/kernel_call.h"

namespace kusari {

// --- argument checks ---------------------------------------------------------------------------

void check_same_device(const char* fn, std::initializer_list<const Array*> arrays) {
  const Array* first = nullptr;
  for (const Array* a : arrays) {
    if (!a->defined()) continue;
    if (!first) {
      first = a;
      continue;
    }
    KUSARI_CHECK(a->device() == first->device(), DeviceError, fn, ": arrays are on different devices (",
                 first->device(), " and ", a->device(), "); move them with to_device() first");
  }
}

void check_same_dtype(const char* fn, std::initializer_list<const Array*> arrays) {
  const Array* first = nullptr;
  for (const Array* a : arrays) {
    if (!a->defined()) continue;
    if (!first) {
      first = a;
      continue;
    }
    KUSARI_CHECK(a->dtype() == first->dtype(), DtypeError, fn, ": dtypes differ (", dtype_name(first->dtype()),
                 " and ", dtype_name(a->dtype()), "); convert one with astype()");
  }
}

void check_floating(const char* fn, const Array& x) {
  KUSARI_CHECK(is_floating(x.dtype()), DtypeError, fn, ": expected a floating-point array, got ",
               dtype_name(x.dtype()));
}

namespace {

void check_defined(const char* fn, const Array& x) {
  KUSARI_CHECK(x.defined(), ValueError, fn, ": the array is undefined (default-constructed)");
}

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

bool unary_op_needs_float(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp: case UnaryOp::kLog: case UnaryOp::kLog1p: case UnaryOp::kExpm1: case UnaryOp::kSqrt:
    case UnaryOp::kRsqrt: case UnaryOp::kReciprocal: case UnaryOp::kSin: case UnaryOp::kCos: case UnaryOp::kTanh:
    case UnaryOp::kSigmoid: case UnaryOp::kFloor: case UnaryOp::kCeil: case UnaryOp::kErf: case UnaryOp::kSoftplus:
    case UnaryOp::kLeakyRelu: case UnaryOp::kElu: case UnaryOp::kRDivScalar: case UnaryOp::kPowScalar:
    case UnaryOp::kRPowScalar:
      return true;
    default:
      return false;
  }
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

// A scalar combined with an integer array must be an integer (no silent truncation).
void check_scalar_kind(const char* fn, const Array& x, Scalar s) {
  KUSARI_CHECK(is_floating(x.dtype()) || !s.is_float(), DtypeError, fn, ": cannot combine a ", dtype_name(x.dtype()),
               " array with the floating-point scalar ", s, "; convert the array with astype() first");
}

}  // namespace

// --- elementwise, one operand ------------------------------------------------------------------

Array unary(UnaryOp op, const Array& x, double p0, double p1) {
  const char* fn = unary_op_name(op);
  check_defined(fn, x);
  if (unary_op_needs_float(op)) check_floating(fn, x);
  KUSARI_CHECK(!(x.dtype() == Dtype::kBool && unary_op_is_arithmetic(op)), DtypeError, fn,
               ": not defined for bool arrays; convert with astype() first");
  Array out = Array::empty(x.shape(), unary_op_is_predicate(op) ? Dtype::kBool : x.dtype(), x.device());
  if (out.size() > 0) KUSARI_KERNEL(x.device(), unary)(op, x, out, p0, p1);
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
  Array out = Array::empty(shape, binary_op_is_predicate(op) ? Dtype::kBool : a.dtype(), a.device());
  if (out.size() == 0) return out;
  const Array ab = a.shape() == shape ? a : a.broadcast_to(shape);
  const Array bb = b.shape() == shape ? b : b.broadcast_to(shape);
  KUSARI_KERNEL(a.device(), binary)(op, ab, bb, out);
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
  KUSARI_KERNEL(out.device(), binary)(BinaryOp::kAdd, out, bb, out);
}

void multiply_to(Array& out, Scalar b) {
  const char* fn = "multiply_to";
  check_defined(fn, out);
  KUSARI_CHECK(out.dtype() != Dtype::kBool, DtypeError, fn, ": not defined for bool arrays; convert with astype() first");
  check_scalar_kind(fn, out, b);
  if (out.size() > 0) KUSARI_KERNEL(out.device(), unary)(UnaryOp::kMulScalar, out, out, b.to_double(), 0.0);
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
  Array out = Array::empty(shape, a.dtype(), a.device());
  if (out.size() > 0) {
    KUSARI_KERNEL(a.device(), where)(cond.broadcast_to(shape), a.broadcast_to(shape), b.broadcast_to(shape), out);
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

// --- reductions --------------------------------------------------------------------------------

namespace {

Shape keepdims_shape(const Shape& shape, const Axes& axes) {
  Shape s = shape;
  for (int64_t a : axes) s[static_cast<int>(a)] = 1;
  return s;
}

Array reduce_impl(ReduceOp op, const Array& x, const Axes& axes_in, bool keepdims, const char* fn, Dtype out_dtype) {
  check_defined(fn, x);
  Axes axes = normalize_axes(axes_in, x.ndim(), fn, true);
  Shape kshape = keepdims_shape(x.shape(), axes);
  Array out = Array::empty(kshape, out_dtype, x.device());
  if (out.size() > 0) KUSARI_KERNEL(x.device(), reduce)(op, x, out);
  return keepdims ? out : out.squeeze(axes);
}

}  // namespace

Array sum(const Array& x, const Axes& axes, bool keepdims) {
  return reduce_impl(ReduceOp::kSum, x, axes, keepdims, "sum", x.dtype() == Dtype::kBool ? Dtype::kInt64 : x.dtype());
}

Array mean(const Array& x, const Axes& axes_in, bool keepdims) {
  check_defined("mean", x);
  check_floating("mean", x);
  Axes axes = normalize_axes(axes_in, x.ndim(), "mean", true);
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[static_cast<int>(a)];
  Array s = sum(x, axes, keepdims);
  return s * (1.0 / static_cast<double>(n));
}

Array prod(const Array& x, const Axes& axes, bool keepdims) {
  return reduce_impl(ReduceOp::kProd, x, axes, keepdims, "prod",
                     x.dtype() == Dtype::kBool ? Dtype::kInt64 : x.dtype());
}

Array amax(const Array& x, const Axes& axes, bool keepdims) {
  return reduce_impl(ReduceOp::kMax, x, axes, keepdims, "max", x.dtype());
}

Array amin(const Array& x, const Axes& axes, bool keepdims) {
  return reduce_impl(ReduceOp::kMin, x, axes, keepdims, "min", x.dtype());
}

// any / all look at truth values: non-zero elements are true (0.5 is true, NaN is true).
Array any(const Array& x, const Axes& axes, bool keepdims) {
  const Array b = x.dtype() == Dtype::kBool ? x : not_equal(x, Scalar(0));
  return reduce_impl(ReduceOp::kAny, b, axes, keepdims, "any", Dtype::kBool);
}

Array all(const Array& x, const Axes& axes, bool keepdims) {
  const Array b = x.dtype() == Dtype::kBool ? x : not_equal(x, Scalar(0));
  return reduce_impl(ReduceOp::kAll, b, axes, keepdims, "all", Dtype::kBool);
}

Array var(const Array& x, const Axes& axes_in, bool keepdims, int ddof) {
  check_floating("var", x);
  Axes axes = normalize_axes(axes_in, x.ndim(), "var", true);
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[static_cast<int>(a)];
  KUSARI_CHECK(n - ddof > 0, ValueError, "var: ", n, " elements with ddof=", ddof, " leave no degrees of freedom");
  Array d = x - mean(x, axes, true);
  return sum(square(d), axes, keepdims) * (1.0 / static_cast<double>(n - ddof));
}

namespace {

Array arg_reduce_impl(ArgReduceOp op, const Array& x_in, std::optional<int> axis_in, bool keepdims, const char* fn) {
  check_defined(fn, x_in);
  Array x = x_in;
  int axis;
  if (!axis_in) {
    x = x_in.reshape({x_in.size()});
    axis = 0;
  } else {
    axis = normalize_axis(*axis_in, x.ndim(), fn);
  }
  KUSARI_CHECK(x.shape()[axis] > 0, ValueError, fn, ": attempt to get ", fn, " of an empty axis");
  Shape kshape = x.shape();
  kshape[axis] = 1;
  Array out = Array::empty(kshape, Dtype::kInt64, x.device());
  if (out.size() > 0) KUSARI_KERNEL(x.device(), arg_reduce)(op, x, axis, out);
  if (!axis_in) return keepdims ? out.reshape(Shape(std::vector<int64_t>(x_in.ndim(), 1))) : out.reshape({});
  return keepdims ? out : out.squeeze({axis});
}

}  // namespace

Array argmax(const Array& x, std::optional<int> axis, bool keepdims) {
  return arg_reduce_impl(ArgReduceOp::kArgMax, x, axis, keepdims, "argmax");
}

Array argmin(const Array& x, std::optional<int> axis, bool keepdims) {
  return arg_reduce_impl(ArgReduceOp::kArgMin, x, axis, keepdims, "argmin");
}

Array sum_to(const Array& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int lead = x.ndim() - shape.size();
  KUSARI_CHECK(lead >= 0, ShapeError, "sum_to: cannot sum shape ", x.shape(), " to the larger shape ", shape);
  Axes axes;
  for (int i = 0; i < lead; ++i) axes.push_back(i);
  for (int i = 0; i < shape.size(); ++i) {
    const int64_t xd = x.shape()[i + lead];
    if (shape[i] == 1 && xd != 1) {
      axes.push_back(i + lead);
    } else {
      KUSARI_CHECK(shape[i] == xd, ShapeError, "sum_to: shape ", shape, " does not broadcast to ", x.shape());
    }
  }
  Array s = sum(x, axes, true);
  return s.reshape(shape);
}

Array logsumexp(const Array& x, const Axes& axes_in, bool keepdims) {
  check_floating("logsumexp", x);
  Axes axes = normalize_axes(axes_in, x.ndim(), "logsumexp", true);
  Array m = amax(x, axes, true);
  // Rows that are entirely -inf (or +inf) would give nan in x - m; shift them by 0 instead.
  m = where(isfinite(m), m, Scalar(0.0));
  Array s = log(sum(exp(x - m), axes, true)) + m;
  return keepdims ? s : s.squeeze(axes);
}

Array softmax(const Array& x, int axis) {
  check_floating("softmax", x);
  int ax = normalize_axis(axis, x.ndim(), "softmax");
  Array out = Array::empty(x.shape(), x.dtype(), x.device());
  if (out.size() > 0) KUSARI_KERNEL(x.device(), softmax)(x, ax, false, out);
  return out;
}

Array log_softmax(const Array& x, int axis) {
  check_floating("log_softmax", x);
  int ax = normalize_axis(axis, x.ndim(), "log_softmax");
  Array out = Array::empty(x.shape(), x.dtype(), x.device());
  if (out.size() > 0) KUSARI_KERNEL(x.device(), softmax)(x, ax, true, out);
  return out;
}

// --- linear algebra ------------------------------------------------------------------------------

Array matmul(const Array& a_in, const Array& b_in) {
  check_defined("matmul", a_in);
  check_defined("matmul", b_in);
  check_same_device("matmul", {&a_in, &b_in});
  check_same_dtype("matmul", {&a_in, &b_in});
  KUSARI_CHECK(a_in.ndim() >= 1 && b_in.ndim() >= 1, ShapeError,
               "matmul: operands must have at least one dimension, got shapes ", a_in.shape(), " and ", b_in.shape());
  Array a = a_in.ndim() == 1 ? a_in.reshape({1, a_in.shape()[0]}) : a_in;
  Array b = b_in.ndim() == 1 ? b_in.reshape({b_in.shape()[0], 1}) : b_in;
  const int64_t k = a.shape()[a.ndim() - 1];
  KUSARI_CHECK(k == b.shape()[b.ndim() - 2], ShapeError, "matmul: shapes ", a_in.shape(), " and ", b_in.shape(),
               " are not aligned (", k, " != ", b.shape()[b.ndim() - 2], ")");
  Shape abatch(a.shape().begin(), a.shape().end() - 2);
  Shape bbatch(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(abatch, bbatch, "matmul");
  Shape ashape = batch, bshape = batch, oshape = batch;
  ashape.push_back(a.shape()[a.ndim() - 2]);
  ashape.push_back(k);
  bshape.push_back(k);
  bshape.push_back(b.shape()[b.ndim() - 1]);
  oshape.push_back(a.shape()[a.ndim() - 2]);
  oshape.push_back(b.shape()[b.ndim() - 1]);
  Array out = Array::empty(oshape, a.dtype(), a.device());
  if (out.size() > 0) KUSARI_KERNEL(a.device(), matmul)(a.broadcast_to(ashape), b.broadcast_to(bshape), out);
  // Drop the axes that 1-d operands were promoted with.
  if (a_in.ndim() == 1 && b_in.ndim() == 1) return out.reshape({});
  if (a_in.ndim() == 1) return out.squeeze({out.ndim() - 2});
  if (b_in.ndim() == 1) return out.squeeze({out.ndim() - 1});
  return out;
}

// --- joining, splitting, indexing ----------------------------------------------------------------

namespace {

Array slice_along(const Array& x, int axis, int64_t begin, int64_t end) {
  Shape s = x.shape();
  s[axis] = end - begin;
  return x.as_strided(s, x.strides(), x.offset() + begin * x.strides()[axis]);
}

}  // namespace

Array concatenate(const std::vector<Array>& xs, int axis_in) {
  KUSARI_CHECK(!xs.empty(), ValueError, "concatenate: need at least one array");
  const Array& first = xs[0];
  const int axis = normalize_axis(axis_in, first.ndim(), "concatenate");
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Array& x = xs[i];
    check_defined("concatenate", x);
    check_same_device("concatenate", {&first, &x});
    check_same_dtype("concatenate", {&first, &x});
    KUSARI_CHECK(x.ndim() == first.ndim(), ShapeError, "concatenate: array ", i, " has shape ", x.shape(),
                 " but array 0 has shape ", first.shape(), " (dimension counts differ)");
    for (int d = 0; d < x.ndim(); ++d) {
      KUSARI_CHECK(d == axis || x.shape()[d] == first.shape()[d], ShapeError, "concatenate: array ", i,
                   " has shape ", x.shape(), " but array 0 has shape ", first.shape(), "; only axis ", axis,
                   " may differ");
    }
    total += x.shape()[axis];
  }
  Shape s = first.shape();
  s[axis] = total;
  Array out = Array::empty(s, first.dtype(), first.device());
  int64_t at = 0;
  for (const Array& x : xs) {
    const int64_t n = x.shape()[axis];
    if (n > 0 && x.size() > 0) {
      Array dst = slice_along(out, axis, at, at + n);
      KUSARI_KERNEL(out.device(), copy)(x, dst);
    }
    at += n;
  }
  return out;
}

Array stack(const std::vector<Array>& xs, int axis) {
  KUSARI_CHECK(!xs.empty(), ValueError, "stack: need at least one array");
  const int ax = normalize_axis(axis, xs[0].ndim() + 1, "stack");
  std::vector<Array> expanded;
  expanded.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    KUSARI_CHECK(xs[i].shape() == xs[0].shape(), ShapeError, "stack: array ", i, " has shape ", xs[i].shape(),
                 " but array 0 has shape ", xs[0].shape(), "; all must match");
    expanded.push_back(xs[i].expand_dims(ax));
  }
  return concatenate(expanded, ax);
}

std::vector<Array> split(const Array& x, int64_t sections, int axis_in) {
  const int axis = normalize_axis(axis_in, x.ndim(), "split");
  KUSARI_CHECK(sections > 0, ValueError, "split: the number of sections must be positive, got ", sections);
  const int64_t len = x.shape()[axis];
  KUSARI_CHECK(len % sections == 0, ValueError, "split: axis ", axis, " of length ", len,
               " does not divide into ", sections, " equal sections");
  std::vector<int64_t> idx;
  for (int64_t i = 1; i < sections; ++i) idx.push_back(i * (len / sections));
  return split_at(x, idx, axis);
}

std::vector<Array> split_at(const Array& x, const std::vector<int64_t>& indices, int axis_in) {
  const int axis = normalize_axis(axis_in, x.ndim(), "split");
  const int64_t len = x.shape()[axis];
  std::vector<Array> out;
  int64_t prev = 0;
  for (size_t i = 0; i <= indices.size(); ++i) {
    int64_t end = i < indices.size() ? std::clamp<int64_t>(indices[i], 0, len) : len;
    end = std::max(end, prev);
    out.push_back(slice_along(x, axis, prev, end));
    prev = end;
  }
  return out;
}

Array take(const Array& x, const Array& indices, int axis_in) {
  check_defined("take", x);
  check_same_device("take", {&x, &indices});
  KUSARI_CHECK(indices.dtype() == Dtype::kInt32 || indices.dtype() == Dtype::kInt64, DtypeError,
               "take: indices must be int32 or int64, got ", dtype_name(indices.dtype()));
  const int axis = normalize_axis(axis_in, x.ndim(), "take");
  Shape s;
  for (int d = 0; d < axis; ++d) s.push_back(x.shape()[d]);
  for (int64_t d : indices.shape()) s.push_back(d);
  for (int d = axis + 1; d < x.ndim(); ++d) s.push_back(x.shape()[d]);
  Array out = Array::empty(s, x.dtype(), x.device());
  if (out.size() > 0) KUSARI_KERNEL(x.device(), take)(x, indices, axis, out);
  return out;
}

Array add_at_zeros(const Shape& shape, const Array& indices, int axis_in, const Array& values) {
  check_same_device("add_at", {&indices, &values});
  const int axis = normalize_axis(axis_in, shape.size(), "add_at");
  Array out = Array::zeros(shape, values.dtype(), values.device());
  Shape expected;
  for (int d = 0; d < axis; ++d) expected.push_back(shape[d]);
  for (int64_t d : indices.shape()) expected.push_back(d);
  for (int d = axis + 1; d < shape.size(); ++d) expected.push_back(shape[d]);
  KUSARI_CHECK(values.shape() == expected, ShapeError, "add_at: values of shape ", values.shape(),
               " do not match the expected ", expected);
  if (values.size() > 0) KUSARI_KERNEL(values.device(), add_at)(out, indices, axis, values);
  return out;
}

// --- neural-network kernels ------------------------------------------------------------------------

int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation, bool cover_all) {
  const int64_t dk = k + (k - 1) * (dilation - 1);
  // Floor division (as in Chainer): a window larger than the padded input gives a size <= 0,
  // where C++'s truncation would round -1 / stride up to a size of 1.
  const int64_t span = in + pad * 2 - dk + (cover_all ? stride - 1 : 0);
  const int64_t steps = span >= 0 ? span / stride : -((-span + stride - 1) / stride);
  return steps + 1;
}

namespace {

void check_conv_params(const char* fn, const Conv2dParams& p) {
  for (int i = 0; i < 2; ++i) {
    KUSARI_CHECK(p.stride[i] > 0, ValueError, fn, ": stride must be positive, got ", p.stride[i]);
    KUSARI_CHECK(p.pad[i] >= 0, ValueError, fn, ": pad must be non-negative, got ", p.pad[i]);
    KUSARI_CHECK(p.dilation[i] > 0, ValueError, fn, ": dilation must be positive, got ", p.dilation[i]);
  }
  KUSARI_CHECK(p.groups > 0, ValueError, fn, ": groups must be positive, got ", p.groups);
}

// The gradient routines get shapes from a backward rule; the kernels index by them, so they must
// describe one convolution: x (N, C, H, W), W (O, C/groups, kH, kW), gy (N, O, outH, outW).
void check_conv_shapes(const char* fn, const Shape& x, const Shape& w, const Shape& gy, const Conv2dParams& p) {
  const int64_t oh = conv_out_size(x[2], w[2], p.stride[0], p.pad[0], p.dilation[0]);
  const int64_t ow = conv_out_size(x[3], w[3], p.stride[1], p.pad[1], p.dilation[1]);
  KUSARI_CHECK(x[1] == w[1] * p.groups && w[0] % p.groups == 0 && gy[0] == x[0] && gy[1] == w[0] && gy[2] == oh &&
                   gy[3] == ow,
               ShapeError, fn, ": shapes x ", x, ", W ", w, ", gy ", gy, " with groups=", p.groups,
               " do not describe one convolution (expected gy of shape (", x[0], ", ", w[0], ", ", oh, ", ", ow,
               ") and x with ", w[1] * p.groups, " channels)");
}

}  // namespace

Array conv2d(const Array& x, const Array& w, const Array& b, const Conv2dParams& p) {
  const char* fn = "convolution_2d";
  check_conv_params(fn, p);
  check_same_device(fn, {&x, &w, &b});
  check_same_dtype(fn, {&x, &w, &b});
  check_floating(fn, x);
  KUSARI_CHECK(x.ndim() == 4 && w.ndim() == 4, ShapeError, fn, ": expected 4-d x (N, C, H, W) and W (O, C/groups, kH, kW), got ",
               x.shape(), " and ", w.shape());
  KUSARI_CHECK(x.shape()[1] == w.shape()[1] * p.groups, ShapeError, fn, ": x has ", x.shape()[1],
               " channels but W ", w.shape(), " with groups=", p.groups, " expects ", w.shape()[1] * p.groups);
  KUSARI_CHECK(w.shape()[0] % p.groups == 0, ShapeError, fn, ": ", w.shape()[0], " output channels do not divide into ",
               p.groups, " groups");
  KUSARI_CHECK(!b.defined() || (b.ndim() == 1 && b.shape()[0] == w.shape()[0]), ShapeError, fn, ": bias of shape ",
               b.shape(), " does not match ", w.shape()[0], " output channels");
  const int64_t oh = conv_out_size(x.shape()[2], w.shape()[2], p.stride[0], p.pad[0], p.dilation[0]);
  const int64_t ow = conv_out_size(x.shape()[3], w.shape()[3], p.stride[1], p.pad[1], p.dilation[1]);
  KUSARI_CHECK(oh > 0 && ow > 0, ShapeError, fn, ": the kernel ", w.shape(), " (with pad and dilation) is larger than the input ",
               x.shape());
  Array y = Array::empty({x.shape()[0], w.shape()[0], oh, ow}, x.dtype(), x.device());
  if (y.size() > 0) KUSARI_KERNEL(x.device(), conv2d_forward)(x, w, b, p, y);
  return y;
}

Array conv2d_backward_data(const Array& w, const Array& gy, const Shape& x_shape, const Conv2dParams& p) {
  const char* fn = "convolution_2d (gradient of x)";
  check_conv_params(fn, p);
  check_same_device(fn, {&w, &gy});
  check_same_dtype(fn, {&w, &gy});
  KUSARI_CHECK(x_shape.size() == 4 && gy.ndim() == 4 && w.ndim() == 4, ShapeError, fn, ": expected 4-d shapes, got x ",
               x_shape, ", gy ", gy.shape(), ", W ", w.shape());
  check_conv_shapes(fn, x_shape, w.shape(), gy.shape(), p);
  Array gx = Array::empty(x_shape, gy.dtype(), gy.device());
  if (gx.size() > 0) KUSARI_KERNEL(gy.device(), conv2d_backward_data)(w, gy, p, gx);
  return gx;
}

Array conv2d_backward_filter(const Array& x, const Array& gy, const Shape& w_shape, const Conv2dParams& p) {
  const char* fn = "convolution_2d (gradient of W)";
  check_conv_params(fn, p);
  check_same_device(fn, {&x, &gy});
  check_same_dtype(fn, {&x, &gy});
  KUSARI_CHECK(w_shape.size() == 4 && gy.ndim() == 4 && x.ndim() == 4, ShapeError, fn, ": expected 4-d shapes, got x ",
               x.shape(), ", gy ", gy.shape(), ", W ", w_shape);
  check_conv_shapes(fn, x.shape(), w_shape, gy.shape(), p);
  Array gw = Array::empty(w_shape, gy.dtype(), gy.device());
  if (gw.size() > 0) KUSARI_KERNEL(gy.device(), conv2d_backward_filter)(x, gy, p, gw);
  return gw;
}

Array pool2d(const Array& x, const Pool2dParams& p) {
  const char* fn = p.kind == PoolKind::kMax ? "max_pooling_2d" : "average_pooling_2d";
  check_floating(fn, x);
  KUSARI_CHECK(x.ndim() == 4, ShapeError, fn, ": expected 4-d x (N, C, H, W), got ", x.shape());
  for (int i = 0; i < 2; ++i) {
    KUSARI_CHECK(p.ksize[i] > 0 && p.stride[i] > 0 && p.pad[i] >= 0, ValueError, fn,
                 ": ksize and stride must be positive and pad non-negative, got ksize ", p.ksize[i], ", stride ",
                 p.stride[i], ", pad ", p.pad[i]);
    KUSARI_CHECK(p.pad[i] * 2 < p.ksize[i] + (p.cover_all ? p.stride[i] : 0) || p.kind == PoolKind::kAverage, ValueError, fn,
                 ": pad ", p.pad[i], " is too large for window ", p.ksize[i]);
  }
  const int64_t oh = conv_out_size(x.shape()[2], p.ksize[0], p.stride[0], p.pad[0], 1, p.cover_all);
  const int64_t ow = conv_out_size(x.shape()[3], p.ksize[1], p.stride[1], p.pad[1], 1, p.cover_all);
  KUSARI_CHECK(oh > 0 && ow > 0, ShapeError, fn, ": window (", p.ksize[0], ", ", p.ksize[1],
               ") is larger than the padded input ", x.shape());
  Array y = Array::empty({x.shape()[0], x.shape()[1], oh, ow}, x.dtype(), x.device());
  if (y.size() > 0) KUSARI_KERNEL(x.device(), pool2d_forward)(x, p, y);
  return y;
}

Array pool2d_backward(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p) {
  const char* fn = p.kind == PoolKind::kMax ? "max_pooling_2d (gradient)" : "average_pooling_2d (gradient)";
  check_same_device(fn, {&x, &y, &gy});
  check_same_dtype(fn, {&x, &gy});
  KUSARI_CHECK(gy.shape() == y.shape(), ShapeError, fn, ": gy of shape ", gy.shape(), " does not match y ", y.shape());
  KUSARI_CHECK(x.ndim() == 4 && y.ndim() == 4, ShapeError, fn, ": expected 4-d x and y, got ", x.shape(), " and ",
               y.shape());
  const Shape expected{x.shape()[0], x.shape()[1],
                       conv_out_size(x.shape()[2], p.ksize[0], p.stride[0], p.pad[0], 1, p.cover_all),
                       conv_out_size(x.shape()[3], p.ksize[1], p.stride[1], p.pad[1], 1, p.cover_all)};
  KUSARI_CHECK(y.shape() == expected, ShapeError, fn, ": y of shape ", y.shape(), " is not the pooling of x ", x.shape(),
               " (expected ", expected, ")");
  Array gx = Array::empty(x.shape(), gy.dtype(), gy.device());
  if (gx.size() > 0) KUSARI_KERNEL(x.device(), pool2d_backward)(x, y, gy, p, gx);
  return gx;
}

// --- optimizer updates ---------------------------------------------------------------------------

const char* update_rule_name(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kSgd:
      return "SGD";
    case UpdateRule::kMomentumSgd:
      return "MomentumSGD";
    case UpdateRule::kNesterov:
      return "NesterovAG";
    case UpdateRule::kAdam:
      return "Adam";
    case UpdateRule::kRmsprop:
      return "RMSprop";
    case UpdateRule::kAdaGrad:
      return "AdaGrad";
  }
  return "update";
}

void update_parameter(UpdateRule rule, Array& param, const Array& grad_in,
                      const std::vector<Array*>& state, const std::vector<double>& hyper,
                      const Array* skip) {
  const std::string fn_str = std::string("update_parameter (") + update_rule_name(rule) + ")";
  const char* fn = fn_str.c_str();
  // How many hyperparameters and state arrays the rule takes; see Note [Update rule layouts].
  size_t want_hyper = 0, want_state = 0;
  const char* state_names = "";
  switch (rule) {
    case UpdateRule::kSgd:
      want_hyper = 1, want_state = 0, state_names = "none";
      break;
    case UpdateRule::kMomentumSgd:
      want_hyper = 2, want_state = 1, state_names = "v";
      break;
    case UpdateRule::kNesterov:
      want_hyper = 2, want_state = 1, state_names = "v";
      break;
    case UpdateRule::kAdam:
      want_hyper = 7;
      want_state = hyper.size() == 7 && hyper[6] != 0.0 ? 3 : 2;
      state_names = want_state == 3 ? "m, v, vhat (amsgrad)" : "m, v";
      break;
    case UpdateRule::kRmsprop:
      want_hyper = 4, want_state = 1, state_names = "ms";
      break;
    case UpdateRule::kAdaGrad:
      want_hyper = 2, want_state = 1, state_names = "h";
      break;
  }
  KUSARI_CHECK(hyper.size() == want_hyper, ValueError, fn, ": expected ", want_hyper,
               " hyperparameters, got ", hyper.size());
  KUSARI_CHECK(state.size() == want_state, ValueError, fn, ": expected ", want_state,
               " state arrays (", state_names, "), got ", state.size());
  check_defined(fn, param);
  check_defined(fn, grad_in);
  check_floating(fn, param);
  check_same_device(fn, {&param, &grad_in});
  check_same_dtype(fn, {&param, &grad_in});
  KUSARI_CHECK(grad_in.shape() == param.shape(), ShapeError, fn, ": the gradient has shape ",
               grad_in.shape(), " but the parameter has shape ", param.shape());
  KUSARI_CHECK(param.is_contiguous(), ValueError, fn, ": the parameter (shape ", param.shape(),
               ") must be contiguous to be updated in place");
  std::vector<Array> views;
  views.reserve(state.size());
  for (size_t k = 0; k < state.size(); ++k) {
    KUSARI_CHECK(state[k] != nullptr, ValueError, fn, ": state array ", k, " is null");
    const Array& s = *state[k];
    check_defined(fn, s);
    check_same_device(fn, {&param, &s});
    check_same_dtype(fn, {&param, &s});
    KUSARI_CHECK(s.shape() == param.shape(), ShapeError, fn, ": state array ", k, " has shape ",
                 s.shape(), " but the parameter has shape ", param.shape());
    KUSARI_CHECK(s.is_contiguous(), ValueError, fn, ": state array ", k, " (shape ", s.shape(),
                 ") must be contiguous to be updated in place");
    views.push_back(s);  // a view of the same memory
  }
  if (skip) {
    check_defined(fn, *skip);
    KUSARI_CHECK(skip->size() == 1 && skip->dtype() == Dtype::kInt64 && skip->is_contiguous() &&
                     skip->device() == param.device(),
                 ValueError, fn, ": the skip flag must be one int64 on ", param.device(),
                 ", got shape ", skip->shape(), " ", dtype_name(skip->dtype()), " on ",
                 skip->device());
  }
  if (param.size() == 0) return;
  const Array grad = grad_in.contiguous();
  KUSARI_KERNEL(param.device(), update_parameter)
  (rule, param, grad, views.data(), static_cast<int>(views.size()), hyper.data(),
   static_cast<int>(hyper.size()), skip);
}

Array count_nonfinite(const std::vector<Array>& arrays) {
  const char* fn = "count_nonfinite";
  KUSARI_CHECK(!arrays.empty(), ValueError, fn, ": no arrays were given");
  const Device device = arrays.front().device();
  std::vector<Array> inputs;
  inputs.reserve(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Array& a = arrays[i];
    check_defined(fn, a);
    check_floating(fn, a);
    KUSARI_CHECK(a.device() == device, DeviceError, fn, ": array ", i, " is on ", a.device(),
                 " but array 0 is on ", device, " (count each device's arrays apart)");
    if (a.size() > 0) inputs.push_back(a.contiguous());
  }
  Array out = Array::empty({}, Dtype::kInt64, device);
  KUSARI_KERNEL(device, count_nonfinite)(inputs.data(), static_cast<int>(inputs.size()), out);
  return out;
}

// --- comparisons ---------------------------------------------------------------------------------

bool allclose(const Array& a, const Array& b, double rtol, double atol, bool equal_nan) {
  Shape s = broadcast_shapes(a.shape(), b.shape(), "allclose");
  std::vector<double> va = a.broadcast_to(s).to_vector<double>();
  std::vector<double> vb = b.broadcast_to(s).to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) {
    const double x = va[i], y = vb[i];
    if (std::isnan(x) || std::isnan(y)) {
      if (equal_nan && std::isnan(x) && std::isnan(y)) continue;
      return false;
    }
    if (x == y) continue;
    if (!(std::abs(x - y) <= atol + rtol * std::abs(y))) return false;
  }
  return true;
}

bool array_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) return false;
  return a.to_vector<double>() == b.to_vector<double>();
}

}  // namespace kusari
