// Differentiable 2-d convolutions (Chainer's F.convolution_2d and F.deconvolution_2d).
//
// Both work on NCHW data. Their gradients are again convolutions and deconvolutions (see
// Note [Convolution gradients] in src/functions/convolution.cc), so any order of gradient can be
// taken.
#pragma once

#include <cstdint>
#include <optional>

#include "kusari/autograd/variable.h"
#include "kusari/functions/int_pair.h"

namespace kusari::functions {

/// 2-d convolution of x (N, C, H, W) with W (O, C / groups, kH, kW), plus b (O,) when defined.
/// The output is (N, O, outH, outW) with out = (in + 2 pad - (dilate (k - 1) + 1)) / stride + 1.
/// `groups` splits the channels into that many independent convolutions (C and O must be
/// multiples of it). Arguments as in Chainer: a single int stands for both axes.
Variable convolution_2d(const Variable& x, const Variable& W, const Variable& b = Variable(),
                        IntPair stride = 1, IntPair pad = 0, IntPair dilate = 1,
                        int64_t groups = 1);

/// 2-d transposed convolution (the gradient of convolution_2d with respect to its input) of
/// x (N, C, H, W) with W (C, O / groups, kH, kW), plus b (O,) when defined. The output is
/// (N, O, outH, outW) with out = stride (in - 1) + dilate (k - 1) + 1 - 2 pad, unless `outsize`
/// picks another size that a convolution with these parameters maps back to (H, W).
Variable deconvolution_2d(const Variable& x, const Variable& W, const Variable& b = Variable(),
                          IntPair stride = 1, IntPair pad = 0,
                          std::optional<IntPair> outsize = std::nullopt, IntPair dilate = 1,
                          int64_t groups = 1);

}  // namespace kusari::functions
