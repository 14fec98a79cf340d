// Gradient checks and known values for linear, relu and softmax_cross_entropy, and the three in
// float16 and bfloat16 against float32 on the same (representable) values.
#include <gtest/gtest.h>

#include <cmath>

#include "kusari/autograd/gradient_check.h"
#include "kernels/reduction.h"
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

// Relative tolerances for a 16-bit result against float32: a few units in the last place of
// the format (11 significant bits for float16, 8 for bfloat16).
double low_precision_tol(Dtype d) { return d == float16 ? 4e-3 : 3e-2; }

// Expects `actual` (a low-precision array) within tol * max|expected| of `expected` (float32).
::testing::AssertionResult CloseToFloat32(const Array& actual, const Array& expected, double tol) {
  const double scale = kusari::amax(kusari::abs(expected)).item<double>();
  return testing::ArraysClose(actual.astype(float32), expected, 0, tol * std::max(scale, 1e-30));
}

// The fused kernels (Note [Fused softmax cross entropy]) against the loss composed from
// log_softmax, which the function runs where a device has no kernel (here: with the slots
// emptied for the test): loss and gradient, with and without label smoothing, mean and per
// sample, ignored labels, and rows long enough for the GPU's block-per-row geometry.
TEST_P(MlpFunctionsTest, SoftmaxCrossEntropyFusedMatchesTheComposedLoss) {
  for (int64_t classes : {7, 9000}) {
    const Array t = Array::from_vector(std::vector<int64_t>{0, classes - 1, -1, 3, 2}, std::nullopt, device());
    for (Dtype d : {float64, float32, bfloat16}) {
      const Array x = (uniform({5, classes}, float32) * 6.0).astype(d);
      for (double eps : {0.0, 0.1}) {
        for (F::Reduce r : {F::Reduce::kMean, F::Reduce::kNone}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(d) << " classes " << classes << " eps " << eps
                                            << (r == F::Reduce::kMean ? " mean" : " none"));
          const Array gy = r == F::Reduce::kMean ? Array::full({}, 2.0, d == float64 ? float64 : float32, device())
                                                 : uniform({5}, d == float64 ? float64 : float32);
          Array loss[2], grad[2];
          for (int composed = 0; composed < 2; ++composed) {
            auto* const forward = kernels::softmax_cross_entropy_forward.find(device());
            if (composed) kernels::softmax_cross_entropy_forward.set(device().type(), nullptr);
            Variable v(x, true);
            Variable l = F::softmax_cross_entropy(v, t, -1, r, eps);
            kernels::softmax_cross_entropy_forward.set(device().type(), forward);
            l.set_grad(gy);
            l.backward();
            loss[composed] = l.data();
            grad[composed] = v.grad();
          }
          EXPECT_EQ(loss[0].dtype(), loss[1].dtype());
          EXPECT_EQ(grad[0].dtype(), d);
          const double tol = d == float64 ? 1e-12 : d == float32 ? 2e-5 : 1e-2;
          EXPECT_TRUE(CloseToFloat32(loss[0].astype(float32), loss[1].astype(float32), tol));
          EXPECT_TRUE(CloseToFloat32(grad[0].astype(float32), grad[1].astype(float32), tol));
          // The ignored sample (row 2) has no loss and no gradient.
          if (r == F::Reduce::kNone) EXPECT_EQ(loss[0].astype(float64).to_vector<double>()[2], 0.0);
          EXPECT_EQ(kusari::amax(kusari::abs(grad[0].at({int64_t{2}}).astype(float32))).item<float>(), 0.0f);
        }
      }
    }
  }
}

// softmax_cross_entropy_padded (Note [Padded classes]) against softmax_cross_entropy of the
// logits' first `classes` columns: the same loss, the same gradient there and exactly 0 in the
// padding, through the fused kernels and through the composed loss (slots emptied), with
// smoothing, both reductions and an ignored label; gradient checks; and its errors.
TEST_P(MlpFunctionsTest, SoftmaxCrossEntropyPaddedEqualsTheLossOfTheClasses) {
  for (auto [classes, width] : {std::pair<int64_t, int64_t>{7, 12}, {9000, 9048}}) {
    const Array t =
        Array::from_vector(std::vector<int64_t>{0, classes - 1, -1, 3, 2}, std::nullopt, device());
    for (Dtype d : {float64, float32, bfloat16}) {
      // Large padding logits: any part they took in the softmax would show.
      Array x = (uniform({5, width}, float32) * 6.0).astype(d);
      x.at({Slice(), Slice(classes, width)}).fill(20.0);
      for (double eps : {0.0, 0.1}) {
        for (F::Reduce r : {F::Reduce::kMean, F::Reduce::kNone}) {
          for (int composed = 0; composed < 2; ++composed) {
            SCOPED_TRACE(::testing::Message() << dtype_name(d) << " classes " << classes << " eps "
                                              << eps << (r == F::Reduce::kMean ? " mean" : " none")
                                              << (composed ? " composed" : " fused"));
            const Array gy = r == F::Reduce::kMean
                                 ? Array::full({}, 2.0, d == float64 ? float64 : float32, device())
                                 : uniform({5}, d == float64 ? float64 : float32);
            auto* const forward = kernels::softmax_cross_entropy_forward.find(device());
            if (composed) kernels::softmax_cross_entropy_forward.set(device().type(), nullptr);
            Variable padded(x, true), sliced(x.at({Slice(), Slice(0, classes)}).copy(), true);
            Variable l = F::softmax_cross_entropy_padded(padded, t, classes, -1, r, eps);
            Variable ref = F::softmax_cross_entropy(sliced, t, -1, r, eps);
            kernels::softmax_cross_entropy_forward.set(device().type(), forward);
            l.set_grad(gy);
            l.backward();
            ref.set_grad(gy);
            ref.backward();
            EXPECT_TRUE(testing::ArraysClose(l.data(), ref.data(), 0, 0));
            ASSERT_EQ(padded.grad().shape(), (Shape{5, width}));
            EXPECT_TRUE(testing::ArraysClose(padded.grad().at({Slice(), Slice(0, classes)}),
                                             sliced.grad(), 0, 0));
            EXPECT_EQ(
                kusari::amax(
                    kusari::abs(padded.grad().at({Slice(), Slice(classes, width)}).astype(float32)))
                    .item<float>(),
                0.0f);
          }
        }
      }
    }
  }
  const Array t = Array::from_vector(std::vector<int32_t>{0, 3, -1, 2}, std::nullopt, device());
  VariadicFunction f = [t](const std::vector<Variable>& v) {
    return std::vector<Variable>{
        F::softmax_cross_entropy_padded(v[0], t, 4, -1, F::Reduce::kMean, 0.1)};
  };
  check_backward(f, {uniform({4, 6})}, {}, opts());
  check_double_backward(f, {uniform({4, 6})}, {}, {}, opts());
  Variable x(uniform({2, 6}));
  const Array t2 = Array::from_vector(std::vector<int64_t>{1, 4}, std::nullopt, device());
  {
    testing::DebugModeScope debug;  // labels on a GPU are checked in debug mode only
    try {
      F::softmax_cross_entropy_padded(x, t2, 4);
      ADD_FAILURE() << "no error";
    } catch (const IndexError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "softmax_cross_entropy_padded: label 4 of sample 1 is out of range for 4 "
                    "classes"),
                std::string::npos)
          << e.what();
    }
  }
  for (int64_t bad : {0, 7}) {
    try {
      F::softmax_cross_entropy_padded(x, t2, bad);
      ADD_FAILURE() << "no error for classes " << bad;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "softmax_cross_entropy_padded: classes must be in [1, 6] (x's columns), "
                    "got " +
                    std::to_string(bad)),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_P(MlpFunctionsTest, LinearAndReluInSixteenBitsMatchFloat32) {
  for (Dtype d : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(d));
    // A layer of MNIST's width: 784 products summed per output (float32 accumulation).
    const Array x = uniform({16, 784}, float32).astype(d), W = uniform({32, 784}, float32).astype(d) * 0.05,
                b = uniform({32}, float32).astype(d);
    Variable x16(x, true), W16(W, true), b16(b, true);
    Variable x32(x.astype(float32), true), W32(W.astype(float32), true), b32(b.astype(float32), true);
    Variable y16 = F::relu(F::linear(x16, W16, b16));
    Variable y32 = F::relu(F::linear(x32, W32, b32));
    EXPECT_EQ(y16.dtype(), d);
    EXPECT_TRUE(CloseToFloat32(y16.data(), y32.data(), low_precision_tol(d)));
    const Array gy = uniform({16, 32}, float32).astype(d);
    F::sum(y16 * Variable(gy)).backward();
    F::sum(y32 * Variable(gy.astype(float32))).backward();
    for (auto [low, ref] : {std::pair{x16, x32}, std::pair{W16, W32}, std::pair{b16, b32}}) {
      EXPECT_EQ(low.grad().dtype(), d);
      EXPECT_TRUE(CloseToFloat32(low.grad(), ref.grad(), low_precision_tol(d)));
    }
  }
}

TEST_P(MlpFunctionsTest, SoftmaxCrossEntropyInSixteenBitsComputesInFloat32) {
  const Array t = Array::from_vector(std::vector<int32_t>{0, 3, -1, 2, 9, 9}, std::nullopt, device());
  for (Dtype d : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(d));
    const Array x = (uniform({6, 10}, float32) * 4.0).astype(d);
    for (F::Reduce r : {F::Reduce::kMean, F::Reduce::kNone}) {
      Variable x16(x, true), x32(x.astype(float32), true);
      Variable loss16 = F::softmax_cross_entropy(x16, t, -1, r);
      Variable loss32 = F::softmax_cross_entropy(x32, t, -1, r);
      // The loss is float32 and is the float32 loss of the same values.
      EXPECT_EQ(loss16.dtype(), float32);
      EXPECT_TRUE(testing::ArraysClose(loss16.data(), loss32.data(), 0, 0));
      Array gy = r == F::Reduce::kMean ? Array::full({}, 3.0, float32, device()) : uniform({6}, float32);
      loss16.set_grad(gy);
      loss32.set_grad(gy);
      loss16.backward();
      loss32.backward();
      // The gradient has x's dtype: the float32 gradient, rounded once.
      EXPECT_EQ(x16.grad().dtype(), d);
      EXPECT_TRUE(testing::ArraysClose(x16.grad().astype(float32), x32.grad().astype(d).astype(float32), 0, 0));
    }
  }
  // Logits whose exponentials overflow float16 (e^12 > 65504): the log-sum-exp is float32's.
  Variable big(Array::full({2, 10}, 12.0, float16, device()), true);
  Variable loss = F::softmax_cross_entropy(big, Array::from_vector(std::vector<int64_t>{1, 7}, std::nullopt, device()));
  EXPECT_NEAR(loss.data().item<double>(), std::log(10.0), 1e-6);
  // A scaled first gradient beyond float16's range (float16 training scales the loss by 2^16).
  loss.backward(BackwardOptions{.loss_scale = 65536.0});
  std::vector<double> g = big.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 65536.0 * 0.1 / 2, 1.0);
  EXPECT_NEAR(g[1], 65536.0 * -0.9 / 2, 16.0);
}

KUSARI_INSTANTIATE_DEVICE_TEST(MlpFunctionsTest);

}  // namespace
}  // namespace kusari
