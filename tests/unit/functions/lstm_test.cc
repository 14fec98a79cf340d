// lstm: outputs against an element-by-element reference of Chainer's formula (interleaved gate
// layout, extra trailing axes, a c_prev with more rows than x), gradients against the same
// computation written with differentiable functions, numerical first- and second-order gradient
// checks, and error cases.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

double sigmoid_ref(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

// Chainer's F.lstm element by element: x (batch, 4 units, rest) holds gate k of unit s in column
// 4 s + k; c_prev (rows, units, rest) with rows >= batch.
struct LstmRef {
  std::vector<double> c, h;
};
LstmRef lstm_ref(const std::vector<double>& c_prev, const std::vector<double>& x, int64_t rows,
                 int64_t batch, int64_t units, int64_t rest) {
  LstmRef r{c_prev, std::vector<double>(static_cast<size_t>(batch * units * rest))};
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < units; ++s) {
      for (int64_t e = 0; e < rest; ++e) {
        auto gate = [&](int64_t k) {
          return x[static_cast<size_t>((b * 4 * units + 4 * s + k) * rest + e)];
        };
        const double a = std::tanh(gate(0)), i = sigmoid_ref(gate(1)), f = sigmoid_ref(gate(2)),
                     o = sigmoid_ref(gate(3));
        const size_t at = static_cast<size_t>((b * units + s) * rest + e);
        r.c[at] = a * i + f * c_prev[at];
        r.h[at] = o * std::tanh(r.c[at]);
      }
    }
  }
  (void)rows;
  return r;
}

// The same computation with differentiable functions (slices of the gate view), as a reference
// for the gradients.
std::pair<Variable, Variable> lstm_composite(const Variable& c_prev, const Variable& x) {
  Shape rs = x.shape();
  rs[1] /= 4;
  rs.insert(2, 4);
  Variable r = F::reshape(x, rs);
  auto gate = [&](int64_t k) { return F::get_item(r, {Slice(), Slice(), k}); };
  const int64_t batch = x.shape()[0];
  Variable cp = F::get_item(c_prev, {Slice(0, batch)});
  Variable c = F::tanh(gate(0)) * F::sigmoid(gate(1)) + F::sigmoid(gate(2)) * cp;
  Variable h = F::sigmoid(gate(3)) * F::tanh(c);
  if (batch < c_prev.shape()[0])
    c = F::concat({c, F::get_item(c_prev, {Slice(batch, std::nullopt)})}, 0);
  return {c, h};
}

class LstmTest : public testing::FunctionTest {};

TEST_P(LstmTest, MatchesChainerFormula) {
  struct Case {
    int64_t rows, batch, units, rest;
  };
  for (const Case& k : {Case{3, 3, 2, 1}, Case{4, 2, 3, 1}, Case{2, 2, 3, 2}, Case{3, 1, 1, 3}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << k.rows << " batch " << k.batch << " units "
                                      << k.units << " rest " << k.rest);
    Shape cs{k.rows, k.units}, xs{k.batch, 4 * k.units};
    if (k.rest > 1) {
      cs.push_back(k.rest);
      xs.push_back(k.rest);
    }
    Array c_prev = uniform(cs, float64), x = uniform(xs, float64, -2, 2);
    auto [c, h] = F::lstm(c_prev, x);
    ASSERT_EQ(c.shape(), cs);
    Shape hs = cs;
    hs[0] = k.batch;
    ASSERT_EQ(h.shape(), hs);
    LstmRef ref = lstm_ref(c_prev.to_vector<double>(), x.to_vector<double>(), k.rows, k.batch,
                           k.units, k.rest);
    EXPECT_TRUE(ArraysClose(c.data(), Array::from_vector(ref.c, cs, device()), 1e-12, 1e-14));
    EXPECT_TRUE(ArraysClose(h.data(), Array::from_vector(ref.h, hs, device()), 1e-12, 1e-14));
  }
}

TEST_P(LstmTest, KnownValues) {
  // One unit, x = (a, i, f, o) pre-activations: c = tanh(a) sigmoid(i) + sigmoid(f) c_prev.
  Array c_prev = Array::from({0.5}, Shape{1, 1}, float64, device());
  Array x = Array::from({1.0, 0.0, 2.0, -1.0}, Shape{1, 4}, float64, device());
  auto [c, h] = F::lstm(c_prev, x);
  const double c_expected = std::tanh(1.0) * 0.5 + sigmoid_ref(2.0) * 0.5;
  EXPECT_NEAR(c.data().item<double>(), c_expected, 1e-12);
  EXPECT_NEAR(h.data().item<double>(), sigmoid_ref(-1.0) * std::tanh(c_expected), 1e-12);
}

TEST_P(LstmTest, GradientsMatchComposite) {
  // Output gradients on c only, h only, or both; c_prev with more rows than x.
  for (int which : {0, 1, 2}) {
    SCOPED_TRACE(which);
    Array c0 = uniform({4, 3}, float64), x0 = uniform({2, 12}, float64, -2, 2);
    Array gc = uniform({4, 3}, float64), gh = uniform({2, 3}, float64);
    // lstm plainly, lstm with enable_double_backprop (its rule recomputes the gates with
    // differentiable functions), and the composite.
    std::vector<Array> grads;
    for (int variant : {0, 1, 2}) {
      Variable c_prev(c0, true), x(x0, true);
      auto [c, h] = variant == 2 ? lstm_composite(c_prev, x) : F::lstm(c_prev, x);
      Variable loss;
      if (which == 0) loss = F::sum(c * Variable(gc));
      if (which == 1) loss = F::sum(h * Variable(gh));
      if (which == 2) loss = F::sum(c * Variable(gc)) + F::sum(h * Variable(gh));
      std::vector<Variable> g = grad({loss}, {c_prev, x}, {}, variant == 1);
      grads.push_back(g[0].data());
      grads.push_back(g[1].data());
    }
    for (int variant : {1, 2}) {
      EXPECT_TRUE(ArraysClose(grads[0], grads[2 * variant], 1e-12, 1e-14)) << variant;
      EXPECT_TRUE(ArraysClose(grads[1], grads[2 * variant + 1], 1e-12, 1e-14)) << variant;
    }
  }
}

TEST_P(LstmTest, Gradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    auto f = [](const std::vector<Variable>& v) {
      auto [c, h] = F::lstm(v[0], v[1]);
      return std::vector<Variable>{c, h};
    };
    check(f, {uniform({3, 2}, d), uniform({3, 8}, d, -2, 2)});
    // A shrinking batch and a trailing axis; non-contiguous inputs.
    check(f, {uniform({4, 2, 3}, d), uniform({2, 8, 3}, d, -2, 2)});
    check(f, {noncontig({3, 2}, d), noncontig({3, 8}, d, -2, 2)});
  }
}

TEST_P(LstmTest, OnlyXNeedsAGradient) {
  Variable c_prev(uniform({2, 3}, float64));
  Variable x(uniform({2, 12}, float64), true);
  auto [c, h] = F::lstm(c_prev, x);
  F::sum(h).backward();
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(c_prev.grad().defined());
}

TEST_P(LstmTest, Errors) {
  Array c = uniform({2, 3}, float32);
  EXPECT_THROW(F::lstm(c, uniform({2, 11}, float32)), ShapeError);     // not 4 * 3 columns
  EXPECT_THROW(F::lstm(c, uniform({3, 12}, float32)), ShapeError);     // more rows than c_prev
  EXPECT_THROW(F::lstm(c, uniform({2, 12, 1}, float32)), ShapeError);  // different ndim
  EXPECT_THROW(F::lstm(uniform({2}, float32), uniform({2}, float32)), ShapeError);
  EXPECT_THROW(F::lstm(c, uniform({2, 12}, float64)), DtypeError);
  EXPECT_THROW(
      F::lstm(Array::zeros({2, 3}, int32, device()), Array::zeros({2, 12}, int32, device())),
      DtypeError);
  try {
    F::lstm(c, uniform({2, 8}, float32));
    FAIL() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("lstm"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(2, 8)"), std::string::npos) << e.what();
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(LstmTest);

}  // namespace
}  // namespace kusari
