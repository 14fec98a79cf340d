// Stacked recurrent networks over variable-length sequences (Chainer's n_step_lstm, n_step_gru,
// n_step_rnn and their bidirectional forms), written with kusari's other functions (Note [N-step
// RNNs as steps] in src/functions/rnn.cc): differentiable any number of times, on every device.
//
// The arguments are Chainer's. xs is time-major: xs[t] is (B_t, I), the inputs at time t of the
// sequences still running, which are sorted by decreasing length, so B_0 >= B_1 >= ... (F::
// transpose_sequence in Chainer turns a list of sequences into this form). hx (and cx for the
// LSTM) is (S, B_0, N) for S layers, (2 S, B_0, N) bidirectional: layer l's forward state at 2 l,
// its backward state at 2 l + 1. ws[i] and bs[i] are the weights and biases of layer i (of layer
// i / 2, direction i % 2, bidirectional): W_j is (N, I) for the input-to-hidden weights of the
// first layer, (N, 2 N) for those of the later bidirectional layers, (N, N) otherwise; b_j (N,).
// The returned hy (and cy) hold each sequence's state after its own last step, ys[t] (B_t, N)
// (B_t, 2 N bidirectional: [forward; backward]) the last layer's outputs. dropout_ratio drops the
// inputs of every layer after the first (each direction with its own mask) in training mode
// (Chainer's config), as Chainer does.
#pragma once

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// The LSTM, with ws[i] and bs[i] eight each: with W_0..W_3 on x and W_4..W_7 on h,
///   i = sigmoid(W_0 x + W_4 h + b_0 + b_4), f = sigmoid(W_1 x + W_5 h + b_1 + b_5),
///   o = sigmoid(W_2 x + W_6 h + b_2 + b_6), a = tanh(W_3 x + W_7 h + b_3 + b_7),
///   c' = f c + i a, h' = o tanh(c').
/// Returns (hy, cy, ys).
std::tuple<Variable, Variable, std::vector<Variable>> n_step_lstm(
    int64_t n_layers, double dropout_ratio, const Variable& hx, const Variable& cx,
    const std::vector<std::vector<Variable>>& ws, const std::vector<std::vector<Variable>>& bs,
    const std::vector<Variable>& xs);
std::tuple<Variable, Variable, std::vector<Variable>> n_step_bilstm(
    int64_t n_layers, double dropout_ratio, const Variable& hx, const Variable& cx,
    const std::vector<std::vector<Variable>>& ws, const std::vector<std::vector<Variable>>& bs,
    const std::vector<Variable>& xs);

/// The GRU, with ws[i] and bs[i] six each: W_0..W_2 on x, W_3..W_5 on h,
///   r = sigmoid(W_0 x + b_0 + W_3 h + b_3), z = sigmoid(W_1 x + b_1 + W_4 h + b_4),
///   h~ = tanh(W_2 x + b_2 + r (W_5 h + b_5)), h' = (1 - z) h~ + z h.
/// Returns (hy, ys).
std::pair<Variable, std::vector<Variable>> n_step_gru(int64_t n_layers, double dropout_ratio,
                                                      const Variable& hx,
                                                      const std::vector<std::vector<Variable>>& ws,
                                                      const std::vector<std::vector<Variable>>& bs,
                                                      const std::vector<Variable>& xs);
std::pair<Variable, std::vector<Variable>> n_step_bigru(
    int64_t n_layers, double dropout_ratio, const Variable& hx,
    const std::vector<std::vector<Variable>>& ws, const std::vector<std::vector<Variable>>& bs,
    const std::vector<Variable>& xs);

/// The Elman network, with ws[i] and bs[i] two each: h' = activation(W_0 x + b_0 + W_1 h + b_1),
/// activation "tanh" or "relu". Returns (hy, ys).
std::pair<Variable, std::vector<Variable>> n_step_rnn(int64_t n_layers, double dropout_ratio,
                                                      const Variable& hx,
                                                      const std::vector<std::vector<Variable>>& ws,
                                                      const std::vector<std::vector<Variable>>& bs,
                                                      const std::vector<Variable>& xs,
                                                      const std::string& activation = "tanh");
std::pair<Variable, std::vector<Variable>> n_step_birnn(
    int64_t n_layers, double dropout_ratio, const Variable& hx,
    const std::vector<std::vector<Variable>>& ws, const std::vector<std::vector<Variable>>& bs,
    const std::vector<Variable>& xs, const std::string& activation = "tanh");

}  // namespace kusari::functions
