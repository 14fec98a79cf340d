// Evaluation metrics (Chainer's F.evaluation family). They are not differentiable: the result
// is a Variable without a creator.
#pragma once

#include <cstdint>
#include <optional>

#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// The fraction of samples whose argmax over axis 1 of y equals the integer label t.
/// y is (N, C, ...) floating; t is int32 or int64 of shape (N, ...). Samples labelled
/// `ignore_label` count in neither the numerator nor the denominator; when every sample is
/// ignored the accuracy is 0. The result is a 0-d array of y's dtype, or float32 when y is float16
/// or bfloat16 (bfloat16 would round 0.87 to 0.8711: its 8 significant bits are too few for a
/// ratio that is reported and averaged).
Variable accuracy(const Variable& y, const Array& t,
                  std::optional<int64_t> ignore_label = std::nullopt);

}  // namespace kusari::functions
