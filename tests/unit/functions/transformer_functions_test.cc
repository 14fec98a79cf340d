// The functions of a transformer: gelu (both forms) and silu, layer and RMS normalization, and
// scaled dot-product attention. Gradient checks of the first and second order on every device,
// known values, the blocked attention kernels against the composed formula (forward, backward,
// masks, causal alignment, dropout, sequences longer than a block), and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "function_test_util.h"
#include "kusari/autograd/mode.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class TransformerFunctionsTest : public testing::FunctionTest {};

// --- gelu and silu -------------------------------------------------------------------------------

TEST_P(TransformerFunctionsTest, GeluSiluGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    for (const Shape& s : {Shape{5}, Shape{3, 4}, Shape{2, 3, 4}}) {
      check([](const Variable& v) { return F::gelu(v); }, uniform(s, d, -3, 3));
      check([](const Variable& v) { return F::gelu(v, true); }, uniform(s, d, -3, 3));
      check([](const Variable& v) { return F::silu(v); }, uniform(s, d, -4, 4));
    }
    check([](const Variable& v) { return F::gelu(v, true); }, noncontig({3, 4}, d, -3, 3));
    check([](const Variable& v) { return F::silu(v); }, noncontig({3, 4}, d, -3, 3));
  }
}

TEST_P(TransformerFunctionsTest, GeluSiluKnownValues) {
  const std::vector<double> xs = {-3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 2.0, 6.0};
  std::vector<double> gelu, gelu_tanh, silu;
  for (double x : xs) {
    gelu.push_back(0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))));
    gelu_tanh.push_back(0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))));
    silu.push_back(x / (1.0 + std::exp(-x)));
  }
  Array x = Array::from_vector(xs, std::nullopt, device());
  EXPECT_TRUE(ArraysClose(F::gelu(Variable(x)).data(), Array::from_vector(gelu, std::nullopt, device()), 1e-12));
  EXPECT_TRUE(ArraysClose(F::gelu(Variable(x), true).data(), Array::from_vector(gelu_tanh, std::nullopt, device()),
                          1e-12));
  EXPECT_TRUE(ArraysClose(F::silu(Variable(x)).data(), Array::from_vector(silu, std::nullopt, device()), 1e-12));
  // gelu(1) = Phi(1) = 0.8413447460685429 (the standard normal CDF at 1).
  EXPECT_NEAR(F::gelu(Variable(Array::from({1.0}, std::nullopt, float64, device()))).data().to_vector<double>()[0],
              0.8413447460685429, 1e-14);
  // silu is finite in both tails.
  Array tails = Array::from({-200.0f, 200.0f}, std::nullopt, float32, device());
  EXPECT_EQ(F::silu(Variable(tails)).data().to_vector<float>(), (std::vector<float>{-0.0f, 200.0f}));
  Variable ints(Array::from_vector(std::vector<int32_t>{1, -2}, std::nullopt, device()));
  EXPECT_THROW(F::gelu(ints), DtypeError);
  EXPECT_THROW(F::silu(ints), DtypeError);
}

// --- layer and RMS normalization ----------------------------------------------------------------

// The normalization written with generic functions, for comparison.
Variable reference_norm(const Variable& x, const Variable& gamma, const Variable& beta, double eps, bool rms,
                        int k) {
  Axes axes;
  for (int d = x.ndim() - k; d < x.ndim(); ++d) axes.push_back(d);
  Variable c = rms ? x : F::sub(x, F::mean(x, axes, true));
  Variable y = F::mul(c, F::pow(F::add(F::mean(F::square(c), axes, true), eps), -0.5));
  if (gamma.defined()) y = F::mul(y, gamma);
  if (beta.defined()) y = F::add(y, beta);
  return y;
}

TEST_P(TransformerFunctionsTest, LayerNormGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    // With gamma and beta, without, over one and over two trailing axes, non-contiguous x.
    check([](const std::vector<Variable>& v) { return std::vector<Variable>{F::layer_normalization(v[0], v[1], v[2])}; },
          {uniform({4, 6}, d, -2, 2), uniform({6}, d, 0.5, 1.5), uniform({6}, d)});
    check([](const std::vector<Variable>& v) {
      return std::vector<Variable>{F::layer_normalization(v[0], Variable(), Variable())};
    }, {uniform({2, 3, 5}, d, -2, 2)});
    check([](const std::vector<Variable>& v) { return std::vector<Variable>{F::layer_normalization(v[0], v[1], v[2])}; },
          {uniform({2, 3, 4}, d, -2, 2), uniform({3, 4}, d, 0.5, 1.5), uniform({3, 4}, d)});
    check([](const std::vector<Variable>& v) { return std::vector<Variable>{F::layer_normalization(v[0], v[1], v[2])}; },
          {noncontig({5, 4}, d, -2, 2), uniform({4}, d, 0.5, 1.5), uniform({4}, d)});
    check([](const std::vector<Variable>& v) { return std::vector<Variable>{F::rms_normalization(v[0], v[1])}; },
          {uniform({4, 6}, d, -2, 2), uniform({6}, d, 0.5, 1.5)});
    check([](const std::vector<Variable>& v) { return std::vector<Variable>{F::rms_normalization(v[0], Variable())}; },
          {noncontig({3, 5}, d, -2, 2)});
  }
}

TEST_P(TransformerFunctionsTest, LayerNormMatchesTheComposedFormula) {
  // Rows long enough for every loop of the kernels, and values with a large mean.
  for (int64_t cols : {1, 7, 768, 1500}) {
    SCOPED_TRACE(cols);
    Array x = uniform({6, cols}, float64, -1, 1) + 100.0;
    Array gamma = uniform({cols}, float64, 0.5, 1.5), beta = uniform({cols}, float64);
    Array gy = uniform({6, cols}, float64);
    for (bool rms : {false, true}) {
      Variable vx(x, true), vg(gamma, true), vb(beta, true);
      Variable y = rms ? F::rms_normalization(vx, vg, 1e-5) : F::layer_normalization(vx, vg, vb, 1e-5);
      y.set_grad(gy);
      y.backward();
      Variable rx(x, true), rg(gamma, true), rb(beta, true);
      Variable r = reference_norm(rx, rg, rms ? Variable() : rb, 1e-5, rms, 1);
      r.set_grad(gy);
      r.backward();
      EXPECT_TRUE(ArraysClose(y.data(), r.data(), 1e-9, 1e-9));
      EXPECT_TRUE(ArraysClose(vx.grad(), rx.grad(), 1e-7, 1e-9));
      EXPECT_TRUE(ArraysClose(vg.grad(), rg.grad(), 1e-9, 1e-9));
      if (!rms) EXPECT_TRUE(ArraysClose(vb.grad(), rb.grad(), 1e-9, 1e-9));
    }
  }
}

TEST_P(TransformerFunctionsTest, LayerNormHalfPrecisionWithFloat32Parameters) {
  for (Dtype d : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(d));
    Array x32 = uniform({8, 64}, float32, -2, 2);
    Array gamma = uniform({64}, float32, 0.5, 1.5), beta = uniform({64}, float32);
    Variable vx(x32.astype(d), true), vg(gamma, true), vb(beta, true);
    Variable y = F::layer_normalization(vx, vg, vb);
    EXPECT_EQ(y.dtype(), d);
    F::sum(F::cast(y, float32)).backward();
    EXPECT_EQ(vx.grad().dtype(), d);
    EXPECT_EQ(vg.grad().dtype(), float32);
    Variable r = reference_norm(Variable(x32.astype(d).astype(float32)), Variable(gamma), Variable(beta), 1e-5, false, 1);
    EXPECT_TRUE(ArraysClose(y.data().astype(float32), r.data(), 2e-2, 2e-2));
    // sum(y) over a row is sum(gamma * x_hat) + sum(beta); its gradient in beta is the row count.
    EXPECT_TRUE(ArraysClose(vb.grad(), Array::full({64}, 8.0, float32, device())));
  }
}

TEST_P(TransformerFunctionsTest, LayerNormErrors) {
  Variable x(uniform({2, 4}, float32));
  EXPECT_THROW(F::layer_normalization(x, Variable(uniform({3}, float32)), Variable()), ShapeError);
  EXPECT_THROW(F::layer_normalization(x, Variable(uniform({4}, float32)), Variable(uniform({2}, float32))),
               ShapeError);
  EXPECT_THROW(F::layer_normalization(x, Variable(uniform({4}, float64)), Variable()), DtypeError);
  EXPECT_THROW(F::layer_normalization(x, Variable(), Variable(), 0.0), ValueError);
  EXPECT_THROW(F::rms_normalization(x, Variable(uniform({2, 2, 4}, float32))), ShapeError);
  try {
    F::layer_normalization(x, Variable(uniform({3}, float32)), Variable());
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("layer_normalization: gamma/beta of shape (3,) must be the trailing shape of x, got x of shape (2, 4)"), std::string::npos)
        << e.what();
  }
}

// --- scaled dot-product attention ----------------------------------------------------------------

// Query row i of a (batch, heads, length, dim) array, keeping the axis.
Array row(const Array& a, int64_t i) { return a.at({Slice(), Slice(), Slice(i, i + 1)}); }

F::AttentionOptions options(F::AttentionPath path, bool causal = false, Array mask = Array()) {
  F::AttentionOptions o;
  o.path = path;
  o.causal = causal;
  o.mask = std::move(mask);
  return o;
}

TEST_P(TransformerFunctionsTest, AttentionGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    for (F::AttentionPath path : {F::AttentionPath::kAuto, F::AttentionPath::kComposed}) {
      for (bool causal : {false, true}) {
        check([path, causal](const std::vector<Variable>& v) {
          return std::vector<Variable>{F::scaled_dot_product_attention(v[0], v[1], v[2], options(path, causal))};
        }, {uniform({2, 2, 3, 4}, d), uniform({2, 2, 5, 4}, d), uniform({2, 2, 5, 3}, d)});
      }
      // One head (3-d), a bool mask over (q_len, kv_len), and an additive one per batch.
      Array keep = kusari::greater(uniform({4, 4}, float64, 0, 1), 0.3);
      keep = kusari::logical_or(keep, kusari::equal(Array::arange(4, int64, device()).reshape({4, 1}),
                                                    Array::arange(4, int64, device()).reshape({1, 4})));
      check([path, keep](const std::vector<Variable>& v) {
        return std::vector<Variable>{F::scaled_dot_product_attention(v[0], v[1], v[2], options(path, false, keep))};
      }, {uniform({2, 4, 3}, d), uniform({2, 4, 3}, d), uniform({2, 4, 2}, d)});
      Array bias = uniform({2, 1, 1, 4}, d, -1, 1);
      check([path, bias](const std::vector<Variable>& v) {
        return std::vector<Variable>{F::scaled_dot_product_attention(v[0], v[1], v[2], options(path, false, bias))};
      }, {uniform({2, 3, 2, 3}, d), uniform({2, 3, 4, 3}, d), uniform({2, 3, 4, 3}, d)});
    }
  }
}

struct AttentionResult {
  Array y, gq, gk, gv;
};

AttentionResult run_attention(const Array& q, const Array& k, const Array& v, const Array& gy,
                              const F::AttentionOptions& o) {
  Variable vq(q, true), vk(k, true), vv(v, true);
  Variable y = F::scaled_dot_product_attention(vq, vk, vv, o);
  y.set_grad(gy);
  y.backward();
  return {y.data(), vq.grad(), vk.grad(), vv.grad()};
}

void expect_same(const AttentionResult& a, const AttentionResult& b, double tol) {
  EXPECT_TRUE(ArraysClose(a.y, b.y, tol, tol));
  EXPECT_TRUE(ArraysClose(a.gq, b.gq, tol, tol));
  EXPECT_TRUE(ArraysClose(a.gk, b.gk, tol, tol));
  EXPECT_TRUE(ArraysClose(a.gv, b.gv, tol, tol));
}

// Longer than a block of queries (64) and of keys (128), with q_len < kv_len (a KV cache's new
// queries) and a head dim of 64: the kernels' blocks and the composed matrices agree.
TEST_P(TransformerFunctionsTest, AttentionKernelsMatchTheComposedPathAcrossBlocks) {
  const int64_t lq = 150, lk = 290;
  Array q = uniform({1, 2, lq, 64}, float64), k = uniform({1, 2, lk, 64}, float64),
        v = uniform({1, 2, lk, 48}, float64), gy = uniform({1, 2, lq, 48}, float64);
  Array mask = kusari::greater(uniform({1, 1, lq, lk}, float64, 0, 1), 0.2);
  for (bool causal : {false, true}) {
    for (bool masked : {false, true}) {
      SCOPED_TRACE(std::string(causal ? "causal" : "full") + (masked ? ", masked" : ""));
      Array m = masked ? mask : Array();
      expect_same(run_attention(q, k, v, gy, options(F::AttentionPath::kAuto, causal, m)),
                  run_attention(q, k, v, gy, options(F::AttentionPath::kComposed, causal, m)), 1e-10);
    }
  }
  // float32 the same within float32's rounding.
  expect_same(run_attention(q.astype(float32), k.astype(float32), v.astype(float32), gy.astype(float32),
                            options(F::AttentionPath::kAuto, true)),
              run_attention(q, k, v, gy, options(F::AttentionPath::kComposed, true)), 1e-4);
}

// causal aligns at the bottom right: with q_len < kv_len it equals the explicit mask j <= i + offset.
TEST_P(TransformerFunctionsTest, AttentionCausalIsTheBottomRightMask) {
  const int64_t lq = 3, lk = 7;
  std::vector<double> m;
  for (int64_t i = 0; i < lq; ++i) {
    for (int64_t j = 0; j < lk; ++j) m.push_back(j <= i + (lk - lq) ? 1.0 : 0.0);
  }
  Array explicit_mask = Array::from_vector(m, Shape{lq, lk}, device()).astype(bool_);
  Array q = uniform({2, 2, lq, 4}, float64), k = uniform({2, 2, lk, 4}, float64), v = uniform({2, 2, lk, 4}, float64);
  Array gy = uniform({2, 2, lq, 4}, float64);
  for (F::AttentionPath path : {F::AttentionPath::kAuto, F::AttentionPath::kComposed}) {
    expect_same(run_attention(q, k, v, gy, options(path, true)),
                run_attention(q, k, v, gy, options(path, false, explicit_mask)), 1e-12);
  }
  // Query 0 of a square causal attention sees only key 0: its output is v[0].
  Array y = F::scaled_dot_product_attention(Variable(q), Variable(q), Variable(q), options(F::AttentionPath::kAuto, true))
                .data();
  EXPECT_TRUE(ArraysClose(row(y, 0), row(q, 0), 1e-12));
}

// A query with every key masked outputs 0 and passes no gradient (no NaN on either path).
TEST_P(TransformerFunctionsTest, AttentionFullyMaskedRowIsZero) {
  Array mask = Array::ones({3, 4}, bool_, device());
  mask = kusari::where(kusari::equal(Array::arange(3, int64, device()).reshape({3, 1}), 1),
                       Array::zeros({3, 4}, bool_, device()), mask);
  Array q = uniform({1, 1, 3, 2}, float64), k = uniform({1, 1, 4, 2}, float64), v = uniform({1, 1, 4, 2}, float64);
  Array gy = uniform({1, 1, 3, 2}, float64);
  for (F::AttentionPath path : {F::AttentionPath::kAuto, F::AttentionPath::kComposed}) {
    AttentionResult r = run_attention(q, k, v, gy, options(path, false, mask));
    EXPECT_TRUE(ArraysClose(row(r.y, 1), Array::zeros({1, 1, 1, 2}, float64, device())));
    EXPECT_TRUE(ArraysClose(row(r.gq, 1), Array::zeros({1, 1, 1, 2}, float64, device())));
    EXPECT_FALSE(kusari::any(kusari::isnan(r.gk)).item<bool>());
  }
}

// Dropout: the kernels and the composed path draw the same mask from the same generator state;
// dropout 0 in evaluation mode; the expected value is unchanged.
TEST_P(TransformerFunctionsTest, AttentionDropoutIsTheSameOnBothPaths) {
  Array q = uniform({2, 2, 70, 8}, float64), k = uniform({2, 2, 130, 8}, float64), v = uniform({2, 2, 130, 8}, float64);
  Array gy = uniform({2, 2, 70, 8}, float64);
  AttentionResult r[2];
  int i = 0;
  for (F::AttentionPath path : {F::AttentionPath::kAuto, F::AttentionPath::kComposed}) {
    Generator g(7);
    F::AttentionOptions o = options(path, true);
    o.dropout = 0.3;
    o.generator = &g;
    r[i++] = run_attention(q, k, v, gy, o);
  }
  expect_same(r[0], r[1], 1e-10);
  AttentionResult plain = run_attention(q, k, v, gy, options(F::AttentionPath::kAuto, true));
  EXPECT_FALSE(ArraysClose(r[0].y, plain.y, 1e-3, 1e-3));
  {
    TrainMode eval(false);
    F::AttentionOptions o = options(F::AttentionPath::kAuto, true);
    o.dropout = 0.3;
    expect_same(run_attention(q, k, v, gy, o), plain, 1e-12);
  }
}

TEST_P(TransformerFunctionsTest, AttentionErrors) {
  Variable q(uniform({2, 2, 3, 4}, float32)), k(uniform({2, 2, 5, 4}, float32)), v(uniform({2, 2, 5, 6}, float32));
  EXPECT_THROW(F::scaled_dot_product_attention(q, Variable(uniform({2, 2, 5, 3}, float32)), v), ShapeError);
  EXPECT_THROW(F::scaled_dot_product_attention(q, k, Variable(uniform({2, 2, 4, 6}, float32))), ShapeError);
  EXPECT_THROW(F::scaled_dot_product_attention(q, Variable(uniform({2, 3, 5, 4}, float32)), v), ShapeError);
  EXPECT_THROW(F::scaled_dot_product_attention(q, Variable(k.data().astype(float64)), v), DtypeError);
  EXPECT_THROW(F::scaled_dot_product_attention(Variable(uniform({3, 4}, float32)), k, v), ShapeError);
  F::AttentionOptions o;
  o.mask = Array::ones({4, 5}, bool_, device());
  try {
    F::scaled_dot_product_attention(q, k, v, o);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("mask of shape (4, 5) does not broadcast to (batch, heads, q_len, kv_len) = "
                                         "(2, 2, 3, 5)"),
              std::string::npos)
        << e.what();
  }
  o.mask = Array::ones({3, 5}, int32, device());
  EXPECT_THROW(F::scaled_dot_product_attention(q, k, v, o), DtypeError);
  o.mask = Array();
  o.dropout = 1.0;
  EXPECT_THROW(F::scaled_dot_product_attention(q, k, v, o), ValueError);
  if (device().is_cuda()) {  // no fused GPU kernel in this build yet: forcing it is an error
    o.dropout = 0.0;
    o.path = F::AttentionPath::kFused;
    EXPECT_THROW(F::scaled_dot_product_attention(q, k, v, o), NotImplementedError);
  }
  try {
    F::scaled_dot_product_attention(q, Variable(uniform({2, 2, 5, 3}, float32)), v);
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("q's head dim 4 differs from k's 3"), std::string::npos) << e.what();
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(TransformerFunctionsTest);

}  // namespace
}  // namespace kusari
