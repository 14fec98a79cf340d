// max_pooling_2d and average_pooling_2d: forward values against a naive reference (padding,
// cover_all, non-square windows, non-contiguous input), gradient checks in float64 (tight) and
// float32 (loose) on inputs with distinct values, double-backward checks, and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kusari/autograd/gradient_check.h"
#include "kusari/functions/pooling.h"
#include "function_test_util.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;
using F::IntPair;

GradientCheckOptions tol(Dtype d) { return testing::grad_tol(d); }

struct PoolCase {
  const char* name;
  Shape x;
  IntPair ksize, stride, pad;
  bool cover_all;
};

std::vector<PoolCase> max_cases() {
  return {
      {"k2s2", {2, 3, 6, 6}, 2, 2, 0, false},
      {"k2s2_cover_all", {2, 2, 5, 5}, 2, 2, 0, true},
      {"k3s2p1", {2, 2, 6, 6}, 3, 2, 1, false},
      {"k3s2p1_cover_all", {2, 2, 6, 6}, 3, 2, 1, true},
      {"k3s1p1_overlapping", {1, 2, 5, 5}, 3, 1, 1, true},
      {"nonsquare", {2, 2, 5, 6}, {2, 3}, {1, 2}, {0, 1}, true},
  };
}

std::vector<PoolCase> average_cases() {
  return {
      {"k2s2", {2, 3, 6, 6}, 2, 2, 0, false},
      {"k3s2p1", {2, 2, 7, 7}, 3, 2, 1, false},
      {"k3s1p1_overlapping", {1, 2, 5, 5}, 3, 1, 1, false},
      {"nonsquare", {2, 2, 5, 6}, {2, 3}, {1, 2}, {0, 1}, false},
  };
}

int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, bool cover_all) {
  return cover_all ? (in + 2 * p - k + s - 1) / s + 1 : (in + 2 * p - k) / s + 1;
}

/// Max or average (zero padding counted, Chainer's semantics) pooling by the definition.
Array reference_pool(const Array& x, const PoolCase& c, bool is_max) {
  const std::vector<double> xv = x.to_vector<double>();
  const int64_t planes = x.shape()[0] * x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t oh = pool_out(h, c.ksize.h, c.stride.h, c.pad.h, c.cover_all);
  const int64_t ow = pool_out(w, c.ksize.w, c.stride.w, c.pad.w, c.cover_all);
  std::vector<double> y;
  for (int64_t pl = 0; pl < planes; ++pl) {
    for (int64_t oy = 0; oy < oh; ++oy) {
      for (int64_t ox = 0; ox < ow; ++ox) {
        double m = -std::numeric_limits<double>::infinity(), s = 0;
        for (int64_t i = 0; i < c.ksize.h; ++i) {
          for (int64_t j = 0; j < c.ksize.w; ++j) {
            const int64_t iy = oy * c.stride.h - c.pad.h + i, ix = ox * c.stride.w - c.pad.w + j;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const double v = xv[(pl * h + iy) * w + ix];
            m = std::max(m, v);
            s += v;
          }
        }
        y.push_back(is_max ? m : s / static_cast<double>(c.ksize.h * c.ksize.w));
      }
    }
  }
  return Array::from_vector(y, Shape{x.shape()[0], x.shape()[1], oh, ow});
}

class PoolingTest : public testing::DeviceTest {
 protected:
  /// A random permutation of 0, 0.1, 0.2, ...: distinct values at least 0.1 apart, so that no
  /// perturbation of the gradient check moves a window's maximum.
  Array distinct(const Shape& s, Dtype dt) {
    std::vector<double> v(static_cast<size_t>(s.numel()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i] = 0.1 * static_cast<double>(i) - 0.05 * static_cast<double>(v.size());
    std::shuffle(v.begin(), v.end(), rng_);
    return Array::from_vector(v, s).astype(dt).to_device(device());
  }
  /// The same, as a non-contiguous view (H and W swapped).
  Array distinct_noncontig(const Shape& s, Dtype dt) {
    return distinct({s[0], s[1], s[3], s[2]}, dt).swapaxes(2, 3);
  }
  std::mt19937 rng_{7};
};

Variable max_pool(const Variable& x, const PoolCase& c) {
  return F::max_pooling_2d(x, c.ksize, c.stride, c.pad, c.cover_all);
}

Variable average_pool(const Variable& x, const PoolCase& c) {
  return F::average_pooling_2d(x, c.ksize, c.stride, c.pad);
}

// --- max_pooling_2d
// -------------------------------------------------------------------------------

TEST_P(PoolingTest, MaxForwardMatchesReference) {
  for (Dtype dt : {float64, float32}) {
    for (const PoolCase& c : max_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const Array x = distinct(c.x, dt);
      EXPECT_TRUE(testing::ArraysClose(max_pool(x, c).data(), reference_pool(x, c, true), 0, 0));
      const Array xn = distinct_noncontig(c.x, dt);
      ASSERT_FALSE(xn.is_contiguous());
      EXPECT_TRUE(testing::ArraysClose(max_pool(xn, c).data(), reference_pool(xn, c, true), 0, 0));
    }
  }
}

TEST_P(PoolingTest, MaxOutputShapes) {
  const Array x = Array::zeros({1, 1, 5, 5}, float32, device());
  EXPECT_EQ(F::max_pooling_2d(x, 2).shape(), (Shape{1, 1, 3, 3}));  // cover_all by default
  EXPECT_EQ(F::max_pooling_2d(x, 2, std::nullopt, 0, false).shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(F::max_pooling_2d(x, {2, 3}, 1).shape(), (Shape{1, 1, 4, 3}));
}

TEST_P(PoolingTest, MaxGradientGoesToFirstMaximum) {
  // Every window is a tie: the gradient goes to its first (row-major) element.
  Variable x(Array::ones({1, 1, 4, 4}, float64, device()), true);
  Variable y = F::max_pooling_2d(x, 2);
  y.set_grad(Array::from({1, 2, 3, 4}, Shape{1, 1, 2, 2}, float64, device()));
  y.backward();
  const Array expected = Array::from({1, 0, 2, 0, 0, 0, 0, 0, 3, 0, 4, 0, 0, 0, 0, 0},
                                     Shape{1, 1, 4, 4}, float64, device());
  EXPECT_TRUE(testing::ArraysClose(x.grad(), expected, 0, 0));
}

TEST_P(PoolingTest, MaxBackward) {
  for (Dtype dt : {float64, float32}) {
    for (const PoolCase& c : max_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      auto f = [c](const Variable& x) { return max_pool(x, c); };
      check_backward(f, distinct(c.x, dt), tol(dt));
      check_backward(f, distinct_noncontig(c.x, dt), tol(dt));
    }
  }
}

TEST_P(PoolingTest, MaxDoubleBackward) {
  for (Dtype dt : {float64, float32}) {
    for (const PoolCase& c : max_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      check_double_backward([c](const Variable& x) { return max_pool(x, c); }, distinct(c.x, dt),
                            tol(dt));
    }
  }
}

TEST_P(PoolingTest, MaxHalfPrecision) {
  const PoolCase c = max_cases()[2];
  const Array x = distinct(c.x, float32);
  for (Dtype dt : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Variable y = max_pool(x.astype(dt), c);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_TRUE(testing::ArraysClose(y.data(), reference_pool(x.astype(dt), c, true), 0, 0));
  }
}

// --- average_pooling_2d
// ---------------------------------------------------------------------------

TEST_P(PoolingTest, AverageForwardMatchesReference) {
  for (Dtype dt : {float64, float32}) {
    const double t = dt == float64 ? 1e-12 : 1e-5;
    for (const PoolCase& c : average_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const Array x = distinct(c.x, dt);
      EXPECT_TRUE(
          testing::ArraysClose(average_pool(x, c).data(), reference_pool(x, c, false), t, t));
      const Array xn = distinct_noncontig(c.x, dt);
      EXPECT_TRUE(
          testing::ArraysClose(average_pool(xn, c).data(), reference_pool(xn, c, false), t, t));
    }
  }
}

TEST_P(PoolingTest, AverageCountsPadding) {
  // A 2x2 input of ones, window 3, pad 1: each corner window holds 4 ones and 5 zeros of padding.
  const Array x = Array::ones({1, 1, 2, 2}, float64, device());
  Variable y = F::average_pooling_2d(x, 3, 1, 1);
  EXPECT_TRUE(testing::ArraysClose(
      y.data(), Array::full({1, 1, 2, 2}, 4.0 / 9.0, float64, device()), 1e-12, 0));
  EXPECT_EQ(F::average_pooling_2d(Array::ones({1, 1, 5, 5}, float64, device()), 2).shape(),
            (Shape{1, 1, 2, 2}));
}

TEST_P(PoolingTest, AverageBackward) {
  for (Dtype dt : {float64, float32}) {
    for (const PoolCase& c : average_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      auto f = [c](const Variable& x) { return average_pool(x, c); };
      check_backward(f, distinct(c.x, dt), tol(dt));
      check_backward(f, distinct_noncontig(c.x, dt), tol(dt));
    }
  }
}

TEST_P(PoolingTest, AverageDoubleBackward) {
  for (Dtype dt : {float64, float32}) {
    for (const PoolCase& c : average_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      check_double_backward([c](const Variable& x) { return average_pool(x, c); },
                            distinct(c.x, dt), tol(dt));
    }
  }
}

TEST_P(PoolingTest, AverageHalfPrecision) {
  const PoolCase c = average_cases()[1];
  const Array x = distinct(c.x, float32) * 0.01;
  for (Dtype dt : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Variable y = average_pool(x.astype(dt), c);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_TRUE(testing::ArraysClose(y.data(), reference_pool(x, c, false), 2e-2, 2e-3));
  }
}

// --- errors
// ---------------------------------------------------------------------------------------

TEST_P(PoolingTest, Errors) {
  const Array x = Array::zeros({2, 3, 4, 4}, float32, device());
  try {
    F::max_pooling_2d(x.reshape({6, 4, 4}), 2);
    ADD_FAILURE() << "no error for a 3-d input";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("max_pooling_2d"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(6, 4, 4)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(F::average_pooling_2d(x.reshape({6, 4, 4}), 2), ShapeError);
  EXPECT_THROW(F::max_pooling_2d(x.astype(int32), 2), DtypeError);
  EXPECT_THROW(F::average_pooling_2d(x.astype(int64), 2), DtypeError);
  EXPECT_THROW(F::max_pooling_2d(x, 5, 1, 0, false), ShapeError);
  EXPECT_THROW(F::average_pooling_2d(x, 5), ShapeError);
  EXPECT_THROW(F::max_pooling_2d(x, 2, 0), ValueError);
  EXPECT_THROW(F::average_pooling_2d(x, 0), ValueError);
  EXPECT_THROW(F::max_pooling_2d(x, 2, 2, -1), ValueError);
}

TEST_P(PoolingTest, BackwardRoutineChecksShapes) {
  Pool2dParams p;  // 2x2 windows, stride 2
  const Array x = Array::zeros({1, 2, 4, 4}, float32, device());
  const Array y = Array::zeros({1, 2, 2, 2}, float32, device());
  EXPECT_NO_THROW(kusari::pool2d_backward(x, y, y, p));
  const Array wrong = Array::zeros({1, 2, 3, 3}, float32, device());
  EXPECT_THROW(kusari::pool2d_backward(x, wrong, wrong, p), ShapeError);
  EXPECT_THROW(kusari::pool2d_backward(x, y, wrong, p), ShapeError);
  EXPECT_THROW(kusari::pool2d_backward(x, y, y.astype(float64), p), DtypeError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(PoolingTest);

}  // namespace
}  // namespace kusari
