// Gradient checks of the arithmetic, math and reduction functions, in float64 (tight) and
// float32 (loose), with broadcasting and non-contiguous inputs, plus double-backward checks.
#include <gtest/gtest.h>

#include <cmath>

#include "kusari/autograd/gradient_check.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"
#include "function_test_util.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;

GradientCheckOptions tol(Dtype d) { return testing::grad_tol(d); }

struct Case {
  Device device;
  Dtype dtype;
};

class MathGradTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (GetParam().device.is_cuda() && !cuda_available()) GTEST_SKIP() << "no CUDA device on this machine";
  }
  Dtype dt() const { return GetParam().dtype; }
  Device dev() const { return GetParam().device; }
  Array uniform(const Shape& s, double lo = -1, double hi = 1) { return Array::uniform(s, lo, hi, dt(), dev(), &gen_); }
  // A non-contiguous array of shape s (a transposed copy).
  Array noncontig(const Shape& s, double lo = -1, double hi = 1) {
    Shape r(s.begin(), s.end());
    std::reverse(r.begin(), r.end());
    return uniform(r, lo, hi).transpose();
  }
  void check2(const std::function<Variable(const Variable&, const Variable&)>& f, const Array& a, const Array& b,
              bool double_backward = true) {
    VariadicFunction g = [&f](const std::vector<Variable>& xs) { return std::vector<Variable>{f(xs[0], xs[1])}; };
    check_backward(g, {a, b}, {}, tol(dt()));
    if (double_backward) check_double_backward(g, {a, b}, {}, {}, tol(dt()));
  }
  void check1(const std::function<Variable(const Variable&)>& f, const Array& x, bool double_backward = true) {
    check_backward(f, x, tol(dt()));
    if (double_backward) check_double_backward(f, x, tol(dt()));
  }
  Generator gen_{1234};
};

TEST_P(MathGradTest, ArithmeticWithBroadcasting) {
  for (auto shapes : std::vector<std::pair<Shape, Shape>>{{{3, 4}, {3, 4}}, {{3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{}, {2, 3}}}) {
    Array a = uniform(shapes.first), b = uniform(shapes.second, 0.5, 1.5);
    check2([](auto& x, auto& y) { return x + y; }, a, b);
    check2([](auto& x, auto& y) { return x - y; }, a, b);
    check2([](auto& x, auto& y) { return x * y; }, a, b);
    check2([](auto& x, auto& y) { return x / y; }, a, b);
  }
  check2([](auto& x, auto& y) { return x * y + x; }, noncontig({3, 4}), noncontig({3, 4}));
}

TEST_P(MathGradTest, ScalarArithmetic) {
  Array x = uniform({2, 3}, 0.5, 1.5);
  check1([](const Variable& v) { return v + 2.0; }, x);
  check1([](const Variable& v) { return v * -3.0; }, x);
  check1([](const Variable& v) { return 2.0 - v; }, x);
  check1([](const Variable& v) { return 2.0 / v; }, x);
  check1([](const Variable& v) { return v / 4.0; }, x);
  check1([](const Variable& v) { return -v; }, noncontig({2, 3}));
}

TEST_P(MathGradTest, PowExpLogSqrtSquareAbs) {
  Array pos = uniform({3, 2}, 0.5, 2.0);
  check1([](const Variable& v) { return F::pow(v, 3); }, pos);
  check1([](const Variable& v) { return F::pow(v, 0.5); }, pos);
  check1([](const Variable& v) { return F::pow(2.0, v); }, pos);
  check2([](auto& a, auto& b) { return F::pow(a, b); }, pos, uniform({2}, 0.5, 2.0));
  check1([](const Variable& v) { return F::exp(v); }, uniform({4}));
  check1([](const Variable& v) { return F::log(v); }, pos);
  check1([](const Variable& v) { return F::sqrt(v); }, pos);
  check1([](const Variable& v) { return F::square(v); }, noncontig({3, 2}));
  // abs is not differentiable at 0; keep samples away from it.
  Array away = uniform({5}, 0.2, 1.0) * Array::from({1, -1, 1, -1, 1}, std::nullopt, dt(), dev());
  check1([](const Variable& v) { return F::abs(v); }, away);
}

TEST_P(MathGradTest, MaximumMinimumClip) {
  // Values kept apart so that no tie sits within eps.
  Array a = Array::from({0.1, 0.9, -0.5, 0.3}, std::nullopt, dt(), dev());
  Array b = Array::from({0.5, 0.2, -0.1, 0.7}, std::nullopt, dt(), dev());
  check2([](auto& x, auto& y) { return F::maximum(x, y); }, a, b);
  check2([](auto& x, auto& y) { return F::minimum(x, y); }, a, b);
  check1([](const Variable& v) { return F::clip(v, -0.4, 0.6); }, a);
}

TEST_P(MathGradTest, Reductions) {
  Array x = uniform({2, 3, 4});
  check1([](const Variable& v) { return F::sum(v); }, x);
  check1([](const Variable& v) { return F::sum(v, {1}); }, x);
  check1([](const Variable& v) { return F::sum(v, {0, 2}, true); }, noncontig({2, 3, 4}));
  check1([](const Variable& v) { return F::mean(v, {-1}); }, x);
  check1([](const Variable& v) { return F::max(v, {1}); }, x);
  check1([](const Variable& v) { return F::min(v); }, x);
  check1([](const Variable& v) { return F::sum_to(v, {3, 1}); }, x);
}

TEST_P(MathGradTest, LogSumExp) {
  Array x = uniform({2, 3, 4}, -2, 2);
  check1([](const Variable& v) { return F::logsumexp(v); }, x);
  check1([](const Variable& v) { return F::logsumexp(v, {1}); }, x);
  check1([](const Variable& v) { return F::logsumexp(v, {0, 2}, true); }, x);
  check1([](const Variable& v) { return F::logsumexp(v, {-1}); }, noncontig({2, 3, 4}, -2, 2));
  check1([](const Variable& v) { return F::logsumexp(v, {0}); }, uniform({5}, -2, 2));
}

TEST_P(MathGradTest, Matmul) {
  check2([](auto& a, auto& b) { return F::matmul(a, b); }, uniform({3, 4}), uniform({4, 2}));
  check2([](auto& a, auto& b) { return F::matmul(a, b, true, false); }, uniform({4, 3}), uniform({4, 2}));
  check2([](auto& a, auto& b) { return F::matmul(a, b, false, true); }, uniform({3, 4}), uniform({2, 4}));
  check2([](auto& a, auto& b) { return F::matmul(a, b, true, true); }, uniform({4, 3}), uniform({2, 4}));
  check2([](auto& a, auto& b) { return F::matmul(a, b); }, uniform({2, 3, 4}), uniform({4, 2}));
  check2([](auto& a, auto& b) { return F::matmul(a, b); }, uniform({4}), uniform({4, 2}));
  check2([](auto& a, auto& b) { return F::matmul(a, b); }, noncontig({3, 4}), noncontig({4, 5}));
}

std::vector<Case> cases() {
  std::vector<Case> c;
  for (Device d : testing::test_devices()) {
    c.push_back({d, float64});
    c.push_back({d, float32});
  }
  return c;
}

INSTANTIATE_TEST_SUITE_P(DevicesDtypes, MathGradTest, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return (i.param.device.is_cpu() ? std::string("cpu_") : std::string("cuda_")) +
                                  dtype_name(i.param.dtype);
                         });

TEST(MathKnownValues, ForwardValues) {
  Variable a(Array::from({1, 2, 3}, std::nullopt, float32));
  Variable b(Array::from({4, 5, 6}, std::nullopt, float32));
  EXPECT_EQ((a * b + 1.0).data().to_vector<float>(), (std::vector<float>{5, 11, 19}));
  EXPECT_FLOAT_EQ(F::sum(F::matmul(a, b)).data().item<float>(), 32.0f);
  EXPECT_FLOAT_EQ(F::mean(a).data().item<float>(), 2.0f);
  EXPECT_EQ(F::max(F::reshape(a, {3, 1}), {0}).shape(), (Shape{1}));
}

TEST(MathKnownValues, LogSumExp) {
  // Stable for large inputs: log(e^1000 + e^1000) = 1000 + log 2.
  Variable x(Array::from({1000, 1000, 1, 2}, Shape{2, 2}, float64), true);
  Variable y = F::logsumexp(x, {1});
  EXPECT_EQ(y.shape(), (Shape{2}));
  EXPECT_NEAR(y.data().to_vector<double>()[0], 1000 + std::log(2.0), 1e-9);
  EXPECT_NEAR(y.data().to_vector<double>()[1], std::log(std::exp(1.0) + std::exp(2.0)), 1e-12);
  EXPECT_EQ(F::logsumexp(x, {1}, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(F::logsumexp(x).shape(), (Shape{}));
  // The gradient is softmax along the reduced axis.
  F::sum(y).backward();
  std::vector<double> g = x.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 0.5, 1e-12);
  EXPECT_NEAR(g[3], std::exp(2.0) / (std::exp(1.0) + std::exp(2.0)), 1e-12);
  EXPECT_THROW(F::logsumexp(x, {2}), ValueError);
  EXPECT_THROW(F::logsumexp(Variable(Array::from_vector(std::vector<int32_t>{1, 2}))), DtypeError);
}

}  // namespace
}  // namespace kusari
