// The fused batch normalization (Note [Fused batch normalization]) against the composed formula:
// values, running statistics and gradients for C-ordered, channels-last and (N, C) inputs,
// float64/float32/bfloat16/float16, odd sizes, batch 1, inputs with a large mean, eval mode, and
// gradient checks through the fused path.
#include <gtest/gtest.h>

#include <cmath>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class BatchNormFusedTest : public testing::FunctionTest {};

// A copy of `a` that the fused kernels decline (dense, but neither C-ordered nor channels-last):
// the composed formula runs on it.
Array composed_view(const Array& a) {
  Axes swap;
  for (int d = 0; d < a.ndim(); ++d) swap.push_back(d);
  if (a.ndim() == 2) {
    swap = {1, 0};
  } else if (a.ndim() == 3) {
    swap = {2, 1, 0};
  } else {
    std::swap(swap[2], swap[3]);
  }
  return a.transpose(swap).astype(a.dtype(), true).transpose(swap);
}

struct Tolerance {
  double rtol, atol;
};

Tolerance tolerance(Dtype d) {
  if (d == float64) return {1e-10, 1e-10};
  if (d == float32) return {1e-4, 1e-4};
  if (d == bfloat16) return {3e-2, 3e-2};
  return {5e-3, 5e-3};
}

struct Result {
  Array y, gx, ggamma, gbeta, running_mean, running_var;
};

// One training-mode batch normalization forward and backward: x in `d` with `layout`, float32
// parameters for 16-bit data (as the link passes them), else parameters in x's dtype.
Result run_train(const Array& x, const Array& gamma, const Array& beta, const Array& gy) {
  Variable vx(x, true), vg(gamma, true), vb(beta, true);
  Array rm = Array::zeros(gamma.shape(), gamma.dtype(), x.device());
  Array rv = Array::ones(gamma.shape(), gamma.dtype(), x.device());
  Variable y = F::batch_normalization(vx, vg, vb, 1e-3, &rm, &rv, 0.8);
  y.set_grad(gy);
  y.backward();
  return {y.data(), vx.grad(), vg.grad(), vb.grad(), rm, rv};
}

TEST_P(BatchNormFusedTest, MatchesComposedFormula) {
  struct Case {
    Shape shape;
    bool channels_last;
  };
  const std::vector<Case> cases = {
      {{2, 3, 5, 7}, false},    {{2, 3, 5, 7}, true},   {{1, 5, 3, 3}, false},
      {{1, 5, 3, 3}, true},     {{7, 33, 1, 1}, false}, {{3, 40, 6, 5}, true},
      {{9, 6}, false},          {{4, 3, 17}, false},    {{16, 70, 20, 20}, false},
      {{16, 70, 20, 20}, true},
  };
  for (Dtype d : {float64, float32, bfloat16, float16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(d) << " " << c.shape << (c.channels_last ? " channels-last" : ""));
      const int64_t ch = c.shape[1];
      const Dtype pd = is_half_precision(d) ? float32 : d;
      Array x = uniform(c.shape, float64, -2, 3).astype(d);
      if (c.channels_last) x = x.to_memory_format(MemoryFormat::kChannelsLast);
      Array gy = uniform(c.shape, float64).astype(d);
      if (c.channels_last) gy = gy.to_memory_format(MemoryFormat::kChannelsLast);
      Array gamma = uniform({ch}, pd, 0.5, 1.5), beta = uniform({ch}, pd);

      Result fused = run_train(x, gamma, beta, gy);
      // The reference: the composed formula in float64 on the same values.
      Result ref = run_train(composed_view(x.astype(float64)), gamma.astype(float64),
                             beta.astype(float64), composed_view(gy.astype(float64)));
      const Tolerance t = tolerance(d);
      EXPECT_EQ(fused.y.dtype(), d);
      EXPECT_TRUE(ArraysClose(fused.y.astype(float64), ref.y, t.rtol, t.atol));
      EXPECT_TRUE(ArraysClose(fused.gx.astype(float64), ref.gx, t.rtol, t.atol * 4));
      EXPECT_TRUE(ArraysClose(fused.ggamma.astype(float64), ref.ggamma, t.rtol, t.atol * 8));
      EXPECT_TRUE(ArraysClose(fused.gbeta.astype(float64), ref.gbeta, t.rtol, t.atol * 8));
      EXPECT_EQ(fused.ggamma.dtype(), pd);
      EXPECT_TRUE(ArraysClose(fused.running_mean.astype(float64), ref.running_mean, 1e-5, 1e-5));
      EXPECT_TRUE(ArraysClose(fused.running_var.astype(float64), ref.running_var, 1e-4, 1e-5));
      if (c.channels_last) {
        EXPECT_TRUE(fused.y.is_contiguous(MemoryFormat::kChannelsLast));
        EXPECT_TRUE(fused.gx.is_contiguous(MemoryFormat::kChannelsLast));
      }
    }
  }
}

TEST_P(BatchNormFusedTest, LargeMeanKeepsTheVariance) {
  // A mean 1e4 times the spread: sums of squares in float32 would cancel to noise.
  for (bool cl : {false, true}) {
    SCOPED_TRACE(cl ? "channels-last" : "contiguous");
    Array x = (uniform({8, 4, 6, 6}, float64, -1, 1) + 1e4).astype(float32);
    if (cl) x = x.to_memory_format(MemoryFormat::kChannelsLast);
    Array gamma = Array::ones({4}, float32, device()), beta = Array::zeros({4}, float32, device());
    Variable y = F::batch_normalization(Variable(x), Variable(gamma), Variable(beta), 1e-5);
    Array ref = F::batch_normalization(Variable(composed_view(x.astype(float64))),
                                       Variable(gamma.astype(float64)),
                                       Variable(beta.astype(float64)), 1e-5)
                    .data();
    // x itself carries float32's rounding of 1e4 + u (about 1e-3): compare with that in mind.
    EXPECT_TRUE(ArraysClose(y.data().astype(float64), ref, 1e-3, 5e-3));
  }
}

TEST_P(BatchNormFusedTest, EvalModeMatchesComposed) {
  for (Dtype d : {float64, float32, bfloat16, float16}) {
    for (bool cl : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << (cl ? " channels-last" : ""));
      Array x = uniform({1, 6, 5, 3}, float64, -2, 2).astype(d);
      if (cl) x = x.to_memory_format(MemoryFormat::kChannelsLast);
      Array gamma = uniform({6}, d, 0.5, 1.5), beta = uniform({6}, d), mean = uniform({6}, d),
            var = uniform({6}, d, 0.5, 2.0);
      Variable y = F::fixed_batch_normalization(Variable(x), Variable(gamma), Variable(beta),
                                                Variable(mean), Variable(var), 1e-3);
      Array ref = F::fixed_batch_normalization(
                      Variable(composed_view(x.astype(float64))), Variable(gamma.astype(float64)),
                      Variable(beta.astype(float64)), Variable(mean.astype(float64)),
                      Variable(var.astype(float64)), 1e-3)
                      .data();
      const Tolerance t = tolerance(d);
      EXPECT_TRUE(ArraysClose(y.data().astype(float64), ref, t.rtol, t.atol));
      if (cl) EXPECT_TRUE(y.data().is_contiguous(MemoryFormat::kChannelsLast));
    }
  }
}

TEST_P(BatchNormFusedTest, GradientChecksThroughFusedPath) {
  VariadicFunction bn = [](const std::vector<Variable>& v) {
    return std::vector<Variable>{F::batch_normalization(v[0], v[1], v[2])};
  };
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    Array x = uniform({3, 4, 3, 2}, d).to_memory_format(MemoryFormat::kChannelsLast);
    check(bn, {x, uniform({4}, d, 0.5, 1.5), uniform({4}, d)});
    check(bn, {uniform({2, 5, 3, 3}, d), uniform({5}, d, 0.5, 1.5), uniform({5}, d)});
  }
}

TEST_P(BatchNormFusedTest, Float32ParametersOf16BitInputFallBackToo) {
  // A 16-bit input the kernels decline still takes float32 parameters (cast inside), and their
  // gradients come back in float32.
  Array x = composed_view(uniform({4, 3, 2, 2}, float64).astype(bfloat16));
  Variable g(Array::ones({3}, float32, device()), true),
      b(Array::zeros({3}, float32, device()), true);
  Variable y = F::batch_normalization(Variable(x), g, b);
  EXPECT_EQ(y.dtype(), bfloat16);
  F::sum(F::mul(y, y)).backward();
  EXPECT_EQ(g.grad().dtype(), float32);
  EXPECT_EQ(b.grad().dtype(), float32);
}

KUSARI_INSTANTIATE_DEVICE_TEST(BatchNormFusedTest);

}  // namespace
}  // namespace kusari
