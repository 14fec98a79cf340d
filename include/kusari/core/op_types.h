// The operation codes and parameter structs that the public routines take (kusari/core/routines.h):
// unary, binary and reduction ops, convolution and pooling geometry, optimizer update rules.
// The kernels that implement them are private to the library (src/kernels/, Note [Kernel families]).
#pragma once

#include <cstdint>

namespace kusari {

/// Elementwise operations of one operand (plus up to two scalar parameters).
enum class UnaryOp : int8_t {
  kIdentity,
  kNeg,
  kAbs,
  kSign,
  kExp,
  kLog,
  kLog1p,
  kExpm1,
  kSqrt,
  kRsqrt,
  kSquare,
  kReciprocal,
  kSin,
  kCos,
  kTanh,
  kSigmoid,
  kRelu,
  kFloor,
  kCeil,
  kErf,
  kSoftplus,     // log(1 + exp(beta x)) / beta, p0 = beta
  kLeakyRelu,    // x >= 0 ? x : p0 x
  kElu,          // x >= 0 ? x : p0 (exp(x) - 1)
  kGelu,         // x Phi(x), Phi the standard normal CDF: 0.5 x (1 + erf(x / sqrt(2)))
  kGeluTanh,     // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
  kSilu,         // x sigmoid(x)
  kGeluDerivative,      // d/dx of kGelu: Phi(x) + x phi(x)
  kGeluTanhDerivative,  // d/dx of kGeluTanh
  kSiluDerivative,      // d/dx of kSilu: s (1 + x (1 - s)), s = sigmoid(x)
  kAddScalar,    // x + p0
  kMulScalar,    // x * p0
  kRSubScalar,   // p0 - x
  kRDivScalar,   // p0 / x
  kPowScalar,    // x ^ p0
  kRPowScalar,   // p0 ^ x
  kMaxScalar,    // max(x, p0)
  kMinScalar,    // min(x, p0)
  kClip,         // min(max(x, p0), p1)
  // Predicates: the output is bool.
  kEqScalar,
  kNeScalar,
  kLtScalar,
  kLeScalar,
  kGtScalar,
  kGeScalar,
  kIsNan,
  kIsInf,
  kIsFinite,
  kLogicalNot,
};

/// True for the unary ops whose output dtype is bool.
constexpr bool unary_op_is_predicate(UnaryOp op) { return op >= UnaryOp::kEqScalar; }

/// Elementwise operations of two operands of the same dtype.
enum class BinaryOp : int8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kPow,
  kMaximum,
  kMinimum,
  // Predicates: the output is bool.
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kLogicalAnd,
  kLogicalOr,
};

constexpr bool binary_op_is_predicate(BinaryOp op) { return op >= BinaryOp::kEq; }

/// Reductions over a set of axes.
enum class ReduceOp : int8_t { kSum, kProd, kMax, kMin, kAny, kAll };

/// Index-valued reductions over one axis.
enum class ArgReduceOp : int8_t { kArgMax, kArgMin };

/// 2-d convolution geometry (NCHW data, OIHW weights); `out_pad` only for the transposed form.
struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t pad[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
};

enum class PoolKind : int8_t { kMax, kAverage };

/// 2-d pooling geometry over NCHW data.
struct Pool2dParams {
  PoolKind kind = PoolKind::kMax;
  int64_t ksize[2] = {2, 2};
  int64_t stride[2] = {2, 2};
  int64_t pad[2] = {0, 0};
  bool cover_all = false;          // Chainer's cover_all: include a partial last window
  bool count_include_pad = true;   // average pooling divides by the full window size
};

/// Fused parameter-update rules of the optimizers (one elementwise pass each).
enum class UpdateRule : int8_t {
  kSgd,
  kMomentumSgd,
  kNesterov,
  kAdam,
  kRmsprop,
  kAdaGrad,
  kRmspropWarmup
};

}  // namespace kusari
