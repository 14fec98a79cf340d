// Differentiable 2-d pooling (Chainer's F.max_pooling_2d and F.average_pooling_2d) over NCHW data.
#pragma once

#include <optional>

#include "kusari/autograd/variable.h"
#include "kusari/functions/int_pair.h"

namespace kusari::functions {

/// Maximum over ksize windows of x (N, C, H, W), moved by `stride` (ksize when absent) over x
/// padded by `pad` (padding never wins). With cover_all, as in Chainer, a partial window at the
/// end of each axis is added so that every input element is covered. The gradient goes to the
/// first maximum of each window, and is itself differentiable.
Variable max_pooling_2d(const Variable& x, IntPair ksize,
                        std::optional<IntPair> stride = std::nullopt, IntPair pad = 0,
                        bool cover_all = true);

/// Mean over ksize windows of x (N, C, H, W), moved by `stride` (ksize when absent) over x padded
/// with zeros by `pad`; as in Chainer the zero padding counts in the mean (every window divides by
/// kH * kW).
Variable average_pooling_2d(const Variable& x, IntPair ksize,
                            std::optional<IntPair> stride = std::nullopt, IntPair pad = 0);

}  // namespace kusari::functions
