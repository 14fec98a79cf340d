// Note [N-step RNNs as steps]
// n_step_lstm, n_step_gru and n_step_rnn (and their bidirectional forms) are written with the
// other functions, so they are differentiable to any order on every device. Per layer and
// direction, the input-to-hidden products of all time steps are one GEMM (the inputs of every
// step concatenated, (sum B_t, I)), with the gates' weights stacked into one matrix; each step then
// adds h's product and applies the cell. The LSTM's gates are stacked in the interleaved layout
// F::lstm reads (Note [LSTM gate layout]: unit s's gates a, i, f, o at columns 4 s .. 4 s + 3), so
// the cell is F::lstm itself, whose pass-through of the rows of c beyond B_t keeps the states of
// the sequences that have ended. The backward direction runs t from the last step down: its batch
// grows, and a sequence's rows join at its own last step from the initial state.
// cuDNN's fused RNN would run the steps in one call on a GPU; that is not done yet.
#include "kusari/functions/rnn.h"

#include "functions/function_util.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/array.h"
#include "kusari/functions/connection.h"
#include "kusari/functions/lstm.h"
#include "kusari/functions/math.h"
#include "kusari/functions/noise.h"

namespace kusari::functions {
namespace {

enum class Cell { kLstm, kGru, kTanh, kRelu };

int weights_per_layer(Cell cell) {
  switch (cell) {
    case Cell::kLstm:
      return 8;
    case Cell::kGru:
      return 6;
    default:
      return 2;
  }
}

/// The stacked weights of one layer and direction: px = linear(x, wx, bx), ph = linear(h, wh, bh).
struct Fused {
  Variable wx, bx, wh, bh;
};

Fused fuse(Cell cell, const std::vector<Variable>& w, const std::vector<Variable>& b) {
  Fused f;
  switch (cell) {
    case Cell::kLstm: {
      // F::lstm's interleaved gates (a, i, f, o) from Chainer's W_3, W_0, W_1, W_2 (on x) and
      // W_7, W_4, W_5, W_6 (on h); the two biases of each gate added.
      const int64_t n = w[0].shape()[0];
      f.wx = reshape(stack({w[3], w[0], w[1], w[2]}, 1), {4 * n, w[0].shape()[1]});
      f.wh = reshape(stack({w[7], w[4], w[5], w[6]}, 1), {4 * n, n});
      f.bx = reshape(stack({add(b[3], b[7]), add(b[0], b[4]), add(b[1], b[5]), add(b[2], b[6])}, 1),
                     {4 * n});
      break;
    }
    case Cell::kGru:
      f.wx = concat({w[0], w[1], w[2]}, 0);
      f.bx = concat({b[0], b[1], b[2]}, 0);
      f.wh = concat({w[3], w[4], w[5]}, 0);
      f.bh = concat({b[3], b[4], b[5]}, 0);
      break;
    default:
      f.wx = w[0];
      f.wh = w[1];
      f.bx = add(b[0], b[1]);
      break;
  }
  return f;
}

Variable rows(const Variable& x, int64_t begin, int64_t end) {
  if (begin == 0 && end == x.shape()[0]) return x;
  return get_item(x, {Slice(begin, end)});
}

/// The final state and the per-step outputs of one direction of one layer.
struct DirectionResult {
  Variable h, c;
  std::vector<Variable> ys;
};

/// One step of a cell: the new h (B_t rows) and, for the LSTM, the new c (c_prev's rows).
std::pair<Variable, Variable> step(Cell cell, const Fused& f, const Variable& px,
                                   const Variable& h_prev, const Variable& c_prev) {
  switch (cell) {
    case Cell::kLstm: {
      auto [c, h] = lstm(c_prev, add(px, linear(h_prev, f.wh)));
      return {h, c};
    }
    case Cell::kGru: {
      const std::vector<Variable> x3 = split_axis(px, 3, 1),
                                  h3 = split_axis(linear(h_prev, f.wh, f.bh), 3, 1);
      const Variable r = sigmoid(add(x3[0], h3[0])), z = sigmoid(add(x3[1], h3[1]));
      const Variable candidate = tanh(add(x3[2], mul(r, h3[2])));
      // (1 - z) h~ + z h = h~ + z (h - h~)
      return {add(candidate, mul(z, sub(h_prev, candidate))), Variable()};
    }
    case Cell::kTanh:
      return {tanh(add(px, linear(h_prev, f.wh))), Variable()};
    case Cell::kRelu:
      return {relu(add(px, linear(h_prev, f.wh))), Variable()};
  }
  return {};
}

DirectionResult run_direction(Cell cell, const Fused& f, const std::vector<Variable>& px,
                              const Variable& h0, const Variable& c0, bool reverse) {
  const int64_t steps = static_cast<int64_t>(px.size()), batch = h0.shape()[0];
  DirectionResult r;
  r.ys.resize(static_cast<size_t>(steps));
  if (!reverse) {
    Variable h = h0, c = c0;
    for (int64_t t = 0; t < steps; ++t) {
      const int64_t bt = px[static_cast<size_t>(t)].shape()[0];
      auto [h_new, c_new] = step(cell, f, px[static_cast<size_t>(t)], rows(h, 0, bt), c);
      r.ys[static_cast<size_t>(t)] = h_new;
      // The rows of ended sequences keep their state (the LSTM's c does so inside F::lstm).
      h = bt < batch ? concat({h_new, rows(h, bt, batch)}, 0) : h_new;
      if (cell == Cell::kLstm) c = c_new;
    }
    r.h = h;
    r.c = c;
    return r;
  }
  Variable h, c;  // the states of the B_{t+1} sequences running after step t
  for (int64_t t = steps - 1; t >= 0; --t) {
    const int64_t bt = px[static_cast<size_t>(t)].shape()[0];
    const int64_t running = h.defined() ? h.shape()[0] : 0;
    // Sequences whose last step is t join from the initial state.
    Variable hp = running == 0   ? rows(h0, 0, bt)
                  : running < bt ? concat({h, rows(h0, running, bt)}, 0)
                                 : h;
    Variable cp;
    if (cell == Cell::kLstm)
      cp = running == 0   ? rows(c0, 0, bt)
           : running < bt ? concat({c, rows(c0, running, bt)}, 0)
                          : c;
    auto [h_new, c_new] = step(cell, f, px[static_cast<size_t>(t)], hp, cp);
    r.ys[static_cast<size_t>(t)] = h_new;
    h = h_new;
    c = c_new;
  }
  r.h = h;
  r.c = c;
  return r;
}

struct Result {
  Variable hy, cy;
  std::vector<Variable> ys;
};

Result n_step(const char* fn, Cell cell, bool bidirectional, int64_t n_layers, double dropout_ratio,
              const Variable& hx, const Variable* cx, const std::vector<std::vector<Variable>>& ws,
              const std::vector<std::vector<Variable>>& bs, const std::vector<Variable>& xs) {
  const int64_t dirs = bidirectional ? 2 : 1, k = weights_per_layer(cell);
  KUSARI_CHECK(n_layers >= 1, ValueError, fn, ": n_layers must be at least 1, got ", n_layers);
  KUSARI_CHECK(dropout_ratio >= 0.0 && dropout_ratio < 1.0, ValueError, fn,
               ": dropout_ratio must be in [0, 1), got ", dropout_ratio);
  KUSARI_CHECK(!xs.empty(), ValueError, fn, ": xs holds no time step");
  KUSARI_CHECK(static_cast<int64_t>(ws.size()) == n_layers * dirs &&
                   static_cast<int64_t>(bs.size()) == n_layers * dirs,
               ValueError, fn, ": expected ", n_layers * dirs, " lists of weights and of biases (",
               n_layers, " layers", bidirectional ? " x 2 directions" : "", "), got ", ws.size(),
               " and ", bs.size());
  KUSARI_CHECK(hx.ndim() == 3 && hx.shape()[0] == n_layers * dirs, ShapeError, fn, ": hx must be (",
               n_layers * dirs, ", batch, units), got shape ", hx.shape());
  detail::check_floating(fn, hx);
  const int64_t batch = hx.shape()[1], units = hx.shape()[2];
  if (cx) {
    KUSARI_CHECK(cx->shape() == hx.shape(), ShapeError, fn, ": cx of shape ", cx->shape(),
                 " must have hx's shape ", hx.shape());
  }
  int64_t previous = batch;
  for (size_t t = 0; t < xs.size(); ++t) {
    const Variable& x = xs[t];
    KUSARI_CHECK(x.ndim() == 2, ShapeError, fn, ": xs[", t,
                 "] must be (batch, features), got shape ", x.shape());
    KUSARI_CHECK(x.dtype() == hx.dtype(), DtypeError, fn, ": xs[", t, "] is ",
                 dtype_name(x.dtype()), " but hx is ", dtype_name(hx.dtype()));
    KUSARI_CHECK(t > 0 || x.shape()[0] == batch, ShapeError, fn, ": xs[0] has ", x.shape()[0],
                 " rows but hx holds states for ", batch, " sequences");
    KUSARI_CHECK(x.shape()[0] <= previous && x.shape()[0] >= 1, ShapeError, fn, ": xs[", t,
                 "] has ", x.shape()[0], " rows after ", previous,
                 "; the sequences must be sorted by decreasing length (each step's batch "
                 "at most the one before, and not empty)");
    KUSARI_CHECK(x.shape()[1] == xs[0].shape()[1], ShapeError, fn, ": xs[", t, "] has ",
                 x.shape()[1], " features but xs[0] has ", xs[0].shape()[1]);
    previous = x.shape()[0];
  }
  for (int64_t i = 0; i < n_layers * dirs; ++i) {
    const auto& w = ws[static_cast<size_t>(i)];
    const auto& b = bs[static_cast<size_t>(i)];
    KUSARI_CHECK(static_cast<int64_t>(w.size()) == k && static_cast<int64_t>(b.size()) == k,
                 ValueError, fn, ": ws[", i, "] and bs[", i, "] must hold ", k,
                 " arrays each, got ", w.size(), " and ", b.size());
    const int64_t in = i < dirs ? xs[0].shape()[1] : units * dirs;
    for (int64_t j = 0; j < k; ++j) {
      const Shape want = j < k / 2 ? Shape{units, in} : Shape{units, units};
      KUSARI_CHECK(w[static_cast<size_t>(j)].shape() == want, ShapeError, fn, ": ws[", i, "][", j,
                   "] must be ", want, ", got ", w[static_cast<size_t>(j)].shape());
      KUSARI_CHECK(b[static_cast<size_t>(j)].shape() == Shape{units}, ShapeError, fn, ": bs[", i,
                   "][", j, "] must be (", units, "), got ", b[static_cast<size_t>(j)].shape());
    }
  }
  std::vector<int64_t> offsets;  // where each step's rows end in the concatenated inputs
  int64_t total = 0;
  for (const Variable& x : xs) {
    total += x.shape()[0];
    offsets.push_back(total);
  }
  offsets.pop_back();
  std::vector<Variable> inputs = xs, hys, cys;
  for (int64_t layer = 0; layer < n_layers; ++layer) {
    std::vector<std::vector<Variable>> outs;
    for (int64_t d = 0; d < dirs; ++d) {
      const int64_t i = layer * dirs + d;
      // Chainer drops the inputs of the layers after the first, each direction with its own mask.
      std::vector<Variable> in = inputs;
      if (layer > 0 && dropout_ratio > 0.0) {
        for (Variable& x : in) x = dropout(x, dropout_ratio);
      }
      const Variable x_all = concat(in, 0);
      const Fused f = fuse(cell, ws[static_cast<size_t>(i)], bs[static_cast<size_t>(i)]);
      const Variable px_all = linear(x_all, f.wx, f.bx);
      const std::vector<Variable> px =
          offsets.empty() ? std::vector<Variable>{px_all} : split_axis(px_all, offsets, 0);
      const Variable h0 = get_item(hx, {Index(i)});
      const Variable c0 = cx ? get_item(*cx, {Index(i)}) : Variable();
      DirectionResult r = run_direction(cell, f, px, h0, c0, d == 1);
      hys.push_back(r.h);
      if (cx) cys.push_back(r.c);
      outs.push_back(std::move(r.ys));
    }
    inputs = outs[0];
    if (dirs == 2) {
      for (size_t t = 0; t < inputs.size(); ++t) inputs[t] = concat({outs[0][t], outs[1][t]}, 1);
    }
  }
  Result out;
  out.hy = stack(hys, 0);
  if (cx) out.cy = stack(cys, 0);
  out.ys = std::move(inputs);
  return out;
}

Cell rnn_cell(const char* fn, const std::string& activation) {
  if (activation == "tanh") return Cell::kTanh;
  KUSARI_CHECK(activation == "relu", ValueError, fn, ": activation must be 'tanh' or 'relu', got '",
               activation, "'");
  return Cell::kRelu;
}

}  // namespace

std::tuple<Variable, Variable, std::vector<Variable>> n_step_lstm(
    int64_t n_layers, double dropout_ratio, const Variable& hx, const Variable& cx,
    const std::vector<std::vector<Variable>>& ws, const std::vector<std::vector<Variable>>& bs,
    const std::vector<Variable>& xs) {
  Result r =
      n_step("n_step_lstm", Cell::kLstm, false, n_layers, dropout_ratio, hx, &cx, ws, bs, xs);
  return {r.hy, r.cy, std::move(r.ys)};
}

std::tuple<Variable, Variable, std::vector<Variable>> n_step_bilstm(
    int64_t n_layers, double dropout_ratio, const Variable& hx, const Variable& cx,
    const std::vector<std::vector<Variable>>& ws, const std::vector<std::vector<Variable>>& bs,
    const std::vector<Variable>& xs) {
  Result r =
      n_step("n_step_bilstm", Cell::kLstm, true, n_layers, dropout_ratio, hx, &cx, ws, bs, xs);
  return {r.hy, r.cy, std::move(r.ys)};
}

std::pair<Variable, std::vector<Variable>> n_step_gru(int64_t n_layers, double dropout_ratio,
                                                      const Variable& hx,
                                                      const std::vector<std::vector<Variable>>& ws,
                                                      const std::vector<std::vector<Variable>>& bs,
                                                      const std::vector<Variable>& xs) {
  Result r =
      n_step("n_step_gru", Cell::kGru, false, n_layers, dropout_ratio, hx, nullptr, ws, bs, xs);
  return {r.hy, std::move(r.ys)};
}

std::pair<Variable, std::vector<Variable>> n_step_bigru(
    int64_t n_layers, double dropout_ratio, const Variable& hx,
    const std::vector<std::vector<Variable>>& ws, const std::vector<std::vector<Variable>>& bs,
    const std::vector<Variable>& xs) {
  Result r =
      n_step("n_step_bigru", Cell::kGru, true, n_layers, dropout_ratio, hx, nullptr, ws, bs, xs);
  return {r.hy, std::move(r.ys)};
}

std::pair<Variable, std::vector<Variable>> n_step_rnn(int64_t n_layers, double dropout_ratio,
                                                      const Variable& hx,
                                                      const std::vector<std::vector<Variable>>& ws,
                                                      const std::vector<std::vector<Variable>>& bs,
                                                      const std::vector<Variable>& xs,
                                                      const std::string& activation) {
  Result r = n_step("n_step_rnn", rnn_cell("n_step_rnn", activation), false, n_layers,
                    dropout_ratio, hx, nullptr, ws, bs, xs);
  return {r.hy, std::move(r.ys)};
}

std::pair<Variable, std::vector<Variable>> n_step_birnn(
    int64_t n_layers, double dropout_ratio, const Variable& hx,
    const std::vector<std::vector<Variable>>& ws, const std::vector<std::vector<Variable>>& bs,
    const std::vector<Variable>& xs, const std::string& activation) {
  Result r = n_step("n_step_birnn", rnn_cell("n_step_birnn", activation), true, n_layers,
                    dropout_ratio, hx, nullptr, ws, bs, xs);
  return {r.hy, std::move(r.ys)};
}

}  // namespace kusari::functions
