// The arithmetic of one element for every unary and binary op, shared by the CPU and CUDA
// elementwise kernels (Note [Shared backend code]).
//
// Each body is a template on the op, so a kernel that switches on the op once (the CPU, which
// then runs a loop the compiler vectorises) and a kernel that switches per element (CUDA, see
// Note [Runtime op switch]) instantiate the same code. C is the compute type (compute_t of the
// element type); c0 and c1 are the op's scalar parameters converted to C on the host.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backends/common/host_device.h"
#include "backends/common/math.h"
#include "kusari/core/op_types.h"

namespace kusari::common {

/// True for the unary ops defined only for floating dtypes.
constexpr bool unary_op_needs_float(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp: case UnaryOp::kLog: case UnaryOp::kLog1p: case UnaryOp::kExpm1: case UnaryOp::kSqrt:
    case UnaryOp::kRsqrt: case UnaryOp::kReciprocal: case UnaryOp::kSin: case UnaryOp::kCos: case UnaryOp::kTanh:
    case UnaryOp::kSigmoid: case UnaryOp::kFloor: case UnaryOp::kCeil: case UnaryOp::kErf: case UnaryOp::kSoftplus:
    case UnaryOp::kLeakyRelu: case UnaryOp::kElu: case UnaryOp::kRDivScalar: case UnaryOp::kPowScalar:
    case UnaryOp::kRPowScalar: case UnaryOp::kGelu: case UnaryOp::kGeluTanh: case UnaryOp::kSilu:
    case UnaryOp::kGeluDerivative: case UnaryOp::kGeluTanhDerivative: case UnaryOp::kSiluDerivative:
      return true;
    default:
      return false;
  }
}

/// op(v) for the arithmetic unary ops (the result has the operand's type). The ops of
/// unary_op_needs_float are instantiated for floating C only.
template <UnaryOp Op, typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE C unary_arith(C v, C c0, C c1) {
  if constexpr (Op == UnaryOp::kIdentity) {
    return v;
  } else if constexpr (Op == UnaryOp::kNeg) {
    return static_cast<C>(-v);
  } else if constexpr (Op == UnaryOp::kAbs) {
    return math::negative(v) ? static_cast<C>(-v) : v;
  } else if constexpr (Op == UnaryOp::kSign) {
    return static_cast<C>((C(0) < v) - math::negative(v));
  } else if constexpr (Op == UnaryOp::kSquare) {
    return static_cast<C>(v * v);
  } else if constexpr (Op == UnaryOp::kRelu) {
    return v > C(0) ? v : C(0);
  } else if constexpr (Op == UnaryOp::kAddScalar) {
    return static_cast<C>(v + c0);
  } else if constexpr (Op == UnaryOp::kMulScalar) {
    return static_cast<C>(v * c0);
  } else if constexpr (Op == UnaryOp::kRSubScalar) {
    return static_cast<C>(c0 - v);
  } else if constexpr (Op == UnaryOp::kMaxScalar) {
    return (v > c0 || v != v) ? v : c0;
  } else if constexpr (Op == UnaryOp::kMinScalar) {
    return (v < c0 || v != v) ? v : c0;
  } else if constexpr (Op == UnaryOp::kClip) {
    return v < c0 ? c0 : (v > c1 ? c1 : v);
  } else if constexpr (Op == UnaryOp::kExp) {
    return math::exp(v);
  } else if constexpr (Op == UnaryOp::kLog) {
    return math::log(v);
  } else if constexpr (Op == UnaryOp::kLog1p) {
    return math::log1p(v);
  } else if constexpr (Op == UnaryOp::kExpm1) {
    return math::expm1(v);
  } else if constexpr (Op == UnaryOp::kSqrt) {
    return math::sqrt(v);
  } else if constexpr (Op == UnaryOp::kRsqrt) {
    return C(1) / math::sqrt(v);
  } else if constexpr (Op == UnaryOp::kReciprocal) {
    return C(1) / v;
  } else if constexpr (Op == UnaryOp::kRDivScalar) {
    return c0 / v;
  } else if constexpr (Op == UnaryOp::kSin) {
    return math::sin(v);
  } else if constexpr (Op == UnaryOp::kCos) {
    return math::cos(v);
  } else if constexpr (Op == UnaryOp::kTanh) {
    return math::tanh(v);
  } else if constexpr (Op == UnaryOp::kSigmoid) {
    // Stable in both tails: exp of a non-positive number only.
    if (v >= C(0)) return C(1) / (C(1) + math::exp(-v));
    const C e = math::exp(v);
    return e / (C(1) + e);
  } else if constexpr (Op == UnaryOp::kFloor) {
    return math::floor(v);
  } else if constexpr (Op == UnaryOp::kCeil) {
    return math::ceil(v);
  } else if constexpr (Op == UnaryOp::kErf) {
    return math::erf(v);
  } else if constexpr (Op == UnaryOp::kSoftplus) {
    // log(1 + exp(b v)) / b = max(b v, 0) / b + log1p(exp(-|b v|)) / b
    const C bv = c0 * v;
    return ((bv < C(0) ? C(0) : bv) + math::log1p(math::exp(-math::fabs(bv)))) / c0;
  } else if constexpr (Op == UnaryOp::kLeakyRelu) {
    return v >= C(0) ? v : c0 * v;
  } else if constexpr (Op == UnaryOp::kElu) {
    return v >= C(0) ? v : c0 * math::expm1(v);
  } else if constexpr (Op == UnaryOp::kGelu) {
    return C(0.5) * v * (C(1) + math::erf(v * C(0.70710678118654752440)));
  } else if constexpr (Op == UnaryOp::kGeluTanh) {
    const C u = C(0.79788456080286535588) * (v + C(0.044715) * v * v * v);
    return C(0.5) * v * (C(1) + math::tanh(u));
  } else if constexpr (Op == UnaryOp::kSilu) {
    return v * unary_arith<UnaryOp::kSigmoid, C>(v, c0, c1);
  } else if constexpr (Op == UnaryOp::kGeluDerivative) {
    // Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
    const C cdf = C(0.5) * (C(1) + math::erf(v * C(0.70710678118654752440)));
    return cdf + v * C(0.39894228040143267794) * math::exp(C(-0.5) * v * v);
  } else if constexpr (Op == UnaryOp::kGeluTanhDerivative) {
    const C k = C(0.79788456080286535588);
    const C t = math::tanh(k * (v + C(0.044715) * v * v * v));
    return C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * k * (C(1) + C(0.134145) * v * v);
  } else if constexpr (Op == UnaryOp::kSiluDerivative) {
    const C s = unary_arith<UnaryOp::kSigmoid, C>(v, c0, c1);
    return s * (C(1) + v * (C(1) - s));
  } else if constexpr (Op == UnaryOp::kPowScalar) {
    return math::pow(v, c0);
  } else if constexpr (Op == UnaryOp::kRPowScalar) {
    return math::pow(c0, v);
  } else {
    static_assert(Op == UnaryOp::kIdentity, "unary_arith: not an arithmetic op");
    return v;
  }
}

/// op(v) for the predicate unary ops (kEqScalar ... kLogicalNot).
template <UnaryOp Op, typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE bool unary_predicate(C v, C c0) {
  constexpr bool kFloat = std::is_floating_point_v<C>;
  if constexpr (Op == UnaryOp::kEqScalar) {
    return v == c0;
  } else if constexpr (Op == UnaryOp::kNeScalar) {
    return v != c0;
  } else if constexpr (Op == UnaryOp::kLtScalar) {
    return v < c0;
  } else if constexpr (Op == UnaryOp::kLeScalar) {
    return v <= c0;
  } else if constexpr (Op == UnaryOp::kGtScalar) {
    return v > c0;
  } else if constexpr (Op == UnaryOp::kGeScalar) {
    return v >= c0;
  } else if constexpr (Op == UnaryOp::kLogicalNot) {
    return !static_cast<bool>(v);
  } else if constexpr (Op == UnaryOp::kIsNan) {
    if constexpr (kFloat) return math::isnan(v);
    return false;
  } else if constexpr (Op == UnaryOp::kIsInf) {
    if constexpr (kFloat) return math::isinf(v);
    return false;
  } else if constexpr (Op == UnaryOp::kIsFinite) {
    if constexpr (kFloat) return math::isfinite(v);
    return true;
  } else {
    static_assert(unary_op_is_predicate(Op), "unary_predicate: not a predicate");
    return false;
  }
}

/// x ** y for integers by squaring, in unsigned arithmetic: it wraps exactly like repeated
/// multiplication, without a y-long loop; y <= 0 gives 1.
template <typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE C integer_pow(C x, C y) {
  if (!(y > C(0))) return C(1);
  uint64_t base = static_cast<uint64_t>(static_cast<int64_t>(x));
  uint64_t e = static_cast<uint64_t>(y);
  uint64_t r = 1;
  while (e) {
    if (e & 1u) r *= base;
    base *= base;
    e >>= 1;
  }
  return static_cast<C>(r);
}

/// op(x, y) for the arithmetic binary ops.
template <BinaryOp Op, typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE C binary_arith(C x, C y) {
  if constexpr (Op == BinaryOp::kAdd) {
    return static_cast<C>(x + y);
  } else if constexpr (Op == BinaryOp::kSub) {
    return static_cast<C>(x - y);
  } else if constexpr (Op == BinaryOp::kMul) {
    return static_cast<C>(x * y);
  } else if constexpr (Op == BinaryOp::kDiv) {
    if constexpr (std::is_floating_point_v<C>) {
      return x / y;
    } else {
      // Floor division like NumPy's floor_divide; division by zero gives 0.
      if (y == C(0)) return C(0);
      C q = static_cast<C>(x / y);
      if ((x % y != 0) && (math::negative(x) != math::negative(y))) --q;
      return q;
    }
  } else if constexpr (Op == BinaryOp::kPow) {
    if constexpr (std::is_floating_point_v<C>) {
      return math::pow(x, y);
    } else {
      return integer_pow(x, y);
    }
  } else if constexpr (Op == BinaryOp::kMaximum) {
    return (x > y || x != x) ? x : y;
  } else if constexpr (Op == BinaryOp::kMinimum) {
    return (x < y || x != x) ? x : y;
  } else {
    static_assert(Op == BinaryOp::kAdd, "binary_arith: not an arithmetic op");
    return x;
  }
}

/// op(x, y) for the comparison and logical binary ops.
template <BinaryOp Op, typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE bool binary_predicate(C x, C y) {
  if constexpr (Op == BinaryOp::kEq) {
    return x == y;
  } else if constexpr (Op == BinaryOp::kNe) {
    return x != y;
  } else if constexpr (Op == BinaryOp::kLt) {
    return x < y;
  } else if constexpr (Op == BinaryOp::kLe) {
    return x <= y;
  } else if constexpr (Op == BinaryOp::kGt) {
    return x > y;
  } else if constexpr (Op == BinaryOp::kGe) {
    return x >= y;
  } else if constexpr (Op == BinaryOp::kLogicalAnd) {
    return static_cast<bool>(x) && static_cast<bool>(y);
  } else if constexpr (Op == BinaryOp::kLogicalOr) {
    return static_cast<bool>(x) || static_cast<bool>(y);
  } else {
    static_assert(binary_op_is_predicate(Op), "binary_predicate: not a predicate");
    return false;
  }
}

/// The ReLU gradient of one element: gy where y > 0, else 0 (the gradient at the kink is 0).
template <typename C>
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE C relu_grad(C gy, C y) {
  return y > C(0) ? gy : C(0);
}

}  // namespace kusari::common
