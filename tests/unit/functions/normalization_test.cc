// batch_normalization and fixed_batch_normalization: known outputs, running statistics after two
// updates, axis conventions, gradient checks (first and second order, float64 and float32,
// non-contiguous inputs) and error cases.
#include <gtest/gtest.h>

#include <cmath>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class NormalizationTest : public testing::FunctionTest {
 protected:
  Array vec(std::initializer_list<double> v, Dtype d = float64) {
    return Array::from(v, std::nullopt, d, device());
  }
};

TEST_P(NormalizationTest, BatchNormalizationKnownValuesAndRunningStatistics) {
  const double eps = 2e-5;
  // Column 0: 1, 3, 5, 7 (mean 4, var 5); column 1: 2, 4, 4, 10 (mean 5, var 9).
  Array x1 = Array::from({1, 2, 3, 4, 5, 4, 7, 10}, Shape{4, 2}, float64, device());
  Variable gamma(vec({2, 0.5}), true), beta(vec({1, -1}), true);
  Array running_mean = Array::zeros({2}, float64, device());
  Array running_var = Array::ones({2}, float64, device());
  Variable y = F::batch_normalization(Variable(x1), gamma, beta, eps, &running_mean, &running_var);
  const double s0 = 1 / std::sqrt(5 + eps), s1 = 1 / std::sqrt(9 + eps);
  Array expected =
      Array::from({2 * -3 * s0 + 1, 0.5 * -3 * s1 - 1, 2 * -1 * s0 + 1, 0.5 * -1 * s1 - 1,
                   2 * 1 * s0 + 1, 0.5 * -1 * s1 - 1, 2 * 3 * s0 + 1, 0.5 * 5 * s1 - 1},
                  Shape{4, 2}, float64, device());
  EXPECT_TRUE(ArraysClose(y.data(), expected, 1e-12));
  // Chainer's update: decay 0.9, the unbiased variance (m / (m - 1) with m = 4).
  EXPECT_TRUE(ArraysClose(running_mean, vec({0.4, 0.5}), 1e-12));
  EXPECT_TRUE(ArraysClose(running_var, vec({0.9 + 0.1 * 20.0 / 3, 0.9 + 0.1 * 12}), 1e-12));
  // Second batch: column 0: 0, 2, 4, 6 (mean 3, unbiased var 20/3); column 1 constant 1 (var 0).
  Array x2 = Array::from({0, 1, 2, 1, 4, 1, 6, 1}, Shape{4, 2}, float64, device());
  Variable y2 = F::batch_normalization(Variable(x2), gamma, beta, eps, &running_mean, &running_var);
  EXPECT_TRUE(ArraysClose(running_mean, vec({0.9 * 0.4 + 0.1 * 3, 0.9 * 0.5 + 0.1 * 1}), 1e-12));
  EXPECT_TRUE(ArraysClose(
      running_var, vec({0.9 * (0.9 + 0.1 * 20.0 / 3) + 0.1 * 20.0 / 3, 0.9 * (0.9 + 0.1 * 12)}),
      1e-12));
  // A constant column normalises to beta.
  EXPECT_TRUE(
      ArraysClose(y2.data().at({Slice(), 1}), Array::full({4}, -1.0, float64, device()), 1e-12));
  // Another decay, running_mean only, and inside NoBackpropMode (the update does not depend on it).
  Array rm = Array::zeros({2}, float64, device());
  {
    NoBackpropMode no_backprop;
    F::batch_normalization(Variable(x1), gamma, beta, eps, &rm, nullptr, 0.5);
  }
  EXPECT_TRUE(ArraysClose(rm, vec({2, 2.5}), 1e-12));
}

TEST_P(NormalizationTest, BatchNormalizationGradientKnownValues) {
  Array x = Array::from({1, 2, 3, 4, 5, 4, 7, 10}, Shape{4, 2}, float64, device());
  Variable xv(x, true), gamma(vec({2, 0.5}), true), beta(vec({1, -1}), true);
  Variable y = F::batch_normalization(xv, gamma, beta);
  Array gy = Array::from({1, 0, -1, 2, 0.5, 0, 2, 1}, Shape{4, 2}, float64, device());
  y.set_grad(gy);
  y.backward();
  // Chainer's formulas, evaluated here with array routines.
  Array mean = kusari::mean(x, {0}, true);
  Array inv_std = kusari::rsqrt(kusari::var(x, {0}, true) + 2e-5);
  Array x_hat = (x - mean) * inv_std;
  Array gbeta = kusari::sum(gy, {0});
  Array ggamma = kusari::sum(gy * x_hat, {0});
  Array gx = gamma.data() * inv_std * (gy - gbeta / 4.0 - x_hat * ggamma / 4.0);
  EXPECT_TRUE(ArraysClose(beta.grad(), vec({2.5, 3}), 1e-12));
  EXPECT_TRUE(ArraysClose(gamma.grad(), ggamma, 1e-12));
  EXPECT_TRUE(ArraysClose(xv.grad(), gx, 1e-10, 1e-12));
}

TEST_P(NormalizationTest, AxisConventions) {
  // 4-d x (N, C, H, W) with 1-d gamma: statistics over (0, 2, 3), per channel.
  Array x = uniform({4, 3, 2, 5}, float64, -2, 3);
  Array gamma = vec({1, 2, 3}), beta = vec({0, -1, 1});
  Array y = F::batch_normalization(Variable(x), Variable(gamma), Variable(beta)).data();
  Array m = kusari::mean(y, {0, 2, 3});
  Array v = kusari::var(y, {0, 2, 3});
  EXPECT_TRUE(ArraysClose(m, beta, 1e-10, 1e-10));
  EXPECT_TRUE(ArraysClose(v, kusari::square(gamma), 1e-3));
  // 2-d gamma (C, H): Chainer's default axes are (0, 3).
  Array g2 = uniform({3, 2}, float64, 0.5, 1.5), b2 = uniform({3, 2}, float64);
  Array y2 = F::batch_normalization(Variable(x), Variable(g2), Variable(b2)).data();
  EXPECT_TRUE(ArraysClose(kusari::mean(y2, {0, 3}), b2, 1e-10, 1e-10));
  // An explicit axis: normalise x (N, T, C) over (0, 1), gamma of shape (C,).
  Array x3 = uniform({2, 4, 3}, float64);
  Array y3 = F::batch_normalization(Variable(x3), Variable(gamma), Variable(beta), 2e-5, nullptr,
                                    nullptr, 0.9, {0, 1})
                 .data();
  EXPECT_TRUE(ArraysClose(kusari::mean(y3, {0, 1}), beta, 1e-10, 1e-10));
  // fixed_batch_normalization with the batch's own statistics equals batch_normalization.
  Array mean = kusari::mean(x, {0, 2, 3}), var = kusari::var(x, {0, 2, 3});
  Array yf = F::fixed_batch_normalization(Variable(x), Variable(gamma), Variable(beta),
                                          Variable(mean), Variable(var))
                 .data();
  EXPECT_TRUE(ArraysClose(yf, y, 1e-12, 1e-12));
}

TEST_P(NormalizationTest, FixedBatchNormalizationKnownValues) {
  Variable x(Array::from({1, 2, 3, 4}, Shape{2, 2}, float64, device()), true);
  Variable gamma(vec({2, 3}), true), beta(vec({0.5, -0.5}), true), mean(vec({1, 1}), true),
      var(vec({4, 1}), true);
  const double eps = 1e-3;
  Variable y = F::fixed_batch_normalization(x, gamma, beta, mean, var, eps);
  const double s0 = 1 / std::sqrt(4 + eps), s1 = 1 / std::sqrt(1 + eps);
  EXPECT_TRUE(ArraysClose(y.data(),
                          Array::from({0.5, 3 * s1 - 0.5, 2 * 2 * s0 + 0.5, 3 * 3 * s1 - 0.5},
                                      Shape{2, 2}, float64, device()),
                          1e-12));
  F::sum(y).backward();
  EXPECT_TRUE(ArraysClose(
      x.grad(), Array::from({2 * s0, 3 * s1, 2 * s0, 3 * s1}, Shape{2, 2}, float64, device()),
      1e-12));
  EXPECT_TRUE(ArraysClose(mean.grad(), vec({-4 * s0, -6 * s1}), 1e-12));
  EXPECT_TRUE(ArraysClose(beta.grad(), vec({2, 2}), 1e-12));
  // ggamma = sum(x_hat), gvar = -gamma ggamma inv_std^2 / 2.
  EXPECT_TRUE(ArraysClose(gamma.grad(), vec({2 * s0, 4 * s1}), 1e-12));
  EXPECT_TRUE(ArraysClose(var.grad(),
                          vec({-0.5 * 2 * 2 * s0 * s0 * s0, -0.5 * 3 * 4 * s1 * s1 * s1}), 1e-12));
}

TEST_P(NormalizationTest, BatchNormalizationGradients) {
  VariadicFunction bn = [](const std::vector<Variable>& v) {
    return std::vector<Variable>{F::batch_normalization(v[0], v[1], v[2])};
  };
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check(bn, {uniform({5, 3}, d), uniform({3}, d, 0.5, 1.5), uniform({3}, d)});
    check(bn, {uniform({3, 2, 2, 3}, d), uniform({2}, d, 0.5, 1.5), uniform({2}, d)});
    check(bn, {noncontig({4, 3, 2}, d), uniform({3}, d, 0.5, 1.5), uniform({3}, d)});
    check(bn, {uniform({2, 3, 2, 2}, d), uniform({3, 2}, d, 0.5, 1.5), uniform({3, 2}, d)});
    VariadicFunction bn_axis = [](const std::vector<Variable>& v) {
      return std::vector<Variable>{
          F::batch_normalization(v[0], v[1], v[2], 1e-3, nullptr, nullptr, 0.9, {0, 1})};
    };
    check(bn_axis, {uniform({2, 3, 4}, d), uniform({4}, d, 0.5, 1.5), uniform({4}, d)});
    // Running statistics do not change the gradient.
    Array rm = Array::zeros({3}, d, device()), rv = Array::ones({3}, d, device());
    VariadicFunction bn_running = [&rm, &rv](const std::vector<Variable>& v) {
      return std::vector<Variable>{F::batch_normalization(v[0], v[1], v[2], 2e-5, &rm, &rv)};
    };
    check(bn_running, {uniform({5, 3}, d), uniform({3}, d, 0.5, 1.5), uniform({3}, d)});
  }
}

TEST_P(NormalizationTest, FixedBatchNormalizationGradients) {
  VariadicFunction fbn = [](const std::vector<Variable>& v) {
    return std::vector<Variable>{F::fixed_batch_normalization(v[0], v[1], v[2], v[3], v[4])};
  };
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check(fbn, {uniform({5, 3}, d), uniform({3}, d, 0.5, 1.5), uniform({3}, d), uniform({3}, d),
                uniform({3}, d, 0.5, 1.5)});
    check(fbn, {noncontig({3, 2, 4}, d), uniform({2}, d, 0.5, 1.5), uniform({2}, d),
                uniform({2}, d), uniform({2}, d, 0.5, 1.5)});
    check(fbn, {uniform({2, 3, 2, 2}, d), uniform({3}, d, 0.5, 1.5), uniform({3}, d),
                uniform({3}, d), uniform({3}, d, 0.5, 1.5)});
  }
}

TEST_P(NormalizationTest, Errors) {
  Variable x(uniform({4, 3}, float32));
  Variable g(uniform({3}, float32)), b(uniform({3}, float32));
  EXPECT_THROW(F::batch_normalization(x, Variable(uniform({4}, float32)), b), ShapeError);
  EXPECT_THROW(F::batch_normalization(x, g, Variable(uniform({2}, float32))), ShapeError);
  EXPECT_THROW(F::batch_normalization(x, Variable(uniform({3}, float64)), b), DtypeError);
  EXPECT_THROW(F::batch_normalization(Variable(Array::zeros({4, 3}, int32, device())), g, b),
               DtypeError);
  EXPECT_THROW(F::batch_normalization(Variable(uniform({3}, float32)), g, b), ShapeError);
  Array rm_bad = Array::zeros({4}, float32, device());
  EXPECT_THROW(F::batch_normalization(x, g, b, 2e-5, &rm_bad), ShapeError);
  Array rv_int = Array::zeros({3}, int32, device());
  EXPECT_THROW(F::batch_normalization(x, g, b, 2e-5, nullptr, &rv_int), DtypeError);
  EXPECT_THROW(F::batch_normalization(x, g, b, 0.0), ValueError);
  EXPECT_THROW(F::batch_normalization(x, g, b, 2e-5, nullptr, nullptr, 1.5), ValueError);
  EXPECT_THROW(F::batch_normalization(x, g, b, 2e-5, nullptr, nullptr, 0.9, {2}), ValueError);
  EXPECT_THROW(F::fixed_batch_normalization(x, g, b, Variable(uniform({3}, float32)),
                                            Variable(uniform({2}, float32))),
               ShapeError);
  try {
    F::batch_normalization(x, Variable(uniform({4}, float32)), b);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("batch_normalization: gamma"), std::string::npos)
        << e.what();
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(NormalizationTest);

}  // namespace
}  // namespace kusari
