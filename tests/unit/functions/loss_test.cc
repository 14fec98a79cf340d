// softmax_cross_entropy with label smoothing, sigmoid_cross_entropy and mean_squared_error: known values, gradient checks (first and second
// order, float64 and float32, non-contiguous inputs) and error cases.
#include <gtest/gtest.h>

#include <cmath>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class LossTest : public testing::FunctionTest {
 protected:
  Array labels(const std::vector<int32_t>& v, const Shape& s) {
    return Array::from_vector(v, s, device());
  }
};

double sce(double x, double t) {
  return std::log1p(std::exp(x)) - x * t;
}
double sig(double x) {
  return 1 / (1 + std::exp(-x));
}

TEST_P(LossTest, SigmoidCrossEntropyKnownValues) {
  const std::vector<double> xv = {0.5, -1.0, 2.0, 0.0, 3.0, -2.0};
  Variable x(Array::from({0.5, -1.0, 2.0, 0.0, 3.0, -2.0}, Shape{2, 3}, float64, device()), true);
  Array t = labels({1, 0, -1, 0, 1, 1}, {2, 3});
  const std::vector<double> tv = {1, 0, -1, 0, 1, 1};
  double total = 0;
  std::vector<double> elem;
  for (size_t i = 0; i < xv.size(); ++i) {
    elem.push_back(tv[i] == -1 ? 0.0 : sce(xv[i], tv[i]));
    total += elem.back();
  }
  // normalize: divided by the 5 elements not ignored; otherwise by the batch size 2.
  Variable loss = F::sigmoid_cross_entropy(x, t);
  EXPECT_EQ(loss.shape(), (Shape{}));
  EXPECT_NEAR(loss.data().item<double>(), total / 5, 1e-12);
  EXPECT_NEAR(F::sigmoid_cross_entropy(x, t, false).data().item<double>(), total / 2, 1e-12);
  Variable none = F::sigmoid_cross_entropy(x, t, true, F::Reduce::kNone);
  EXPECT_TRUE(ArraysClose(none.data(),
                          Array::from_vector(elem, Shape{2, 3}, device()).astype(float64), 1e-12));
  // d loss / dx = (sigmoid(x) - t) * mask / count.
  loss.backward();
  std::vector<double> g = x.grad().to_vector<double>();
  for (size_t i = 0; i < xv.size(); ++i) {
    const double expected = tv[i] == -1 ? 0.0 : (sig(xv[i]) - tv[i]) / 5;
    EXPECT_NEAR(g[i], expected, 1e-12) << "element " << i;
  }
  // All ignored: the mean is 0, not nan.
  EXPECT_EQ(
      F::sigmoid_cross_entropy(x, labels({-1, -1, -1, -1, -1, -1}, {2, 3})).data().item<double>(),
      0.0);
  // Large logits stay finite: -log sigmoid(-100) = 100.
  Variable big(Array::from({100, -100}, Shape{1, 2}, float32, device()));
  Variable l = F::sigmoid_cross_entropy(big, labels({0, 1}, {1, 2}), true, F::Reduce::kNone);
  EXPECT_TRUE(ArraysClose(l.data(), Array::from({100, 100}, Shape{1, 2}, float32, device()), 1e-6));
  // int64 labels work as well.
  EXPECT_NEAR(F::sigmoid_cross_entropy(x, t.astype(int64)).data().item<double>(), total / 5, 1e-12);
}

TEST_P(LossTest, SigmoidCrossEntropyGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    Array t2 = labels({1, 0, -1, 0, 1, 1, -1, 0, 1, 0, 0, 1}, {4, 3});
    Array t3 = labels({1, 0, -1, 0, 1, 1, -1, 0, 1, 0, 0, 1}, {2, 3, 2});
    for (bool normalize : {true, false}) {
      for (F::Reduce r : {F::Reduce::kMean, F::Reduce::kNone}) {
        SCOPED_TRACE(::testing::Message()
                     << "normalize=" << normalize << " reduce=" << static_cast<int>(r));
        auto f = [normalize, r](const Array& t) {
          return [t, normalize, r](const Variable& v) {
            return F::sigmoid_cross_entropy(v, t, normalize, r);
          };
        };
        check(f(t2), uniform({4, 3}, d, -3, 3));
        check(f(t3), uniform({2, 3, 2}, d, -3, 3));
        check(f(t2), noncontig({4, 3}, d, -3, 3));
      }
    }
  }
}

TEST_P(LossTest, SigmoidCrossEntropyErrors) {
  Variable x(uniform({2, 3}, float32));
  EXPECT_THROW(F::sigmoid_cross_entropy(x, labels({0, 1, 0}, {3})), ShapeError);
  EXPECT_THROW(F::sigmoid_cross_entropy(x, uniform({2, 3}, float32)), DtypeError);
  EXPECT_THROW(F::sigmoid_cross_entropy(Variable(labels({0, 1}, {1, 2})), labels({0, 1}, {1, 2})),
               DtypeError);
}

TEST_P(LossTest, MeanSquaredErrorKnownValues) {
  Variable a(Array::from({1, 2, 3, 4}, Shape{2, 2}, float64, device()), true);
  Variable b(Array::from({0, 2, 5, 1}, Shape{2, 2}, float64, device()), true);
  Variable loss = F::mean_squared_error(a, b);
  EXPECT_EQ(loss.shape(), (Shape{}));
  EXPECT_NEAR(loss.data().item<double>(), (1 + 0 + 4 + 9) / 4.0, 1e-12);
  loss.backward();
  EXPECT_TRUE(
      ArraysClose(a.grad(), Array::from({0.5, 0, -1, 1.5}, Shape{2, 2}, float64, device()), 1e-12));
  EXPECT_TRUE(ArraysClose(b.grad(), Array::from({-0.5, 0, 1, -1.5}, Shape{2, 2}, float64, device()),
                          1e-12));
}

TEST_P(LossTest, MeanSquaredErrorGradients) {
  VariadicFunction f = [](const std::vector<Variable>& v) {
    return std::vector<Variable>{F::mean_squared_error(v[0], v[1])};
  };
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check(f, {uniform({5}, d), uniform({5}, d)});
    check(f, {uniform({3, 4}, d), uniform({3, 4}, d)});
    check(f, {noncontig({2, 3, 4}, d), uniform({2, 3, 4}, d)});
    check(f, {uniform({}, d), uniform({}, d)});
  }
}

TEST_P(LossTest, MeanSquaredErrorErrors) {
  Variable a(uniform({2, 3}, float32));
  EXPECT_THROW(F::mean_squared_error(a, Variable(uniform({3}, float32))), ShapeError);
  EXPECT_THROW(F::mean_squared_error(a, Variable(uniform({2, 3}, float64))), DtypeError);
  EXPECT_THROW(F::mean_squared_error(Variable(labels({1, 2}, {2})), Variable(labels({1, 2}, {2}))),
               DtypeError);
}

// --- softmax_cross_entropy with label smoothing (Note [Label smoothing]) ------------------------

TEST_P(LossTest, LabelSmoothingKnownValuesAndGradient) {
  // x = [[1, 2, 3], [1, 1, 1], [0, -1, 2]], t = [2, 0, ignored]; eps = 0.3 over K = 3 classes: the
  // target is 0.1 everywhere plus 0.7 on the label. Loss = -sum_k q_k log p_k, averaged over the
  // two samples kept; gradient (p - q) / 2 on their rows, 0 on the ignored one.
  const std::vector<std::vector<double>> xv = {{1, 2, 3}, {1, 1, 1}, {0, -1, 2}};
  const int labels_v[] = {2, 0};
  const double eps = 0.3;
  double total = 0;
  std::vector<double> grad(9, 0.0);
  for (int i = 0; i < 2; ++i) {
    double z = 0;
    for (double v : xv[i]) z += std::exp(v);
    for (int k = 0; k < 3; ++k) {
      const double q = (k == labels_v[i] ? 1 - eps : 0.0) + eps / 3;
      const double logp = xv[i][k] - std::log(z);
      total -= q * logp;
      grad[i * 3 + k] = (std::exp(logp) - q) / 2;
    }
  }
  Variable x(Array::from({1, 2, 3, 1, 1, 1, 0, -1, 2}, Shape{3, 3}, float64, device()), true);
  Array t = labels({2, 0, -1}, {3});
  Variable loss = F::softmax_cross_entropy(x, t, -1, F::Reduce::kMean, eps);
  EXPECT_NEAR(loss.data().item<double>(), total / 2, 1e-12);
  loss.backward();
  EXPECT_TRUE(ArraysClose(x.grad(), Array::from_vector(grad, Shape{3, 3}, device()), 1e-12, 1e-14));
  // Per sample: the ignored one is 0.
  Variable none = F::softmax_cross_entropy(x, t, -1, F::Reduce::kNone, eps);
  std::vector<double> per = none.data().to_vector<double>();
  EXPECT_NEAR(per[0] + per[1], total, 1e-12);
  EXPECT_EQ(per[2], 0.0);
  // Smoothing raises the loss of a confident correct prediction above the plain one.
  EXPECT_GT(loss.data().item<double>(), F::softmax_cross_entropy(x, t).data().item<double>());
}

TEST_P(LossTest, LabelSmoothingZeroIsThePlainLoss) {
  Variable x(uniform({4, 5}, float32), true);
  Array t = labels({0, 3, -1, 2}, {4});
  Variable a = F::softmax_cross_entropy(x, t);
  Variable b = F::softmax_cross_entropy(x, t, -1, F::Reduce::kMean, 0.0);
  EXPECT_TRUE(ArraysClose(a.data(), b.data(), 0, 0));
  // eps = 1: the target is uniform whatever the label.
  Variable u1 = F::softmax_cross_entropy(x, labels({0, 3, -1, 2}, {4}), -1, F::Reduce::kMean, 1.0);
  Variable u2 = F::softmax_cross_entropy(x, labels({1, 1, -1, 4}, {4}), -1, F::Reduce::kMean, 1.0);
  EXPECT_TRUE(ArraysClose(u1.data(), u2.data(), 1e-6, 1e-7));
}

TEST_P(LossTest, LabelSmoothingGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    Array t = labels({0, 3, -1, 2}, {4});
    for (F::Reduce r : {F::Reduce::kMean, F::Reduce::kNone}) {
      for (double eps : {0.1, 0.5}) {
        SCOPED_TRACE(::testing::Message() << "reduce=" << static_cast<int>(r) << " eps=" << eps);
        auto f = [t, r, eps](const Variable& v) {
          return F::softmax_cross_entropy(v, t, -1, r, eps);
        };
        check(f, uniform({4, 5}, d, -3, 3));
        check(f, noncontig({4, 5}, d, -3, 3));
      }
    }
  }
}

TEST_P(LossTest, LabelSmoothingInSixteenBitsIsComputedInFloat32) {
  Array x32 = uniform({8, 10}, float32, -4, 4);
  Array t = labels({0, 1, 2, 3, 4, 5, 6, 7}, {8});
  for (Dtype d : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(d));
    Array xd = x32.astype(d);
    Variable loss = F::softmax_cross_entropy(Variable(xd), t, -1, F::Reduce::kMean, 0.1);
    EXPECT_EQ(loss.dtype(), float32);
    Variable ref = F::softmax_cross_entropy(Variable(xd.astype(float32)), t, -1, F::Reduce::kMean, 0.1);
    EXPECT_NEAR(loss.data().item<double>(), ref.data().item<double>(), 1e-6);
  }
}

TEST_P(LossTest, LabelSmoothingOutOfRangeIsRefused) {
  Variable x(uniform({2, 3}, float32));
  for (double eps : {-0.1, 1.5}) {
    try {
      F::softmax_cross_entropy(x, labels({0, 1}, {2}), -1, F::Reduce::kMean, eps);
      FAIL() << "label_smoothing " << eps << " was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("label_smoothing must be in [0, 1]"), std::string::npos)
          << e.what();
    }
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(LossTest);

}  // namespace
}  // namespace kusari
