// links::LSTM: Chainer's child links and parameter names, Chainer's initialisation (block-wise
// weights, forget-gate bias at the interleaved positions, lazy in_size), the state over several
// steps against manually unrolled functions::lstm calls, shrinking batches, reset_state and
// set_state, gradients, npz round trip into a lazy instance, to_device, errors.
#include <gtest/gtest.h>

#include "link_test_util.h"

namespace kusari {
namespace {

namespace F = functions;
namespace L = links;
using testing::ArraysClose;
using StrVec = std::vector<std::string>;

// Fills with a constant and records the shapes it was asked to fill.
class RecordingInitializer : public Initializer {
 public:
  explicit RecordingInitializer(double value) : value_(value) {}
  void operator()(Array& array) const override {
    shapes.push_back(array.shape());
    array.fill(value_);
  }
  mutable std::vector<Shape> shapes;

 private:
  double value_;
};

class LSTMLinkTest : public testing::DeviceTest {
 protected:
  Array input(const Shape& s) { return Array::uniform(s, -1, 1, float32, device(), &gen_); }
  // upward/b with the forget entries (4 s + 2) set to `forget` and the others to `other`.
  Array gate_bias(int64_t units, double other, double forget) {
    std::vector<float> v;
    for (int64_t s = 0; s < units; ++s) {
      for (int k = 0; k < 4; ++k) v.push_back(static_cast<float>(k == 2 ? forget : other));
    }
    return Array::from_vector(v, std::nullopt, device());
  }
  Generator gen_{3};
};

TEST_P(LSTMLinkTest, ChildrenParametersAndInitialisation) {
  L::LSTM lstm(3, 4);
  lstm.to_device(device());
  EXPECT_EQ(testing::param_paths(lstm), (StrVec{"/upward/W", "/upward/b", "/lateral/W"}));
  EXPECT_EQ(lstm.upward->W.shape(), (Shape{16, 3}));
  EXPECT_EQ(lstm.upward->b.shape(), (Shape{16}));
  EXPECT_EQ(lstm.lateral->W.shape(), (Shape{16, 4}));
  EXPECT_FALSE(lstm.lateral->b.defined());
  EXPECT_EQ(lstm.state_size(), 4);
  // Chainer's defaults: bias 0, forget bias 1 on upward/b[4 s + 2]; LeCunNormal weights.
  EXPECT_TRUE(ArraysClose(lstm.upward->b.data(), gate_bias(4, 0.0, 1.0), 0, 0));
  EXPECT_GT(kusari::sum(kusari::abs(lstm.upward->W.data())).item<double>(), 0.0);
  EXPECT_GT(kusari::sum(kusari::abs(lstm.lateral->W.data())).item<double>(), 0.0);

  // Given initializers: weights filled in four blocks of out_size rows, as Chainer does.
  auto lateral_init = std::make_shared<RecordingInitializer>(0.5);
  auto upward_init = std::make_shared<RecordingInitializer>(0.25);
  L::LSTM given(3, 2, lateral_init, upward_init, std::make_shared<initializers::Constant>(-1.0),
                std::make_shared<initializers::Constant>(2.5));
  EXPECT_EQ(upward_init->shapes, (std::vector<Shape>(4, Shape{2, 3})));
  EXPECT_EQ(lateral_init->shapes, (std::vector<Shape>(4, Shape{2, 2})));
  EXPECT_TRUE(ArraysClose(given.upward->W.data(), Array::full({8, 3}, 0.25), 0, 0));
  EXPECT_TRUE(ArraysClose(given.lateral->W.data(), Array::full({8, 2}, 0.5), 0, 0));
  given.to_device(device());
  EXPECT_TRUE(ArraysClose(given.upward->b.data(), gate_bias(2, -1.0, 2.5), 0, 0));
}

TEST_P(LSTMLinkTest, LazyInSize) {
  L::LSTM lstm(4);
  lstm.to_device(device());
  EXPECT_FALSE(lstm.upward->W.is_initialized());
  EXPECT_EQ(testing::param_paths(lstm, false), (StrVec{"/upward/b", "/lateral/W"}));
  // As in Chainer, lateral/W and the bias keep their zero initial values until the first forward.
  EXPECT_TRUE(ArraysClose(lstm.lateral->W.data(), Array::zeros({16, 4}, float32, device()), 0, 0));
  EXPECT_TRUE(ArraysClose(lstm.upward->b.data(), Array::zeros({16}, float32, device()), 0, 0));
  Variable y = lstm(input({2, 3, 2}));  // features beyond the batch axis are flattened: in_size 6
  EXPECT_EQ(y.shape(), (Shape{2, 4}));
  EXPECT_EQ(lstm.upward->W.shape(), (Shape{16, 6}));
  EXPECT_EQ(lstm.upward->W.device(), device());
  EXPECT_TRUE(ArraysClose(lstm.upward->b.data(), gate_bias(4, 0.0, 1.0), 0, 0));
  EXPECT_GT(kusari::sum(kusari::abs(lstm.lateral->W.data())).item<double>(), 0.0);
  L::LSTM explicit_lazy(std::nullopt, 4);
  EXPECT_FALSE(explicit_lazy.upward->W.is_initialized());
}

TEST_P(LSTMLinkTest, StateOverStepsEqualsUnrolledFunctionCalls) {
  L::LSTM lstm(3, 4);
  lstm.to_device(device());
  testing::randomize_params(lstm, gen_);
  const Variable Wu = lstm.upward->W, bu = lstm.upward->b, Wl = lstm.lateral->W;
  std::vector<Array> xs = {input({2, 3}), input({2, 3}), input({2, 3})};

  Variable c(Array::zeros({2, 4}, float32, device())), h;
  for (size_t t = 0; t < xs.size(); ++t) {
    SCOPED_TRACE(t);
    Variable pre = F::linear(xs[t], Wu, bu);
    if (h.defined()) pre = pre + F::linear(h, Wl);
    std::tie(c, h) = F::lstm(c, pre);
    Variable y = lstm(xs[t]);
    EXPECT_TRUE(ArraysClose(y.data(), h.data(), 1e-6, 1e-7));
    EXPECT_TRUE(ArraysClose(lstm.h().data(), h.data(), 1e-6, 1e-7));
    EXPECT_TRUE(ArraysClose(lstm.c().data(), c.data(), 1e-6, 1e-7));
  }

  // reset_state forgets: the next step is the first step again.
  lstm.reset_state();
  EXPECT_FALSE(lstm.c().defined());
  EXPECT_FALSE(lstm.h().defined());
  auto [c1, h1] = F::lstm(Array::zeros({2, 4}, float32, device()), F::linear(xs[0], Wu, bu));
  EXPECT_TRUE(ArraysClose(lstm(xs[0]).data(), h1.data(), 1e-6, 1e-7));

  // set_state replaces the state.
  Variable c0(input({2, 4})), h0(input({2, 4}));
  lstm.set_state(c0, h0);
  auto [c2, h2] = F::lstm(c0, F::linear(xs[1], Wu, bu) + F::linear(h0, Wl));
  EXPECT_TRUE(ArraysClose(lstm(xs[1]).data(), h2.data(), 1e-6, 1e-7));
  EXPECT_TRUE(ArraysClose(lstm.c().data(), c2.data(), 1e-6, 1e-7));
}

TEST_P(LSTMLinkTest, ShrinkingBatchKeepsTheOtherRows) {
  L::LSTM lstm(3, 2);
  lstm.to_device(device());
  const Variable Wu = lstm.upward->W, bu = lstm.upward->b, Wl = lstm.lateral->W;
  Array x1 = input({3, 3}), x2 = input({2, 3});
  lstm(x1);
  Variable y2 = lstm(x2);

  auto [c1, h1] = F::lstm(Array::zeros({3, 2}, float32, device()), F::linear(x1, Wu, bu));
  Variable pre = F::linear(x2, Wu, bu) + F::linear(F::get_item(h1, {Slice(0, 2)}), Wl);
  auto [c2, h2] = F::lstm(c1, pre);  // rows beyond the batch pass through
  EXPECT_TRUE(ArraysClose(y2.data(), h2.data(), 1e-6, 1e-7));
  EXPECT_EQ(lstm.c().shape(), (Shape{3, 2}));
  EXPECT_TRUE(ArraysClose(lstm.c().data(), c2.data(), 1e-6, 1e-7));
  Variable h_expected = F::concat({h2, F::get_item(h1, {Slice(2, std::nullopt)})}, 0);
  EXPECT_TRUE(ArraysClose(lstm.h().data(), h_expected.data(), 1e-6, 1e-7));

  // A batch larger than the state's is an error.
  KUSARI_EXPECT_THROW_WITH(lstm(input({4, 3})), ShapeError, "LSTM", "batch size of x (4)", "(3)");
}

TEST_P(LSTMLinkTest, GradientsReachEveryParameter) {
  L::LSTM lstm(std::nullopt, 3);
  lstm.to_device(device());
  Variable x0(input({2, 5}), true);
  Variable loss = F::sum(lstm(x0));
  for (int t = 0; t < 2; ++t) loss = loss + F::sum(lstm(input({2, 5})) * Variable(input({2, 3})));
  loss.backward();
  testing::expect_grads_on_every_param(lstm);  // lateral/W through steps 2 and 3
  EXPECT_TRUE(x0.grad().defined());
}

TEST_P(LSTMLinkTest, NpzRoundTripIntoLazyInstance) {
  L::LSTM lstm(3, 4);
  lstm.to_device(device());
  testing::randomize_params(lstm, gen_);
  const testing::TempFile file("lstm.npz");
  const std::string& path = file.path;
  save_npz(path, lstm);
  EXPECT_EQ(testing::npz_keys(path), (StrVec{"lateral/W", "upward/W", "upward/b"}));

  L::LSTM fresh(4);
  fresh.to_device(device());
  load_npz(path, fresh);
  ASSERT_TRUE(fresh.upward->W.is_initialized());
  EXPECT_EQ(fresh.upward->W.shape(), (Shape{16, 3}));
  // The loaded values are not re-initialised by the first forward.
  for (int t = 0; t < 3; ++t) {
    Array x = input({2, 3});
    EXPECT_TRUE(ArraysClose(fresh(x).data(), lstm(x).data(), 0, 0)) << "step " << t;
  }
  EXPECT_TRUE(ArraysClose(fresh.upward->b.data(), lstm.upward->b.data(), 0, 0));
}

TEST_P(LSTMLinkTest, ToDeviceMovesTheState) {
  L::LSTM lstm(2, 3);
  Array x = Array::uniform({2, 2}, -1, 1, float32, Device::cpu(), &gen_);
  lstm(x);
  Array c_before = lstm.c().data();
  lstm.to_device(Device::cpu());
  EXPECT_TRUE(ArraysClose(lstm.c().data(), c_before, 0, 0));
  lstm.to_device(device());
  EXPECT_EQ(lstm.c().device(), device());
  EXPECT_EQ(lstm.h().device(), device());
  EXPECT_EQ(lstm.upward->W.device(), device());
  Variable y = lstm(x.to_device(device()));
  EXPECT_EQ(y.device(), device());
  // The state keeps its graph: the first step's input still gets a gradient.
  lstm.to_device(Device::cpu());
  lstm.reset_state();
  Variable x1(Array::uniform({2, 2}, -1, 1, float32, Device::cpu(), &gen_), true);
  lstm(x1);
  lstm.to_device(Device::cpu());
  F::sum(lstm(x)).backward();
  EXPECT_TRUE(x1.grad().defined());
}

TEST_P(LSTMLinkTest, Errors) {
  KUSARI_EXPECT_THROW_WITH(L::LSTM(0), ValueError, "LSTM", "out_size");
  KUSARI_EXPECT_THROW_WITH(L::LSTM(-1, 3), ValueError, "LSTM", "in_size", "-1");
  L::LSTM lstm(3, 2);
  lstm.to_device(device());
  KUSARI_EXPECT_THROW_WITH(lstm(input({3})), ShapeError, "LSTM", "(3,)");
  EXPECT_THROW(lstm(input({2, 4})), ShapeError);  // 4 features for in_size 3
  KUSARI_EXPECT_THROW_WITH(lstm.set_state(Variable(input({2, 3})), Variable(input({2, 3}))),
                           ShapeError, "LSTM::set_state", "(2, 3)");
  EXPECT_THROW(lstm.set_state(Variable(), Variable()), ValueError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(LSTMLinkTest);

}  // namespace
}  // namespace kusari
