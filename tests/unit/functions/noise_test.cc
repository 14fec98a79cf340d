// dropout: keep rate and scaling, identity in test mode, reproducibility, gradients (first and
// second order, with a fixed mask) and error cases.
#include <gtest/gtest.h>

#include <cmath>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class NoiseTest : public testing::FunctionTest {};

TEST_P(NoiseTest, KeepsAboutOneMinusRatioAndScales) {
  for (Dtype d : {float32, float64}) {
    for (double ratio : {0.3, 0.5, 0.9}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << " ratio=" << ratio);
      const int64_t n = 20000;
      Generator gen(11);
      Variable y = F::dropout(Variable(Array::ones({n}, d, device())), ratio, &gen);
      std::vector<double> v = y.data().to_vector<double>();
      int64_t kept = 0;
      const double scale = 1.0 / (1.0 - ratio);
      for (double e : v) {
        if (e != 0.0) {
          ++kept;
          EXPECT_NEAR(e, scale, 1e-6 * scale);
        }
      }
      // Binomial(n, 1 - ratio): 5 standard deviations.
      const double sd = std::sqrt(n * ratio * (1 - ratio));
      EXPECT_NEAR(static_cast<double>(kept), n * (1 - ratio), 5 * sd);
      // The expectation is preserved.
      EXPECT_NEAR(kusari::mean(y.data()).item<double>(), 1.0, 5 * sd * scale / n);
    }
  }
}

TEST_P(NoiseTest, IdentityInTestModeOrWithZeroRatio) {
  Variable x(uniform({3, 4}, float32), true);
  {
    TrainMode test_mode(false);
    Variable y = F::dropout(x, 0.5);
    EXPECT_TRUE(y.is(x));
  }
  EXPECT_TRUE(F::dropout(x, 0.0).is(x));
  // Train mode is back after the scope.
  Generator gen(3);
  EXPECT_FALSE(F::dropout(x, 0.5, &gen).is(x));
}

TEST_P(NoiseTest, ReproducibleWithAGenerator) {
  Array x = uniform({64}, float32);
  Generator a(42), b(42);
  Array ya = F::dropout(Variable(x), 0.5, &a).data();
  Array yb = F::dropout(Variable(x), 0.5, &b).data();
  EXPECT_TRUE(array_equal(ya, yb));
  // The generator advances: the next mask differs.
  EXPECT_FALSE(array_equal(F::dropout(Variable(x), 0.5, &a).data(), ya));
  // The default generator is used when none is given.
  manual_seed(5);
  Array yd = F::dropout(Variable(x), 0.5).data();
  Generator c(5);
  EXPECT_TRUE(array_equal(yd, F::dropout(Variable(x), 0.5, &c).data()));
}

TEST_P(NoiseTest, GradientIsTheMask) {
  Variable x(uniform({5, 6}, float64, 0.5, 1.5), true);
  Generator gen(9);
  Variable y = F::dropout(x, 0.4, &gen);
  F::sum(y).backward();
  // y = x * mask, so the gradient of sum(y) is mask = y / x.
  EXPECT_TRUE(ArraysClose(x.grad(), y.data() / x.data(), 1e-12));
}

TEST_P(NoiseTest, Gradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    // Each evaluation redraws the same mask from a fresh generator.
    for (double ratio : {0.2, 0.6}) {
      auto f = [ratio](const Variable& v) {
        Generator gen(17);
        return F::dropout(v, ratio, &gen);
      };
      check(f, uniform({4, 5}, d));
      check(f, uniform({2, 3, 4}, d));
      check(f, noncontig({4, 5}, d));
    }
  }
}

TEST_P(NoiseTest, Errors) {
  Variable x(uniform({2, 3}, float32));
  EXPECT_THROW(F::dropout(x, 1.0), ValueError);
  EXPECT_THROW(F::dropout(x, -0.1), ValueError);
  EXPECT_THROW(F::dropout(Variable(Array::zeros({2}, int32, device())), 0.5), DtypeError);
  // The ratio is checked in test mode too.
  TrainMode test_mode(false);
  EXPECT_THROW(F::dropout(x, 1.5), ValueError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(NoiseTest);

}  // namespace
}  // namespace kusari
