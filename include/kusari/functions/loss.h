// Differentiable loss functions (Chainer's F.loss family).
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// How a loss combines per-sample values.
enum class Reduce { kMean, kNone };

/// Cross entropy of softmax(x) along axis 1 against integer labels t (int32 or int64).
/// Samples whose label equals `ignore_label` contribute nothing; with Reduce::kMean the sum is
/// divided by the number of samples that are not ignored (Chainer's normalize=True).
Variable softmax_cross_entropy(const Variable& x, const Array& t, int64_t ignore_label = -1,
                               Reduce reduce = Reduce::kMean);

}  // namespace kusari::functions
