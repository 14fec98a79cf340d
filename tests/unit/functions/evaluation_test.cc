// accuracy: known values with and without ignore_label, dtypes, shapes and error cases.
#include <gtest/gtest.h>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;

class EvaluationTest : public testing::FunctionTest {
 protected:
  Array labels(const std::vector<int32_t>& v) {
    return Array::from_vector(v, std::nullopt, device());
  }
  // Scores of 4 samples over 3 classes; the argmaxes are 2, 0, 1, 1.
  Array scores(Dtype d) {
    return Array::from({0.1, 0.2, 0.7, 0.9, 0.05, 0.05, 0.3, 0.4, 0.3, -1, 2, 1}, Shape{4, 3}, d,
                       device());
  }
};

TEST_P(EvaluationTest, KnownValues) {
  for (Dtype d : {float64, float32, float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(d));
    Variable y(scores(d), is_floating(d));
    Variable acc = F::accuracy(y, labels({2, 0, 0, 1}));
    EXPECT_EQ(acc.shape(), (Shape{}));
    // 16-bit scores give a float32 ratio.
    EXPECT_EQ(acc.dtype(), d == float64 ? float64 : float32);
    EXPECT_EQ(acc.creator(), nullptr);
    EXPECT_FALSE(acc.requires_grad());
    EXPECT_DOUBLE_EQ(acc.data().item<double>(), 0.75);
    EXPECT_DOUBLE_EQ(F::accuracy(y, labels({0, 1, 2, 0})).data().item<double>(), 0.0);
  }
}

TEST_P(EvaluationTest, SixteenBitScoresGiveAFloat32Ratio) {
  // 87 of 100 right: bfloat16 would round 0.87 to 0.87109375, float16 to 0.8701171875.
  std::vector<int32_t> t(100, 0);
  for (int i = 87; i < 100; ++i) t[static_cast<size_t>(i)] = 1;
  Array y = kusari::concatenate({Array::ones({100, 1}, float32, device()), Array::zeros({100, 1}, float32, device())}, 1);
  for (Dtype d : {float16, bfloat16}) {
    Variable acc = F::accuracy(Variable(y.astype(d)), labels(t));
    EXPECT_EQ(acc.dtype(), float32) << dtype_name(d);
    EXPECT_EQ(acc.data().item<float>(), 0.87f) << dtype_name(d);
  }
}

TEST_P(EvaluationTest, IgnoreLabel) {
  Variable y(scores(float32));
  // Ignored samples leave both the count and the total.
  EXPECT_DOUBLE_EQ(F::accuracy(y, labels({2, 0, -1, -1}), -1).data().item<double>(), 1.0);
  EXPECT_FLOAT_EQ(F::accuracy(y, labels({2, 1, -1, 1}), -1).data().item<float>(), 2.0f / 3);
  // Ignored samples are dropped even when predicted right (samples 2 and 3 predict 1 here).
  EXPECT_DOUBLE_EQ(F::accuracy(y, labels({0, 0, 1, 1}), 1).data().item<double>(), 0.5);
  // Without ignore_label, -1 is just a wrong label.
  EXPECT_DOUBLE_EQ(F::accuracy(y, labels({2, 0, -1, -1})).data().item<double>(), 0.5);
  // Every sample ignored: 0.
  Variable all = F::accuracy(y, labels({-1, -1, -1, -1}), -1);
  EXPECT_EQ(all.dtype(), float32);
  EXPECT_EQ(all.data().item<double>(), 0.0);
}

TEST_P(EvaluationTest, SpatialLabelsAndInt64) {
  // y (N=2, C=2, L=3), t (2, 3): argmax over axis 1 per position.
  Array y = Array::from({1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1}, Shape{2, 2, 3}, float64, device());
  Array t = Array::from_vector(std::vector<int64_t>{0, 1, 0, 1, 0, 0}, Shape{2, 3}, device());
  // predictions: [[0, 1, 0], [1, 0, 1]]; 5 of 6 correct.
  EXPECT_DOUBLE_EQ(F::accuracy(Variable(y), t).data().item<double>(), 5.0 / 6);
  // Ignoring label 0 leaves positions (0, 1) and (1, 0), both right.
  EXPECT_DOUBLE_EQ(F::accuracy(Variable(y), t, 0).data().item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(F::accuracy(Variable(y), t, 1).data().item<double>(), 3.0 / 4);
  // Non-contiguous scores.
  Array yt = scores(float64).transpose().copy().transpose();
  EXPECT_DOUBLE_EQ(F::accuracy(Variable(yt), labels({2, 0, 0, 1})).data().item<double>(), 0.75);
}

TEST_P(EvaluationTest, Errors) {
  Variable y(scores(float32));
  EXPECT_THROW(F::accuracy(y, labels({2, 0, 1})), ShapeError);
  EXPECT_THROW(F::accuracy(y, uniform({4}, float32)), DtypeError);
  EXPECT_THROW(F::accuracy(Variable(uniform({4}, float32)), labels({0, 1, 2, 3})), ShapeError);
  EXPECT_THROW(F::accuracy(Variable(labels({0, 1, 2, 3}).reshape({2, 2})), labels({0, 1})),
               DtypeError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(EvaluationTest);

}  // namespace
}  // namespace kusari
