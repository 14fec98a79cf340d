// Channels-last (NHWC) arrays: the layout queries and conversions, allocation that keeps the
// layout, Link::to_memory_format, and every function that takes images giving the same values
// and gradients for NCHW and channels-last inputs (Note [Memory formats]).
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "kusari/core/routines.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/convolution.h"
#include "kusari/functions/math.h"
#include "kusari/functions/normalization.h"
#include "kusari/functions/pooling.h"
#include "kusari/links/convolution_2d.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;
constexpr MemoryFormat kCL = MemoryFormat::kChannelsLast;
constexpr MemoryFormat kC = MemoryFormat::kContiguous;

class MemoryFormatTest : public testing::DeviceTest {
 protected:
  Array rand(const Shape& s, double lo = -1.0, double hi = 1.0) {
    return Array::uniform(s, lo, hi, Dtype::kFloat32, device());
  }
  double rtol() const { return device().is_cpu() ? 1e-5 : 2e-3; }
  double atol() const { return device().is_cpu() ? 1e-6 : 2e-3; }
};

// --- the array API ---------------------------------------------------------------------------

TEST_P(MemoryFormatTest, ToMemoryFormatGivesNhwcStrides) {
  Array x = rand({2, 3, 4, 5});
  EXPECT_EQ(x.memory_format(), kC);
  EXPECT_TRUE(x.is_contiguous(kC));
  EXPECT_FALSE(x.is_contiguous(kCL));
  Array y = x.to_memory_format(kCL);
  EXPECT_EQ(y.strides(), (Strides{60, 1, 15, 3}));
  EXPECT_EQ(y.memory_format(), kCL);
  EXPECT_TRUE(y.is_contiguous(kCL));
  EXPECT_FALSE(y.is_contiguous());
  EXPECT_FALSE(y.shares_memory_with(x));
  EXPECT_TRUE(testing::ArraysClose(y, x, 0, 0));
  // No copy when already in the format, either way.
  EXPECT_TRUE(y.to_memory_format(kCL).same_view(y));
  EXPECT_TRUE(x.to_memory_format(kC).same_view(x));
  Array back = y.to_memory_format(kC);
  EXPECT_TRUE(back.is_contiguous());
  EXPECT_TRUE(testing::ArraysClose(back, x, 0, 0));
  // The NHWC view of a channels-last array is C-contiguous.
  EXPECT_TRUE(y.transpose({0, 2, 3, 1}).is_contiguous());
}

TEST_P(MemoryFormatTest, AmbiguousAndOtherLayouts) {
  // Length-1 axes make both layouts hold: contiguous wins.
  Array a = rand({2, 3, 1, 1}).to_memory_format(kCL);
  EXPECT_TRUE(a.is_contiguous(kCL));
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(a.memory_format(), kC);
  Array c1 = rand({2, 1, 4, 5});
  EXPECT_TRUE(c1.is_contiguous(kCL));
  EXPECT_EQ(c1.memory_format(), kC);
  // Other ranks and other strides are never channels-last.
  EXPECT_FALSE(rand({3, 4}).is_contiguous(kCL));
  EXPECT_EQ(rand({3, 4}).memory_format(), kC);
  Array t = rand({2, 3, 4, 5}).transpose({0, 1, 3, 2});
  EXPECT_EQ(t.memory_format(), kC);
  EXPECT_FALSE(t.is_contiguous(kCL));
  EXPECT_THROW(rand({3, 4}).to_memory_format(kCL), ShapeError);
  EXPECT_THROW(Array::empty({3, 4}, Dtype::kFloat32, device(), kCL), ShapeError);
}

TEST_P(MemoryFormatTest, AllocationKeepsTheLayout) {
  Array x = rand({2, 3, 4, 5}).to_memory_format(kCL);
  EXPECT_EQ(Array::empty_like(x).memory_format(), kCL);
  EXPECT_EQ(Array::zeros_like(x).memory_format(), kCL);
  EXPECT_EQ(Array::ones_like(x).memory_format(), kCL);
  Array f = Array::full_like(x, 2.5);
  EXPECT_EQ(f.memory_format(), kCL);
  EXPECT_EQ(f.to_vector<float>(), std::vector<float>(120, 2.5f));
  EXPECT_EQ(Array::empty({2, 3, 4, 5}, Dtype::kFloat32, device(), kCL).strides(), (Strides{60, 1, 15, 3}));
  EXPECT_EQ(Array::zeros_like(rand({2, 3, 4, 5})).memory_format(), kC);
  Array h = x.astype(Dtype::kFloat64);
  EXPECT_EQ(h.memory_format(), kCL);
  EXPECT_TRUE(testing::ArraysClose(h, x, 0, 0));
  // copy() stays a contiguous copy.
  EXPECT_TRUE(x.copy().is_contiguous());
  // reshape is shape-based: the values in C order.
  EXPECT_EQ(x.reshape({2, 60}).to_vector<float>(), x.contiguous().reshape({2, 60}).to_vector<float>());
  EXPECT_EQ(x.transpose({0, 2, 3, 1}).to_vector<float>(), x.contiguous().transpose({0, 2, 3, 1}).to_vector<float>());
  // Moving between devices keeps the layout.
  Array cpu = x.to_device(Device::cpu());
  EXPECT_EQ(cpu.memory_format(), kCL);
  EXPECT_TRUE(testing::ArraysClose(cpu, x, 0, 0));
}

TEST_P(MemoryFormatTest, ElementwiseOutputsFollowTheInputs) {
  Array xn = rand({2, 3, 4, 5});
  Array x = xn.to_memory_format(kCL);
  Array yn = rand({2, 3, 4, 5});
  Array y = yn.to_memory_format(kCL);
  Array bias = rand({1, 3, 1, 1});
  EXPECT_EQ(relu(x).memory_format(), kCL);
  EXPECT_EQ(exp(x).memory_format(), kCL);
  EXPECT_EQ((x * 2.0).memory_format(), kCL);
  EXPECT_EQ((x + y).memory_format(), kCL);
  EXPECT_EQ((x + bias).memory_format(), kCL);
  EXPECT_EQ((bias * x).memory_format(), kCL);
  EXPECT_EQ(greater(x, y).memory_format(), kCL);
  EXPECT_EQ(where(greater(x, y), x, y).memory_format(), kCL);
  // Disagreeing layouts give a contiguous output.
  EXPECT_EQ((x + yn).memory_format(), kC);
  EXPECT_EQ((xn + bias).memory_format(), kC);
  EXPECT_TRUE(testing::ArraysClose(x + y, xn + yn, 0, 0));
  EXPECT_TRUE(testing::ArraysClose(x + bias, xn + bias, 0, 0));
  EXPECT_TRUE(testing::ArraysClose(x + yn, xn + yn, 0, 0));
  EXPECT_TRUE(testing::ArraysClose(where(greater(x, y), x, y), where(greater(xn, yn), xn, yn), 0, 0));
  // A broadcast view of the full shape does not vote.
  Array g = Array::full({}, 3.0, Dtype::kFloat32, device()).broadcast_to(x.shape());
  EXPECT_EQ((g * x).memory_format(), kCL);
  // In-place accumulation into a channels-last array.
  Array acc = Array::zeros_like(x);
  add_to(acc, xn);
  add_to(acc, bias);
  EXPECT_EQ(acc.memory_format(), kCL);
  EXPECT_TRUE(testing::ArraysClose(acc, xn + bias, 0, 0));
}

TEST_P(MemoryFormatTest, MixedStridesCopy) {
  // A copy between an NCHW source and an NHWC destination of an odd shape, and back.
  Array xn = rand({3, 5, 7, 2});
  Array x = xn.to_memory_format(kCL);
  Array t = xn.transpose({0, 1, 3, 2});  // neither layout
  Array out = Array::empty(t.shape(), Dtype::kFloat32, device(), kCL);
  out.assign(t);
  EXPECT_TRUE(testing::ArraysClose(out, t, 0, 0));
  EXPECT_TRUE(testing::ArraysClose(x.to_memory_format(kC), xn, 0, 0));
  EXPECT_TRUE(testing::ArraysClose(t + out, t * 2.0, 1e-6, 0));
}

// --- functions: NCHW and channels-last give the same values and gradients ----------------------

/// Runs f on `inputs` as given and with every 4-d input channels-last, backpropagates the same
/// upstream gradient (channels-last in the second run when the output is 4-d), and compares the
/// outputs and the gradients of every input. Returns the channels-last run's output.
Array check_same(const std::function<Variable(const std::vector<Variable>&)>& f, const std::vector<Array>& inputs,
                 double rtol, double atol, bool grads_follow = false) {
  auto run = [&](bool cl, Array* gy_io, std::vector<Array>& grads, std::vector<MemoryFormat>& grad_formats) {
    std::vector<Variable> vs;
    for (const Array& a : inputs) {
      vs.emplace_back(cl && a.ndim() == 4 ? a.to_memory_format(kCL) : a, true);
    }
    Variable y = f(vs);
    if (!gy_io->defined()) *gy_io = Array::uniform(y.shape(), -1.0, 1.0, y.dtype(), y.device());
    const Array gy = cl && y.ndim() == 4 ? gy_io->to_memory_format(kCL) : *gy_io;
    Variable loss = F::sum(F::mul(y, Variable(gy)));
    loss.backward();
    for (const Variable& v : vs) {
      grads.push_back(v.grad());
      grad_formats.push_back(v.grad().defined() ? v.grad().memory_format() : kC);
    }
    return y.data();
  };
  Array gy;
  std::vector<Array> gn, gc;
  std::vector<MemoryFormat> fn, fc;
  const Array yn = run(false, &gy, gn, fn);
  const Array yc = run(true, &gy, gc, fc);
  EXPECT_TRUE(testing::ArraysClose(yc, yn, rtol, atol)) << "forward";
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!gn[k].defined()) continue;
    EXPECT_TRUE(testing::ArraysClose(gc[k], gn[k], rtol, atol)) << "gradient of input " << k;
    if (grads_follow && inputs[k].ndim() == 4 && inputs[k].shape()[2] * inputs[k].shape()[3] > 1) {
      EXPECT_EQ(fc[k], kCL) << "gradient of input " << k << " should be channels-last";
    }
  }
  return yc;
}

TEST_P(MemoryFormatTest, Convolution2D) {
  for (int64_t groups : {1, 2}) {
    for (int stride : {1, 2}) {
      const Array x = rand({2, 4, 7, 6});
      const Array w = rand({6, 4 / groups, 3, 3});
      const Array b = rand({6});
      Array y = check_same(
          [&](const std::vector<Variable>& v) { return F::convolution_2d(v[0], v[1], v[2], stride, 1, 1, groups); },
          {x, w, b}, rtol(), atol());
      EXPECT_EQ(y.memory_format(), kCL) << "groups " << groups << " stride " << stride;
    }
  }
  // A contiguous filter with a channels-last input, and the reverse.
  const Array x = rand({2, 3, 5, 5}), w = rand({4, 3, 3, 3});
  const Array ref = F::convolution_2d(Variable(x), Variable(w)).data();
  Array y1 = F::convolution_2d(Variable(x.to_memory_format(kCL)), Variable(w)).data();
  Array y2 = F::convolution_2d(Variable(x), Variable(w.to_memory_format(kCL))).data();
  EXPECT_EQ(y1.memory_format(), kCL);
  EXPECT_EQ(y2.memory_format(), kCL);  // a channels-last filter makes the output channels-last
  EXPECT_TRUE(testing::ArraysClose(y1, ref, rtol(), atol()));
  EXPECT_TRUE(testing::ArraysClose(y2, ref, rtol(), atol()));
}

TEST_P(MemoryFormatTest, Deconvolution2D) {
  const Array x = rand({2, 4, 4, 5});
  const Array w = rand({4, 3, 3, 3});
  const Array b = rand({3});
  Array y = check_same(
      [&](const std::vector<Variable>& v) { return F::deconvolution_2d(v[0], v[1], v[2], 2, 1); }, {x, w, b},
      rtol(), atol());
  EXPECT_EQ(y.memory_format(), kCL);
}

TEST_P(MemoryFormatTest, Pooling) {
  const Array x = rand({2, 3, 6, 7});
  Array ym = check_same([](const std::vector<Variable>& v) { return F::max_pooling_2d(v[0], 3, 2, 1); }, {x},
                        rtol(), atol(), true);
  EXPECT_EQ(ym.memory_format(), kCL);
  Array ya = check_same([](const std::vector<Variable>& v) { return F::average_pooling_2d(v[0], 2, 2, 0); }, {x},
                        rtol(), atol(), true);
  EXPECT_EQ(ya.memory_format(), kCL);
}

TEST_P(MemoryFormatTest, BatchNormalization) {
  const Array x = rand({4, 3, 5, 5});
  const Array gamma = rand({3}, 0.5, 1.5), beta = rand({3});
  Array y = check_same(
      [](const std::vector<Variable>& v) { return F::batch_normalization(v[0], v[1], v[2]); }, {x, gamma, beta},
      device().is_cpu() ? 1e-4 : 2e-3, device().is_cpu() ? 1e-5 : 2e-3, true);
  EXPECT_EQ(y.memory_format(), kCL);
  const Array mean = rand({3}), var = rand({3}, 0.5, 1.5);
  Array yf = check_same(
      [](const std::vector<Variable>& v) { return F::fixed_batch_normalization(v[0], v[1], v[2], v[3], v[4]); },
      {x, gamma, beta, mean, var}, 1e-4, 1e-5, true);
  EXPECT_EQ(yf.memory_format(), kCL);
}

TEST_P(MemoryFormatTest, ElementwiseFunctions) {
  const Array x = rand({2, 3, 4, 5});
  const Array x2 = rand({2, 3, 4, 5});
  const Array bias = rand({1, 3, 1, 1});
  using Fn = std::function<Variable(const std::vector<Variable>&)>;
  const std::vector<std::pair<const char*, Fn>> unary{
      {"relu", [](const std::vector<Variable>& v) { return F::relu(v[0]); }},
      {"sigmoid", [](const std::vector<Variable>& v) { return F::sigmoid(v[0]); }},
      {"tanh", [](const std::vector<Variable>& v) { return F::tanh(v[0]); }},
      {"scale", [](const std::vector<Variable>& v) { return F::add(F::mul(v[0], 3.0), 1.0); }},
  };
  for (const auto& [name, f] : unary) {
    Array y = check_same(f, {x}, 1e-5, 1e-6, true);
    EXPECT_EQ(y.memory_format(), kCL) << name;
  }
  Array y = check_same([](const std::vector<Variable>& v) { return F::mul(F::add(v[0], v[1]), v[0]); }, {x, x2},
                       1e-5, 1e-6, true);
  EXPECT_EQ(y.memory_format(), kCL);
  // A bias broadcast over N, H and W (its gradient is a sum, (1, C, 1, 1)).
  Array yb = check_same([](const std::vector<Variable>& v) { return F::add(v[0], v[1]); }, {x, bias}, 1e-5, 1e-6,
                        true);
  EXPECT_EQ(yb.memory_format(), kCL);
}

TEST_P(MemoryFormatTest, GlobalAveragePooling) {
  const Array x = rand({2, 3, 4, 5});
  Array y = check_same([](const std::vector<Variable>& v) { return F::mean(v[0], {2, 3}); }, {x}, 1e-5, 1e-6);
  EXPECT_EQ(y.shape(), (Shape{2, 3}));
  Array yk = check_same([](const std::vector<Variable>& v) { return F::mean(v[0], {2, 3}, true); }, {x}, 1e-5, 1e-6);
  EXPECT_EQ(yk.shape(), (Shape{2, 3, 1, 1}));
}

// --- links -----------------------------------------------------------------------------------------

class ConvNet : public Chain {
 public:
  ConvNet() {
    conv = add_link("conv", std::make_shared<links::Convolution2D>(3, 4, 3, 1, 1));
    // Input channels sized at the first call.
    lazy = add_link("lazy", std::make_shared<links::Convolution2D>(int64_t{5}, 3));
    fc = add_link("fc", std::make_shared<links::Linear>(std::nullopt, 5));
  }
  Variable forward(const Variable& x) override {
    Variable h = F::relu(conv->forward(x));
    h = F::relu(lazy->forward(h));
    return fc->forward(F::mean(h, {2, 3}));
  }
  std::shared_ptr<links::Convolution2D> conv;
  std::shared_ptr<links::Convolution2D> lazy;
  std::shared_ptr<links::Linear> fc;
};

TEST_P(MemoryFormatTest, LinkToMemoryFormat) {
  ConvNet net;
  net.to_device(device());
  const Array x = rand({2, 3, 6, 6});
  ConvNet ref;
  ref.to_device(device());
  // Size the lazy parameters of the reference, then give both the same values.
  ref.forward(Variable(x));
  net.to_memory_format(kCL);
  EXPECT_EQ(net.conv->W.data().memory_format(), kCL);
  EXPECT_EQ(net.conv->b.data().memory_format(), kC);  // 1-d: stays
  EXPECT_FALSE(net.lazy->W.is_initialized());
  Variable y = net.forward(Variable(x.to_memory_format(kCL)));
  // The lazily sized filter is created channels-last too.
  EXPECT_EQ(net.lazy->W.data().memory_format(), kCL);
  net.copyparams(ref);
  EXPECT_EQ(net.conv->W.data().memory_format(), kCL);
  Variable yn = ref.forward(Variable(x));
  Variable yc = net.forward(Variable(x.to_memory_format(kCL)));
  EXPECT_TRUE(testing::ArraysClose(yc.data(), yn.data(), rtol(), atol()));
  F::sum(yn).backward();
  F::sum(yc).backward();
  EXPECT_TRUE(testing::ArraysClose(net.conv->W.grad(), ref.conv->W.grad(), rtol(), atol()));
  EXPECT_TRUE(testing::ArraysClose(net.lazy->W.grad(), ref.lazy->W.grad(), rtol(), atol()));
  EXPECT_EQ(net.conv->W.grad().memory_format(), kCL);
  // Back to contiguous.
  net.to_memory_format(kC);
  EXPECT_TRUE(net.conv->W.data().is_contiguous());
  EXPECT_TRUE(net.conv->W.grad().is_contiguous());
}

TEST_P(MemoryFormatTest, UpdateChannelsLastParameter) {
  const Array p0 = rand({4, 3, 2, 2});
  const Array g = rand({4, 3, 2, 2});
  Array pn = p0.copy(), pc = p0.to_memory_format(kCL);
  Array vn = Array::zeros_like(pn), vc = Array::zeros_like(pc);
  ASSERT_EQ(vc.memory_format(), kCL);
  for (int step = 0; step < 2; ++step) {
    update_parameter(UpdateRule::kMomentumSgd, pn, g, {&vn}, {0.1, 0.9});
    update_parameter(UpdateRule::kMomentumSgd, pc, g, {&vc}, {0.1, 0.9});  // gradient NCHW
  }
  EXPECT_EQ(pc.memory_format(), kCL);
  EXPECT_TRUE(testing::ArraysClose(pc, pn, 1e-6, 1e-7));
  EXPECT_TRUE(testing::ArraysClose(vc, vn, 1e-6, 1e-7));
  Array bad = Array::zeros_like(pn);  // contiguous state for a channels-last parameter
  EXPECT_THROW(update_parameter(UpdateRule::kMomentumSgd, pc, g, {&bad}, {0.1, 0.9}), ValueError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(MemoryFormatTest);

}  // namespace
}  // namespace kusari
