// n_step_lstm, n_step_gru, n_step_rnn and their bidirectional forms (Note [N-step RNNs as steps])
// against each sequence run alone through the equations of Chainer's documentation (array
// arithmetic, one sequence at a time, no batching): the outputs of every step, the final states
// of sequences of different lengths, both directions; gradient checks of every input; and the
// errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "function_test_util.h"
#include "kusari/autograd/mode.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class NStepRnnTest : public testing::FunctionTest {};

enum class Kind { kLstm, kGru, kTanh, kRelu };

int count(Kind k) {
  return k == Kind::kLstm ? 8 : k == Kind::kGru ? 6 : 2;
}

Array sig(const Array& x) {
  return 1.0 / (1.0 + kusari::exp(-x));
}

// x (1, I) @ W^T (N, I) -> (1, N), plus b (N).
Array aff(const Array& x, const Array& w, const Array& b) {
  return kusari::matmul(x, w.transpose()) + b;
}

// One sequence (rows of xs) through one direction of one layer, from the documented equations.
struct SeqOut {
  std::vector<Array> ys;  // (1, N) each, in time order
  Array h, c;
};

SeqOut run_sequence(Kind kind, const std::vector<Array>& xs, const std::vector<Array>& w,
                    const std::vector<Array>& b, Array h, Array c, bool reverse) {
  const int64_t n = static_cast<int64_t>(xs.size());
  SeqOut out;
  out.ys.resize(xs.size());
  for (int64_t s = 0; s < n; ++s) {
    const int64_t t = reverse ? n - 1 - s : s;
    const Array& x = xs[static_cast<size_t>(t)];
    switch (kind) {
      case Kind::kLstm: {
        const Array i = sig(aff(x, w[0], b[0]) + aff(h, w[4], b[4]));
        const Array f = sig(aff(x, w[1], b[1]) + aff(h, w[5], b[5]));
        const Array o = sig(aff(x, w[2], b[2]) + aff(h, w[6], b[6]));
        const Array a = kusari::tanh(aff(x, w[3], b[3]) + aff(h, w[7], b[7]));
        c = f * c + i * a;
        h = o * kusari::tanh(c);
        break;
      }
      case Kind::kGru: {
        const Array r = sig(aff(x, w[0], b[0]) + aff(h, w[3], b[3]));
        const Array z = sig(aff(x, w[1], b[1]) + aff(h, w[4], b[4]));
        const Array hh = kusari::tanh(aff(x, w[2], b[2]) + r * aff(h, w[5], b[5]));
        h = (1.0 - z) * hh + z * h;
        break;
      }
      case Kind::kTanh:
        h = kusari::tanh(aff(x, w[0], b[0]) + aff(h, w[1], b[1]));
        break;
      case Kind::kRelu:
        h = kusari::maximum(aff(x, w[0], b[0]) + aff(h, w[1], b[1]), 0.0);
        break;
    }
    out.ys[static_cast<size_t>(t)] = h;
  }
  out.h = h;
  out.c = c;
  return out;
}

struct Problem {
  Kind kind;
  bool bi;
  int64_t layers, units, in;
  std::vector<int64_t> lengths;  // per sequence, decreasing
  Array hx, cx;
  std::vector<std::vector<Array>> ws, bs;
  std::vector<Array> xs;  // time-major
};

Problem make_problem(testing::FunctionTest& t, Kind kind, bool bi, Dtype d,
                     std::function<Array(const Shape&, Dtype)> uniform) {
  Problem p{kind, bi, 2, 3, 4, {3, 3, 2, 1}, {}, {}, {}, {}, {}};
  const int64_t dirs = bi ? 2 : 1, batch = static_cast<int64_t>(p.lengths.size());
  p.hx = uniform({p.layers * dirs, batch, p.units}, d);
  p.cx = uniform({p.layers * dirs, batch, p.units}, d);
  for (int64_t i = 0; i < p.layers * dirs; ++i) {
    const int64_t in = i < dirs ? p.in : p.units * dirs;
    std::vector<Array> w, b;
    for (int j = 0; j < count(kind); ++j) {
      w.push_back(uniform({p.units, j < count(kind) / 2 ? in : p.units}, d));
      b.push_back(uniform({p.units}, d));
    }
    p.ws.push_back(w);
    p.bs.push_back(b);
  }
  for (int64_t step = 0; step < p.lengths[0]; ++step) {
    int64_t bt = 0;
    while (bt < batch && p.lengths[static_cast<size_t>(bt)] > step) ++bt;
    p.xs.push_back(uniform({bt, p.in}, d));
  }
  (void)t;
  return p;
}

// The reference: each sequence alone, layer by layer.
struct Reference {
  std::vector<Array> ys;  // time-major (B_t, N or 2N)
  Array hy, cy;
};

Reference reference(const Problem& p) {
  const int64_t dirs = p.bi ? 2 : 1, batch = static_cast<int64_t>(p.lengths.size());
  std::vector<std::vector<Array>> per_seq_y(static_cast<size_t>(batch));
  std::vector<Array> hys(static_cast<size_t>(p.layers * dirs * batch)), cys(hys.size());
  for (int64_t s = 0; s < batch; ++s) {
    std::vector<Array> inputs;
    for (int64_t t = 0; t < p.lengths[static_cast<size_t>(s)]; ++t) {
      inputs.push_back(p.xs[static_cast<size_t>(t)].to_device(Device::cpu()).at({Slice(s, s + 1)}));
    }
    for (int64_t layer = 0; layer < p.layers; ++layer) {
      std::vector<SeqOut> outs;
      for (int64_t d = 0; d < dirs; ++d) {
        const int64_t i = layer * dirs + d;
        std::vector<Array> w, b;
        for (const Array& a : p.ws[static_cast<size_t>(i)]) w.push_back(a.to_device(Device::cpu()));
        for (const Array& a : p.bs[static_cast<size_t>(i)]) b.push_back(a.to_device(Device::cpu()));
        const Array h0 = p.hx.to_device(Device::cpu()).at({Index(i), Slice(s, s + 1)});
        const Array c0 = p.cx.to_device(Device::cpu()).at({Index(i), Slice(s, s + 1)});
        outs.push_back(run_sequence(p.kind, inputs, w, b, h0, c0, d == 1));
        hys[static_cast<size_t>(i * batch + s)] = outs.back().h;
        cys[static_cast<size_t>(i * batch + s)] = outs.back().c;
      }
      for (size_t t = 0; t < inputs.size(); ++t) {
        inputs[t] =
            dirs == 1 ? outs[0].ys[t] : kusari::concatenate({outs[0].ys[t], outs[1].ys[t]}, 1);
      }
    }
    per_seq_y[static_cast<size_t>(s)] = inputs;
  }
  Reference r;
  for (int64_t t = 0; t < p.lengths[0]; ++t) {
    std::vector<Array> rows;
    for (int64_t s = 0; s < batch && p.lengths[static_cast<size_t>(s)] > t; ++s) {
      rows.push_back(per_seq_y[static_cast<size_t>(s)][static_cast<size_t>(t)]);
    }
    r.ys.push_back(kusari::concatenate(rows, 0));
  }
  r.hy = kusari::concatenate(hys, 0).reshape({p.layers * dirs, batch, p.units});
  if (p.kind == Kind::kLstm)
    r.cy = kusari::concatenate(cys, 0).reshape({p.layers * dirs, batch, p.units});
  return r;
}

std::vector<std::vector<Variable>> vars(const std::vector<std::vector<Array>>& a) {
  std::vector<std::vector<Variable>> out;
  for (const auto& row : a) {
    out.emplace_back();
    for (const Array& x : row) out.back().emplace_back(x);
  }
  return out;
}

struct RunOut {
  Variable hy, cy;
  std::vector<Variable> ys;
};

RunOut run(const Problem& p, const Variable& hx, const Variable& cx,
           const std::vector<std::vector<Variable>>& ws,
           const std::vector<std::vector<Variable>>& bs, const std::vector<Variable>& xs) {
  RunOut r;
  switch (p.kind) {
    case Kind::kLstm: {
      auto [hy, cy, ys] = p.bi ? F::n_step_bilstm(p.layers, 0.0, hx, cx, ws, bs, xs)
                               : F::n_step_lstm(p.layers, 0.0, hx, cx, ws, bs, xs);
      r = {hy, cy, ys};
      break;
    }
    case Kind::kGru: {
      auto [hy, ys] = p.bi ? F::n_step_bigru(p.layers, 0.0, hx, ws, bs, xs)
                           : F::n_step_gru(p.layers, 0.0, hx, ws, bs, xs);
      r = {hy, Variable(), ys};
      break;
    }
    default: {
      const std::string act = p.kind == Kind::kTanh ? "tanh" : "relu";
      auto [hy, ys] = p.bi ? F::n_step_birnn(p.layers, 0.0, hx, ws, bs, xs, act)
                           : F::n_step_rnn(p.layers, 0.0, hx, ws, bs, xs, act);
      r = {hy, Variable(), ys};
      break;
    }
  }
  return r;
}

TEST_P(NStepRnnTest, MatchesEachSequenceRunAlone) {
  for (Kind kind : {Kind::kLstm, Kind::kGru, Kind::kTanh, Kind::kRelu}) {
    for (bool bi : {false, true}) {
      SCOPED_TRACE(std::string(kind == Kind::kLstm   ? "lstm"
                               : kind == Kind::kGru  ? "gru"
                               : kind == Kind::kTanh ? "tanh"
                                                     : "relu") +
                   (bi ? " bidirectional" : ""));
      const Problem p = make_problem(*this, kind, bi, float64,
                                     [&](const Shape& s, Dtype d) { return uniform(s, d); });
      std::vector<Variable> xs(p.xs.begin(), p.xs.end());
      const RunOut got = run(p, Variable(p.hx), Variable(p.cx), vars(p.ws), vars(p.bs), xs);
      const Reference want = reference(p);
      ASSERT_EQ(got.ys.size(), want.ys.size());
      for (size_t t = 0; t < want.ys.size(); ++t) {
        EXPECT_TRUE(
            ArraysClose(got.ys[t].data().to_device(Device::cpu()), want.ys[t], 1e-10, 1e-12))
            << "step " << t;
      }
      EXPECT_TRUE(ArraysClose(got.hy.data().to_device(Device::cpu()), want.hy, 1e-10, 1e-12));
      if (kind == Kind::kLstm)
        EXPECT_TRUE(ArraysClose(got.cy.data().to_device(Device::cpu()), want.cy, 1e-10, 1e-12));
    }
  }
}

TEST_P(NStepRnnTest, GradientsOfEveryInput) {
  for (Kind kind : {Kind::kLstm, Kind::kGru, Kind::kTanh}) {
    for (bool bi : {false, true}) {
      SCOPED_TRACE(std::string(kind == Kind::kLstm  ? "lstm"
                               : kind == Kind::kGru ? "gru"
                                                    : "tanh") +
                   (bi ? " bidirectional" : ""));
      const Problem p = make_problem(*this, kind, bi, float64,
                                     [&](const Shape& s, Dtype d) { return uniform(s, d); });
      // Inputs: hx, cx, every weight and bias, every step's x; outputs: hy, cy and every y.
      std::vector<Array> inputs{p.hx, p.cx};
      for (size_t i = 0; i < p.ws.size(); ++i) {
        inputs.insert(inputs.end(), p.ws[i].begin(), p.ws[i].end());
        inputs.insert(inputs.end(), p.bs[i].begin(), p.bs[i].end());
      }
      inputs.insert(inputs.end(), p.xs.begin(), p.xs.end());
      const size_t per = static_cast<size_t>(count(kind));
      auto f = [&](const std::vector<Variable>& v) {
        std::vector<std::vector<Variable>> ws, bs;
        size_t at = 2;
        for (size_t i = 0; i < p.ws.size(); ++i) {
          ws.emplace_back(v.begin() + static_cast<ptrdiff_t>(at),
                          v.begin() + static_cast<ptrdiff_t>(at + per));
          bs.emplace_back(v.begin() + static_cast<ptrdiff_t>(at + per),
                          v.begin() + static_cast<ptrdiff_t>(at + 2 * per));
          at += 2 * per;
        }
        std::vector<Variable> xs(v.begin() + static_cast<ptrdiff_t>(at), v.end());
        RunOut r = run(p, v[0], v[1], ws, bs, xs);
        std::vector<Variable> outs{r.hy};
        if (r.cy.defined()) outs.push_back(r.cy);
        outs.insert(outs.end(), r.ys.begin(), r.ys.end());
        return outs;
      };
      // cx is not an input of the GRU and the Elman network.
      check(f, inputs, /*double_backward=*/kind == Kind::kTanh,
            kind == Kind::kLstm ? std::vector<int>{} : std::vector<int>{1});
    }
  }
}

TEST_P(NStepRnnTest, DropoutDropsEachLayersInputInTrainingOnly) {
  const Problem p = make_problem(*this, Kind::kTanh, false, float64,
                                 [&](const Shape& s, Dtype d) { return uniform(s, d); });
  std::vector<Variable> xs(p.xs.begin(), p.xs.end());
  auto [hy_train, ys_train] =
      F::n_step_rnn(p.layers, 0.5, Variable(p.hx), vars(p.ws), vars(p.bs), xs);
  const RunOut plain = run(p, Variable(p.hx), Variable(p.cx), vars(p.ws), vars(p.bs), xs);
  EXPECT_FALSE(ArraysClose(hy_train.data(), plain.hy.data(), 1e-6, 1e-6));
  {
    TrainMode test_mode(false);
    auto [hy_test, ys_test] =
        F::n_step_rnn(p.layers, 0.5, Variable(p.hx), vars(p.ws), vars(p.bs), xs);
    EXPECT_TRUE(ArraysClose(hy_test.data(), plain.hy.data(), 1e-12, 1e-12));
  }
}

TEST_P(NStepRnnTest, BadArgumentsAreNamed) {
  const Problem p = make_problem(*this, Kind::kLstm, false, float64,
                                 [&](const Shape& s, Dtype d) { return uniform(s, d); });
  std::vector<Variable> xs(p.xs.begin(), p.xs.end());
  const auto expect = [](auto&& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "accepted; expected an error containing: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  std::vector<Variable> unsorted{xs[2], xs[0]};
  expect(
      [&] {
        F::n_step_lstm(2, 0.0, Variable(p.hx), Variable(p.cx), vars(p.ws), vars(p.bs), unsorted);
      },
      "n_step_lstm: xs[0] has 2 rows but hx holds states for 4 sequences");
  std::vector<Variable> growing{xs[0], xs[2], xs[1]};
  expect(
      [&] {
        F::n_step_lstm(2, 0.0, Variable(p.hx), Variable(p.cx), vars(p.ws), vars(p.bs), growing);
      },
      "sorted by decreasing length");
  auto ws = vars(p.ws);
  ws[1].pop_back();
  expect([&] { F::n_step_lstm(2, 0.0, Variable(p.hx), Variable(p.cx), ws, vars(p.bs), xs); },
         "n_step_lstm: ws[1] and bs[1] must hold 8 arrays each, got 7 and 8");
  ws = vars(p.ws);
  ws[0][0] = Variable(uniform({3, 5}, float64));
  expect([&] { F::n_step_lstm(2, 0.0, Variable(p.hx), Variable(p.cx), ws, vars(p.bs), xs); },
         "n_step_lstm: ws[0][0] must be (3, 4)");
  expect(
      [&] { F::n_step_bilstm(2, 0.0, Variable(p.hx), Variable(p.cx), vars(p.ws), vars(p.bs), xs); },
      "n_step_bilstm: expected 4 lists of weights and of biases (2 layers x 2 directions), got 2 "
      "and 2");
  expect([&] { F::n_step_rnn(1, 0.0, Variable(p.hx), {}, {}, xs, "sigmoid"); },
         "n_step_rnn: activation must be 'tanh' or 'relu', got 'sigmoid'");
}

KUSARI_INSTANTIATE_DEVICE_TEST(NStepRnnTest);

}  // namespace
}  // namespace kusari
