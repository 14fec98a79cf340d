// Gradient checks and known values for linear, relu and softmax_cross_entropy.
#include <gtest/gtest.h>

#include <cmath>

#include "kusari/autograd/gradient_check.h"
#include "kusari/functions.h"
#include "function_test_util.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;

class MlpFunctionsTest : public testing::DeviceTest {
 protected:
  Array uniform(const Shape& s, Dtype d = float64) { return Array::uniform(s, -1, 1, d, device(), &gen_); }
  GradientCheckOptions opts(Dtype d = float64) { return testing::grad_tol(d); }
  Generator gen_{5};
};

TEST_P(MlpFunctionsTest, LinearGradients) {
  for (Dtype d : {float64, float32}) {
    VariadicFunction f = [](const std::vector<Variable>& v) { return std::vector<Variable>{F::linear(v[0], v[1], v[2])}; };
    check_backward(f, {uniform({4, 3}, d), uniform({5, 3}, d), uniform({5}, d)}, {}, opts(d));
    check_double_backward(f, {uniform({4, 3}, d), uniform({5, 3}, d), uniform({5}, d)}, {}, {}, opts(d));
    VariadicFunction nob = [](const std::vector<Variable>& v) { return std::vector<Variable>{F::linear(v[0], v[1])}; };
    check_backward(nob, {uniform({3, 4}, d).transpose(), uniform({5, 3}, d)}, {}, opts(d));
    VariadicFunction nd = [](const std::vector<Variable>& v) { return std::vector<Variable>{F::linear(v[0], v[1], Variable(), 2)}; };
    check_backward(nd, {uniform({2, 3, 2, 2}, d), uniform({5, 4}, d)}, {}, opts(d));
  }
  EXPECT_THROW(F::linear(Variable(uniform({2, 3})), Variable(uniform({4, 2}))), ShapeError);
}

TEST_P(MlpFunctionsTest, ReluGradients) {
  // Keep samples away from the kink at 0.
  Array x = uniform({3, 4});
  x = kusari::where(kusari::less(kusari::abs(x), 0.05), x + 0.2, x);
  check_backward([](const Variable& v) { return F::relu(v); }, x, opts());
  check_double_backward([](const Variable& v) { return F::relu(v); }, x, opts());
  check_backward([](const Variable& v) { return F::relu(v); }, x.astype(float32), opts(float32));
}

TEST_P(MlpFunctionsTest, SoftmaxCrossEntropyKnownValue) {
  // x = [[1, 2, 3], [1, 1, 1]], t = [2, 0]: loss = mean(-log softmax) by hand.
  Variable x(Array::from({1, 2, 3, 1, 1, 1}, Shape{2, 3}, float64, device()), true);
  Array t = Array::from_vector(std::vector<int64_t>{2, 0}, std::nullopt, device());
  Variable loss = F::softmax_cross_entropy(x, t);
  double z = std::exp(1) + std::exp(2) + std::exp(3);
  double expected = (-(3 - std::log(z)) + std::log(3.0)) / 2;
  EXPECT_NEAR(loss.data().item<double>(), expected, 1e-12);
  loss.backward();
  std::vector<double> g = x.grad().to_vector<double>();
  EXPECT_NEAR(g[2], (std::exp(3) / z - 1) / 2, 1e-12);
  EXPECT_NEAR(g[3], (1.0 / 3 - 1) / 2, 1e-12);
  // ignore_label drops a sample from both the sum and the count.
  Array t2 = Array::from_vector(std::vector<int64_t>{2, -1}, std::nullopt, device());
  EXPECT_NEAR(F::softmax_cross_entropy(x, t2).data().item<double>(), -(3 - std::log(z)), 1e-12);
  Variable none = F::softmax_cross_entropy(x, t, -1, F::Reduce::kNone);
  EXPECT_EQ(none.shape(), (Shape{2}));
  {
    testing::DebugModeScope debug;  // labels on a GPU are checked in debug mode only
    EXPECT_THROW(F::softmax_cross_entropy(x, Array::from_vector(std::vector<int64_t>{3, 0}, std::nullopt, device())),
                 IndexError);
  }
  EXPECT_THROW(F::softmax_cross_entropy(x, Array::from_vector(std::vector<float>{1, 0}, std::nullopt, device())),
               DtypeError);
}

TEST_P(MlpFunctionsTest, SoftmaxCrossEntropyGradients) {
  Array t = Array::from_vector(std::vector<int32_t>{0, 3, -1, 2}, std::nullopt, device());
  for (F::Reduce r : {F::Reduce::kMean, F::Reduce::kNone}) {
    VariadicFunction f = [t, r](const std::vector<Variable>& v) {
      return std::vector<Variable>{F::softmax_cross_entropy(v[0], t, -1, r)};
    };
    check_backward(f, {uniform({4, 5})}, {}, opts());
    check_double_backward(f, {uniform({4, 5})}, {}, {}, opts());
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(MlpFunctionsTest);

}  // namespace
}  // namespace kusari
