// Convolution2D and Deconvolution2D: parameter names and shapes (groups, nobias, initializers),
// lazy input channels, forward equal to the functions, gradients on every parameter, npz round
// trips into lazy instances, to_device, and argument errors.
#include <gtest/gtest.h>

#include <cmath>

#include "link_test_util.h"

namespace kusari {
namespace {

namespace F = functions;
namespace L = links;
using testing::ArraysClose;

class ConvolutionLinkTest : public testing::DeviceTest {
 protected:
  Array input(const Shape& s) { return Array::uniform(s, -1, 1, float32, device(), &gen_); }
  Generator gen_{7};
};

using StrVec = std::vector<std::string>;

// --- Convolution2D
// --------------------------------------------------------------------------------

TEST_P(ConvolutionLinkTest, Convolution2DParameters) {
  L::Convolution2D conv(3, 8, {3, 2});
  EXPECT_EQ(testing::param_paths(conv), (StrVec{"/W", "/b"}));
  EXPECT_EQ(conv.W.shape(), (Shape{8, 3, 3, 2}));
  EXPECT_EQ(conv.b.shape(), (Shape{8}));
  EXPECT_EQ(conv.W.dtype(), float32);
  EXPECT_TRUE(ArraysClose(conv.b.data(), Array::zeros({8}), 0, 0));
  EXPECT_EQ(conv.ksize(), functions::IntPair(3, 2));
  EXPECT_EQ(conv.stride(), functions::IntPair(1));
  EXPECT_EQ(conv.pad(), functions::IntPair(0));

  // Groups divide W's second axis; nobias drops b.
  L::Convolution2D grouped(4, 6, 3, 1, 0, true, nullptr, nullptr, 1, 2);
  EXPECT_EQ(testing::param_paths(grouped), (StrVec{"/W"}));
  EXPECT_EQ(grouped.W.shape(), (Shape{6, 2, 3, 3}));
  EXPECT_FALSE(grouped.b.defined());

  // Given initializers (their dtype too).
  L::Convolution2D c2(2, 3, 1, 1, 0, false, std::make_shared<initializers::Constant>(0.5, float64),
                      std::make_shared<initializers::Constant>(-2.0, float64));
  EXPECT_EQ(c2.W.dtype(), float64);
  EXPECT_TRUE(ArraysClose(c2.W.data(), Array::full({3, 2, 1, 1}, 0.5, float64), 0, 0));
  EXPECT_TRUE(ArraysClose(c2.b.data(), Array::full({3}, -2.0, float64), 0, 0));

  // The default W is LeCunNormal: standard deviation sqrt(1 / fan_in), fan_in = 16 * 3 * 3.
  L::Convolution2D big(16, 64, 3);
  Array w = big.W.data().astype(float64);
  const double mean = kusari::mean(w).item<double>();
  const double stddev = std::sqrt(kusari::mean(kusari::square(w - mean)).item<double>());
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(stddev, std::sqrt(1.0 / 144.0), 0.1 * std::sqrt(1.0 / 144.0));
}

TEST_P(ConvolutionLinkTest, Convolution2DLazyInChannels) {
  for (bool short_form : {false, true}) {
    SCOPED_TRACE(short_form);
    auto conv = short_form ? std::make_shared<L::Convolution2D>(4, 3)
                           : std::make_shared<L::Convolution2D>(std::nullopt, 4, 3);
    conv->to_device(device());
    EXPECT_FALSE(conv->W.is_initialized());
    EXPECT_EQ(testing::param_paths(*conv), (StrVec{"/W", "/b"}));
    EXPECT_EQ(testing::param_paths(*conv, false), (StrVec{"/b"}));
    Variable y = (*conv)(input({2, 5, 6, 6}));
    ASSERT_TRUE(conv->W.is_initialized());
    EXPECT_EQ(conv->W.shape(), (Shape{4, 5, 3, 3}));
    EXPECT_EQ(conv->W.device(), device());
    EXPECT_EQ(y.shape(), (Shape{2, 4, 4, 4}));
  }
  // Groups apply to the inferred channels.
  L::Convolution2D grouped(std::nullopt, 4, 3, 1, 0, false, nullptr, nullptr, 1, 2);
  grouped.to_device(device());
  grouped(input({1, 6, 5, 5}));
  EXPECT_EQ(grouped.W.shape(), (Shape{4, 3, 3, 3}));
  L::Convolution2D bad_groups(std::nullopt, 4, 3, 1, 0, false, nullptr, nullptr, 1, 2);
  bad_groups.to_device(device());
  KUSARI_EXPECT_THROW_WITH(bad_groups(input({1, 5, 5, 5})), ValueError, "Convolution2D",
                           "in_channels (5)", "groups (2)");
  EXPECT_FALSE(bad_groups.W.is_initialized());
}

TEST_P(ConvolutionLinkTest, Convolution2DForwardIsTheFunction) {
  L::Convolution2D conv(4, 6, {3, 2}, {2, 1}, {1, 2}, false, nullptr, nullptr, {2, 1}, 2);
  conv.to_device(device());
  testing::randomize_params(conv, gen_);
  Array x = input({2, 4, 9, 7});
  Variable y = conv(x);
  Variable expected = F::convolution_2d(x, conv.W, conv.b, {2, 1}, {1, 2}, {2, 1}, 2);
  EXPECT_TRUE(ArraysClose(y.data(), expected.data(), 0, 0));
  L::Convolution2D nobias(4, 6, 3, 1, 1, true);
  nobias.to_device(device());
  EXPECT_TRUE(
      ArraysClose(nobias(x).data(), F::convolution_2d(x, nobias.W, Variable(), 1, 1).data(), 0, 0));
}

TEST_P(ConvolutionLinkTest, Convolution2DGradientsReachEveryParameter) {
  L::Convolution2D conv(std::nullopt, 5, 3, 1, 1);
  conv.to_device(device());
  Variable x(input({2, 3, 5, 5}), true);
  testing::backward_random_weighted(conv(x), gen_);
  testing::expect_grads_on_every_param(conv);
  EXPECT_TRUE(x.grad().defined());
  // cleargrads drops them.
  conv.cleargrads();
  EXPECT_FALSE(conv.W.grad().defined());
}

TEST_P(ConvolutionLinkTest, Convolution2DNpzRoundTripIntoLazyInstance) {
  L::Convolution2D conv(3, 4, 3, 1, 1);
  conv.to_device(device());
  testing::randomize_params(conv, gen_);
  const testing::TempFile file("conv.npz");
  const std::string& path = file.path;
  save_npz(path, conv);
  EXPECT_EQ(testing::npz_keys(path), (StrVec{"W", "b"}));

  L::Convolution2D fresh(std::nullopt, 4, 3, 1, 1);
  fresh.to_device(device());
  load_npz(path, fresh);
  ASSERT_TRUE(fresh.W.is_initialized());
  EXPECT_EQ(fresh.W.shape(), (Shape{4, 3, 3, 3}));
  EXPECT_EQ(fresh.W.dtype(), float32);
  EXPECT_EQ(fresh.W.device(), device());
  Array x = input({2, 3, 6, 6});
  EXPECT_TRUE(ArraysClose(fresh(x).data(), conv(x).data(), 0, 0));
}

TEST_P(ConvolutionLinkTest, Convolution2DToDevice) {
  L::Convolution2D conv(2, 3, 2);
  Array x = Array::uniform({1, 2, 4, 4}, -1, 1, float32, Device::cpu(), &gen_);
  Array before = conv(x).data();
  conv.to_device(Device::cpu());
  EXPECT_EQ(conv.device(), Device::cpu());
  EXPECT_TRUE(ArraysClose(conv(x).data(), before, 0, 0));
  conv.to_device(device());
  EXPECT_EQ(conv.W.device(), device());
  EXPECT_EQ(conv.b.device(), device());
  EXPECT_TRUE(ArraysClose(conv(x.to_device(device())).data(), before, 1e-6, 1e-6));
}

TEST_P(ConvolutionLinkTest, Convolution2DErrors) {
  using L::Convolution2D;
  KUSARI_EXPECT_THROW_WITH(Convolution2D(3, -1, 3), ValueError, "Convolution2D", "out_channels",
                           "-1");
  KUSARI_EXPECT_THROW_WITH(Convolution2D(0, 4, 3), ValueError, "Convolution2D", "in_channels");
  KUSARI_EXPECT_THROW_WITH(Convolution2D(3, 4, {3, 0}), ValueError, "ksize", "(3, 0)");
  EXPECT_THROW(Convolution2D(3, 4, 3, 0), ValueError);
  EXPECT_THROW(Convolution2D(3, 4, 3, 1, -1), ValueError);
  EXPECT_THROW(Convolution2D(3, 4, 3, 1, 0, false, nullptr, nullptr, 0), ValueError);
  EXPECT_THROW(Convolution2D(3, 4, 3, 1, 0, false, nullptr, nullptr, 1, 0), ValueError);
  KUSARI_EXPECT_THROW_WITH(Convolution2D(4, 3, 3, 1, 0, false, nullptr, nullptr, 1, 2), ValueError,
                           "out_channels (3)", "groups (2)");
  EXPECT_THROW(Convolution2D(3, 4, 3, 1, 0, false, nullptr, nullptr, 1, 2), ValueError);

  Convolution2D conv(3, 4, 3);
  conv.to_device(device());
  KUSARI_EXPECT_THROW_WITH(conv(input({3, 6, 6})), ShapeError, "Convolution2D", "4 axes",
                           "(3, 6, 6)");
  KUSARI_EXPECT_THROW_WITH(conv(input({1, 2, 6, 6})), ShapeError, "Convolution2D", "2 channels");
}

// --- Deconvolution2D
// ------------------------------------------------------------------------------

TEST_P(ConvolutionLinkTest, Deconvolution2DParameters) {
  L::Deconvolution2D deconv(3, 8, {3, 2});
  EXPECT_EQ(testing::param_paths(deconv), (StrVec{"/W", "/b"}));
  // W is (in_channels, out_channels / groups, kh, kw).
  EXPECT_EQ(deconv.W.shape(), (Shape{3, 8, 3, 2}));
  EXPECT_EQ(deconv.b.shape(), (Shape{8}));
  EXPECT_TRUE(ArraysClose(deconv.b.data(), Array::zeros({8}), 0, 0));
  L::Deconvolution2D grouped(4, 6, 3, 1, 0, true, std::nullopt, nullptr, nullptr, 1, 2);
  EXPECT_EQ(testing::param_paths(grouped), (StrVec{"/W"}));
  EXPECT_EQ(grouped.W.shape(), (Shape{4, 3, 3, 3}));
  // LeCunNormal with Chainer's fan_in for this layout: W.shape[1] * kh * kw = 32 * 9.
  L::Deconvolution2D big(64, 32, 3);
  Array w = big.W.data().astype(float64);
  const double stddev = std::sqrt(kusari::mean(kusari::square(w)).item<double>());
  EXPECT_NEAR(stddev, std::sqrt(1.0 / 288.0), 0.1 * std::sqrt(1.0 / 288.0));
}

TEST_P(ConvolutionLinkTest, Deconvolution2DLazyInChannelsAndOutsize) {
  L::Deconvolution2D deconv(3, 4);
  deconv.to_device(device());
  EXPECT_FALSE(deconv.W.is_initialized());
  Variable y = deconv(input({2, 5, 3, 3}));
  EXPECT_EQ(deconv.W.shape(), (Shape{5, 3, 4, 4}));
  EXPECT_EQ(y.shape(), (Shape{2, 3, 6, 6}));
  // Stride 2, pad 1, k 3 on 4x4: 2 * 3 + 3 - 2 = 7 by default, 8 when asked.
  L::Deconvolution2D d7(2, 3, 3, 2, 1);
  L::Deconvolution2D d8(2, 3, 3, 2, 1, false, functions::IntPair(8, 8));
  d7.to_device(device());
  d8.to_device(device());
  Array x = input({1, 2, 4, 4});
  EXPECT_EQ(d7(x).shape(), (Shape{1, 3, 7, 7}));
  EXPECT_EQ(d8(x).shape(), (Shape{1, 3, 8, 8}));
  EXPECT_EQ(d8.outsize(), functions::IntPair(8, 8));
}

TEST_P(ConvolutionLinkTest, Deconvolution2DForwardIsTheFunction) {
  L::Deconvolution2D deconv(4, 6, {3, 2}, {2, 1}, {1, 0}, false, functions::IntPair(10, 6), nullptr,
                            nullptr, 1, 2);
  deconv.to_device(device());
  testing::randomize_params(deconv, gen_);
  Array x = input({2, 4, 5, 5});
  Variable y = deconv(x);
  EXPECT_EQ(y.shape(), (Shape{2, 6, 10, 6}));
  Variable expected =
      F::deconvolution_2d(x, deconv.W, deconv.b, {2, 1}, {1, 0}, functions::IntPair(10, 6), 1, 2);
  EXPECT_TRUE(ArraysClose(y.data(), expected.data(), 0, 0));
}

TEST_P(ConvolutionLinkTest, Deconvolution2DGradientsReachEveryParameter) {
  L::Deconvolution2D deconv(std::nullopt, 2, 3, 2, 1);
  deconv.to_device(device());
  Variable x(input({2, 3, 3, 3}), true);
  testing::backward_random_weighted(deconv(x), gen_);
  testing::expect_grads_on_every_param(deconv);
  EXPECT_TRUE(x.grad().defined());
}

TEST_P(ConvolutionLinkTest, Deconvolution2DNpzRoundTripIntoLazyInstance) {
  L::Deconvolution2D deconv(3, 2, 4, 2, 1);
  deconv.to_device(device());
  testing::randomize_params(deconv, gen_);
  const testing::TempFile file("deconv.npz");
  const std::string& path = file.path;
  save_npz(path, deconv);
  EXPECT_EQ(testing::npz_keys(path), (StrVec{"W", "b"}));
  L::Deconvolution2D fresh(std::nullopt, 2, 4, 2, 1);
  fresh.to_device(device());
  load_npz(path, fresh);
  EXPECT_EQ(fresh.W.shape(), (Shape{3, 2, 4, 4}));
  Array x = input({1, 3, 3, 3});
  EXPECT_TRUE(ArraysClose(fresh(x).data(), deconv(x).data(), 0, 0));
  fresh.to_device(Device::cpu());
  EXPECT_TRUE(ArraysClose(fresh(x.to_device(Device::cpu())).data(),
                          deconv(x).data().to_device(Device::cpu()), 1e-6, 1e-6));
}

TEST_P(ConvolutionLinkTest, Deconvolution2DErrors) {
  using L::Deconvolution2D;
  KUSARI_EXPECT_THROW_WITH(Deconvolution2D(3, 0, 3), ValueError, "Deconvolution2D", "out_channels");
  EXPECT_THROW(Deconvolution2D(-3, 4, 3), ValueError);
  EXPECT_THROW(Deconvolution2D(3, 4, -1), ValueError);
  EXPECT_THROW(Deconvolution2D(3, 4, 3, 1, 0, false, functions::IntPair(0, 4)), ValueError);
  KUSARI_EXPECT_THROW_WITH(
      Deconvolution2D(3, 4, 3, 1, 0, false, std::nullopt, nullptr, nullptr, 1, 2), ValueError,
      "in_channels (3)", "groups (2)");
  Deconvolution2D deconv(3, 4, 3);
  deconv.to_device(device());
  KUSARI_EXPECT_THROW_WITH(deconv(input({1, 3, 6})), ShapeError, "Deconvolution2D", "4 axes");
  KUSARI_EXPECT_THROW_WITH(deconv(input({1, 2, 6, 6})), ShapeError, "Deconvolution2D",
                           "2 channels");
}

KUSARI_INSTANTIATE_DEVICE_TEST(ConvolutionLinkTest);

}  // namespace
}  // namespace kusari
