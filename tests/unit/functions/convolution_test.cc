// convolution_2d and deconvolution_2d: forward values against a naive reference, the oneDNN and
// im2col CPU paths against each other, gradient checks in float64 (tight) and float32 (loose),
// double-backward checks, and argument errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kusari/autograd/gradient_check.h"
#include "kusari/autograd/mode.h"
#include "kusari/functions/convolution.h"
#include "kusari/functions/math.h"
#include "function_test_util.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;
using F::IntPair;

GradientCheckOptions tol(Dtype d) { return testing::grad_tol(d); }

/// One convolution geometry. For a deconvolution the same numbers read as x (N, C, H, W) and
/// W (C, O / groups, kH, kW).
struct ConvCase {
  const char* name;
  Shape x, w;
  IntPair stride, pad, dilate;
  int64_t groups;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"basic", {2, 3, 6, 6}, {4, 3, 3, 3}, 1, 0, 1, 1},
      {"stride2_pad1", {2, 3, 7, 7}, {4, 3, 3, 3}, 2, 1, 1, 1},
      {"dilate2", {2, 2, 7, 7}, {3, 2, 3, 3}, 1, 1, 2, 1},
      {"groups2", {2, 4, 5, 5}, {6, 2, 3, 3}, 1, 1, 1, 2},
      {"nonsquare", {2, 3, 6, 7}, {4, 3, 2, 3}, {2, 1}, {1, 0}, {1, 2}, 1},
      {"pointwise", {2, 3, 4, 4}, {5, 3, 1, 1}, 1, 0, 1, 1},
      {"depthwise_stride2", {1, 4, 5, 5}, {4, 1, 3, 3}, 2, 1, 1, 4},
  };
}

std::vector<ConvCase> deconv_cases() {
  return {
      {"basic", {2, 3, 4, 4}, {3, 2, 3, 3}, 1, 0, 1, 1},
      {"stride2_pad1", {2, 3, 4, 4}, {3, 4, 3, 3}, 2, 1, 1, 1},
      {"dilate2", {2, 2, 3, 3}, {2, 3, 3, 3}, 1, 1, 2, 1},
      {"groups2", {2, 4, 3, 3}, {4, 3, 3, 3}, 2, 1, 1, 2},
      {"nonsquare", {2, 3, 3, 4}, {3, 2, 2, 3}, {2, 1}, {1, 0}, {1, 2}, 1},
  };
}

int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - (d * (k - 1) + 1)) / s + 1;
}

/// y = conv(x, W) + b by the definition, in float64 on the host.
Array reference_conv(const Array& x, const Array& w, const Array& b, const ConvCase& c) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> bv = b.defined() ? b.to_vector<double>() : std::vector<double>();
  const int64_t n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2], wd = x.shape()[3];
  const int64_t o = w.shape()[0], cg = w.shape()[1], kh = w.shape()[2], kw = w.shape()[3];
  const int64_t og = o / c.groups;
  const int64_t oh = conv_out(h, kh, c.stride.h, c.pad.h, c.dilate.h);
  const int64_t ow = conv_out(wd, kw, c.stride.w, c.pad.w, c.dilate.w);
  std::vector<double> y(static_cast<size_t>(n * o * oh * ow));
  for (int64_t in = 0; in < n; ++in) {
    for (int64_t oc = 0; oc < o; ++oc) {
      const int64_t g = oc / og;
      for (int64_t oy = 0; oy < oh; ++oy) {
        for (int64_t ox = 0; ox < ow; ++ox) {
          double s = bv.empty() ? 0.0 : bv[oc];
          for (int64_t ic = 0; ic < cg; ++ic) {
            for (int64_t i = 0; i < kh; ++i) {
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t iy = oy * c.stride.h - c.pad.h + i * c.dilate.h;
                const int64_t ix = ox * c.stride.w - c.pad.w + j * c.dilate.w;
                if (iy < 0 || iy >= h || ix < 0 || ix >= wd) continue;
                s += xv[((in * ch + g * cg + ic) * h + iy) * wd + ix] *
                     wv[((oc * cg + ic) * kh + i) * kw + j];
              }
            }
          }
          y[((in * o + oc) * oh + oy) * ow + ox] = s;
        }
      }
    }
  }
  return Array::from_vector(y, Shape{n, o, oh, ow});
}

/// y = deconv(x, W) + b by scattering every input element, in float64 on the host.
Array reference_deconv(const Array& x, const Array& w, const Array& b, const ConvCase& c,
                       int64_t out_h, int64_t out_w) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const int64_t n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2], wd = x.shape()[3];
  const int64_t ocg = w.shape()[1], kh = w.shape()[2], kw = w.shape()[3];
  const int64_t icg = ch / c.groups, o = ocg * c.groups;
  std::vector<double> y(static_cast<size_t>(n * o * out_h * out_w), 0.0);
  for (int64_t in = 0; in < n; ++in) {
    for (int64_t ic = 0; ic < ch; ++ic) {
      const int64_t g = ic / icg;
      for (int64_t oc = 0; oc < ocg; ++oc) {
        for (int64_t iy = 0; iy < h; ++iy) {
          for (int64_t ix = 0; ix < wd; ++ix) {
            for (int64_t i = 0; i < kh; ++i) {
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t oy = iy * c.stride.h - c.pad.h + i * c.dilate.h;
                const int64_t ox = ix * c.stride.w - c.pad.w + j * c.dilate.w;
                if (oy < 0 || oy >= out_h || ox < 0 || ox >= out_w) continue;
                y[((in * o + g * ocg + oc) * out_h + oy) * out_w + ox] +=
                    xv[((in * ch + ic) * h + iy) * wd + ix] *
                    wv[((ic * ocg + oc) * kh + i) * kw + j];
              }
            }
          }
        }
      }
    }
  }
  Array out = Array::from_vector(y, Shape{n, o, out_h, out_w});
  if (b.defined()) out = out + b.astype(float64).to_device(Device::cpu()).reshape({1, o, 1, 1});
  return out;
}

class ConvolutionTest : public testing::DeviceTest {
 protected:
  Array uniform(const Shape& s, Dtype dt) { return Array::uniform(s, -1, 1, dt, device(), &gen_); }
  /// A non-contiguous (N, C, H, W) array: a view with H and W swapped.
  Array noncontig(const Shape& s, Dtype dt) {
    return uniform({s[0], s[1], s[3], s[2]}, dt).swapaxes(2, 3);
  }
  Generator gen_{4321};
};

// --- convolution_2d
// -------------------------------------------------------------------------------

TEST_P(ConvolutionTest, ConvolutionForwardMatchesReference) {
  for (Dtype dt : {float64, float32}) {
    const double rtol = dt == float64 ? 1e-12 : 1e-5, atol = dt == float64 ? 1e-12 : 1e-5;
    for (const ConvCase& c : conv_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const Array x = uniform(c.x, dt), w = uniform(c.w, dt), b = uniform({c.w[0]}, dt);
      Variable y = F::convolution_2d(x, w, b, c.stride, c.pad, c.dilate, c.groups);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(testing::ArraysClose(y.data(), reference_conv(x, w, b, c), rtol, atol));
      Variable y0 = F::convolution_2d(x, w, Variable(), c.stride, c.pad, c.dilate, c.groups);
      EXPECT_TRUE(testing::ArraysClose(y0.data(), reference_conv(x, w, Array(), c), rtol, atol));
      // Non-contiguous x and W.
      const Array xn = noncontig(c.x, dt), wn = noncontig(c.w, dt);
      ASSERT_FALSE(xn.is_contiguous());
      Variable yn = F::convolution_2d(xn, wn, b, c.stride, c.pad, c.dilate, c.groups);
      EXPECT_TRUE(testing::ArraysClose(yn.data(), reference_conv(xn, wn, b, c), rtol, atol));
    }
  }
}

TEST_P(ConvolutionTest, ConvolutionOutputShape) {
  const Array x = uniform({100, 1, 28, 28}, float32), w = uniform({32, 1, 5, 5}, float32);
  EXPECT_EQ(F::convolution_2d(x, w).shape(), (Shape{100, 32, 24, 24}));
  EXPECT_EQ(F::convolution_2d(x, w, Variable(), 2, 2).shape(), (Shape{100, 32, 14, 14}));
  EXPECT_EQ(F::convolution_2d(x, w, Variable(), {1, 2}, {0, 1}, {2, 1}).shape(),
            (Shape{100, 32, 20, 13}));
}

TEST_P(ConvolutionTest, OneDnnAndIm2colAgree) {
  if (!device().is_cpu()) GTEST_SKIP() << "KUSARI_CPU_CONV selects between CPU implementations";
  if (!build_info().dnnl) GTEST_SKIP() << "this build has no oneDNN; every CPU convolution uses im2col";
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    Conv2dParams p;
    p.stride[0] = c.stride.h;
    p.stride[1] = c.stride.w;
    p.pad[0] = c.pad.h;
    p.pad[1] = c.pad.w;
    p.dilation[0] = c.dilate.h;
    p.dilation[1] = c.dilate.w;
    p.groups = c.groups;
    const Array x = uniform(c.x, float32), w = uniform(c.w, float32),
                b = uniform({c.w[0]}, float32);
    const Array y = kusari::conv2d(x, w, b, p);
    const Array gy = uniform(y.shape(), float32);
    const Array gx = kusari::conv2d_backward_data(w, gy, x.shape(), p);
    const Array gw = kusari::conv2d_backward_filter(x, gy, w.shape(), p);
    testing::ScopedEnv env("KUSARI_CPU_CONV", "im2col");
    EXPECT_TRUE(testing::ArraysClose(kusari::conv2d(x, w, b, p), y, 1e-5, 1e-5));
    EXPECT_TRUE(
        testing::ArraysClose(kusari::conv2d_backward_data(w, gy, x.shape(), p), gx, 1e-5, 1e-5));
    EXPECT_TRUE(
        testing::ArraysClose(kusari::conv2d_backward_filter(x, gy, w.shape(), p), gw, 1e-5, 1e-5));
  }
}

TEST_P(ConvolutionTest, Im2colPathMatchesReference) {
  if (!device().is_cpu()) GTEST_SKIP() << "KUSARI_CPU_CONV selects between CPU implementations";
  testing::ScopedEnv env("KUSARI_CPU_CONV", "im2col");
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    const Array x = noncontig(c.x, float32), w = uniform(c.w, float32),
                b = uniform({c.w[0]}, float32);
    Variable y = F::convolution_2d(x, w, b, c.stride, c.pad, c.dilate, c.groups);
    EXPECT_TRUE(testing::ArraysClose(y.data(), reference_conv(x, w, b, c), 1e-5, 1e-5));
  }
}

TEST_P(ConvolutionTest, BadAlgorithmVariableIsReported) {
  if (!device().is_cpu()) GTEST_SKIP() << "KUSARI_CPU_CONV selects between CPU implementations";
  testing::ScopedEnv env("KUSARI_CPU_CONV", "im2colx");
  const Array x = uniform({1, 1, 3, 3}, float32), w = uniform({1, 1, 2, 2}, float32);
  EXPECT_THROW(F::convolution_2d(x, w), ValueError);
}

TEST_P(ConvolutionTest, ConvolutionHalfPrecision) {
  const ConvCase c = conv_cases()[1];
  const Array x = uniform(c.x, float32), w = uniform(c.w, float32), b = uniform({c.w[0]}, float32);
  const Array ref = reference_conv(x, w, b, c);
  for (Dtype dt : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    Variable y = F::convolution_2d(x.astype(dt), w.astype(dt), b.astype(dt), c.stride, c.pad);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_TRUE(testing::ArraysClose(y.data(), ref, 5e-2, 5e-2));
  }
}

TEST_P(ConvolutionTest, ConvolutionBackward) {
  for (Dtype dt : {float64, float32}) {
    for (const ConvCase& c : conv_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      VariadicFunction with_bias = [c](const std::vector<Variable>& v) {
        return std::vector<Variable>{
            F::convolution_2d(v[0], v[1], v[2], c.stride, c.pad, c.dilate, c.groups)};
      };
      VariadicFunction without_bias = [c](const std::vector<Variable>& v) {
        return std::vector<Variable>{
            F::convolution_2d(v[0], v[1], Variable(), c.stride, c.pad, c.dilate, c.groups)};
      };
      check_backward(with_bias, {uniform(c.x, dt), uniform(c.w, dt), uniform({c.w[0]}, dt)}, {},
                     tol(dt));
      check_backward(without_bias, {noncontig(c.x, dt), uniform(c.w, dt)}, {}, tol(dt));
    }
  }
}

TEST_P(ConvolutionTest, ConvolutionDoubleBackward) {
  for (Dtype dt : {float64, float32}) {
    for (const ConvCase& c : conv_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      VariadicFunction f = [c](const std::vector<Variable>& v) {
        return std::vector<Variable>{
            F::convolution_2d(v[0], v[1], v[2], c.stride, c.pad, c.dilate, c.groups)};
      };
      check_double_backward(f, {uniform(c.x, dt), uniform(c.w, dt), uniform({c.w[0]}, dt)}, {}, {},
                            tol(dt));
    }
  }
}

TEST_P(ConvolutionTest, ConvolutionThirdOrder) {
  // W's gradient is itself a recorded function: check its gradient and its double backward
  // (the third order of the convolution).
  const ConvCase c = conv_cases()[3];
  VariadicFunction grad_w = [c](const std::vector<Variable>& v) {
    ForceBackpropMode force;  // the checker evaluates without backprop; this graph is needed
    Variable x = v[0], w = v[1];
    if (!w.requires_grad()) w.set_requires_grad(true);
    Variable y = F::convolution_2d(x, w, Variable(), c.stride, c.pad, c.dilate, c.groups);
    std::vector<Variable> g = grad({y}, {w}, {v[2]}, true);
    return std::vector<Variable>{g[0]};
  };
  Array gy = uniform(
      reference_conv(uniform(c.x, float64), uniform(c.w, float64), Array(), c).shape(), float64);
  const std::vector<Array> inputs{uniform(c.x, float64), uniform(c.w, float64), gy};
  check_backward(grad_w, inputs, {}, tol(float64));
  check_double_backward(grad_w, inputs, {}, {}, tol(float64));
}

// --- deconvolution_2d
// -----------------------------------------------------------------------------

int64_t deconv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return s * (in - 1) + d * (k - 1) + 1 - 2 * p;
}

TEST_P(ConvolutionTest, DeconvolutionForwardMatchesReference) {
  for (Dtype dt : {float64, float32}) {
    const double rtol = dt == float64 ? 1e-12 : 1e-5, atol = dt == float64 ? 1e-12 : 1e-5;
    for (const ConvCase& c : deconv_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const int64_t oh = deconv_out(c.x[2], c.w[2], c.stride.h, c.pad.h, c.dilate.h);
      const int64_t ow = deconv_out(c.x[3], c.w[3], c.stride.w, c.pad.w, c.dilate.w);
      const int64_t o = c.w[1] * c.groups;
      const Array x = uniform(c.x, dt), w = uniform(c.w, dt), b = uniform({o}, dt);
      Variable y = F::deconvolution_2d(x, w, b, c.stride, c.pad, std::nullopt, c.dilate, c.groups);
      EXPECT_TRUE(testing::ArraysClose(y.data(), reference_deconv(x, w, b, c, oh, ow), rtol, atol));
      const Array xn = noncontig(c.x, dt);
      Variable yn =
          F::deconvolution_2d(xn, w, Variable(), c.stride, c.pad, std::nullopt, c.dilate, c.groups);
      EXPECT_TRUE(
          testing::ArraysClose(yn.data(), reference_deconv(xn, w, Array(), c, oh, ow), rtol, atol));
    }
  }
}

TEST_P(ConvolutionTest, DeconvolutionOutsize) {
  // stride 2, kernel 3, pad 1 on 4 gives 7 by default; 8 also convolves back to 4, 9 does not.
  const ConvCase c{"outsize", {2, 3, 4, 4}, {3, 2, 3, 3}, 2, 1, 1, 1};
  const Array x = uniform(c.x, float64), w = uniform(c.w, float64);
  EXPECT_EQ(F::deconvolution_2d(x, w, Variable(), 2, 1).shape(), (Shape{2, 2, 7, 7}));
  Variable y = F::deconvolution_2d(x, w, Variable(), 2, 1, IntPair{8, 7});
  EXPECT_EQ(y.shape(), (Shape{2, 2, 8, 7}));
  EXPECT_TRUE(
      testing::ArraysClose(y.data(), reference_deconv(x, w, Array(), c, 8, 7), 1e-12, 1e-12));
  EXPECT_THROW(F::deconvolution_2d(x, w, Variable(), 2, 1, IntPair{9, 7}), ValueError);
  EXPECT_THROW(F::deconvolution_2d(x, w, Variable(), 2, 1, 6), ValueError);
  VariadicFunction f = [](const std::vector<Variable>& v) {
    return std::vector<Variable>{F::deconvolution_2d(v[0], v[1], v[2], 2, 1, IntPair{8, 8})};
  };
  const std::vector<Array> inputs{x, w, uniform({2}, float64)};
  check_backward(f, inputs, {}, tol(float64));
  check_double_backward(f, inputs, {}, {}, tol(float64));
}

TEST_P(ConvolutionTest, DeconvolutionBackward) {
  for (Dtype dt : {float64, float32}) {
    for (const ConvCase& c : deconv_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const int64_t o = c.w[1] * c.groups;
      VariadicFunction with_bias = [c](const std::vector<Variable>& v) {
        return std::vector<Variable>{F::deconvolution_2d(v[0], v[1], v[2], c.stride, c.pad,
                                                         std::nullopt, c.dilate, c.groups)};
      };
      VariadicFunction without_bias = [c](const std::vector<Variable>& v) {
        return std::vector<Variable>{F::deconvolution_2d(v[0], v[1], Variable(), c.stride, c.pad,
                                                         std::nullopt, c.dilate, c.groups)};
      };
      check_backward(with_bias, {uniform(c.x, dt), uniform(c.w, dt), uniform({o}, dt)}, {},
                     tol(dt));
      check_backward(without_bias, {noncontig(c.x, dt), uniform(c.w, dt)}, {}, tol(dt));
    }
  }
}

TEST_P(ConvolutionTest, DeconvolutionDoubleBackward) {
  for (Dtype dt : {float64, float32}) {
    for (const ConvCase& c : deconv_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const int64_t o = c.w[1] * c.groups;
      VariadicFunction f = [c](const std::vector<Variable>& v) {
        return std::vector<Variable>{F::deconvolution_2d(v[0], v[1], v[2], c.stride, c.pad,
                                                         std::nullopt, c.dilate, c.groups)};
      };
      check_double_backward(f, {uniform(c.x, dt), uniform(c.w, dt), uniform({o}, dt)}, {}, {},
                            tol(dt));
    }
  }
}

// --- errors
// ---------------------------------------------------------------------------------------

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_P(ConvolutionTest, ConvolutionErrors) {
  const Array x = uniform({2, 4, 5, 5}, float32), w = uniform({6, 4, 3, 3}, float32);
  std::string m = error_of<ShapeError>([&] { F::convolution_2d(x.reshape({2, 4, 25}), w); });
  EXPECT_NE(m.find("convolution_2d"), std::string::npos) << m;
  EXPECT_NE(m.find("(2, 4, 25)"), std::string::npos) << m;
  EXPECT_THROW(F::convolution_2d(x, w.reshape({6, 4, 9})), ShapeError);
  // Channel mismatch.
  m = error_of<ShapeError>([&] { F::convolution_2d(x, uniform({6, 3, 3, 3}, float32)); });
  EXPECT_NE(m.find("4 channels"), std::string::npos) << m;
  EXPECT_NE(m.find("expects 3"), std::string::npos) << m;
  // groups not dividing the channels.
  m = error_of<ShapeError>([&] {
    F::convolution_2d(x, uniform({6, 1, 3, 3}, float32), Variable(), 1, 0, 1, 3);
  });
  EXPECT_NE(m.find("groups=3 does not divide"), std::string::npos) << m;
  m = error_of<ShapeError>([&] {
    F::convolution_2d(x, uniform({5, 2, 3, 3}, float32), Variable(), 1, 0, 1, 2);
  });
  EXPECT_NE(m.find("output channels, which groups=2"), std::string::npos) << m;
  // Bias of the wrong length.
  EXPECT_THROW(F::convolution_2d(x, w, uniform({5}, float32)), ShapeError);
  // dtype mismatch.
  m = error_of<DtypeError>([&] { F::convolution_2d(x, w.astype(float64)); });
  EXPECT_NE(m.find("convolution_2d"), std::string::npos) << m;
  EXPECT_THROW(F::convolution_2d(x.astype(int32), w.astype(int32)), DtypeError);
  // Kernel larger than the input; bad parameters.
  EXPECT_THROW(F::convolution_2d(x, uniform({6, 4, 7, 7}, float32)), ShapeError);
  EXPECT_THROW(F::convolution_2d(x, uniform({6, 4, 7, 7}, float32), Variable(), 3), ShapeError);
  EXPECT_THROW(F::convolution_2d(x, w, Variable(), 0), ValueError);
  EXPECT_THROW(F::convolution_2d(x, w, Variable(), 1, -1), ValueError);
  EXPECT_THROW(F::convolution_2d(x, w, Variable(), 1, 0, 0), ValueError);
  EXPECT_THROW(F::convolution_2d(x, w, Variable(), 1, 0, 1, 0), ValueError);
}

TEST_P(ConvolutionTest, DeconvolutionErrors) {
  const Array x = uniform({2, 4, 3, 3}, float32), w = uniform({4, 3, 3, 3}, float32);
  std::string m = error_of<ShapeError>([&] {
    F::deconvolution_2d(x, uniform({5, 3, 3, 3}, float32));
  });
  EXPECT_NE(m.find("deconvolution_2d"), std::string::npos) << m;
  EXPECT_NE(m.find("expects 5"), std::string::npos) << m;
  m = error_of<ShapeError>(
      [&] { F::deconvolution_2d(x, w, Variable(), 1, 0, std::nullopt, 1, 3); });
  EXPECT_NE(m.find("groups=3 does not divide"), std::string::npos) << m;
  EXPECT_THROW(F::deconvolution_2d(x, w, uniform({4}, float32)), ShapeError);
  EXPECT_THROW(F::deconvolution_2d(x, w.astype(float64)), DtypeError);
  EXPECT_THROW(F::deconvolution_2d(x.reshape({2, 4, 9}), w), ShapeError);
  // A pad that leaves no output.
  EXPECT_THROW(F::deconvolution_2d(uniform({1, 4, 1, 1}, float32), w, Variable(), 1, 2),
               ShapeError);
  EXPECT_THROW(F::deconvolution_2d(x, w, Variable(), 0), ValueError);
}

TEST_P(ConvolutionTest, GradientRoutinesCheckShapes) {
  // The kernels index by these shapes, so the routines refuse shapes of no single convolution.
  Conv2dParams p;
  const Array x = uniform({2, 4, 5, 5}, float32), w = uniform({6, 4, 3, 3}, float32);
  const Array gy = uniform({2, 6, 3, 3}, float32);
  EXPECT_NO_THROW(kusari::conv2d_backward_data(w, gy, x.shape(), p));
  EXPECT_THROW(kusari::conv2d_backward_data(w, gy, {2, 4, 7, 7}, p), ShapeError);
  EXPECT_THROW(kusari::conv2d_backward_data(w, gy, {2, 3, 5, 5}, p), ShapeError);
  EXPECT_THROW(kusari::conv2d_backward_data(w, uniform({2, 5, 3, 3}, float32), x.shape(), p),
               ShapeError);
  EXPECT_NO_THROW(kusari::conv2d_backward_filter(x, gy, w.shape(), p));
  EXPECT_THROW(kusari::conv2d_backward_filter(x, gy, {6, 4, 2, 2}, p), ShapeError);
  EXPECT_THROW(kusari::conv2d_backward_filter(x, uniform({3, 6, 3, 3}, float32), w.shape(), p),
               ShapeError);
}

// An input used by two convolutions and a residual join: the second convolution's gradient of
// x is added into the one x already has (Note [Accumulating into an input's gradient]; on CUDA
// by cuDNN with beta = 1, Note [Accumulating convolution gradients]). The first convolution
// finds x's gradient shared with the join's and must not write into it.
TEST_P(ConvolutionTest, AnInputUsedByTwoConvolutionsGetsTheSumOfTheirGradients) {
  const auto block = [](const std::vector<Variable>& v) {
    const Variable h = v[0] * 1.0;  // not a leaf: leaves are never added into
    return std::vector<Variable>{F::convolution_2d(h, v[1], Variable(), 1, 1) +
                                 F::convolution_2d(h, v[2], Variable(), 1, 0) * 0.5 + h};
  };
  check_backward(block, {uniform({2, 4, 5, 5}, float64), uniform({4, 4, 3, 3}, float64), uniform({4, 4, 1, 1}, float64)},
                 {}, tol(float64));
  // In float32, channels-last and NCHW: the same gradients as with double backprop, which records
  // every sum and so never adds in place.
  for (const MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
    SCOPED_TRACE(format == MemoryFormat::kChannelsLast ? "channels-last" : "NCHW");
    const Array x = uniform({2, 8, 6, 6}, float32).to_memory_format(format);
    const Array w1 = uniform({8, 8, 3, 3}, float32).to_memory_format(format);
    const Array w2 = uniform({8, 8, 1, 1}, float32).to_memory_format(format);
    std::vector<Array> grads[2];
    for (const bool recorded : {false, true}) {
      std::vector<Variable> in{Variable(x, true), Variable(w1, true), Variable(w2, true)};
      const Variable y = block(in)[0];
      F::sum(y * y).backward({.enable_double_backprop = recorded});
      for (const Variable& v : in) grads[recorded ? 1 : 0].push_back(v.grad());
    }
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(testing::ArraysClose(grads[0][i], grads[1][i], 1e-4, 1e-4)) << "input " << i;
    }
  }
}

TEST_P(ConvolutionTest, AccumulatingGradientRoutineAddsAndChecksItsArguments) {
  Conv2dParams p;
  p.pad[0] = p.pad[1] = 1;
  const Array w = uniform({6, 4, 3, 3}, float32), gy = uniform({2, 6, 5, 5}, float32);
  const Array g0 = uniform({2, 4, 5, 5}, float32);
  Array gx = g0.copy();
  kusari::conv2d_backward_data_accumulate(w, gy, p, gx);
  EXPECT_TRUE(testing::ArraysClose(gx, g0 + kusari::conv2d_backward_data(w, gy, g0.shape(), p), 1e-6, 1e-6));
  Array wrong = uniform({2, 4, 6, 6}, float32);
  EXPECT_THROW(kusari::conv2d_backward_data_accumulate(w, gy, p, wrong), ShapeError);
  Array wrong_dtype = g0.astype(float64);
  EXPECT_THROW(kusari::conv2d_backward_data_accumulate(w, gy, p, wrong_dtype), DtypeError);
  Array aliased = gy.at({Slice(), Slice(0, 4)});
  EXPECT_THROW(kusari::conv2d_backward_data_accumulate(w, gy, p, aliased), ValueError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(ConvolutionTest);

}  // namespace
}  // namespace kusari
