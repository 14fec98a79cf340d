#include <gtest/gtest.h>

#include <cmath>

#include "kusari/core/array.h"
#include "kusari/core/random.h"
#include "kusari/core/routines.h"
#include "kernels/elementwise.h"
#include "test_util.h"

namespace kusari {
namespace {

using testing::ArraysClose;

class RoutinesTest : public testing::DeviceTest {
 protected:
  Array arr(std::initializer_list<double> v, std::optional<Shape> s = std::nullopt, Dtype d = float32) {
    return Array::from(v, s, d, device());
  }
};

TEST_P(RoutinesTest, ElementwiseWithBroadcasting) {
  Array a = arr({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Array b = arr({10, 20, 30});
  EXPECT_EQ((a + b).to_vector<float>(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ((a - b).to_vector<float>(), (std::vector<float>{-9, -18, -27, -6, -15, -24}));
  Array col = arr({2, 4}, Shape{2, 1});
  EXPECT_EQ((a * col).to_vector<float>(), (std::vector<float>{2, 4, 6, 16, 20, 24}));
  EXPECT_EQ((a / col).to_vector<float>(), (std::vector<float>{0.5, 1, 1.5, 1, 1.25, 1.5}));
  EXPECT_EQ((col + b).shape(), (Shape{2, 3}));
  EXPECT_EQ((a * 2.0).to_vector<float>(), (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ((1.0 - a).to_vector<float>(), (std::vector<float>{0, -1, -2, -3, -4, -5}));
  EXPECT_EQ((6.0 / a).to_vector<float>(), (std::vector<float>{6, 3, 2, 1.5, 1.2f, 1}));
  EXPECT_EQ((-a).to_vector<float>()[5], -6.0f);
  // Non-contiguous operands.
  Array t = a.transpose();  // (3, 2)
  EXPECT_EQ((t + t).to_vector<float>(), (std::vector<float>{2, 8, 4, 10, 6, 12}));
}

// relu_grad runs the fused kernel where the backend takes the case and the composition
// where(y > 0, gy, 0) where it declines; both must give the same values.
TEST_P(RoutinesTest, ReluGradMatchesTheComposition) {
  Generator gen(7);
  for (Dtype d : {float32, float64, float16, int32}) {
    SCOPED_TRACE(dtype_name(d));
    const Array y = Array::uniform({4, 5}, -2, 2, float64, device(), &gen).astype(d);
    const Array gy = Array::uniform({4, 5}, -3, 3, float64, device(), &gen).astype(d);
    const Array expected = where(greater(y, 0.0), gy, Scalar(0));
    EXPECT_TRUE(array_equal(relu_grad(gy, y), expected));
    // Strided and broadcast operands (which the CUDA kernel declines).
    EXPECT_TRUE(array_equal(relu_grad(gy.transpose(), y.transpose()), expected.transpose()));
    const Array row = Array::uniform({5}, -3, 3, float64, device(), &gen).astype(d);
    EXPECT_TRUE(array_equal(relu_grad(row, y), where(greater(y, 0.0), row, Scalar(0))));
  }
  EXPECT_EQ(relu_grad(arr({1, -2, 3}), arr({0.5, 0.5, -0.5})).to_vector<float>(), (std::vector<float>{1, -2, 0}));
  EXPECT_THROW(relu_grad(arr({1}), arr({1}, std::nullopt, float64)), DtypeError);
}

bool decline_relu_grad(const Array&, const Array&, Array&) { return false; }

// A backend whose fused kernel declines every case (or has none) still gets the right values.
TEST_P(RoutinesTest, ReluGradFallsBackWhenTheKernelDeclines) {
  Generator gen(8);
  const Array y = Array::uniform({3, 7}, -1, 1, float32, device(), &gen);
  const Array gy = Array::uniform({3, 7}, -1, 1, float32, device(), &gen);
  const Array fused = relu_grad(gy, y);
  auto* const saved = kernels::relu_grad.find(device());
  ASSERT_NE(saved, nullptr);
  kernels::relu_grad.set(device().type(), &decline_relu_grad);
  const Array declined = relu_grad(gy, y);
  kernels::relu_grad.set(device().type(), nullptr);
  const Array absent = relu_grad(gy, y);
  kernels::relu_grad.set(device().type(), saved);
  EXPECT_TRUE(array_equal(declined, fused));
  EXPECT_TRUE(array_equal(absent, fused));
  EXPECT_TRUE(array_equal(fused, where(greater(y, 0.0), gy, Scalar(0))));
}

TEST_P(RoutinesTest, ElementwiseErrorsNameTheFunction) {
  Array a = arr({1, 2, 3});
  try {
    add(a, arr({1, 2}));
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("add"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(3,)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(add(a, arr({1, 2, 3}, std::nullopt, float64)), DtypeError);
  EXPECT_THROW(exp(Array::arange(3, int64, device())), DtypeError);
  EXPECT_THROW(Array::arange(3, int64, device()) * 0.5, DtypeError);
  EXPECT_EQ((Array::arange(3, int64, device()) * 2).to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 4}));
}

TEST_P(RoutinesTest, AddToAndMultiplyToWorkInPlace) {
  // A large array too: the CPU splits it over threads, the GPU takes its vectorised path.
  for (int64_t n : {int64_t{6}, int64_t{1} << 20}) {
    Array out = Array::arange(0.0, static_cast<double>(n), 1.0, float32, device());
    Array keep = out;  // a handle to the same memory
    const auto storage = out.storage();
    add_to(out, Array::full({n}, 2.0, float32, device()));
    EXPECT_EQ(out.storage(), storage);
    EXPECT_TRUE(ArraysClose(keep, Array::arange(2.0, n + 2.0, 1.0, float32, device())));
    add_to(out, out);  // the operand may be the output itself
    EXPECT_TRUE(ArraysClose(keep, Array::arange(4.0, 2.0 * n + 4.0, 2.0, float32, device())));
    multiply_to(out, 0.5);
    EXPECT_TRUE(ArraysClose(keep, Array::arange(2.0, n + 2.0, 1.0, float32, device())));
    EXPECT_EQ(out.storage(), storage);
  }
  // Broadcasting the operand; a view of a larger array as the output.
  Array a = arr({1, 2, 3, 4, 5, 6}, Shape{2, 3});
  add_to(a, arr({10, 20, 30}));
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  Array row = a[1];
  add_to(row, arr({1}));
  multiply_to(row, 2.0);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{11, 22, 33, 30, 52, 74}));
  Array ints = Array::arange(3, int64, device());
  multiply_to(ints, 3);
  EXPECT_EQ(ints.to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 6}));
}

TEST_P(RoutinesTest, AddToErrorsNameTheFunctionAndTheValues) {
  Array out = arr({1, 2, 3});
  try {
    add_to(out, arr({1, 2, 3, 4, 5, 6}, Shape{2, 3}));  // would broadcast the output
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("add_to"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(2, 3)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(add_to(out, arr({1, 2})), ShapeError);
  try {
    add_to(out, arr({1, 2, 3}, std::nullopt, float64));
    FAIL() << "expected DtypeError";
  } catch (const DtypeError& e) {
    EXPECT_NE(std::string(e.what()).find("add_to"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float64"), std::string::npos) << e.what();
  }
  if (device().is_cuda()) EXPECT_THROW(add_to(out, Array::ones({3}, float32, Device::cpu())), DeviceError);
  // An operand overlapping the output at other indices would read values already written.
  Array wide = arr({1, 2, 3, 4});
  Array head = wide.at({Slice(0, 3)}), tail = wide.at({Slice(1, 4)});
  EXPECT_THROW(add_to(head, tail), ValueError);
  Array ints = Array::arange(3, int64, device());
  EXPECT_THROW(multiply_to(ints, 0.5), DtypeError);
  Array undefined;
  EXPECT_THROW(add_to(undefined, out), ValueError);
}

TEST_P(RoutinesTest, MathFunctions) {
  Array x = arr({-2, -0.5, 0, 0.5, 2}, std::nullopt, float64);
  auto expect = [&](const Array& got, double (*f)(double)) {
    std::vector<double> in = x.to_vector<double>(), out = got.to_vector<double>();
    for (size_t i = 0; i < in.size(); ++i) {
      double e = f(in[i]);
      if (std::isnan(e)) {
        EXPECT_TRUE(std::isnan(out[i]));
      } else {
        EXPECT_NEAR(out[i], e, 1e-12) << "at " << in[i];
      }
    }
  };
  expect(exp(x), [](double v) { return std::exp(v); });
  expect(tanh(x), [](double v) { return std::tanh(v); });
  expect(sigmoid(x), [](double v) { return 1 / (1 + std::exp(-v)); });
  expect(relu(x), [](double v) { return v > 0 ? v : 0.0; });
  expect(abs(x), [](double v) { return std::fabs(v); });
  expect(square(x), [](double v) { return v * v; });
  expect(softplus(x), [](double v) { return std::log1p(std::exp(v)); });
  expect(leaky_relu(x, 0.2), [](double v) { return v >= 0 ? v : 0.2 * v; });
  expect(elu(x, 1.0), [](double v) { return v >= 0 ? v : std::expm1(v); });
  expect(clip(x, -1, 1), [](double v) { return std::min(std::max(v, -1.0), 1.0); });
  expect(power(x, 3), [](double v) { return v * v * v; });
  expect(sign(x), [](double v) { return static_cast<double>((v > 0) - (v < 0)); });
  EXPECT_THROW(clip(x, 1, -1), ValueError);
  // Sigmoid does not overflow in the tails.
  Array big = arr({-1000, 1000});
  EXPECT_EQ(sigmoid(big).to_vector<float>(), (std::vector<float>{0, 1}));
}

TEST_P(RoutinesTest, ComparisonsAndWhere) {
  Array a = arr({1, 5, 3});
  Array b = arr({2, 5, 1});
  EXPECT_EQ(less(a, b).to_vector<bool>(), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(equal(a, b).to_vector<bool>(), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(greater(a, 2.0).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(where(less(a, b), a, b).to_vector<float>(), (std::vector<float>{1, 5, 1}));
  EXPECT_EQ(where(less(a, b), a, Scalar(0.0)).to_vector<float>(), (std::vector<float>{1, 0, 0}));
  EXPECT_THROW(where(a, a, b), DtypeError);
  EXPECT_EQ(maximum(a, b).to_vector<float>(), (std::vector<float>{2, 5, 3}));
  Array n = arr({NAN, 1});
  EXPECT_EQ(isnan(n).to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_TRUE(std::isnan(maximum(n, arr({0, 0})).to_vector<float>()[0]));
}

TEST_P(RoutinesTest, Reductions) {
  Array a = Array::arange(0.0, 24.0, 1.0, float32, device()).reshape({2, 3, 4});
  EXPECT_FLOAT_EQ(sum(a).item<float>(), 276.0f);
  EXPECT_EQ(sum(a, {0, 2}).to_vector<float>(), (std::vector<float>{60, 92, 124}));
  EXPECT_EQ(sum(a, {1}, true).shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(sum(a, {-1}).to_vector<float>(), (std::vector<float>{6, 22, 38, 54, 70, 86}));
  EXPECT_EQ(amax(a, {1}).to_vector<float>(), (std::vector<float>{8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(amin(a, {0, 1}).to_vector<float>(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_FLOAT_EQ(mean(a).item<float>(), 11.5f);
  // Non-contiguous input.
  Array t = a.transpose({2, 0, 1});
  EXPECT_EQ(sum(t, {0}).to_vector<float>(), sum(a, {2}).to_vector<float>());
  EXPECT_EQ(argmax(a, 2).to_vector<int64_t>(), std::vector<int64_t>(6, 3));
  EXPECT_EQ(argmax(a).item<int64_t>(), 23);
  EXPECT_EQ(argmin(arr({3, 1, 2, 1})).item<int64_t>(), 1);
  EXPECT_EQ(sum(greater(a, 20.0)).item<int64_t>(), 3);
  EXPECT_TRUE(any(greater(a, 22.0)).item<bool>());
  EXPECT_FALSE(all(greater(a, 0.0)).item<bool>());
  EXPECT_THROW(sum(a, {3}), ValueError);
  EXPECT_THROW(sum(a, {1, -2}), ValueError);
  EXPECT_NEAR(var(arr({1, 2, 3, 4})).item<double>(), 1.25, 1e-6);
  EXPECT_NEAR(var(arr({1, 2, 3, 4}), {}, false, 1).item<double>(), 5.0 / 3, 1e-6);
  // Large float32 sums accumulate in double.
  Array ones = Array::ones({3000000}, float32, device());
  EXPECT_FLOAT_EQ(sum(ones).item<float>(), 3000000.0f);
}

TEST_P(RoutinesTest, SumToIsTheAdjointOfBroadcast) {
  Array a = Array::arange(0.0, 6.0, 1.0, float32, device()).reshape({2, 3});
  EXPECT_EQ(sum_to(a, {3}).to_vector<float>(), (std::vector<float>{3, 5, 7}));
  EXPECT_EQ(sum_to(a, {2, 1}).to_vector<float>(), (std::vector<float>{3, 12}));
  EXPECT_FLOAT_EQ(sum_to(a, {}).item<float>(), 15.0f);
  EXPECT_THROW(sum_to(a, {4}), ShapeError);
}

TEST_P(RoutinesTest, MatmulMatchesNaive) {
  Generator g(3);
  for (Dtype dt : {float32, float64}) {
    Array a = Array::normal({2, 4, 5}, 0, 1, dt, device(), &g);
    Array b = Array::normal({5, 3}, 0, 1, dt, device(), &g);
    Array c = matmul(a, b);
    ASSERT_EQ(c.shape(), (Shape{2, 4, 3}));
    std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), cv = c.to_vector<double>();
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j) {
          double s = 0;
          for (int k = 0; k < 5; ++k) s += av[n * 20 + i * 5 + k] * bv[k * 3 + j];
          EXPECT_NEAR(cv[n * 12 + i * 3 + j], s, 1e-4);
        }
    // Transposed views go to BLAS without copies and give the same result.
    Array at = a.at({0}).transpose().copy().transpose();
    EXPECT_TRUE(ArraysClose(matmul(at, b), c.at({0}), 1e-5, 1e-5));
    Array bt = b.transpose().copy().transpose();
    EXPECT_TRUE(ArraysClose(matmul(a, bt), c, 1e-5, 1e-5));
  }
  Array v = arr({1, 2, 3});
  EXPECT_FLOAT_EQ(matmul(v, v).item<float>(), 14.0f);
  Array m = arr({1, 0, 0, 1, 1, 1}, Shape{3, 2});
  EXPECT_EQ(matmul(v, m).to_vector<float>(), (std::vector<float>{4, 5}));
  EXPECT_THROW(matmul(m, m), ShapeError);
  Array h = Array::ones({2, 3}, float16, device());
  EXPECT_EQ(matmul(h, Array::ones({3, 2}, float16, device())).astype(float32).to_vector<float>(),
            std::vector<float>(4, 3.0f));
  EXPECT_EQ(matmul(Array::ones({2, 2}, int64, device()), Array::ones({2, 2}, int64, device())).to_vector<int64_t>(),
            std::vector<int64_t>(4, 2));
}

TEST_P(RoutinesTest, SoftmaxAndLogSumExp) {
  Array x = arr({1, 2, 3, 1, 1, 1}, Shape{2, 3}, float64);
  Array s = softmax(x, 1);
  std::vector<double> v = s.to_vector<double>();
  double z = std::exp(1) + std::exp(2) + std::exp(3);
  EXPECT_NEAR(v[0], std::exp(1) / z, 1e-12);
  EXPECT_NEAR(v[4], 1.0 / 3, 1e-12);
  EXPECT_TRUE(ArraysClose(log_softmax(x, 1), log(s), 1e-10, 1e-12));
  EXPECT_TRUE(ArraysClose(exp(log_softmax(x, 0)), softmax(x, 0), 1e-10, 1e-12));
  EXPECT_NEAR(logsumexp(x, {1}).to_vector<double>()[0], std::log(z), 1e-12);
  // Stable for large inputs.
  Array big = arr({1000, 1000}, std::nullopt, float32);
  EXPECT_EQ(softmax(big, 0).to_vector<float>(), (std::vector<float>{0.5, 0.5}));
}

TEST_P(RoutinesTest, JoinSplitTake) {
  Array a = Array::arange(0.0, 6.0, 1.0, float32, device()).reshape({2, 3});
  Array b = Array::arange(6.0, 8.0, 1.0, float32, device()).reshape({2, 1});
  Array c = concatenate({a, b}, 1);
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 1, 2, 6, 3, 4, 5, 7}));
  EXPECT_THROW(concatenate({a, b}, 0), ShapeError);
  EXPECT_EQ(stack({a, a}, 1).shape(), (Shape{2, 2, 3}));
  std::vector<Array> parts = split(c, 2, 1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[1].copy().to_vector<float>(), (std::vector<float>{2, 6, 5, 7}));
  EXPECT_THROW(split(c, 3, 1), ValueError);
  std::vector<Array> p2 = split_at(c, {1, 3}, 1);
  EXPECT_EQ(p2[1].shape(), (Shape{2, 2}));
  Array idx = Array::from_vector(std::vector<int64_t>{2, 0, 2}, std::nullopt, device());
  Array t = take(a, idx, 1);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2, 0, 2, 5, 3, 5}));
  Array back = add_at_zeros(a.shape(), idx, 1, t);
  EXPECT_EQ(back.to_vector<float>(), (std::vector<float>{0, 0, 4, 3, 0, 10}));
  EXPECT_THROW(take(a, Array::from_vector(std::vector<int64_t>{3}, std::nullopt, device()), 1), IndexError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(RoutinesTest);

}  // namespace
}  // namespace kusari

namespace kusari {
namespace {

class TruthTest : public testing::DeviceTest {};

TEST_P(TruthTest, AnyAndAllUseTruthValues) {
  Array half = Array::from({0.0, 0.5}, std::nullopt, float32, device());
  EXPECT_TRUE(any(half).item<bool>());
  EXPECT_FALSE(all(half).item<bool>());
  EXPECT_TRUE(all(Array::from({0.25, -1.0}, std::nullopt, float64, device())).item<bool>());
  EXPECT_FALSE(any(Array::zeros({3}, int64, device())).item<bool>());
}

KUSARI_INSTANTIATE_DEVICE_TEST(TruthTest);

}  // namespace
}  // namespace kusari
