// Chainer's functions written with other differentiable functions (Note [Composed Chainer
// functions]): selu, hard_sigmoid, crelu, maxout, huber_loss, sigmoid_focal_loss,
// group_normalization, local_response_normalization, unpooling_2d, resize_images, and the boxes of
// detection (bbox_iou, bbox_to_loc, loc_to_bbox, roi_average_align_2d, roi_average_pooling_2d,
// roi_max_align_2d, roi_max_pooling_2d, roi_pooling_2d; and non_maximum_suppression, not
// differentiable). Gradient checks on every device, values against formulas computed here element
// by element, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "function_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::ArraysClose;

class ComposedFunctionsTest : public testing::FunctionTest {
 protected:
  Array vec(const std::vector<double>& v, const Shape& s, Dtype d = float64) {
    return Array::from_vector(v, s, device()).astype(d);
  }
};

TEST_P(ComposedFunctionsTest, ActivationsMatchTheirFormulas) {
  const std::vector<double> xs = {-3.0, -1.0, -0.2, 0.3, 1.0, 2.7};
  std::vector<double> selu, hs;
  const double a = 1.6732632423543772, s = 1.0507009873554805;
  for (double x : xs) {
    selu.push_back(s * (x >= 0 ? x : a * (std::exp(x) - 1)));
    hs.push_back(std::min(1.0, std::max(0.0, 0.2 * x + 0.5)));
  }
  const Array x = vec(xs, {6});
  EXPECT_TRUE(ArraysClose(F::selu(Variable(x)).data(), vec(selu, {6}), 1e-12));
  EXPECT_TRUE(ArraysClose(F::hard_sigmoid(Variable(x)).data(), vec(hs, {6}), 1e-12));
  // crelu: (2, 3) -> (2, 6) along axis 1, the positive parts first.
  const Array x23 = vec({1, -2, 3, -4, 5, -6}, {2, 3});
  EXPECT_TRUE(ArraysClose(F::crelu(Variable(x23)).data(), vec({1, 0, 3, 0, 2, 0, 0, 5, 0, 4, 0, 6}, {2, 6}), 0));
  EXPECT_EQ(F::crelu(Variable(x23), 0).shape(), (Shape{4, 3}));
  // maxout over pairs of axis 1: (2, 4) -> (2, 2).
  const Array x24 = vec({1, 5, -2, -3, 0, 0.5, 7, 2}, {2, 4});
  EXPECT_TRUE(ArraysClose(F::maxout(Variable(x24), 2).data(), vec({5, -2, 0.5, 7}, {2, 2}), 0));
  EXPECT_TRUE(ArraysClose(F::maxout(Variable(x24), 4).data(), vec({5, 7}, {2, 1}), 0));
  EXPECT_THROW(F::maxout(Variable(x24), 3), ValueError);
  EXPECT_THROW(F::crelu(Variable(x24), 2), ValueError);
}

TEST_P(ComposedFunctionsTest, ActivationGradients) {
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([](const Variable& v) { return F::selu(v); }, away_from_zero({3, 4}, d, 0.1, 2));
    check([](const Variable& v) { return F::hard_sigmoid(v); }, uniform({3, 4}, d, -2, 2), false);
    check([](const Variable& v) { return F::crelu(v); }, away_from_zero({2, 3, 2}, d));
    // Distinct values, so the maximum of each group is unique (the gradient is defined).
    Array x = Array::arange(24, float64, device()).reshape({2, 6, 2});
    x = (kusari::sin(x) * 3.0).astype(d);
    check([](const Variable& v) { return F::maxout(v, 3); }, x, false);
  }
}

TEST_P(ComposedFunctionsTest, HuberLossIsQuadraticInsideAndLinearOutside) {
  // d = x - t = (0.5, -2, 3, -0.25); delta 1.
  const Array x = vec({1.5, 0, 3, 0.75}, {2, 2});
  const Array t = vec({1, 2, 0, 1}, {2, 2});
  const Array none = F::huber_loss(Variable(x), Variable(t), 1.0, F::HuberReduce::kNone).data();
  EXPECT_TRUE(ArraysClose(none, vec({0.125, 1.5, 2.5, 0.03125}, {2, 2}), 1e-12));
  const Array per_sample = F::huber_loss(Variable(x), Variable(t), 1.0).data();
  EXPECT_TRUE(ArraysClose(per_sample, vec({1.625, 2.53125}, {2}), 1e-12));
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    // |x - t| away from delta (the kink) and from 0.
    Array xs = away_from_zero({3, 4}, d, 0.1, 0.8);
    Array ts = kusari::add(xs, away_from_zero({3, 4}, d, 1.3, 2.5));
    ts = kusari::where(kusari::less(uniform({3, 4}, d, 0, 1), 0.5), ts, kusari::add(xs, uniform({3, 4}, d, -0.8, 0.8)));
    check(
        [](const std::vector<Variable>& v) { return std::vector<Variable>{F::huber_loss(v[0], v[1], 1.0)}; },
        {xs, ts});
  }
  EXPECT_THROW(F::huber_loss(Variable(x), Variable(t), 0.0), ValueError);
  EXPECT_THROW(F::huber_loss(Variable(x), Variable(vec({1, 2}, {2})), 1.0), ValueError);
}

TEST_P(ComposedFunctionsTest, SigmoidFocalLossMatchesTorchvisionsFormula) {
  const std::vector<double> xs = {-2.0, -0.5, 0.0, 0.7, 3.0, -40.0}, ts = {0, 1, 1, 0, 1, 1};
  std::vector<double> want;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double p = 1 / (1 + std::exp(-xs[i])), t = ts[i];
    const double ce = -(t * std::log(p) + (1 - t) * std::log1p(-p));
    const double pt = p * t + (1 - p) * (1 - t);
    want.push_back((0.25 * t + 0.75 * (1 - t)) * ce * (1 - pt) * (1 - pt));
  }
  // (the last logit, -40 with target 1, is where a naive log(sigmoid) would lose digits: ce = 40)
  want.back() = 0.25 * 40.0 * std::pow(1 - 1 / (1 + std::exp(40.0)), 2);
  const Array x = vec(xs, {6}), t = vec(ts, {6});
  EXPECT_TRUE(ArraysClose(F::sigmoid_focal_loss(Variable(x), t).data(), vec(want, {6}), 1e-9));
  double m = 0;
  for (double w : want) m += w / 6;
  EXPECT_NEAR(F::sigmoid_focal_loss(Variable(x), t, 0.25, 2.0, F::Reduce::kMean).data().item<double>(), m, 1e-9);
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    Array targets = kusari::less(uniform({3, 4}, d, 0, 1), 0.5).astype(d);
    check([targets](const Variable& v) { return F::sigmoid_focal_loss(v, targets); }, uniform({3, 4}, d, -3, 3));
    check([targets](const Variable& v) { return F::sigmoid_focal_loss(v, targets, -1, 1.5); },
          uniform({3, 4}, d, -3, 3), false);
  }
  EXPECT_THROW(F::sigmoid_focal_loss(Variable(x), vec({1, 0}, {2})), ValueError);
  EXPECT_THROW(F::sigmoid_focal_loss(Variable(x), t, 0.25, -1.0), ValueError);
}

TEST_P(ComposedFunctionsTest, GroupNormalizationNormalizesEachGroup) {
  Array x = uniform({2, 6, 3, 2}, float64, -2, 5);
  Array gamma = uniform({6}, float64, 0.5, 1.5), beta = uniform({6}, float64, -1, 1);
  const Array y = F::group_normalization(Variable(x), 3, Variable(gamma), Variable(beta)).data();
  // Element by element: group g of sample n holds channels 2g, 2g + 1.
  std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>(), gv = gamma.to_vector<double>(),
                      bv = beta.to_vector<double>();
  for (int n = 0; n < 2; ++n) {
    for (int g = 0; g < 3; ++g) {
      const int begin = (n * 6 + 2 * g) * 6, count = 12;
      double mu = 0, var = 0;
      for (int i = 0; i < count; ++i) mu += xv[begin + i] / count;
      for (int i = 0; i < count; ++i) var += (xv[begin + i] - mu) * (xv[begin + i] - mu) / count;
      for (int i = 0; i < count; ++i) {
        const int ch = 2 * g + i / 6;
        EXPECT_NEAR(yv[begin + i], (xv[begin + i] - mu) / std::sqrt(var + 1e-5) * gv[ch] + bv[ch], 1e-10);
      }
    }
  }
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check(
        [](const std::vector<Variable>& v) {
          return std::vector<Variable>{F::group_normalization(v[0], 2, v[1], v[2])};
        },
        {uniform({2, 4, 3}, d, -1, 2), uniform({4}, d, 0.5, 1.5), uniform({4}, d, -1, 1)}, false);
  }
  const Array h = F::group_normalization(Variable(x.astype(bfloat16)), 3, Variable(gamma.astype(float32)),
                                         Variable(beta.astype(float32)))
                      .data();
  EXPECT_EQ(h.dtype(), Dtype::kBFloat16);
  EXPECT_TRUE(ArraysClose(h.astype(float64), y, 3e-2, 3e-2));
  EXPECT_THROW(F::group_normalization(Variable(x), 4, Variable(gamma), Variable(beta)), ValueError);
  EXPECT_THROW(F::group_normalization(Variable(x), 3, Variable(beta.reshape({2, 3})), Variable(beta)), ValueError);
}

TEST_P(ComposedFunctionsTest, LocalResponseNormalizationSumsAWindowOfChannels) {
  Array x = uniform({2, 5, 2, 3}, float64, -2, 2);
  const double k = 2, alpha = 0.3, beta = 0.75;
  const int n = 3;  // channels c - 1 .. c + 1
  const Array y = F::local_response_normalization(Variable(x), n, k, alpha, beta).data();
  std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>();
  for (int b = 0; b < 2; ++b) {
    for (int c = 0; c < 5; ++c) {
      for (int p = 0; p < 6; ++p) {
        double s = 0;
        for (int cc = std::max(0, c - 1); cc <= std::min(4, c + 1); ++cc) {
          const double v = xv[(b * 5 + cc) * 6 + p];
          s += v * v;
        }
        const int i = (b * 5 + c) * 6 + p;
        EXPECT_NEAR(yv[i], xv[i] / std::pow(k + alpha * s, beta), 1e-12);
      }
    }
  }
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([](const Variable& v) { return F::local_response_normalization(v, 5, 2.0, 0.1, 0.75); },
          uniform({2, 6, 2, 2}, d, -2, 2), false);
  }
  EXPECT_THROW(F::local_response_normalization(Variable(x), 0), ValueError);
}

TEST_P(ComposedFunctionsTest, UnpoolingCopiesEachPixelIntoItsWindow) {
  const Array x = vec({1, 2, 3, 4}, {1, 1, 2, 2});
  // ksize 2 = stride, cover_all false: each pixel becomes a 2x2 block.
  const Array y = F::unpooling_2d(Variable(x), 2, std::nullopt, 0, std::nullopt, false).data();
  EXPECT_TRUE(ArraysClose(y, vec({1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}, {1, 1, 4, 4}), 0));
  // cover_all (Chainer's default) gives s (h - 1) + k - s + 1 = 3 rows and columns.
  // the last windows cut off, as Chainer's col2im drops what falls outside.
  EXPECT_TRUE(ArraysClose(F::unpooling_2d(Variable(x), 2).data(), vec({1, 1, 2, 1, 1, 2, 3, 3, 4}, {1, 1, 3, 3}), 0));
  // Overlapping windows (ksize 3, stride 2) add up where they meet.
  const Array o = F::unpooling_2d(Variable(x), 3, 2, 0, std::nullopt, false).data();
  EXPECT_EQ(o.shape(), (Shape{1, 1, 5, 5}));
  EXPECT_TRUE(ArraysClose(o, vec({1, 1, 3, 2, 2, 1, 1, 3, 2, 2, 4, 4, 10, 6, 6, 3, 3, 7, 4, 4, 3, 3, 7, 4, 4},
                                 {1, 1, 5, 5}),
                          0));
  EXPECT_EQ(F::unpooling_2d(Variable(x), 2, std::nullopt, 0, F::IntPair{5, 5}).shape(), (Shape{1, 1, 5, 5}));
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([](const Variable& v) { return F::unpooling_2d(v, 2, std::nullopt, 0, std::nullopt, false); },
          uniform({2, 3, 2, 3}, d));
    check([](const Variable& v) { return F::unpooling_2d(v, 3, 2, 1); }, uniform({1, 2, 3, 3}, d));
  }
  EXPECT_THROW(F::unpooling_2d(Variable(x.reshape({2, 2})), 2), ShapeError);
  EXPECT_THROW(F::unpooling_2d(Variable(x), 0), ValueError);
  EXPECT_THROW(F::unpooling_2d(Variable(x), 2, std::nullopt, 0, F::IntPair{6, 6}), ValueError);
}

TEST_P(ComposedFunctionsTest, ResizeImagesInterpolatesBilinearly) {
  // A 2x2 image to 3x3 with aligned corners: the centre is the mean, the edges' middles the means
  // of their ends.
  const Array x = vec({0, 2, 4, 6}, {1, 1, 2, 2});
  EXPECT_TRUE(ArraysClose(F::resize_images(Variable(x), {3, 3}).data(), vec({0, 1, 2, 2, 3, 4, 4, 5, 6}, {1, 1, 3, 3}),
                          1e-12));
  // Without aligned corners, 2 -> 4: centres at -0.25, 0.25, 0.75, 1.25, clamped to [0, 1].
  const Array row = vec({0, 4}, {1, 1, 1, 2});
  EXPECT_TRUE(ArraysClose(F::resize_images(Variable(row), {1, 4}, false).data(), vec({0, 1, 3, 4}, {1, 1, 1, 4}),
                          1e-12));
  // Element by element against the formula, shrinking and growing, on several channels.
  Array img = uniform({2, 3, 5, 4}, float64);
  const Array y = F::resize_images(Variable(img), {3, 7}).data();
  const std::vector<double> iv = img.to_vector<double>(), yv = y.to_vector<double>();
  for (int nc = 0; nc < 6; ++nc) {
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 7; ++j) {
        const double u = i * 4.0 / 2.0, v = j * 3.0 / 6.0;
        const int u0 = std::min(static_cast<int>(u), 3), v0 = std::min(static_cast<int>(v), 2);
        const double du = u - u0, dv = v - v0;
        auto at = [&](int a, int b) { return iv[nc * 20 + a * 4 + b]; };
        const double want = (1 - du) * ((1 - dv) * at(u0, v0) + dv * at(u0, v0 + 1)) +
                            du * ((1 - dv) * at(u0 + 1, v0) + dv * at(u0 + 1, v0 + 1));
        EXPECT_NEAR(yv[nc * 21 + i * 7 + j], want, 1e-12) << nc << " " << i << " " << j;
      }
    }
  }
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([](const Variable& v) { return F::resize_images(v, {5, 3}); }, uniform({1, 2, 3, 4}, d));
    check([](const Variable& v) { return F::resize_images(v, {2, 6}, false); }, uniform({2, 1, 4, 3}, d));
  }
  EXPECT_THROW(F::resize_images(Variable(x.reshape({2, 2})), {3, 3}), ShapeError);
  EXPECT_THROW(F::resize_images(Variable(x), {0, 3}), ValueError);
}

TEST_P(ComposedFunctionsTest, TakeGathersAndAddsBack) {
  const Array x = vec({0, 1, 2, 3, 4, 5}, {2, 3});
  const Array idx = Array::from_vector(std::vector<int64_t>{2, 0, 2, -1}, std::nullopt, device());
  Variable vx(x, true);
  Variable y = F::take(vx, idx, 1);
  EXPECT_TRUE(ArraysClose(y.data(), vec({2, 0, 2, 2, 5, 3, 5, 5}, {2, 4}), 0));
  F::sum(y).backward();
  // Index 2 is taken three times (-1 is 2), 0 once, 1 never.
  EXPECT_TRUE(ArraysClose(vx.grad(), vec({1, 0, 3, 1, 0, 3}, {2, 3}), 0));
  const Array rows = Array::from_vector(std::vector<int32_t>{1, 1, 0}, Shape{3, 1}, device());
  EXPECT_EQ(F::take(Variable(x), rows, 0).shape(), (Shape{3, 1, 3}));
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([idx](const Variable& v) { return F::take(v, idx, 1); }, uniform({2, 3}, d));
    check([rows](const Variable& v) { return F::take(v, rows, -2); }, uniform({2, 4}, d));
  }
  EXPECT_THROW(F::take(Variable(x), idx.astype(float32), 1), DtypeError);
  EXPECT_THROW(F::take(Variable(x), idx, 2), ShapeError);
}

// Chainer's spatial_transformer_sampler element by element (Note [Spatial transformer]), for the
// tests: x (B, C, H, W) and grid (B, 2, Ho, Wo) as flat float64 vectors.
std::vector<double> sample_bilinear(const std::vector<double>& x, const std::vector<double>& grid, int64_t b,
                                    int64_t c, int64_t h, int64_t w, int64_t ho, int64_t wo) {
  std::vector<double> y(static_cast<size_t>(b * c * ho * wo));
  for (int64_t n = 0; n < b; ++n) {
    for (int64_t i = 0; i < ho; ++i) {
      for (int64_t j = 0; j < wo; ++j) {
        const double gu = grid[static_cast<size_t>(((n * 2 + 0) * ho + i) * wo + j)];
        const double gv = grid[static_cast<size_t>(((n * 2 + 1) * ho + i) * wo + j)];
        const double u = std::clamp((gu + 1) * (w - 1) / 2.0 + 1, 0.0, w + 1.0);
        const double v = std::clamp((gv + 1) * (h - 1) / 2.0 + 1, 0.0, h + 1.0);
        const int64_t u0 = std::min<int64_t>(static_cast<int64_t>(std::floor(u)), w), v0 =
            std::min<int64_t>(static_cast<int64_t>(std::floor(v)), h);
        for (int64_t ch = 0; ch < c; ++ch) {
          // The padded image: row r, column q of the padding are 0.
          const auto at = [&](int64_t r, int64_t q) {
            if (r < 1 || r > h || q < 1 || q > w) return 0.0;
            return x[static_cast<size_t>(((n * c + ch) * h + (r - 1)) * w + (q - 1))];
          };
          const double value = (u0 + 1 - u) * (v0 + 1 - v) * at(v0, u0) + (u - u0) * (v0 + 1 - v) * at(v0, u0 + 1) +
                               (u0 + 1 - u) * (v - v0) * at(v0 + 1, u0) + (u - u0) * (v - v0) * at(v0 + 1, u0 + 1);
          y[static_cast<size_t>(((n * c + ch) * ho + i) * wo + j)] = value;
        }
      }
    }
  }
  return y;
}

TEST_P(ComposedFunctionsTest, SpatialTransformerSamplesAnAffineGrid) {
  // The identity transform: the grid is the target coordinates, and sampling it returns x.
  const Array identity = vec({1, 0, 0, 0, 1, 0}, {1, 2, 3});
  const Array grid = F::spatial_transformer_grid(Variable(identity), {2, 3}).data();
  EXPECT_TRUE(ArraysClose(grid, vec({-1, 0, 1, -1, 0, 1, -1, -1, -1, 1, 1, 1}, {1, 2, 2, 3}), 1e-12));
  const Array img = uniform({1, 2, 2, 3}, float64);
  EXPECT_TRUE(ArraysClose(F::spatial_transformer_sampler(Variable(img), Variable(grid)).data(), img, 1e-12));
  // Random affine maps (some points outside the image, which fade to zero) against the formula.
  const Array theta = uniform({2, 2, 3}, float64, -1.2, 1.2);
  const Array g = F::spatial_transformer_grid(Variable(theta), {4, 5}).data();
  const std::vector<double> tv = theta.to_vector<double>(), gv = g.to_vector<double>();
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < 5; ++j) {
        const double xt = -1 + 2.0 * j / 4, yt = -1 + 2.0 * i / 3;
        for (int64_t r = 0; r < 2; ++r) {
          const double* t = tv.data() + (n * 2 + r) * 3;
          EXPECT_NEAR(gv[static_cast<size_t>(((n * 2 + r) * 4 + i) * 5 + j)], t[0] * xt + t[1] * yt + t[2], 1e-12);
        }
      }
    }
  }
  const Array x = uniform({2, 3, 6, 7}, float64);
  const Array y = F::spatial_transformer_sampler(Variable(x), Variable(g)).data();
  EXPECT_EQ(y.shape(), (Shape{2, 3, 4, 5}));
  EXPECT_TRUE(ArraysClose(y, vec(sample_bilinear(x.to_vector<double>(), gv, 2, 3, 6, 7, 4, 5), {2, 3, 4, 5}), 1e-12));
  // Gradients with respect to theta, x and the grid (coordinates away from whole pixels, where the
  // bilinear weights have kinks).
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([](const Variable& t) { return F::spatial_transformer_grid(t, {3, 4}); }, uniform({2, 2, 3}, d));
    const VariadicFunction sampler = [](const std::vector<Variable>& v) {
      return std::vector<Variable>{F::spatial_transformer_sampler(v[0], v[1])};
    };
    // Over a 4 x 5 image, grid points 0.3 or 0.7 of a pixel from whole ones (in the padded
    // image's pixels: u = (g + 1) (W - 1) / 2 + 1), some in the border that fades to zero.
    std::vector<double> pts;
    for (int n = 0; n < 2; ++n) {
      for (int ch = 0; ch < 2; ++ch) {
        const int size = ch == 0 ? 5 : 4;
        for (int i = 0; i < 3; ++i) {
          for (int j = 0; j < 3; ++j) {
            const double pixel = 1 + (ch == 0 ? (n + i + 2 * j) % 5 : (n + 2 * i + j) % 4) + ((i + j + n) % 2 ? 0.7 : 0.3);
            pts.push_back((pixel - 1) * 2.0 / (size - 1) - 1);
          }
        }
      }
    }
    check(sampler, {uniform({2, 2, 4, 5}, d), vec(pts, {2, 2, 3, 3}, d)});
  }
  EXPECT_THROW(F::spatial_transformer_grid(Variable(identity.reshape({2, 3})), {2, 2}), ShapeError);
  EXPECT_THROW(F::spatial_transformer_grid(Variable(identity), {0, 2}), ShapeError);
  EXPECT_THROW(F::spatial_transformer_sampler(Variable(x), Variable(uniform({3, 2, 4, 5}, float64))), ShapeError);
  EXPECT_THROW(F::spatial_transformer_sampler(Variable(x), Variable(g.astype(float32))), DtypeError);
}

// -log of the probability that `steps` steps of class probabilities p[t][k] emit a path that
// collapses (repeats merged, blanks removed) to `labels`, by enumerating every path.
double ctc_by_enumeration(const std::vector<std::vector<double>>& p, const std::vector<int64_t>& labels, int64_t blank) {
  const size_t steps = p.size(), classes = p.empty() ? 0 : p[0].size();
  size_t paths = 1;
  for (size_t i = 0; i < steps; ++i) paths *= classes;
  double total = 0.0;
  for (size_t code = 0; code < paths; ++code) {
    std::vector<int64_t> collapsed;
    double prob = 1.0;
    int64_t previous = -1;
    size_t rest = code;
    for (size_t i = 0; i < steps; ++i) {
      const int64_t k = static_cast<int64_t>(rest % classes);
      rest /= classes;
      prob *= p[i][static_cast<size_t>(k)];
      if (k != blank && k != previous) collapsed.push_back(k);
      previous = k;
    }
    if (collapsed == labels) total += prob;
  }
  return -std::log(total);
}

TEST_P(ComposedFunctionsTest, CtcSumsEveryAlignment) {
  const int64_t batch = 3, steps = 4, classes = 3, blank = 2;
  std::vector<Array> xs;
  std::vector<Variable> vs;
  for (int64_t i = 0; i < steps; ++i) {
    xs.push_back(uniform({batch, classes}, float64, -2, 2));
    vs.emplace_back(xs.back());
  }
  // Labels (0, 1), (1, 1) (a blank must separate the repeat) and (0); the last sample has 3 steps.
  const Array t = Array::from_vector(std::vector<int32_t>{0, 1, 1, 1, 0, 0}, Shape{batch, 2}, device());
  const Array in_len = Array::from_vector(std::vector<int64_t>{4, 4, 3}, std::nullopt, device());
  const Array lab_len = Array::from_vector(std::vector<int64_t>{2, 2, 1}, std::nullopt, device());
  const std::vector<std::vector<int64_t>> labels{{0, 1}, {1, 1}, {0}};
  const Array losses =
      F::connectionist_temporal_classification(vs, t, blank, in_len, lab_len, F::Reduce::kNone).data();
  ASSERT_EQ(losses.shape(), (Shape{batch}));
  const std::vector<double> got = losses.to_vector<double>();
  double mean = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<std::vector<double>> p;
    for (int64_t i = 0; i < (b == 2 ? 3 : steps); ++i) {
      const std::vector<double> row = xs[static_cast<size_t>(i)].to_vector<double>();
      std::vector<double> q(classes);
      double z = 0.0;
      for (int64_t k = 0; k < classes; ++k) z += std::exp(row[static_cast<size_t>(b * classes + k)]);
      for (int64_t k = 0; k < classes; ++k) q[static_cast<size_t>(k)] = std::exp(row[static_cast<size_t>(b * classes + k)]) / z;
      p.push_back(q);
    }
    const double want = ctc_by_enumeration(p, labels[static_cast<size_t>(b)], blank);
    EXPECT_NEAR(got[static_cast<size_t>(b)], want, 1e-10) << "sample " << b;
    mean += want / batch;
  }
  EXPECT_NEAR(F::connectionist_temporal_classification(vs, t, blank, in_len, lab_len).data().item<double>(), mean,
              1e-10);
  // Without lengths: every step and every label.
  const Array all = F::connectionist_temporal_classification(vs, t, blank, Array(), Array(), F::Reduce::kNone).data();
  EXPECT_NEAR(all.to_vector<double>()[0], got[0], 1e-12);
  // Too few steps for (1, 1): about 1e30.
  const Array two = Array::from_vector(std::vector<int64_t>{2, 2, 2}, std::nullopt, device());
  EXPECT_GT(F::connectionist_temporal_classification(vs, t, blank, two, lab_len, F::Reduce::kNone)
                .data()
                .to_vector<double>()[1],
            1e29);
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    const VariadicFunction f = [t, in_len, lab_len](const std::vector<Variable>& v) {
      return std::vector<Variable>{F::connectionist_temporal_classification(v, t, 2, in_len, lab_len)};
    };
    std::vector<Array> inputs;
    for (int64_t i = 0; i < steps; ++i) inputs.push_back(uniform({batch, classes}, d));
    check(f, inputs);
  }
  EXPECT_THROW(F::connectionist_temporal_classification(vs, t, 3), ValueError);
  EXPECT_THROW(F::connectionist_temporal_classification(vs, t.astype(float32), blank), DtypeError);
  EXPECT_THROW(F::connectionist_temporal_classification({}, t, blank), ValueError);
  if (device().is_cpu()) {
    EXPECT_THROW(F::connectionist_temporal_classification(vs, t, 0), IndexError);  // label 0 is the blank
    EXPECT_THROW(F::connectionist_temporal_classification(vs, t, blank, Array::full({batch}, 5, int64, device())),
                 ValueError);
  }
}

TEST_P(ComposedFunctionsTest, BoxesOverlapsAndOffsets) {
  // (y_min, x_min, y_max, x_max): a 2x2 box, one sharing a 1x1 corner with it, one far away.
  const Array a = vec({0, 0, 2, 2, 10, 10, 11, 12}, {2, 4});
  const Array b = vec({1, 1, 3, 3, 0, 0, 2, 2, 5, 5, 6, 6}, {3, 4});
  EXPECT_TRUE(ArraysClose(F::bbox_iou(Variable(a), Variable(b)).data(), vec({1.0 / 7, 1, 0, 0, 0, 0}, {2, 3}), 1e-12));
  // Offsets and back: loc_to_bbox(src, bbox_to_loc(src, dst)) == dst; a box onto itself is 0.
  const Array src = vec({0, 0, 2, 4, 1, 1, 5, 3}, {2, 4}), dst = vec({1, 0, 3, 8, 0, 2, 2, 3}, {2, 4});
  const Array loc = F::bbox_to_loc(Variable(src), Variable(dst)).data();
  // First pair: centres (1, 2) -> (2, 4), sizes (2, 4) -> (2, 8).
  EXPECT_TRUE(ArraysClose(loc.at({0}), vec({0.5, 0.5, 0, std::log(2.0)}, {4}), 1e-12));
  EXPECT_TRUE(ArraysClose(F::loc_to_bbox(Variable(src), Variable(loc)).data(), dst, 1e-12));
  EXPECT_TRUE(ArraysClose(F::bbox_to_loc(Variable(src), Variable(src)).data(), Array::zeros({2, 4}, float64, device()),
                          0, 1e-15));
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    const Array s = vec({0, 0, 2, 4, 1, 1, 5, 3}, {2, 4}, d);
    check([s](const Variable& l) { return F::loc_to_bbox(Variable(s), l); }, uniform({2, 4}, d, -0.5, 0.5));
    // Overlapping boxes with no tie between their corners (the maximum and minimum have a gradient).
    const Array boxes = vec({0, 0, 2, 3, 1.1, 0.4, 2.7, 2.5}, {2, 4}, d);
    const Array others = vec({0.5, 0.2, 2.4, 2.6, -0.3, 1.3, 1.6, 3.3, 0.7, 0.9, 1.9, 2.2}, {3, 4}, d);
    check([others](const Variable& v) { return F::bbox_iou(v, Variable(others)); }, boxes, false);
  }
  EXPECT_THROW(F::bbox_iou(Variable(a.reshape({4, 2})), Variable(b)), ShapeError);
  EXPECT_THROW(F::bbox_to_loc(Variable(src), Variable(b)), ValueError);
}

// Chainer's bilinear sample of a plane at (y, x), a point already known to be in bounds (y in
// [-1, h], x in [-1, w]): a coordinate below 0 counts as 0, one past the last pixel as the last.
double bilinear_sample(const double* plane, int64_t h, int64_t w, double y, double x) {
  const auto bounds = [](double& v, int64_t size, int64_t& lo, int64_t& hi) {
    if (v <= 0) v = 0;
    lo = static_cast<int64_t>(v);
    if (lo >= size - 1) {
      lo = hi = size - 1;
      v = static_cast<double>(lo);
    } else {
      hi = lo + 1;
    }
  };
  int64_t yl, yh, xl, xh;
  bounds(y, h, yl, yh);
  bounds(x, w, xl, xh);
  const double ly = y - yl, lx = x - xl, hy = 1 - ly, hx = 1 - lx;
  return hy * hx * plane[yl * w + xl] + hy * lx * plane[yl * w + xh] +
         ly * hx * plane[yh * w + xl] + ly * lx * plane[yh * w + xh];
}

// Chainer's roi_average_align_2d, sample by sample (the loops of its kernel), for one RoI.
std::vector<double> roi_align_reference(const std::vector<double>& x, int64_t c, int64_t h, int64_t w, int64_t image,
                                        const double* box, int64_t oh, int64_t ow, double scale, int64_t ratio) {
  const double y0 = box[0] * scale, x0 = box[1] * scale;
  const double rh = std::max(box[2] * scale - y0, 1.0), rw = std::max(box[3] * scale - x0, 1.0);
  const double bh = rh / oh, bw = rw / ow;
  const int64_t gh = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rh / oh));
  const int64_t gw = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rw / ow));
  std::vector<double> out(static_cast<size_t>(c * oh * ow), 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    const double* plane = x.data() + (image * c + ch) * h * w;
    for (int64_t ph = 0; ph < oh; ++ph) {
      for (int64_t pw = 0; pw < ow; ++pw) {
        double sum = 0;
        for (int64_t iy = 0; iy < gh; ++iy) {
          for (int64_t ix = 0; ix < gw; ++ix) {
            const double y = y0 + ph * bh + (iy + 0.5) * bh / gh,
                         xx = x0 + pw * bw + (ix + 0.5) * bw / gw;
            if (y < -1.0 || y > h || xx < -1.0 || xx > w) continue;
            sum += bilinear_sample(plane, h, w, y, xx);
          }
        }
        out[static_cast<size_t>((ch * oh + ph) * ow + pw)] = sum / static_cast<double>(gh * gw);
      }
    }
  }
  return out;
}

TEST_P(ComposedFunctionsTest, RoiAlignMatchesChainersSampling) {
  const int64_t n = 2, c = 3, h = 7, w = 9;
  const Array x = uniform({n, c, h, w}, float64);
  const std::vector<double> xv = x.to_vector<double>();
  // Boxes inside, across the border, past it, smaller than a pixel and of both images, out of
  // image order (so that they run as several groups), at half scale.
  const std::vector<double> boxes = {1, 2, 9, 14,  -3, -2, 6, 5,   10, 12, 16, 20,  4, 4, 4.5, 4.2,
                                     0, 0, 14, 18, 6.5, 1, 13, 11, 2, 2, 3, 17};
  const std::vector<int32_t> images = {0, 0, 1, 0, 1, 1, 0};
  const Array rois = vec(boxes, {7, 4}, float32), idx = Array::from_vector(images, Shape{7}, device());
  for (int64_t ratio : {0, 2}) {
    const std::optional<int64_t> r = ratio > 0 ? std::optional<int64_t>(ratio) : std::nullopt;
    const Array y = F::roi_average_align_2d(Variable(x), rois, idx, {3, 4}, 0.5, r).data();
    ASSERT_EQ(y.shape(), (Shape{7, c, 3, 4}));
    const std::vector<double> yv = y.to_vector<double>();
    for (int64_t i = 0; i < 7; ++i) {
      const std::vector<double> want =
          roi_align_reference(xv, c, h, w, images[static_cast<size_t>(i)], boxes.data() + 4 * i, 3, 4, 0.5, ratio);
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_NEAR(yv[static_cast<size_t>(i) * want.size() + k], want[k], 1e-12) << "roi " << i << " element " << k;
      }
    }
  }
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([&](const Variable& v) { return F::roi_average_align_2d(v, rois, idx, {2, 3}, 0.5, 2); },
          uniform({n, c, h, w}, d));
  }
  EXPECT_THROW(F::roi_average_align_2d(Variable(x), rois.reshape({4, 7}), idx, {2, 2}, 1.0), ShapeError);
  EXPECT_THROW(F::roi_average_align_2d(Variable(x), rois, idx.astype(float32), {2, 2}, 1.0), ShapeError);
  EXPECT_THROW(F::roi_average_align_2d(Variable(x), rois, idx, {0, 2}, 1.0), ValueError);
  EXPECT_THROW(F::roi_average_align_2d(Variable(x), rois, idx, {2, 2}, 0.0), ValueError);
  EXPECT_THROW(F::roi_average_align_2d(Variable(x), rois, idx, {2, 2}, 1.0, 0), ValueError);
  try {
    F::roi_average_align_2d(Variable(x), rois, Array::from_vector(std::vector<int32_t>{0, 0, 2, 0, 1, 1, 0}, Shape{7},
                                                                   device()), {2, 2}, 1.0);
    FAIL() << "an image index past the batch was accepted";
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("roi_indices[2] is 2 but x holds 2 images"), std::string::npos) << e.what();
  }
}

TEST_P(ComposedFunctionsTest, RoiAveragePoolingMatchesFastRcnnsBins) {
  const int64_t n = 2, c = 2, h = 6, w = 8;
  const Array x = uniform({n, c, h, w}, float64);
  const std::vector<double> xv = x.to_vector<double>();
  // Inside, across the border, beyond it (empty bins), degenerate, at scale 0.5 (corners rounded).
  const std::vector<double> boxes = {1, 2, 9, 13, -4, -3, 5, 6, 14, 18, 20, 22, 3, 3, 3, 3, 0, 0, 12, 16};
  const std::vector<int32_t> images = {1, 0, 0, 1, 1};
  const Array rois = vec(boxes, {5, 4}, float32), idx = Array::from_vector(images, Shape{5}, device());
  const int64_t oh = 3, ow = 2;
  const Array y = F::roi_average_pooling_2d(Variable(x), rois, idx, {oh, ow}, 0.5).data();
  ASSERT_EQ(y.shape(), (Shape{5, c, oh, ow}));
  const std::vector<double> yv = y.to_vector<double>();
  for (int64_t r = 0; r < 5; ++r) {
    const double* b = boxes.data() + 4 * r;
    const int64_t y0 = std::lround(b[0] * 0.5), x0 = std::lround(b[1] * 0.5);
    const int64_t rh = std::max<int64_t>(std::lround(b[2] * 0.5) - y0, 1);
    const int64_t rw = std::max<int64_t>(std::lround(b[3] * 0.5) - x0, 1);
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t ph = 0; ph < oh; ++ph) {
        for (int64_t pw = 0; pw < ow; ++pw) {
          const double bh = static_cast<double>(rh) / oh, bw = static_cast<double>(rw) / ow;
          const int64_t hs = std::clamp<int64_t>(static_cast<int64_t>(std::floor(ph * bh)) + y0, 0, h);
          const int64_t he = std::clamp<int64_t>(static_cast<int64_t>(std::ceil((ph + 1) * bh)) + y0, 0, h);
          const int64_t ws = std::clamp<int64_t>(static_cast<int64_t>(std::floor(pw * bw)) + x0, 0, w);
          const int64_t we = std::clamp<int64_t>(static_cast<int64_t>(std::ceil((pw + 1) * bw)) + x0, 0, w);
          double sum = 0;
          for (int64_t i = hs; i < he; ++i) {
            for (int64_t j = ws; j < we; ++j) sum += xv[static_cast<size_t>(((images[r] * c + ch) * h + i) * w + j)];
          }
          const double want = he <= hs || we <= ws ? 0.0 : sum / static_cast<double>((he - hs) * (we - ws));
          EXPECT_NEAR(yv[static_cast<size_t>(((r * c + ch) * oh + ph) * ow + pw)], want, 1e-12)
              << "roi " << r << " channel " << ch << " bin " << ph << "," << pw;
        }
      }
    }
  }
  for (Dtype d : testing::grad_dtypes()) {
    SCOPED_TRACE(dtype_name(d));
    check([&](const Variable& v) { return F::roi_average_pooling_2d(v, rois, idx, {2, 3}, 0.5); },
          uniform({n, c, h, w}, d));
  }
  EXPECT_THROW(F::roi_average_pooling_2d(Variable(x), rois, idx, {2}, 1.0), ValueError);
  EXPECT_THROW(F::roi_average_pooling_2d(Variable(x.reshape({n * c, h, w})), rois, idx, {2, 2}, 1.0), ShapeError);
}

// Chainer's roi_max_align_2d, sample by sample, for one RoI: the first largest valid sample of
// each bin (0 for a bin with none).
std::vector<double> roi_max_align_reference(const std::vector<double>& x, int64_t c, int64_t h,
                                            int64_t w, int64_t image, const double* box, int64_t oh,
                                            int64_t ow, double scale, int64_t ratio) {
  const double y0 = box[0] * scale, x0 = box[1] * scale;
  const double rh = std::max(box[2] * scale - y0, 1.0), rw = std::max(box[3] * scale - x0, 1.0);
  const double bh = rh / oh, bw = rw / ow;
  const int64_t gh = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rh / oh));
  const int64_t gw = ratio > 0 ? ratio : static_cast<int64_t>(std::ceil(rw / ow));
  std::vector<double> out(static_cast<size_t>(c * oh * ow), 0.0);
  for (int64_t ch = 0; ch < c; ++ch) {
    const double* plane = x.data() + (image * c + ch) * h * w;
    for (int64_t ph = 0; ph < oh; ++ph) {
      for (int64_t pw = 0; pw < ow; ++pw) {
        std::optional<double> best;
        for (int64_t iy = 0; iy < gh; ++iy) {
          for (int64_t ix = 0; ix < gw; ++ix) {
            const double y = y0 + ph * bh + (iy + 0.5) * bh / gh,
                         xx = x0 + pw * bw + (ix + 0.5) * bw / gw;
            if (y < -1.0 || y > h || xx < -1.0 || xx > w) continue;
            const double v = bilinear_sample(plane, h, w, y, xx);
            if (!best || v > *best) best = v;
          }
        }
        out[static_cast<size_t>((ch * oh + ph) * ow + pw)] = best.value_or(0.0);
      }
    }
  }
  return out;
}

TEST_P(ComposedFunctionsTest, RoiMaxAlignMatchesChainersSampling) {
  const int64_t n = 2, c = 3, h = 7, w = 9;
  const Array x = uniform({n, c, h, w}, float64);
  const std::vector<double> xv = x.to_vector<double>();
  // Inside, across the border, entirely past it (bins without a valid sample), smaller than a
  // pixel, of both images and out of image order; adaptive grids of different sizes in one run.
  const std::vector<double> boxes = {1,   2,   9, 14, -3, -2, 6,   5, 30, 34, 40, 44, 4, 4,
                                     4.5, 4.2, 0, 0,  14, 18, 6.5, 1, 13, 11, 2,  2,  3, 17};
  const std::vector<int32_t> images = {0, 0, 1, 0, 1, 1, 0};
  const Array rois = vec(boxes, {7, 4}, float32),
              idx = Array::from_vector(images, Shape{7}, device());
  for (int64_t ratio : {0, 2}) {
    SCOPED_TRACE("sampling ratio " + std::to_string(ratio));
    const std::optional<int64_t> r = ratio > 0 ? std::optional<int64_t>(ratio) : std::nullopt;
    const Array y = F::roi_max_align_2d(Variable(x), rois, idx, {3, 4}, 0.5, r).data();
    ASSERT_EQ(y.shape(), (Shape{7, c, 3, 4}));
    const std::vector<double> yv = y.to_vector<double>();
    for (int64_t i = 0; i < 7; ++i) {
      const std::vector<double> want = roi_max_align_reference(
          xv, c, h, w, images[static_cast<size_t>(i)], boxes.data() + 4 * i, 3, 4, 0.5, ratio);
      for (size_t k = 0; k < want.size(); ++k) {
        EXPECT_NEAR(yv[static_cast<size_t>(i) * want.size() + k], want[k], 1e-12)
            << "roi " << i << " element " << k;
      }
    }
  }
  check(
      [&](const Variable& v) {
        return F::roi_max_align_2d(v, rois, idx, {2, 3}, 0.5, 2);
      },
      uniform({n, c, h, w}, float64));
  EXPECT_THROW(F::roi_max_align_2d(Variable(x), rois, idx, {2, 2}, 1.0, 0), ValueError);
  EXPECT_THROW(F::roi_max_align_2d(Variable(x), rois.reshape({4, 7}), idx, {2, 2}, 1.0),
               ShapeError);
}

// With every sample equal, each bin's gradient goes to one sample (its first), never to all ties.
TEST_P(ComposedFunctionsTest, RoiMaxFunctionsRouteTheGradientToOneSamplePerBin) {
  const Array rois = vec({0, 0, 6, 8, 1, 1, 5, 5}, {2, 4}, float32);
  const Array idx = Array::from_vector(std::vector<int32_t>{0, 0}, Shape{2}, device());
  for (int which = 0; which < 2; ++which) {
    Variable v(Array::full({1, 2, 6, 8}, 1.5, float64, device()), true);
    Variable y = which == 0 ? F::roi_max_pooling_2d(v, rois, idx, {2, 2}, 1.0)
                            : F::roi_max_align_2d(v, rois, idx, {2, 2}, 1.0, 2);
    EXPECT_TRUE(
        ArraysClose(y.data(), Array::full({2, 2, 2, 2}, 1.5, float64, device()), 1e-12, 1e-12));
    F::sum(y).backward();
    // 2 RoIs x 2 channels x 4 bins, one unit of gradient each (bilinear weights sum to 1).
    EXPECT_NEAR(kusari::sum(v.grad()).item<double>(), 16.0, 1e-12)
        << (which == 0 ? "pooling" : "align");
  }
}

// Fast R-CNN's max pooling over the integer bins of roi_average_pooling_2d; roi_pooling_2d is the
// same with (image, x_min, y_min, x_max, y_max) rows and both corner pixels counted.
TEST_P(ComposedFunctionsTest, RoiMaxPoolingMatchesFastRcnnsBins) {
  const int64_t n = 2, c = 2, h = 6, w = 8;
  const Array x = uniform({n, c, h, w}, float64);
  const std::vector<double> xv = x.to_vector<double>();
  const std::vector<double> boxes = {1,  2,  9, 13, -4, -3, 5, 6, 14, 18,
                                     20, 22, 3, 3,  3,  3,  0, 0, 12, 16};
  const std::vector<int32_t> images = {1, 0, 0, 1, 1};
  const Array rois = vec(boxes, {5, 4}, float32),
              idx = Array::from_vector(images, Shape{5}, device());
  std::vector<double> rows5;  // roi_pooling_2d's form of the same boxes
  for (int64_t r = 0; r < 5; ++r) {
    const double* b = boxes.data() + 4 * r;
    rows5.insert(rows5.end(), {static_cast<double>(images[r]), b[1], b[0], b[3], b[2]});
  }
  const int64_t oh = 3, ow = 2;
  for (int inclusive = 0; inclusive < 2; ++inclusive) {
    SCOPED_TRACE(inclusive ? "roi_pooling_2d" : "roi_max_pooling_2d");
    const Array y =
        inclusive ? F::roi_pooling_2d(Variable(x), vec(rows5, {5, 5}, float32), oh, ow, 0.5).data()
                  : F::roi_max_pooling_2d(Variable(x), rois, idx, {oh, ow}, 0.5).data();
    ASSERT_EQ(y.shape(), (Shape{5, c, oh, ow}));
    const std::vector<double> yv = y.to_vector<double>();
    for (int64_t r = 0; r < 5; ++r) {
      const double* b = boxes.data() + 4 * r;
      const int64_t y0 = std::lround(b[0] * 0.5), x0 = std::lround(b[1] * 0.5);
      const int64_t rh = std::max<int64_t>(std::lround(b[2] * 0.5) - y0 + inclusive, 1);
      const int64_t rw = std::max<int64_t>(std::lround(b[3] * 0.5) - x0 + inclusive, 1);
      for (int64_t ch = 0; ch < c; ++ch) {
        for (int64_t ph = 0; ph < oh; ++ph) {
          for (int64_t pw = 0; pw < ow; ++pw) {
            const double bh = static_cast<double>(rh) / oh, bw = static_cast<double>(rw) / ow;
            const int64_t hs =
                std::clamp<int64_t>(static_cast<int64_t>(std::floor(ph * bh)) + y0, 0, h);
            const int64_t he =
                std::clamp<int64_t>(static_cast<int64_t>(std::ceil((ph + 1) * bh)) + y0, 0, h);
            const int64_t ws =
                std::clamp<int64_t>(static_cast<int64_t>(std::floor(pw * bw)) + x0, 0, w);
            const int64_t we =
                std::clamp<int64_t>(static_cast<int64_t>(std::ceil((pw + 1) * bw)) + x0, 0, w);
            double best = -1e300;
            for (int64_t i = hs; i < he; ++i) {
              for (int64_t j = ws; j < we; ++j) {
                best =
                    std::max(best, xv[static_cast<size_t>(((images[r] * c + ch) * h + i) * w + j)]);
              }
            }
            const double want = he <= hs || we <= ws ? 0.0 : best;
            EXPECT_NEAR(yv[static_cast<size_t>(((r * c + ch) * oh + ph) * ow + pw)], want, 1e-12)
                << "roi " << r << " channel " << ch << " bin " << ph << "," << pw;
          }
        }
      }
    }
  }
  check(
      [&](const Variable& v) {
        return F::roi_max_pooling_2d(v, rois, idx, {2, 3}, 0.5);
      },
      uniform({n, c, h, w}, float64));
  EXPECT_THROW(F::roi_pooling_2d(Variable(x), rois, 2, 2, 1.0), ShapeError);
  EXPECT_THROW(F::roi_max_pooling_2d(Variable(x), rois, idx, {2}, 1.0), ValueError);
}

TEST_P(ComposedFunctionsTest, NonMaximumSuppressionKeepsTheBestOfEachCluster) {
  // Two clusters of overlapping boxes and a lone one; scores out of order.
  const Array boxes = vec({0, 0, 10, 10,  1, 1, 11, 11,  0, 0, 10, 9,  20, 20, 30, 30,  21, 20, 31, 30,  50, 50, 52, 52},
                          {6, 4}, float32);
  const Array score = vec({0.5, 0.9, 0.3, 0.6, 0.8, 0.1}, {6}, float32);
  const auto kept = [](const Array& a) { return a.astype(int64).to_vector<int64_t>(); };
  // IoU(0, 1) = 81 / 119 = 0.68, IoU(1, 2) = 72 / 118 = 0.61, IoU(3, 4) = 90 / 110 = 0.82.
  EXPECT_EQ(kept(F::non_maximum_suppression(boxes, 0.5, score)), (std::vector<int64_t>{1, 4, 5}));
  EXPECT_EQ(kept(F::non_maximum_suppression(boxes, 0.65, score)), (std::vector<int64_t>{1, 4, 2, 5}));
  EXPECT_EQ(kept(F::non_maximum_suppression(boxes, 0.5, score, 2)), (std::vector<int64_t>{1, 4}));
  // Without scores the given order decides; boxes of other classes never suppress each other.
  EXPECT_EQ(kept(F::non_maximum_suppression(boxes, 0.5)), (std::vector<int64_t>{0, 3, 5}));
  const Array label = Array::from_vector(std::vector<int32_t>{0, 1, 0, 2, 2, 0}, Shape{6}, device());
  EXPECT_EQ(kept(F::non_maximum_suppression(boxes, 0.5, score, std::nullopt, label)),
            (std::vector<int64_t>{1, 4, 0, 5}));
  const Array result = F::non_maximum_suppression(boxes, 0.5, score);
  EXPECT_EQ(result.dtype(), int32);
  EXPECT_EQ(result.device(), device());
  EXPECT_EQ(F::non_maximum_suppression(Array::zeros({0, 4}, float32, device()), 0.5).shape(), (Shape{0}));
  EXPECT_THROW(F::non_maximum_suppression(boxes.reshape({4, 6}), 0.5), ShapeError);
  EXPECT_THROW(F::non_maximum_suppression(boxes, 0.5, vec({1, 2}, {2})), ShapeError);
  EXPECT_THROW(F::non_maximum_suppression(boxes, 0.5, score, std::nullopt, label.astype(float32)), ShapeError);
  EXPECT_THROW(F::non_maximum_suppression(boxes, 0.5, score, -1), ValueError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(ComposedFunctionsTest);

}  // namespace
}  // namespace kusari
