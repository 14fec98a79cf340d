// Gradient checks (first and second order, float64 and float32, several shapes, non-contiguous
// inputs), known values and error cases of the activation functions.
#include <gtest/gtest.h>

#include <cmath>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class ActivationTest : public testing::FunctionTest {};

const std::vector<Shape> kShapes = {{5}, {3, 4}, {2, 3, 4}};

// relu's backward is one fused kernel (kusari::relu_grad), itself differentiable.
TEST_P(ActivationTest, ReluGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    for (const Shape& s : kShapes) check([](const Variable& v) { return F::relu(v); }, away_from_zero(s, d));
    check([](const Variable& v) { return F::relu(v); }, away_from_zero({4, 3}, d).transpose());
  }
  Variable x(Array::from({-1.0, 2.0, 0.0, 3.0}, std::nullopt, float32, device()), true);
  F::sum(F::relu(x) * 2.0).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{0, 2, 0, 2}));
}

TEST_P(ActivationTest, LeakyReluGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    for (const Shape& s : kShapes) {
      check([](const Variable& v) { return F::leaky_relu(v); }, away_from_zero(s, d));
      check([](const Variable& v) { return F::leaky_relu(v, -0.5); }, away_from_zero(s, d));
    }
    Array x = away_from_zero({4, 3}, d).transpose();
    check([](const Variable& v) { return F::leaky_relu(v, 0.1); }, x);
  }
}

TEST_P(ActivationTest, EluGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    for (const Shape& s : kShapes) {
      check([](const Variable& v) { return F::elu(v); }, away_from_zero(s, d, 0.1, 2.0));
      check([](const Variable& v) { return F::elu(v, 0.5); }, away_from_zero(s, d, 0.1, 2.0));
    }
    check([](const Variable& v) { return F::elu(v, 2.0); }, away_from_zero({4, 3}, d).transpose());
  }
}

TEST_P(ActivationTest, SigmoidTanhSoftplusGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    for (const Shape& s : kShapes) {
      check([](const Variable& v) { return F::sigmoid(v); }, uniform(s, d, -3, 3));
      check([](const Variable& v) { return F::tanh(v); }, uniform(s, d, -2, 2));
      check([](const Variable& v) { return F::softplus(v); }, uniform(s, d, -3, 3));
      check([](const Variable& v) { return F::softplus(v, 2.5); }, uniform(s, d, -2, 2));
    }
    check([](const Variable& v) { return F::sigmoid(v); }, noncontig({3, 4}, d, -3, 3));
    check([](const Variable& v) { return F::tanh(v); }, noncontig({3, 4}, d, -2, 2));
    check([](const Variable& v) { return F::softplus(v, 0.5); }, noncontig({3, 4}, d, -3, 3));
    check([](const Variable& v) { return F::sigmoid(v); }, uniform({}, d, -1, 1));
  }
}

TEST_P(ActivationTest, SoftmaxLogSoftmaxGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    for (int axis : {1, 0, -1}) {
      SCOPED_TRACE(axis);
      check([axis](const Variable& v) { return F::softmax(v, axis); }, uniform({3, 4}, d, -2, 2));
      check([axis](const Variable& v) { return F::log_softmax(v, axis); },
            uniform({3, 4}, d, -2, 2));
      check([axis](const Variable& v) { return F::softmax(v, axis); },
            uniform({2, 3, 4}, d, -2, 2));
      check([axis](const Variable& v) { return F::log_softmax(v, axis); },
            noncontig({2, 3, 4}, d, -2, 2));
    }
    check([](const Variable& v) { return F::softmax(v, 0); }, uniform({6}, d, -2, 2));
    check([](const Variable& v) { return F::log_softmax(v); }, noncontig({4, 5}, d, -2, 2));
  }
}

TEST_P(ActivationTest, PiecewiseKnownValues) {
  Variable x(Array::from({-2, -0.5, 0, 1.5}, std::nullopt, float64, device()), true);
  EXPECT_TRUE(ArraysClose(F::leaky_relu(x).data(),
                          Array::from({-0.4, -0.1, 0, 1.5}, std::nullopt, float64, device())));
  EXPECT_TRUE(ArraysClose(F::leaky_relu(x, 0.5).data(),
                          Array::from({-1, -0.25, 0, 1.5}, std::nullopt, float64, device())));
  Array e =
      Array::from({std::exp(-2) - 1, std::exp(-0.5) - 1, 0, 1.5}, std::nullopt, float64, device());
  EXPECT_TRUE(ArraysClose(F::elu(x).data(), e, 1e-12));
  EXPECT_TRUE(ArraysClose(F::elu(x, 2.0).data(),
                          e * 2.0 - Array::from({0, 0, 0, 1.5}, std::nullopt, float64, device()),
                          1e-12));
  // Gradients: slope / alpha exp(x) below 0, 1 from 0 up (Chainer's convention at 0).
  F::sum(F::leaky_relu(x)).backward();
  EXPECT_TRUE(
      ArraysClose(x.grad(), Array::from({0.2, 0.2, 1, 1}, std::nullopt, float64, device())));
  x.cleargrad();
  F::sum(F::elu(x, 2.0)).backward();
  EXPECT_TRUE(ArraysClose(
      x.grad(),
      Array::from({2 * std::exp(-2), 2 * std::exp(-0.5), 1, 1}, std::nullopt, float64, device()),
      1e-12));
}

TEST_P(ActivationTest, SmoothKnownValues) {
  Variable x(Array::from({-100, -1, 0, 2, 100}, std::nullopt, float64, device()), true);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  Array y = F::sigmoid(x).data();
  EXPECT_TRUE(ArraysClose(
      y, Array::from({std::exp(-100.0), sig(-1), 0.5, sig(2), 1}, std::nullopt, float64, device()),
      1e-12, 0));
  EXPECT_TRUE(ArraysClose(
      F::tanh(x).data(),
      Array::from({-1, std::tanh(-1.0), 0, std::tanh(2.0), 1}, std::nullopt, float64, device()),
      1e-12));
  // softplus stays finite in both tails.
  EXPECT_TRUE(ArraysClose(F::softplus(x).data(),
                          Array::from({std::exp(-100.0), std::log1p(std::exp(-1.0)), std::log(2.0),
                                       std::log1p(std::exp(2.0)), 100},
                                      std::nullopt, float64, device()),
                          1e-12, 0));
  EXPECT_NEAR(F::softplus(x, 2.0).data().to_vector<double>()[3], std::log1p(std::exp(4.0)) / 2,
              1e-12);
  F::sum(F::sigmoid(x)).backward();
  EXPECT_NEAR(x.grad().to_vector<double>()[2], 0.25, 1e-15);
  x.cleargrad();
  F::sum(F::softplus(x)).backward();
  EXPECT_NEAR(x.grad().to_vector<double>()[3], sig(2), 1e-15);
  // float32 at large magnitudes: no inf or nan.
  Array big = Array::from({-1e4, 1e4}, std::nullopt, float32, device());
  for (const Array& a : {F::sigmoid(Variable(big)).data(), F::softplus(Variable(big)).data(),
                         F::tanh(Variable(big)).data()}) {
    EXPECT_TRUE(kusari::all(kusari::isfinite(a)).item<bool>()) << a;
  }
}

TEST_P(ActivationTest, SoftmaxKnownValues) {
  Variable x(Array::from({1, 2, 3, 1000, 1000, 1000}, Shape{2, 3}, float64, device()));
  const double z = std::exp(1) + std::exp(2) + std::exp(3);
  Array expected =
      Array::from({std::exp(1) / z, std::exp(2) / z, std::exp(3) / z, 1.0 / 3, 1.0 / 3, 1.0 / 3},
                  Shape{2, 3}, float64, device());
  EXPECT_TRUE(ArraysClose(F::softmax(x).data(), expected, 1e-12));
  EXPECT_TRUE(ArraysClose(F::log_softmax(x).data(), kusari::log(expected), 1e-12));
  // Along axis 0 the columns sum to 1.
  Array s0 = kusari::sum(F::softmax(x, 0).data(), {0});
  EXPECT_TRUE(ArraysClose(s0, Array::ones({3}, float64, device()), 1e-12));
  // The gradient of sum(softmax) is zero; of log_softmax[.., 0] it is onehot - softmax.
  Variable v(Array::from({0.1, -0.3, 0.7}, Shape{1, 3}, float64, device()), true);
  F::sum(F::softmax(v)).backward();
  EXPECT_TRUE(ArraysClose(v.grad(), Array::zeros({1, 3}, float64, device()), 0, 1e-15));
  v.cleargrad();
  F::get_item(F::log_softmax(v), {0, 0}).backward();
  Array p = kusari::softmax(v.data(), 1);
  EXPECT_TRUE(
      ArraysClose(v.grad(), Array::from({1, 0, 0}, Shape{1, 3}, float64, device()) - p, 1e-12));
}

TEST_P(ActivationTest, Errors) {
  Variable ints(Array::from_vector(std::vector<int32_t>{1, -2}, std::nullopt, device()));
  EXPECT_THROW(F::leaky_relu(ints), DtypeError);
  EXPECT_THROW(F::elu(ints), DtypeError);
  EXPECT_THROW(F::sigmoid(ints), DtypeError);
  EXPECT_THROW(F::tanh(ints), DtypeError);
  EXPECT_THROW(F::softplus(ints), DtypeError);
  EXPECT_THROW(F::softmax(ints, 0), DtypeError);
  EXPECT_THROW(F::log_softmax(ints, 0), DtypeError);
  Variable x(uniform({2, 3}, float32));
  EXPECT_THROW(F::softplus(x, 0.0), ValueError);
  EXPECT_THROW(F::softmax(x, 2), ValueError);
  EXPECT_THROW(F::log_softmax(x, -3), ValueError);
  EXPECT_THROW(F::softmax(Variable(uniform({4}, float32))),
               ValueError);  // default axis 1 needs 2 axes
  try {
    F::softmax(x, 5);
    FAIL() << "softmax accepted axis 5";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos) << e.what();
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(ActivationTest);

}  // namespace
}  // namespace kusari
