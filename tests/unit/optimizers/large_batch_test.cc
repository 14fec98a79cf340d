// The large-minibatch pieces of the optimizers against hand-computed steps (double-precision
// references written here, independently of the optimizers): weight decay that leaves biases and
// normalisation parameters alone, Akiba et al.'s RMSprop warm-up and its transition curve, LARS
// and LAMB with their trust ratios and exclusions.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kusari/links/batch_normalization.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"
#include "kusari/optimizers/hooks.h"
#include "kusari/optimizers/lamb.h"
#include "kusari/optimizers/lars.h"
#include "kusari/optimizers/rmsprop_warmup.h"
#include "kusari/optimizers/sgd.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace O = optimizers;
using Vec = std::vector<double>;

/// A layer's weight "/l/W" (2x3) and bias "/l/b" (3).
struct Layer : Chain {
  std::shared_ptr<Chain> l;
  Parameter W, b;
  Layer(const Array& w0, const Array& b0) {
    l = add_link("l", std::make_shared<Chain>());
    W = l->add_param("W", Parameter(w0));
    b = l->add_param("b", Parameter(b0));
  }
};

const Vec kW0 = {0.5, -1.0, 2.0, 0.25, 0.0, -0.75};
const Vec kB0 = {0.1, -0.2, 0.3};
const std::vector<Vec> kGW = {{1.0, -2.0, 0.5, 0.0, 0.3, -0.1},
                              {-0.1, 0.05, 0.2, 0.3, -0.4, 0.6},
                              {0.02, 0.1, -0.3, -0.2, 0.1, 0.05}};
const std::vector<Vec> kGB = {{0.5, -0.5, 0.25}, {0.1, 0.2, -0.3}, {-0.05, 0.0, 0.4}};

double norm(const Vec& v) {
  return std::sqrt(std::inner_product(v.begin(), v.end(), v.begin(), 0.0));
}

class LargeBatchTest : public testing::DeviceTest {
 protected:
  Array make(const Vec& v, const Shape& shape) {
    return Array::from_vector(v, shape, device());
  }
  std::shared_ptr<Layer> layer() {
    return std::make_shared<Layer>(make(kW0, {2, 3}), make(kB0, {3}));
  }
  void set_grads(Layer& m, int step) {
    m.W.set_grad(make(kGW[step], {2, 3}));
    m.b.set_grad(make(kGB[step], {3}));
  }
  ::testing::AssertionResult close(const Array& a, const Vec& expected, const Shape& shape) {
    return testing::ArraysClose(a, make(expected, shape), 1e-12, 1e-14);
  }
};

// --- weight decay by kind ----------------------------------------------------------------------

TEST_P(LargeBatchTest, WeightDecayLeavesBiasesAndNormalisationAlone) {
  auto m = layer();
  O::SGD opt(0.1);
  opt.setup(m);
  opt.add_hook(std::make_shared<O::WeightDecay>(0.5, O::is_bias_or_norm));
  set_grads(*m, 0);
  opt.update();
  Vec w = kW0, b = kB0;
  for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.1 * (kGW[0][i] + 0.5 * kW0[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] -= 0.1 * kGB[0][i];  // no decay
  EXPECT_TRUE(close(m->W.data(), w, {2, 3}));
  EXPECT_TRUE(close(m->b.data(), b, {3}));
  // Without a predicate every parameter decays (the bias too).
  auto all = layer();
  O::SGD plain(0.1);
  plain.setup(all);
  plain.add_hook(std::make_shared<O::WeightDecay>(0.5));
  set_grads(*all, 0);
  plain.update();
  for (size_t i = 0; i < b.size(); ++i) b[i] = kB0[i] - 0.1 * (kGB[0][i] + 0.5 * kB0[i]);
  EXPECT_TRUE(close(all->b.data(), b, {3}));
}

TEST_P(LargeBatchTest, WeightDecayTakesAnyPredicateOnThePath) {
  auto m = layer();
  O::SGD opt(0.1);
  opt.setup(m);
  std::vector<std::string> asked;
  opt.add_hook(std::make_shared<O::WeightDecay>(
      0.5, [&](const std::string& path, const Parameter&) {
        asked.push_back(path);
        return path == "/l/W";  // the opposite of the usual choice
      }));
  set_grads(*m, 0);
  opt.update();
  EXPECT_EQ(asked, (std::vector<std::string>{"/l/W", "/l/b"}));
  Vec w = kW0, b = kB0;
  for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.1 * kGW[0][i];
  for (size_t i = 0; i < b.size(); ++i) b[i] -= 0.1 * (kGB[0][i] + 0.5 * kB0[i]);
  EXPECT_TRUE(close(m->W.data(), w, {2, 3}));
  EXPECT_TRUE(close(m->b.data(), b, {3}));
}

TEST_P(LargeBatchTest, IsBiasOrNormPicksBiasesGammaAndBeta) {
  auto net = std::make_shared<Chain>();
  net->add_link("fc", std::make_shared<links::Linear>(4, 3));
  net->add_link("bn", std::make_shared<links::BatchNormalization>(3));
  std::vector<std::string> picked;
  for (auto& [path, p] : net->namedparams(false)) {
    if (O::is_bias_or_norm(path, p)) picked.push_back(path);
  }
  std::sort(picked.begin(), picked.end());
  EXPECT_EQ(picked, (std::vector<std::string>{"/bn/beta", "/bn/gamma", "/fc/b"}));
}

// --- RMSprop warm-up ---------------------------------------------------------------------------

TEST(RMSpropWarmupTransitionTest, HandComputedWeights) {
  const O::RMSpropWarmupTransition tr{.center = 10, .period = 5};
  EXPECT_DOUBLE_EQ(tr(10.0), 0.5);
  EXPECT_DOUBLE_EQ(tr(11.0), 0.7);  // x = 2 (11 - 10) / 5 = 0.4: 0.4 / 2 + 1/2
  EXPECT_DOUBLE_EQ(tr(12.5), 1.0);
  EXPECT_DOUBLE_EQ(tr(40.0), 1.0);
  EXPECT_NEAR(tr(5.0), 0.5 * std::exp(-2.0), 1e-15);  // x = -2: (e^-2 - 1) / 2 + 1/2
  EXPECT_NEAR(tr(0.0), 0.5 * std::exp(-4.0), 1e-15);
  // Continuous at the centre and rising.
  EXPECT_NEAR(tr(10.0 - 1e-9), 0.5, 1e-8);
  EXPECT_LT(tr(9.0), tr(9.5));
  EXPECT_THROW((O::RMSpropWarmupTransition{.center = 1, .period = 0})(1.0), ValueError);
}

TEST_P(LargeBatchTest, RMSpropWarmupMatchesHandComputedSteps) {
  // lr 0.05, lr_rmsprop 0.002, momentum 0.8, alpha 0.9, eps 1e-2; the weight of SGD goes 0, 0.4, 1.
  const double weights[] = {0.0, 0.4, 1.0};
  for (bool grouped : {true, false}) {
    SCOPED_TRACE(grouped ? "grouped" : "one by one");
    auto m = layer();
    O::RMSpropWarmup opt(0.05, 0.002, 0.8, 0.9, 1e-2);
    opt.use_multi_tensor_update(grouped);
    opt.setup(m);
    Vec w = kW0, ms(6, 0.0), v(6, 0.0);
    for (int t = 0; t < 3; ++t) {
      opt.sgd_weight() = weights[t];
      set_grads(*m, t);
      opt.update();
      for (size_t i = 0; i < w.size(); ++i) {
        const double g = kGW[t][i];
        ms[i] = 0.9 * ms[i] + 0.1 * g * g;
        const double rate = weights[t] * 0.05 + (1 - weights[t]) * 0.002 / (std::sqrt(ms[i]) + 1e-2);
        v[i] = 0.8 * v[i] - rate * g;
        w[i] += v[i];
      }
      ASSERT_TRUE(close(m->W.data(), w, {2, 3})) << "step " << t + 1;
    }
    ParamState& s = opt.param_states().at(0);
    EXPECT_EQ(s.path, "/l/W");
    EXPECT_TRUE(close(s.get("ms"), ms, {2, 3}));
    EXPECT_TRUE(close(s.get("v"), v, {2, 3}));
    EXPECT_EQ(opt.last_update_calls(), grouped ? 1 : 2) << "both tensors in one fused call";
  }
  O::RMSpropWarmup bad;
  auto m = layer();
  bad.setup(m);
  bad.sgd_weight() = 1.5;
  set_grads(*m, 0);
  EXPECT_THROW(bad.update(), ValueError);
}

TEST_P(LargeBatchTest, RMSpropWarmupAtWeightOneIsMomentumSgd) {
  auto a = layer(), b = layer();
  O::RMSpropWarmup warm(0.05, 0.002, 0.9, 0.99, 1e-8, /*sgd_weight=*/1.0);
  O::MomentumSGD sgd(0.05, 0.9);
  warm.setup(a);
  sgd.setup(b);
  for (int t = 0; t < 3; ++t) {
    set_grads(*a, t);
    set_grads(*b, t);
    warm.update();
    sgd.update();
  }
  EXPECT_TRUE(testing::ArraysClose(a->W.data(), b->W.data(), 1e-15, 1e-15));
  EXPECT_TRUE(testing::ArraysClose(a->b.data(), b->b.data(), 1e-15, 1e-15));
}

// --- LARS --------------------------------------------------------------------------------------

TEST_P(LargeBatchTest, LARSMatchesHandComputedSteps) {
  const double lr = 0.5, mom = 0.9, wd = 0.01, eta = 0.02, eps = 1e-9;
  auto m = layer();
  O::LARS opt({.lr = lr, .momentum = mom, .weight_decay_rate = wd, .eta = eta, .eps = eps});
  opt.setup(m);
  Vec w = kW0, b = kB0, vw(6, 0.0), vb(3, 0.0);
  for (int t = 0; t < 3; ++t) {
    set_grads(*m, t);
    opt.update();
    // W: trust ratio and weight decay.
    const double trust = eta * norm(w) / (norm(kGW[t]) + wd * norm(w) + eps);
    for (size_t i = 0; i < w.size(); ++i) {
      vw[i] = mom * vw[i] - lr * trust * (kGW[t][i] + wd * w[i]);
    }
    for (size_t i = 0; i < w.size(); ++i) w[i] += vw[i];
    // b (1-d, excluded): plain momentum SGD.
    for (size_t i = 0; i < b.size(); ++i) {
      vb[i] = mom * vb[i] - lr * kGB[t][i];
      b[i] += vb[i];
    }
    ASSERT_TRUE(close(m->W.data(), w, {2, 3})) << "step " << t + 1;
    ASSERT_TRUE(close(m->b.data(), b, {3})) << "step " << t + 1;
  }
  EXPECT_TRUE(close(opt.param_states().at(0).get("v"), vw, {2, 3}));  // "/l/W" sorts first
  EXPECT_TRUE(close(opt.param_states().at(1).get("v"), vb, {3}));
}

TEST_P(LargeBatchTest, LARSWithoutExclusionAdaptsTheBiasToo) {
  auto m = layer();
  O::LARS opt({.lr = 0.5, .momentum = 0.0, .eta = 0.02, .exclude = nullptr});
  opt.setup(m);
  set_grads(*m, 0);
  opt.update();
  const double trust = 0.02 * norm(kB0) / (norm(kGB[0]) + 1e-9);
  Vec b = kB0;
  for (size_t i = 0; i < b.size(); ++i) b[i] -= 0.5 * trust * kGB[0][i];
  EXPECT_TRUE(close(m->b.data(), b, {3}));
}

TEST_P(LargeBatchTest, TrustRatioIsOneForZeroNorms) {
  // A weight of zeros (||w|| = 0) steps as momentum SGD instead of standing still forever.
  auto m = std::make_shared<Layer>(make(Vec(6, 0.0), {2, 3}), make(kB0, {3}));
  O::LARS opt({.lr = 0.5, .momentum = 0.0, .eta = 0.02});
  opt.setup(m);
  set_grads(*m, 0);
  opt.update();
  Vec w(6);
  for (size_t i = 0; i < w.size(); ++i) w[i] = -0.5 * kGW[0][i];
  EXPECT_TRUE(close(m->W.data(), w, {2, 3}));
  // A zero gradient without weight decay leaves the weight as it is (no NaN from 0 / 0).
  O::LAMB lamb({.lr = 0.1, .weight_decay_rate = 0.0});
  auto z = layer();
  lamb.setup(z);
  z->W.set_grad(make(Vec(6, 0.0), {2, 3}));
  z->b.set_grad(make(Vec(3, 0.0), {3}));
  lamb.update();
  EXPECT_TRUE(close(z->W.data(), kW0, {2, 3}));
}

// --- LAMB --------------------------------------------------------------------------------------

TEST_P(LargeBatchTest, LAMBMatchesHandComputedSteps) {
  const double lr = 0.1, b1 = 0.8, b2 = 0.9, eps = 1e-3, wd = 0.05;
  for (bool correct : {true, false}) {
    SCOPED_TRACE(correct ? "bias correction" : "no bias correction");
    auto m = layer();
    O::LAMB opt({.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay_rate = wd,
                 .bias_correction = correct});
    opt.setup(m);
    Vec w = kW0, b = kB0, mw(6, 0.0), vw(6, 0.0), mb(3, 0.0), vb(3, 0.0);
    for (int t = 1; t <= 3; ++t) {
      set_grads(*m, t - 1);
      opt.update();
      const double c1 = correct ? 1 - std::pow(b1, t) : 1.0;
      const double c2 = correct ? 1 - std::pow(b2, t) : 1.0;
      Vec r(6);
      for (size_t i = 0; i < w.size(); ++i) {
        const double g = kGW[t - 1][i];
        mw[i] = b1 * mw[i] + (1 - b1) * g;
        vw[i] = b2 * vw[i] + (1 - b2) * g * g;
        r[i] = (mw[i] / c1) / (std::sqrt(vw[i] / c2) + eps) + wd * w[i];
      }
      const double trust = norm(w) / norm(r);
      for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * trust * r[i];
      for (size_t i = 0; i < b.size(); ++i) {  // excluded: Adam's step, no decay, no ratio
        const double g = kGB[t - 1][i];
        mb[i] = b1 * mb[i] + (1 - b1) * g;
        vb[i] = b2 * vb[i] + (1 - b2) * g * g;
        b[i] -= lr * (mb[i] / c1) / (std::sqrt(vb[i] / c2) + eps);
      }
      ASSERT_TRUE(close(m->W.data(), w, {2, 3})) << "step " << t;
      ASSERT_TRUE(close(m->b.data(), b, {3})) << "step " << t;
    }
    ParamState& s = opt.param_states().at(0);
    EXPECT_EQ(s.path, "/l/W");
    EXPECT_TRUE(close(s.get("m"), mw, {2, 3}));
    EXPECT_TRUE(close(s.get("v"), vw, {2, 3}));
  }
}

TEST_P(LargeBatchTest, LARSAndLAMBTrainWithFloat32MasterWeights) {
  // A bfloat16 model under use_fp32_update: the step is computed on the float32 master copy.
  for (int which = 0; which < 2; ++which) {
    auto m = std::make_shared<Layer>(make(kW0, {2, 3}).astype(bfloat16),
                                     make(kB0, {3}).astype(bfloat16));
    std::unique_ptr<Optimizer> opt;
    if (which == 0) {
      opt = std::make_unique<O::LARS>(O::LARSOptions{.lr = 0.5, .eta = 0.02});
    } else {
      opt = std::make_unique<O::LAMB>(O::LAMBOptions{.lr = 0.1});
    }
    opt->use_fp32_update();
    opt->setup(m);
    set_grads(*m, 0);
    m->W.set_grad(m->W.grad().astype(bfloat16));
    m->b.set_grad(m->b.grad().astype(bfloat16));
    opt->update();
    ParamState& s = opt->param_states().at(0);
    ASSERT_NE(s.find("master"), nullptr) << opt->type_name();
    EXPECT_EQ(s.get("master").dtype(), float32);
    EXPECT_TRUE(testing::ArraysClose(m->W.data().astype(float32),
                                     s.get("master").astype(bfloat16).astype(float32), 0, 0));
    EXPECT_FALSE(testing::ArraysClose(s.get("master").astype(float64), make(kW0, {2, 3}), 0, 1e-6))
        << opt->type_name() << " did not step";
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(LargeBatchTest);

}  // namespace
}  // namespace kusari
