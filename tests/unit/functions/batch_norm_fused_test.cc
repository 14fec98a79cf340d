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

// relu(bn(x) + residual) through the fused epilogue (Note [Batch norm epilogues]) against the
// composed float64 formula. The relu's mask is taken from the fused output, so that an element
// rounded to the other side of 0 in a 16-bit dtype is compared with the same mask.
TEST_P(BatchNormFusedTest, ReluEpilogueMatchesComposed) {
  // 16 channels: the CUDA kernels' 16-byte packs in channels-last (10: one element at a time).
  for (const int64_t channels : {10, 16})
  for (Dtype d : {float64, float32, bfloat16, float16}) {
    for (bool cl : {false, true}) {
      for (bool with_residual : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(d) << (cl ? " channels-last" : "")
                                          << (with_residual ? " + residual" : "") << ", "
                                          << channels << " channels");
        const Shape shape{6, channels, 7, 5};
        const Dtype pd = is_half_precision(d) ? float32 : d;
        auto layout = [cl](Array a) {
          return cl ? a.to_memory_format(MemoryFormat::kChannelsLast) : a;
        };
        Array x = layout(uniform(shape, float64, -2, 3).astype(d));
        Array r = layout(uniform(shape, float64, -1, 1).astype(d));
        Array gy = layout(uniform(shape, float64).astype(d));
        Array gamma = uniform({channels}, pd, 0.5, 1.5), beta = uniform({channels}, pd);
        Array rm = Array::zeros({channels}, pd, device()), rv = Array::ones({channels}, pd, device());

        Variable vx(x, true), vg(gamma, true), vb(beta, true), vr(r, true);
        Variable y = F::batch_normalization_relu(vx, vg, vb, with_residual ? vr : Variable(), 1e-3,
                                                 &rm, &rv, 0.8);
        EXPECT_EQ(y.dtype(), d);
        if (cl) EXPECT_TRUE(y.data().is_contiguous(MemoryFormat::kChannelsLast));
        y.set_grad(gy);
        y.backward();

        const Array mask = greater(y.data(), 0.0).astype(float64);
        const Array gy_masked = gy.astype(float64) * mask;
        Result ref = run_train(composed_view(x.astype(float64)), gamma.astype(float64),
                               beta.astype(float64), composed_view(gy_masked));
        Array y_ref = ref.y;
        if (with_residual) y_ref = y_ref + r.astype(float64);
        y_ref = maximum(y_ref, 0.0);
        const Tolerance t = tolerance(d);
        EXPECT_TRUE(ArraysClose(y.data().astype(float64), y_ref, t.rtol, t.atol));
        EXPECT_TRUE(ArraysClose(vx.grad().astype(float64), ref.gx, t.rtol, t.atol * 4));
        EXPECT_TRUE(ArraysClose(vg.grad().astype(float64), ref.ggamma, t.rtol, t.atol * 8));
        EXPECT_TRUE(ArraysClose(vb.grad().astype(float64), ref.gbeta, t.rtol, t.atol * 8));
        EXPECT_TRUE(ArraysClose(rm.astype(float64), ref.running_mean, 1e-5, 1e-5));
        EXPECT_TRUE(ArraysClose(rv.astype(float64), ref.running_var, 1e-4, 1e-5));
        if (with_residual) {
          EXPECT_TRUE(ArraysClose(vr.grad().astype(float64), gy_masked, 0, 0));
        } else {
          EXPECT_FALSE(vr.grad().defined());
        }
      }
    }
  }
}

TEST_P(BatchNormFusedTest, ReluEpilogueGradientChecks) {
  // First and second derivatives: the fused backward, and the composed one double backprop uses.
  VariadicFunction with_residual = [](const std::vector<Variable>& v) {
    return std::vector<Variable>{F::batch_normalization_relu(v[0], v[1], v[2], v[3])};
  };
  VariadicFunction without = [](const std::vector<Variable>& v) {
    return std::vector<Variable>{F::batch_normalization_relu(v[0], v[1], v[2])};
  };
  // float64 only: float32's step (1e-2) carries outputs across the relu's kink, where the
  // numerical derivative is meaningless (the composed relu(bn(x)) fails the same check there).
  const Dtype d = float64;
  Array x = uniform({3, 4, 3, 2}, d).to_memory_format(MemoryFormat::kChannelsLast);
  Array r = uniform({3, 4, 3, 2}, d).to_memory_format(MemoryFormat::kChannelsLast);
  check(with_residual, {x, uniform({4}, d, 0.5, 1.5), uniform({4}, d), r});
  check(without, {uniform({2, 5, 3, 3}, d), uniform({5}, d, 0.5, 1.5), uniform({5}, d)});
}

// Note [Inputs whose data no rule reads]: a residual that only the graph holds is freed at the
// next record(), and still gets its gradient; one the program holds keeps its data.
TEST_P(BatchNormFusedTest, AResidualOnlyTheGraphHoldsIsFreedBeforeBackward) {
  const Shape shape{4, 8, 5, 3};
  const Array x = uniform(shape, float32), r0 = uniform(shape, float32);
  Variable vx(x, true), vg(uniform({8}, float32, 0.5, 1.5), true), vb(uniform({8}, float32), true);
  Variable vr0(r0, true);
  std::weak_ptr<void> residual_memory;
  Variable y;
  {
    const Variable r = vr0 * 2.0;  // not a leaf: after this scope only the node holds it
    residual_memory = r.data().storage();
    y = F::batch_normalization_relu(vx, vg, vb, r);
  }
  EXPECT_FALSE(residual_memory.expired()) << "released at the next record(), not before";
  Variable loss = F::sum(y * y);
  EXPECT_TRUE(residual_memory.expired());
  loss.backward();
  // d loss / d r0 = 2 * (2 y where y > 0) = 4 y (y is 0 elsewhere).
  EXPECT_TRUE(ArraysClose(vr0.grad(), y.data() * 4.0, 1e-6, 1e-6));
  // Held by the program, the residual keeps its values.
  const Variable kept = vr0 * 2.0;
  const Variable y2 = F::batch_normalization_relu(vx, vg, vb, kept);
  const Variable loss2 = F::sum(y2 * y2);
  EXPECT_TRUE(ArraysClose(kept.data(), r0 * 2.0, 0, 0));
  // A residual that is also the normalised input is read as that input: never released.
  Variable h = vr0 * 1.0;
  std::weak_ptr<void> h_memory = h.data().storage();
  const Variable y3 = F::batch_normalization_relu(h, vg, vb, h);
  h = Variable();
  const Variable loss3 = F::sum(y3 * y3);
  EXPECT_FALSE(h_memory.expired());
}

TEST_P(BatchNormFusedTest, ReluEpilogueFallsBackAndChecksTheResidual) {
  // A layout the kernels decline gives the composed result; a residual of another shape or
  // dtype is refused by name.
  Array x = composed_view(uniform({4, 3, 2, 2}, float64));
  Array r = uniform({4, 3, 2, 2}, float64);
  Array g = uniform({3}, float64, 0.5, 1.5), b = uniform({3}, float64);
  Variable y = F::batch_normalization_relu(Variable(x), Variable(g), Variable(b), Variable(r));
  Array ref =
      maximum(F::batch_normalization(Variable(x), Variable(g), Variable(b)).data() + r, 0.0);
  EXPECT_TRUE(ArraysClose(y.data(), ref, 1e-12, 1e-12));
  EXPECT_TRUE(testing::ThrowsWith<ShapeError>(
      [&] {
        F::batch_normalization_relu(Variable(x), Variable(g), Variable(b),
                                    Variable(uniform({4, 3, 2, 1}, float64)));
      },
      {"batch_normalization_relu: the residual of shape", "does not match x"}));
  EXPECT_TRUE(testing::ThrowsWith<DtypeError>(
      [&] {
        F::batch_normalization_relu(Variable(x), Variable(g), Variable(b),
                                    Variable(r.astype(float32)));
      },
      {"batch_normalization_relu", "the residual is float32 but x is float64"}));
  // Eval mode: relu(fixed_bn(x) + r).
  Array mean = uniform({3}, float64), var = uniform({3}, float64, 0.5, 2);
  Variable ye = F::fixed_batch_normalization_relu(Variable(x), Variable(g), Variable(b),
                                                  Variable(mean), Variable(var), Variable(r));
  Array ref_e = maximum(F::fixed_batch_normalization(Variable(x), Variable(g), Variable(b),
                                                     Variable(mean), Variable(var))
                                .data() +
                            r,
                        0.0);
  EXPECT_TRUE(ArraysClose(ye.data(), ref_e, 1e-12, 1e-12));
}

KUSARI_INSTANTIATE_DEVICE_TEST(BatchNormFusedTest);

}  // namespace
}  // namespace kusari
