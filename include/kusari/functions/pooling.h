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

/// The inverse of pooling (Chainer's unpooling_2d): every pixel of x (N, C, H, W) is copied
/// into its ksize window of the output, windows `stride` apart (ksize by default) and overlapping
/// windows adding up. The output size is outsize, or s (h - 1) + k - 2 p, minus s - 1 with
/// cover_all (Chainer's default, matching a pooling that covered every input pixel); what falls
/// outside it is dropped, as Chainer's col2im does.
Variable unpooling_2d(const Variable& x, IntPair ksize, std::optional<IntPair> stride = std::nullopt,
                      IntPair pad = 0, std::optional<IntPair> outsize = std::nullopt, bool cover_all = true);

}  // namespace kusari::functions
