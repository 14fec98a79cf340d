// The LSTM cell update (Chainer's F.lstm): the activation part of a long short-term memory unit,
// without its weights. links::LSTM adds the upward and lateral connections and keeps the state.
#pragma once

#include <utility>

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// One LSTM step, Chainer's F.lstm: returns (c, h) for the previous cell state c_prev (B', S, ...)
/// and the pre-activations x (B, 4 S, ...), B <= B'.
///
/// x is read as Chainer reads it, reshaped to (B, S, 4, ...): the four gates of unit s are the
/// interleaved columns x[:, 4 s + k], k = 0 (cell input a), 1 (input gate i), 2 (forget gate f),
/// 3 (output gate o); see Note [LSTM gate layout]. With a = tanh, i, f, o = sigmoid:
///   c = a * i + f * c_prev[:B],   h = o * tanh(c).
/// Rows of c_prev beyond B are passed through unchanged into c (so c has c_prev's shape and h has
/// B rows), which lets a batch of sequences sorted by decreasing length shrink over time.
/// Differentiable any number of times.
std::pair<Variable, Variable> lstm(const Variable& c_prev, const Variable& x);

}  // namespace kusari::functions
