// Differentiable loss functions (Chainer's F.loss family).
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// How a loss combines per-sample values.
enum class Reduce { kMean, kNone };

/// Cross entropy of softmax(x) along axis 1 against integer labels t (int32 or int64).
/// Samples whose label equals `ignore_label` contribute nothing; with Reduce::kMean the sum is
/// divided by the number of samples that are not ignored (Chainer's normalize=True). The loss
/// has x's dtype, except for float16 and bfloat16 x: it is then computed and returned in float32
/// (the gradient with respect to x keeps x's dtype; Note [Softmax cross entropy in 16-bit floats]).
/// With label_smoothing = eps in [0, 1] the target is (1 - eps) onehot(t) + eps / classes
/// instead of onehot(t) (Note [Label smoothing] in src/functions/loss.cc).
Variable softmax_cross_entropy(const Variable& x, const Array& t, int64_t ignore_label = -1,
                               Reduce reduce = Reduce::kMean, double label_smoothing = 0.0);

/// Sigmoid cross entropy of logits x against binary labels t (int32 or int64, same shape as x;
/// 0 or 1, or -1 to ignore an element), computed stably as
/// max(x, 0) - x t + log(1 + exp(-|x|)). With Reduce::kMean the sum is divided by the number of
/// elements not ignored when `normalize`, else by the batch size x.shape[0] (Chainer's semantics).
Variable sigmoid_cross_entropy(const Variable& x, const Array& t, bool normalize = true,
                               Reduce reduce = Reduce::kMean);

/// mean((x0 - x1)^2) over all elements; x0 and x1 must have the same shape and dtype.
Variable mean_squared_error(const Variable& x0, const Variable& x1);

}  // namespace kusari::functions
