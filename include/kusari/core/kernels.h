// The kernel table: the narrow interface between array routines and a backend.
//
// Note [Kernel table]
// Every backend (CPU now, CUDA next) fills one KernelTable in its constructor; there is no
// registration by static initialisers and no per-call lookup beyond one pointer load. A kernel
// receives arrays that the routine has already checked: same device, agreed dtypes, broadcast
// operands as stride-0 views of the output's shape, and an allocated output. The kernel dispatches
// on dtype once and never touches autograd. An entry left null means "not implemented on this
// backend" and the routine reports it with the kernel's name and the device.
#pragma once

#include <cstdint>

#include "kusari/core/scalar.h"
#include "kusari/core/shape.h"

namespace kusari {

class Array;
class Generator;

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
enum class UpdateRule : int8_t { kSgd, kMomentumSgd, kNesterov, kAdam, kRmsprop, kAdaGrad };

/// The per-backend table of kernels. See Note [Kernel table].
struct KernelTable {
  // --- creation and copies ---------------------------------------------------------------
  /// out[...] = value.
  void (*fill)(Array& out, Scalar value) = nullptr;
  /// out[i] = start + i * step (out is 1-d and contiguous).
  void (*arange)(Array& out, double start, double step) = nullptr;
  /// dst = src, converting dtype; same shape, any strides.
  void (*copy)(const Array& src, Array& dst) = nullptr;
  /// Uniform [low, high) or normal(mean = a, std = b) random numbers from the generator.
  void (*random_uniform)(Array& out, double low, double high, Generator& gen) = nullptr;
  void (*random_normal)(Array& out, double mean, double stddev, Generator& gen) = nullptr;

  // --- elementwise ----------------------------------------------------------------------
  void (*unary)(UnaryOp op, const Array& x, Array& out, double p0, double p1) = nullptr;
  /// a and b are views with out's shape (broadcast dims have stride 0).
  void (*binary)(BinaryOp op, const Array& a, const Array& b, Array& out) = nullptr;
  /// out = cond ? a : b; cond is bool; all views of out's shape.
  void (*where)(const Array& cond, const Array& a, const Array& b, Array& out) = nullptr;

  // --- reductions -------------------------------------------------------------------------
  /// out has x's shape with every reduced axis of length 1 (keepdims form).
  void (*reduce)(ReduceOp op, const Array& x, Array& out) = nullptr;
  /// out (int64) has x's shape with `axis` of length 1.
  void (*arg_reduce)(ArgReduceOp op, const Array& x, int axis, Array& out) = nullptr;
  /// Softmax (or log-softmax) along `axis`; out has x's shape.
  void (*softmax)(const Array& x, int axis, bool log, Array& out) = nullptr;

  // --- linear algebra ---------------------------------------------------------------------
  /// out = a @ b over the last two axes; batch axes already broadcast; out is contiguous.
  void (*matmul)(const Array& a, const Array& b, Array& out) = nullptr;

  // --- indexing -----------------------------------------------------------------------------
  /// out = x.take(indices, axis): out.shape = x.shape[:axis] + indices.shape + x.shape[axis+1:].
  void (*take)(const Array& x, const Array& indices, int axis, Array& out) = nullptr;
  /// out[..., indices[j], ...] += values[..., j, ...] along axis (the transpose of take).
  void (*add_at)(Array& out, const Array& indices, int axis, const Array& values) = nullptr;

  // --- neural-network kernels ---------------------------------------------------------------
  /// y = conv(x, w) + b (b may be undefined).
  void (*conv2d_forward)(const Array& x, const Array& w, const Array& b, const Conv2dParams& p,
                         Array& y) = nullptr;
  /// gx = conv_transpose(gy, w): the gradient of conv2d with respect to x.
  void (*conv2d_backward_data)(const Array& w, const Array& gy, const Conv2dParams& p, Array& gx) = nullptr;
  /// gw = the gradient of conv2d with respect to w.
  void (*conv2d_backward_filter)(const Array& x, const Array& gy, const Conv2dParams& p, Array& gw) = nullptr;
  void (*pool2d_forward)(const Array& x, const Pool2dParams& p, Array& y) = nullptr;
  /// gx for pooling; max pooling routes gy to the first maximum of each window of x.
  void (*pool2d_backward)(const Array& x, const Array& y, const Array& gy, const Pool2dParams& p,
                          Array& gx) = nullptr;

  /// One fused optimizer step on a parameter: updates `param` and the `state` arrays in place.
  /// param, grad and the n_state state arrays are contiguous, of one floating dtype and one size
  /// (the routine update_parameter checks this); 16-bit floats are computed in float32, float32
  /// in float32 and float64 in float64. hyper holds the rule's hyperparameters, see
  /// Note [Update rule layouts]:
  ///
  ///   rule          hyper                                                      state
  ///   kSgd          lr                                                         -
  ///   kMomentumSgd  lr, momentum                                               v
  ///   kNesterov     lr, momentum                                               v
  ///   kAdam         alpha_t, beta1, beta2, eps, eta, weight_decay_rate,        m, v (, vhat)
  ///                 amsgrad (0 or 1; 1 needs the third state vhat)
  ///   kRmsprop      lr, alpha, eps, eps_inside_sqrt (0 or 1)                   ms
  ///   kAdaGrad      lr, eps                                                    h
  ///
  /// Note [Update rule layouts]
  /// Each rule is Chainer's, element by element (g the gradient, p the parameter):
  ///   kSgd          p -= lr g
  ///   kMomentumSgd  v = momentum v - lr g;  p += v
  ///   kNesterov     v = momentum v - lr g;  p += momentum^2 v - (1 + momentum) lr g
  ///   kAdam         m += (1 - beta1) (g - m);  v += (1 - beta2) (g^2 - v);
  ///                 vhat = max(vhat, v) with amsgrad, else vhat = v;
  ///                 p -= eta (alpha_t m / (sqrt(vhat) + eps) + weight_decay_rate p)
  ///                 where alpha_t = alpha sqrt(1 - beta2^t) / (1 - beta1^t) is computed by the
  ///                 caller from the parameter's step count t (bias correction).
  ///   kRmsprop      ms = alpha ms + (1 - alpha) g^2;
  ///                 p -= lr g / (sqrt(ms) + eps), or lr g / sqrt(ms + eps) with eps_inside_sqrt
  ///   kAdaGrad      h += g^2;  p -= lr g / (sqrt(h) + eps)
  ///
  /// With `skip` (one int64, on the parameter's device; may be null), nothing is written when
  /// *skip is nonzero at the time the kernel runs.
  void (*update_parameter)(UpdateRule rule, Array& param, const Array& grad, Array* state,
                           int n_state, const double* hyper, int n_hyper,
                           const Array* skip) = nullptr;
  /// out (one int64) = the number of Inf and NaN values in the n contiguous floating arrays
  /// (all on out's device), in one pass; on a GPU a few launches for all of them.
  void (*count_nonfinite)(const Array* arrays, int n, Array& out) = nullptr;
};

}  // namespace kusari
