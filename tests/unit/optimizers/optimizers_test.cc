// Optimizers against hand-computed steps (double-precision references written here, independently
// of the kernels), the Optimizer base's protocol (hooks, loss scale, disabled updates, lazy
// parameters, update(lossfun), hyperparameter table, serialization) and a convergence check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"
#include "kusari/optimizers/adagrad.h"
#include "kusari/optimizers/adam.h"
#include "kusari/optimizers/hooks.h"
#include "kusari/optimizers/rmsprop.h"
#include "kusari/optimizers/sgd.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;
namespace O = optimizers;
using Vec = std::vector<double>;

// --- a minimal map-based serializer (npz lives elsewhere)
// ------------------------------------------

struct Store {
  std::map<std::string, Array> entries;
};

class MapSerializer : public Serializer {
 public:
  MapSerializer(std::shared_ptr<Store> store, bool loading, std::string prefix = "")
      : store_(std::move(store)), loading_(loading), prefix_(std::move(prefix)) {}
  using Serializer::operator();
  bool is_loading() const override { return loading_; }
  std::unique_ptr<Serializer> child(const std::string& name) override {
    return std::make_unique<MapSerializer>(store_, loading_, prefix_ + name + "/");
  }
  void operator()(const std::string& key, Array& value) override {
    const std::string k = prefix_ + key;
    if (!loading_) {
      store_->entries[k] = value.to_device(Device::cpu()).copy();
      return;
    }
    auto it = store_->entries.find(k);
    KUSARI_CHECK(it != store_->entries.end(), IOError, "MapSerializer: no entry '", k, "'");
    if (!value.defined()) {
      value = it->second.copy();
    } else {
      value.assign(it->second.to_device(value.device()));
    }
  }
  bool contains(const std::string& key) const override {
    return !loading_ || store_->entries.count(prefix_ + key) > 0;
  }
  std::string path() const override { return prefix_; }

 private:
  std::shared_ptr<Store> store_;
  bool loading_;
  std::string prefix_;
};

std::shared_ptr<Store> save(Serializable& obj) {
  auto store = std::make_shared<Store>();
  MapSerializer s(store, false);
  obj.serialize(s);
  return store;
}

void load(Serializable& obj, const std::shared_ptr<Store>& store) {
  MapSerializer s(store, true);
  obj.serialize(s);
}

// --- references
// --------------------------------------------------------------------------------------

// One step of a rule in double precision on the parameter p with gradient g; t is the step (>= 1).
using RefStep = std::function<void(Vec& p, const Vec& g, std::map<std::string, Vec>& st, int t)>;

struct OptCase {
  std::string name;
  std::function<std::unique_ptr<Optimizer>()> make;
  std::vector<std::string> state_names;
  RefStep ref;
};

double alpha_t(double alpha, double beta1, double beta2, int64_t t) {
  return alpha * std::sqrt(1.0 - std::pow(beta2, static_cast<double>(t))) /
         (1.0 - std::pow(beta1, static_cast<double>(t)));
}

RefStep adam_ref(double alpha, double b1, double b2, double eps, double eta, double wd, bool ams) {
  return [=](Vec& p, const Vec& g, std::map<std::string, Vec>& st, int t) {
    Vec& m = st["m"];
    Vec& v = st["v"];
    const double at = alpha_t(alpha, b1, b2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];  // the same moments, written as in the paper
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double denom_v = v[i];
      if (ams) {
        st["vhat"][i] = std::max(st["vhat"][i], v[i]);
        denom_v = st["vhat"][i];
      }
      p[i] = p[i] - eta * (at * m[i] / (std::sqrt(denom_v) + eps) + wd * p[i]);
    }
  };
}

std::vector<OptCase> opt_cases() {
  std::vector<OptCase> c;
  c.push_back({"SGD",
               [] { return std::make_unique<O::SGD>(0.1); },
               {},
               [](Vec& p, const Vec& g, auto&, int) {
                 for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.1 * g[i];
               }});
  c.push_back({"MomentumSGD",
               [] { return std::make_unique<O::MomentumSGD>(0.1, 0.8); },
               {"v"},
               [](Vec& p, const Vec& g, auto& st, int) {
                 for (size_t i = 0; i < p.size(); ++i) {
                   st["v"][i] = 0.8 * st["v"][i] - 0.1 * g[i];
                   p[i] += st["v"][i];
                 }
               }});
  c.push_back({"NesterovAG",
               [] { return std::make_unique<O::NesterovAG>(0.1, 0.8); },
               {"v"},
               [](Vec& p, const Vec& g, auto& st, int) {
                 // Nesterov with the look-ahead folded in: p_new = p + m^2 v_new - (1 + m) lr g.
                 for (size_t i = 0; i < p.size(); ++i) {
                   const double v_new = 0.8 * st["v"][i] - 0.1 * g[i];
                   p[i] = p[i] + 0.64 * v_new - 1.8 * 0.1 * g[i];
                   st["v"][i] = v_new;
                 }
               }});
  c.push_back({"Adam",
               [] { return std::make_unique<O::Adam>(0.01, 0.8, 0.9, 1e-3); },
               {"m", "v"},
               adam_ref(0.01, 0.8, 0.9, 1e-3, 1.0, 0.0, false)});
  c.push_back({"AdamEta",
               [] { return std::make_unique<O::Adam>(0.01, 0.8, 0.9, 1e-3, 0.5); },
               {"m", "v"},
               adam_ref(0.01, 0.8, 0.9, 1e-3, 0.5, 0.0, false)});
  c.push_back({"AMSGrad",
               [] {
                 return std::make_unique<O::Adam>(
                     O::AdamOptions{.alpha = 0.01, .beta2 = 0.5, .amsgrad = true});
               },
               {"m", "v", "vhat"},
               adam_ref(0.01, 0.9, 0.5, 1e-8, 1.0, 0.0, true)});
  c.push_back({"AdamW",
               [] { return std::make_unique<O::AdamW>(0.01, 0.9, 0.999, 1e-8, 0.5, 0.1); },
               {"m", "v"},
               adam_ref(0.01, 0.9, 0.999, 1e-8, 0.5, 0.1, false)});
  c.push_back({"RMSprop",
               [] { return std::make_unique<O::RMSprop>(0.01, 0.9, 1e-2); },
               {"ms"},
               [](Vec& p, const Vec& g, auto& st, int) {
                 for (size_t i = 0; i < p.size(); ++i) {
                   st["ms"][i] = 0.9 * st["ms"][i] + 0.1 * g[i] * g[i];
                   p[i] -= 0.01 * g[i] / (std::sqrt(st["ms"][i]) + 1e-2);
                 }
               }});
  c.push_back({"RMSpropEpsInsideSqrt",
               [] { return std::make_unique<O::RMSprop>(0.01, 0.9, 1e-2, true); },
               {"ms"},
               [](Vec& p, const Vec& g, auto& st, int) {
                 for (size_t i = 0; i < p.size(); ++i) {
                   st["ms"][i] = 0.9 * st["ms"][i] + 0.1 * g[i] * g[i];
                   p[i] -= 0.01 * g[i] / std::sqrt(st["ms"][i] + 1e-2);
                 }
               }});
  c.push_back({"AdaGrad",
               [] { return std::make_unique<O::AdaGrad>(0.1, 1e-2); },
               {"h"},
               [](Vec& p, const Vec& g, auto& st, int) {
                 for (size_t i = 0; i < p.size(); ++i) {
                   st["h"][i] += g[i] * g[i];
                   p[i] -= 0.1 * g[i] / (std::sqrt(st["h"][i]) + 1e-2);
                 }
               }});
  return c;
}

// Fixed parameter start and gradients: a large first gradient, then smaller ones (AMSGrad), a zero.
const Vec kStart = {0.5, -1.0, 2.0, 0.0};
const std::vector<Vec> kGrads = {
    {1.0, -2.0, 0.5, 0.0}, {-0.1, 0.05, 0.2, 0.3}, {0.02, 0.1, -0.3, -0.2}};

/// A chain with one child "l1" holding the parameter "w" (paths "/l1/w").
struct Holder : Chain {
  std::shared_ptr<Chain> l1;
  Parameter w;
  Holder(const Array& w0) {
    l1 = add_link("l1", std::make_shared<Chain>());
    w = l1->add_param("w", Parameter(w0));
  }
};

class OptimizersTest : public testing::DeviceTest {
 protected:
  Array make(const Vec& v, Dtype dtype = float64) {
    return Array::from_vector(v).astype(dtype).to_device(device());
  }
};

// --- known values of every rule
// ---------------------------------------------------------------------

TEST_P(OptimizersTest, EveryOptimizerMatchesHandComputedSteps) {
  for (Dtype dtype : {float64, float32}) {
    const double rtol = dtype == float64 ? 1e-12 : 2e-5, atol = dtype == float64 ? 1e-15 : 1e-7;
    for (const OptCase& c : opt_cases()) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      auto model = std::make_shared<Holder>(make(kStart, dtype));
      std::unique_ptr<Optimizer> opt = c.make();
      opt->setup(model);
      Vec p = kStart;
      std::map<std::string, Vec> st;
      for (const auto& n : c.state_names) st[n] = Vec(p.size(), 0.0);
      for (int t = 1; t <= 3; ++t) {
        Vec g = Array::from_vector(kGrads[t - 1]).astype(dtype).to_vector<double>();
        model->w.set_grad(make(g, dtype));
        opt->update();
        c.ref(p, g, st, t);
        EXPECT_EQ(opt->t(), t);
        ASSERT_TRUE(testing::ArraysClose(model->w.data(), make(p), rtol, atol)) << "step " << t;
      }
      ParamState& s = opt->param_states().at(0);
      EXPECT_EQ(s.path, "/l1/w");
      EXPECT_EQ(s.t, 3);
      ASSERT_EQ(s.arrays.size(), c.state_names.size());
      for (size_t k = 0; k < c.state_names.size(); ++k) {
        EXPECT_EQ(s.arrays[k].first, c.state_names[k]);
        EXPECT_TRUE(
            testing::ArraysClose(s.arrays[k].second, make(st[c.state_names[k]]), rtol, atol))
            << "state " << c.state_names[k];
      }
    }
  }
}

TEST_P(OptimizersTest, AdamBiasCorrectionOnTheFirstStep) {
  // After one step m = (1 - b1) g and v = (1 - b2) g^2, so the bias-corrected step is alpha sign(g)
  // up to eps: exactly what the correction is for.
  auto model = std::make_shared<Holder>(make({1.0, 1.0}));
  O::Adam opt(0.1, 0.9, 0.999, 0.0);
  opt.setup(model);
  model->w.set_grad(make({0.001, -30.0}));
  opt.update();
  EXPECT_TRUE(testing::ArraysClose(model->w.data(), make({0.9, 1.1}), 1e-12));
}

TEST_P(OptimizersTest, AdamLrIsChainersAlphaT) {
  auto model = std::make_shared<Holder>(make(kStart));
  O::Adam opt(0.01, 0.8, 0.9);
  opt.setup(model);
  // Before any step: the step size the first update will use.
  EXPECT_DOUBLE_EQ(opt.lr(), 0.01 * std::sqrt(1 - 0.9) / (1 - 0.8));
  double seen_in_post_hook = 0.0;
  struct Probe : OptimizerHook {
    double* out;
    explicit Probe(double* o) : out(o) {}
    const char* name() const override { return "Probe"; }
    Timing timing() const override { return Timing::kPost; }
    void operator()(Optimizer& o) override { *out = o.lr(); }
  };
  opt.add_hook(std::make_shared<Probe>(&seen_in_post_hook));
  for (int t = 1; t <= 4; ++t) {
    model->w.set_grad(make(kGrads[0]));
    opt.update();
    EXPECT_EQ(opt.t(), t);
    EXPECT_DOUBLE_EQ(opt.lr(), alpha_t(0.01, 0.8, 0.9, t));
    EXPECT_DOUBLE_EQ(opt.alpha_t(), opt.lr());
    EXPECT_DOUBLE_EQ(seen_in_post_hook, alpha_t(0.01, 0.8, 0.9, t));
  }
  const Optimizer& base = opt;
  EXPECT_DOUBLE_EQ(base.lr(), alpha_t(0.01, 0.8, 0.9, 4));
}

TEST_P(OptimizersTest, AdamWDecayIsDecoupledFromTheGradient) {
  // With a zero gradient the moments stay zero, so the whole step is the decay eta wd p.
  auto model = std::make_shared<Holder>(make({2.0, -4.0}));
  O::AdamW opt(0.001, 0.9, 0.999, 1e-8, 0.5, 0.1);
  opt.setup(model);
  model->w.set_grad(make({0.0, 0.0}));
  opt.update();
  EXPECT_TRUE(
      testing::ArraysClose(model->w.data(), make({2.0 - 0.05 * 2.0, -4.0 + 0.05 * 4.0}), 1e-14));
  // L2 through the gradient (WeightDecay) would instead be normalised away by Adam: the step is
  // alpha sign(p), not proportional to p.
  auto model2 = std::make_shared<Holder>(make({2.0, -4.0}));
  O::Adam adam(0.001, 0.9, 0.999, 0.0);
  adam.setup(model2);
  adam.add_hook(std::make_shared<O::WeightDecay>(0.1));
  model2->w.set_grad(make({0.0, 0.0}));
  adam.update();
  EXPECT_TRUE(testing::ArraysClose(model2->w.data(), make({2.0 - 0.001, -4.0 + 0.001}), 1e-12));
  EXPECT_EQ(std::string(opt.type_name()), "AdamW");
  EXPECT_EQ(opt.hyperparam("weight_decay_rate"), 0.1);
}

TEST_P(OptimizersTest, PerParameterWeightDecaySparesBiases) {
  // AdamW with decay 0.1, eta 0.5 and zero gradients: a step is the decay alone, so the matrix
  // shrinks by eta wd and the bias, exempted by is_bias_or_norm, stays as it was.
  auto model = std::make_shared<Chain>();
  auto l1 = model->add_link("l1", std::make_shared<links::Linear>(2, 2));
  l1->to_device(device());
  l1->W.set_data(make({1.0, 2.0, 3.0, 4.0}, float32).reshape({2, 2}));
  l1->b.set_data(make({5.0, 6.0}, float32));
  O::AdamW opt(0.001, 0.9, 0.999, 1e-8, 0.5, 0.1);
  opt.setup(model);
  opt.set_hyperparam_where("weight_decay_rate", 0.0, O::is_bias_or_norm);
  l1->W.set_grad(Array::zeros({2, 2}, float32, device()));
  l1->b.set_grad(Array::zeros({2}, float32, device()));
  opt.update();
  EXPECT_TRUE(testing::ArraysClose(l1->W.data(), make({0.95, 1.9, 2.85, 3.8}, float32).reshape({2, 2}), 1e-6));
  EXPECT_TRUE(testing::ArraysClose(l1->b.data(), make({5.0, 6.0}, float32), 0));
  // The optimizer's own value is untouched; the last rule that picks a parameter wins.
  EXPECT_EQ(opt.weight_decay_rate(), 0.1);
  opt.set_hyperparam_where("weight_decay_rate", 0.2, [](const std::string& path, const Parameter&) {
    return path == "/l1/b";
  });
  for (auto& st : opt.param_states()) {
    EXPECT_EQ(opt.hyperparam_for(st, "weight_decay_rate"), st.path == "/l1/b" ? 0.2 : 0.1) << st.path;
  }
}

TEST_P(OptimizersTest, PerParameterBetasAlsoCorrectTheirBias) {
  // One parameter with its own betas steps exactly as an Adam with those betas would.
  auto with_rule = std::make_shared<Holder>(make(kStart));
  auto alone = std::make_shared<Holder>(make(kStart));
  O::Adam a(0.01), b(0.01, 0.5, 0.7);
  a.setup(with_rule);
  b.setup(alone);
  a.set_hyperparam_where("beta1", 0.5, [](const std::string&, const Parameter&) { return true; });
  a.set_hyperparam_where("beta2", 0.7, [](const std::string&, const Parameter&) { return true; });
  for (const Vec& g : kGrads) {
    with_rule->w.set_grad(make(g));
    alone->w.set_grad(make(g));
    a.update();
    b.update();
    EXPECT_TRUE(testing::ArraysClose(with_rule->w.data(), alone->w.data(), 1e-14, 0));
  }
}

TEST(OptimizerHyperparams, PerParameterValuesOnlyWhereTheRuleReadsThem) {
  O::Adam adam;
  try {
    adam.set_hyperparam_where("alpha", 0.0, O::is_bias_or_norm);
    FAIL() << "alpha is read once per step";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("Adam: set_hyperparam_where('alpha'): Adam reads 'alpha' once for all "
                                         "parameters; it reads per parameter: beta1, beta2, eps, eta, "
                                         "weight_decay_rate"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(adam.set_hyperparam_where("momentum", 0.0, O::is_bias_or_norm), ValueError);
  O::SGD sgd;
  EXPECT_THROW(sgd.set_hyperparam_where("lr", 0.0, O::is_bias_or_norm), ValueError);
  EXPECT_THROW(adam.set_hyperparam_where("eps", 0.0, nullptr), ValueError);
}

TEST_P(OptimizersTest, AmsgradSwitchedOnLaterGainsVhat) {
  auto model = std::make_shared<Holder>(make(kStart));
  O::Adam opt;
  opt.setup(model);
  model->w.set_grad(make(kGrads[0]));
  opt.update();
  EXPECT_EQ(opt.param_states()[0].find("vhat"), nullptr);
  opt.set_amsgrad(true);
  EXPECT_TRUE(opt.amsgrad());
  model->w.set_grad(make(kGrads[1]));
  opt.update();
  ASSERT_NE(opt.param_states()[0].find("vhat"), nullptr);
  EXPECT_TRUE(
      testing::ArraysClose(*opt.param_states()[0].find("vhat"), opt.param_states()[0].get("v")));
}

// --- the hyperparameter table
// -------------------------------------------------------------------------

TEST_P(OptimizersTest, HyperparameterTableIsTheSourceOfTruth) {
  auto model = std::make_shared<Holder>(make({1.0}));
  O::MomentumSGD opt;
  EXPECT_EQ(opt.lr(), 0.01);
  EXPECT_EQ(opt.momentum(), 0.9);
  EXPECT_EQ(opt.hyperparam_names(), (std::vector<std::string>{"lr", "momentum"}));
  opt.setup(model);
  opt.hyperparam("lr") = 0.5;  // what ExponentialShift("lr", ...) does
  opt.momentum() = 0.0;
  EXPECT_EQ(opt.lr(), 0.5);
  const Optimizer& base = opt;
  EXPECT_EQ(base.lr(), 0.5);
  model->w.set_grad(make({2.0}));
  opt.update();
  EXPECT_DOUBLE_EQ(model->w.data().item<double>(), 0.0);
  EXPECT_TRUE(opt.has_hyperparam("momentum"));
  EXPECT_FALSE(opt.has_hyperparam("alpha"));
}

TEST(OptimizerHyperparams, DefaultsFollowChainer) {
  EXPECT_EQ(O::SGD().lr(), 0.01);
  EXPECT_EQ(O::MomentumSGD().lr(), 0.01);
  EXPECT_EQ(O::MomentumSGD().momentum(), 0.9);
  EXPECT_EQ(O::NesterovAG().lr(), 0.01);
  EXPECT_EQ(O::NesterovAG().momentum(), 0.9);
  O::Adam adam;
  EXPECT_EQ(adam.hyperparam_names(),
            (std::vector<std::string>{"alpha", "beta1", "beta2", "eps", "eta", "weight_decay_rate",
                                      "amsgrad"}));
  EXPECT_EQ(adam.alpha(), 0.001);
  EXPECT_EQ(adam.beta1(), 0.9);
  EXPECT_EQ(adam.beta2(), 0.999);
  EXPECT_EQ(adam.eps(), 1e-8);
  EXPECT_EQ(adam.eta(), 1.0);
  EXPECT_EQ(adam.weight_decay_rate(), 0.0);
  EXPECT_FALSE(adam.amsgrad());
  EXPECT_EQ(O::AdamW().weight_decay_rate(), 0.0);
  EXPECT_EQ(O::RMSprop().lr(), 0.01);
  EXPECT_EQ(O::RMSprop().alpha(), 0.99);
  EXPECT_EQ(O::RMSprop().eps(), 1e-8);
  EXPECT_FALSE(O::RMSprop().eps_inside_sqrt());
  EXPECT_EQ(O::AdaGrad().lr(), 0.001);
  EXPECT_EQ(O::AdaGrad().eps(), 1e-8);
  O::Adam from_options(O::AdamOptions{.alpha = 0.5, .amsgrad = true});
  EXPECT_EQ(from_options.alpha(), 0.5);
  EXPECT_EQ(from_options.beta2(), 0.999);
  EXPECT_TRUE(from_options.amsgrad());
}

TEST(OptimizerHyperparams, UnknownNameListsTheValidOnes) {
  O::Adam adam;
  try {
    adam.hyperparam("nonexistent");
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Adam"), std::string::npos) << msg;
    EXPECT_NE(msg.find("nonexistent"), std::string::npos) << msg;
    for (const char* n :
         {"alpha", "beta1", "beta2", "eps", "eta", "weight_decay_rate", "amsgrad"}) {
      EXPECT_NE(msg.find(n), std::string::npos) << n << " missing from: " << msg;
    }
  }
  O::SGD sgd;
  EXPECT_THROW(sgd.hyperparam("momentum"), ValueError);
  const Optimizer& c = sgd;
  EXPECT_THROW(c.hyperparam("alpha"), ValueError);
}

// --- hooks
// ------------------------------------------------------------------------------------------------

TEST_P(OptimizersTest, WeightDecayAddsRateTimesParameter) {
  auto model = std::make_shared<Holder>(make({1.0, -2.0, 0.0}));
  O::SGD opt(0.1);
  opt.setup(model);
  opt.add_hook(std::make_shared<O::WeightDecay>(0.5));
  model->w.set_grad(make({0.2, 0.2, 0.2}));
  opt.update();
  // p - lr (g + rate p)
  EXPECT_TRUE(testing::ArraysClose(
      model->w.data(), make({1.0 - 0.1 * (0.2 + 0.5), -2.0 - 0.1 * (0.2 - 1.0), 0.0 - 0.1 * 0.2}),
      1e-14));
}

TEST_P(OptimizersTest, LassoAddsRateTimesSign) {
  auto model = std::make_shared<Holder>(make({1.0, -2.0, 0.0}));
  O::SGD opt(0.1);
  opt.setup(model);
  opt.add_hook(std::make_shared<O::Lasso>(0.5));
  model->w.set_grad(make({0.2, 0.2, 0.2}));
  opt.update();
  EXPECT_TRUE(testing::ArraysClose(
      model->w.data(), make({1.0 - 0.1 * (0.2 + 0.5), -2.0 - 0.1 * (0.2 - 0.5), 0.0 - 0.1 * 0.2}),
      1e-14));
}

TEST_P(OptimizersTest, GradientClippingScalesByTheGlobalNorm) {
  // Two parameters whose gradients (3, 0) and (0, 4) have global norm 5.
  auto model = std::make_shared<Chain>();
  Parameter a = model->add_param("a", Parameter(make({0.0, 0.0})));
  Parameter b = model->add_param("b", Parameter(make({0.0, 0.0})));
  O::SGD opt(1.0);
  opt.setup(model);
  auto clip = std::make_shared<O::GradientClipping>(1.0);
  opt.add_hook(clip);
  a.set_grad(make({3.0, 0.0}));
  b.set_grad(make({0.0, 4.0}));
  EXPECT_DOUBLE_EQ(O::gradient_norm(opt), 5.0);
  opt.update();
  EXPECT_TRUE(testing::ArraysClose(a.data(), make({-0.6, 0.0}), 1e-14));
  EXPECT_TRUE(testing::ArraysClose(b.data(), make({0.0, -0.8}), 1e-14));
  // Below the threshold nothing changes.
  clip->threshold = 10.0;
  a.set_grad(make({3.0, 0.0}));
  b.set_grad(make({0.0, 4.0}));
  opt.update();
  EXPECT_TRUE(testing::ArraysClose(a.data(), make({-3.6, 0.0}), 1e-14));
  EXPECT_TRUE(testing::ArraysClose(b.data(), make({0.0, -4.8}), 1e-14));
  EXPECT_THROW(O::GradientClipping(-1.0), ValueError);
}

TEST_P(OptimizersTest, GradientHardClippingClipsEachElement) {
  auto model = std::make_shared<Holder>(make({0.0, 0.0, 0.0, 0.0}));
  O::SGD opt(1.0);
  opt.setup(model);
  opt.add_hook(std::make_shared<O::GradientHardClipping>(-0.5, 0.25));
  model->w.set_grad(make({-2.0, -0.1, 0.1, 3.0}));
  opt.update();
  EXPECT_TRUE(testing::ArraysClose(model->w.data(), make({0.5, 0.1, -0.1, -0.25}), 1e-14));
  EXPECT_THROW(O::GradientHardClipping(1.0, -1.0), ValueError);
}

TEST_P(OptimizersTest, HooksHaveChainersNamesTimingAndOrder) {
  O::WeightDecay wd(0.1);
  O::Lasso lasso(0.1);
  O::GradientClipping gc(1.0);
  O::GradientHardClipping ghc(-1.0, 1.0);
  EXPECT_STREQ(wd.name(), "WeightDecay");
  EXPECT_STREQ(lasso.name(), "Lasso");
  EXPECT_STREQ(gc.name(), "GradientClipping");
  EXPECT_STREQ(ghc.name(), "GradientHardClipping");
  for (OptimizerHook* h : std::vector<OptimizerHook*>{&wd, &lasso, &gc, &ghc}) {
    EXPECT_EQ(h->timing(), OptimizerHook::Timing::kPre);
  }
  // Hooks run in registration order: clip to 1, then decay (g = 1 + 0.5 * 4 = 3): p = 4 - 3.
  auto model = std::make_shared<Holder>(make({4.0}));
  O::SGD opt(1.0);
  opt.setup(model);
  opt.add_hook(std::make_shared<O::GradientHardClipping>(-1.0, 1.0));
  opt.add_hook(std::make_shared<O::WeightDecay>(0.5));
  EXPECT_THROW(opt.add_hook(std::make_shared<O::WeightDecay>(0.5)), ValueError);  // duplicate name
  model->w.set_grad(make({10.0}));
  opt.update();
  EXPECT_DOUBLE_EQ(model->w.data().item<double>(), 1.0);
  opt.remove_hook("WeightDecay");
  EXPECT_THROW(opt.remove_hook("WeightDecay"), ValueError);
}

TEST_P(OptimizersTest, PreHooksSeeTheOldStepCountPostHooksTheNewOne) {
  struct Probe : OptimizerHook {
    Timing when;
    std::vector<int64_t>* log;
    Probe(Timing w, std::vector<int64_t>* l) : when(w), log(l) {}
    const char* name() const override { return when == Timing::kPre ? "pre" : "post"; }
    Timing timing() const override { return when; }
    void operator()(Optimizer& o) override { log->push_back(o.t()); }
  };
  std::vector<int64_t> pre, post;
  auto model = std::make_shared<Holder>(make({1.0}));
  O::SGD opt;
  opt.setup(model);
  opt.add_hook(std::make_shared<Probe>(OptimizerHook::Timing::kPre, &pre));
  opt.add_hook(std::make_shared<Probe>(OptimizerHook::Timing::kPost, &post));
  for (int i = 0; i < 2; ++i) {
    model->w.set_grad(make({1.0}));
    opt.update();
  }
  EXPECT_EQ(pre, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(post, (std::vector<int64_t>{1, 2}));
}

// --- loss scale, disabled updates, lazy parameters, update(lossfun)
// ---------------------------------------

TEST_P(OptimizersTest, LossScaleIsDividedOutBeforeHooksAndUpdates) {
  // loss = sum(w * c): the gradient is c; with loss scale 8, backward produces 8 c.
  const Vec c = {1.0, -2.0, 0.5};
  for (bool through_lossfun : {true, false}) {
    SCOPED_TRACE(through_lossfun ? "update(lossfun)" : "backward(loss_scale) + update()");
    auto model = std::make_shared<Holder>(make({1.0, 1.0, 1.0}));
    O::SGD opt(0.1);
    opt.setup(model);
    opt.add_hook(std::make_shared<O::GradientHardClipping>(-1.5, 1.5));  // would clip 8 c, not c
    auto lossfun = [&] { return F::sum(F::mul(model->w, Variable(make(c)))); };
    if (through_lossfun) {
      opt.set_loss_scale(8.0);
      opt.update(lossfun);
    } else {
      BackwardOptions o;
      o.loss_scale = 8.0;
      lossfun().backward(o);
      EXPECT_TRUE(testing::ArraysClose(model->w.grad(), make({8.0, -16.0, 4.0})));
      opt.update();
    }
    EXPECT_TRUE(
        testing::ArraysClose(model->w.data(), make({1.0 - 0.1, 1.0 + 0.15, 1.0 - 0.05}), 1e-14));
    EXPECT_TRUE(testing::ArraysClose(model->w.grad(), make({1.0, -1.5, 0.5}), 1e-14));
  }
}

TEST_P(OptimizersTest, DisabledUpdateLeavesParametersAndStateUntouched) {
  for (const OptCase& c : opt_cases()) {
    SCOPED_TRACE(c.name);
    auto model = std::make_shared<Chain>();
    auto l1 = model->add_link("l1", std::make_shared<Chain>());
    auto l2 = model->add_link("l2", std::make_shared<Chain>());
    Parameter a = l1->add_param("w", Parameter(make({1.0, 2.0})));
    Parameter b = l2->add_param("w", Parameter(make({3.0, 4.0})));
    l2->disable_update();
    std::unique_ptr<Optimizer> opt = c.make();
    opt->setup(model);
    for (int t = 0; t < 2; ++t) {
      a.set_grad(make({0.5, 0.5}));
      b.set_grad(make({0.5, 0.5}));
      opt->update();
    }
    EXPECT_TRUE(array_equal(b.data(), make({3.0, 4.0})));
    EXPECT_FALSE(array_equal(a.data(), make({1.0, 2.0})));
    auto& states = opt->param_states();
    ASSERT_EQ(states.size(), 2u);
    EXPECT_EQ(states[1].path, "/l2/w");
    EXPECT_FALSE(states[1].initialized);
    EXPECT_EQ(states[1].t, 0);
    EXPECT_EQ(states[0].t, 2);
    // Re-enabling resumes updates from a fresh state.
    l2->enable_update();
    b.set_grad(make({0.5, 0.5}));
    a.cleargrad();
    opt->update();
    EXPECT_FALSE(array_equal(b.data(), make({3.0, 4.0})));
    EXPECT_EQ(states[0].t, 2);  // no gradient: skipped
    EXPECT_EQ(states[1].t, 1);
  }
}

TEST_P(OptimizersTest, LazilyInitialisedParametersGetStateAfterTheirFirstForward) {
  auto model = std::make_shared<Chain>();
  auto l1 = model->add_link("l1", std::make_shared<links::Linear>(3));
  model->to_device(device());
  O::Adam opt;
  opt.setup(model);
  ASSERT_EQ(opt.param_states().size(), 1u);  // only the bias has a shape yet
  EXPECT_EQ(opt.param_states()[0].path, "/l1/b");
  Array x = Array::uniform({5, 4}, -1, 1, float32, device());
  opt.update([&] { return F::sum(F::square((*l1)(Variable(x)))); });
  auto& states = opt.param_states();
  ASSERT_EQ(states.size(), 2u);
  EXPECT_EQ(states[0].path, "/l1/W");
  EXPECT_EQ(states[1].path, "/l1/b");
  for (auto& s : states) {
    EXPECT_TRUE(s.initialized);
    EXPECT_EQ(s.t, 1);
    EXPECT_EQ(s.get("m").shape(), s.param.shape());
    EXPECT_EQ(s.get("m").device(), device());
  }
  EXPECT_EQ(states[0].param.shape(), (Shape{3, 4}));
}

TEST_P(OptimizersTest, UpdateWithLossfunClearsOldGradientsFirst) {
  auto model = std::make_shared<Holder>(make({1.0, 2.0}));
  O::SGD opt(0.5);
  opt.setup(model);
  model->w.set_grad(make({100.0, 100.0}));  // stale: must not be accumulated into
  int calls = 0;
  opt.update([&] {
    ++calls;
    return F::sum(F::mul(model->w, Variable(make({1.0, -1.0}))));
  });
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(testing::ArraysClose(model->w.grad(), make({1.0, -1.0})));
  EXPECT_TRUE(testing::ArraysClose(model->w.data(), make({0.5, 2.5}), 1e-14));
  EXPECT_EQ(opt.t(), 1);
}

TEST_P(OptimizersTest, UsingAnOptimizerBeforeSetupIsAClearError) {
  O::SGD opt;
  EXPECT_THROW(opt.update(), ValueError);
  EXPECT_THROW(opt.update([] { return Variable(); }), ValueError);
  EXPECT_THROW(opt.setup(nullptr), ValueError);
}

// --- serialization
// ------------------------------------------------------------------------------------------

TEST_P(OptimizersTest, SerializedKeysFollowChainersLayout) {
  auto model = std::make_shared<Holder>(make(kStart));
  O::Adam opt(O::AdamOptions{.amsgrad = true});
  opt.setup(model);
  model->w.set_grad(make(kGrads[0]));
  opt.update();
  opt.new_epoch();
  auto store = save(opt);
  std::set<std::string> keys;
  for (auto& [k, v] : store->entries) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"t", "epoch", "l1/w/t", "l1/w/m", "l1/w/v", "l1/w/vhat"}));
  EXPECT_EQ(store->entries["t"].item<int64_t>(), 1);
  EXPECT_EQ(store->entries["epoch"].item<int64_t>(), 1);
  EXPECT_EQ(store->entries["l1/w/t"].item<int64_t>(), 1);
}

// Trains `model` with `opt` for `steps` steps with fixed gradients.
void take_steps(Holder& model, Optimizer& opt, int from, int to, Device device) {
  for (int t = from; t < to; ++t) {
    model.w.set_grad(
        Array::from_vector(kGrads[t % kGrads.size()]).astype(model.w.dtype()).to_device(device));
    opt.update();
  }
}

TEST_P(OptimizersTest, RestoredOptimizerTakesTheSameNextStepBitForBit) {
  for (Dtype dtype : {float32, float64}) {
    for (const OptCase& c : opt_cases()) {
      SCOPED_TRACE(c.name + " " + dtype_name(dtype));
      auto model_a = std::make_shared<Holder>(make(kStart, dtype));
      auto opt_a = c.make();
      opt_a->setup(model_a);
      opt_a->add_hook(std::make_shared<O::WeightDecay>(1e-3));
      take_steps(*model_a, *opt_a, 0, 2, device());
      auto opt_store = save(*opt_a);
      auto model_store = save(*model_a);

      auto model_b = std::make_shared<Holder>(make({9, 9, 9, 9}, dtype));
      auto opt_b = c.make();
      opt_b->setup(model_b);
      opt_b->add_hook(std::make_shared<O::WeightDecay>(1e-3));
      load(*opt_b, opt_store);
      load(*model_b, model_store);
      EXPECT_EQ(opt_b->t(), 2);
      EXPECT_EQ(opt_b->lr(), opt_a->lr());

      take_steps(*model_a, *opt_a, 2, 4, device());
      take_steps(*model_b, *opt_b, 2, 4, device());
      EXPECT_TRUE(array_equal(model_a->w.data(), model_b->w.data()))
          << model_a->w.data() << " vs " << model_b->w.data();
      auto& sa = opt_a->param_states()[0];
      auto& sb = opt_b->param_states()[0];
      EXPECT_EQ(sa.t, sb.t);
      ASSERT_EQ(sa.arrays.size(), sb.arrays.size());
      for (size_t k = 0; k < sa.arrays.size(); ++k) {
        EXPECT_EQ(sa.arrays[k].first, sb.arrays[k].first);
        EXPECT_TRUE(array_equal(sa.arrays[k].second, sb.arrays[k].second)) << sa.arrays[k].first;
      }
    }
  }
}

TEST_P(OptimizersTest, StateOfLazyParametersSurvivesLoadingBeforeTheModel) {
  // The updater loads the optimizer before the model (Chainer's order). With a lazily sized
  // Linear, W has no data when the optimizer state is read; it must still be restored.
  auto make_model = [&] {
    auto m = std::make_shared<Chain>();
    m->add_link("l1", std::make_shared<links::Linear>(2));
    m->to_device(device());
    return m;
  };
  Array x = Array::uniform({3, 4}, -1, 1, float32, device());
  auto loss_of = [&](Chain& m) {
    return [&m, x] {
      return F::sum(F::square(static_cast<Link&>(*m.children()[0].second)(Variable(x))));
    };
  };
  auto model_a = make_model();
  O::Adam opt_a(0.05);
  opt_a.setup(model_a);
  for (int i = 0; i < 3; ++i) opt_a.update(loss_of(*model_a));
  auto opt_store = save(opt_a);
  auto model_store = save(*model_a);

  auto model_b = make_model();
  O::Adam opt_b(0.05);
  opt_b.setup(model_b);
  load(opt_b, opt_store);       // W has no data yet
  load(*model_b, model_store);  // now it has
  // Saving before the first step keeps the pending state too.
  auto resaved = save(opt_b);
  EXPECT_EQ(resaved->entries.count("l1/W/m"), 1u);

  opt_a.update(loss_of(*model_a));
  opt_b.update(loss_of(*model_b));
  auto pa = model_a->namedparams(), pb = model_b->namedparams();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(array_equal(pa[i].second.data(), pb[i].second.data())) << pa[i].first;
  }
  auto& sb = opt_b.param_states();
  ASSERT_EQ(sb.size(), 2u);
  EXPECT_EQ(sb[0].path, "/l1/W");
  EXPECT_EQ(sb[0].t, 4);
  EXPECT_EQ(sb[0].get("m").device(), device());
}

TEST_P(OptimizersTest, MixedPrecisionStateSurvivesASnapshot) {
  // 16-bit parameters under use_fp32_update: the float32 master copies and float32 moments are
  // saved and restored, for a lazily sized W (loaded before the model has data) and for sized ones.
  for (Dtype dtype : {bfloat16, float16}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto make_model = [&](uint64_t seed) {
      manual_seed(seed);
      auto m = std::make_shared<Chain>();
      m->add_link("l1", std::make_shared<links::Linear>(3));
      m->add_link("l2", std::make_shared<links::Linear>(3, 2));
      m->to_device(device());
      m->to_dtype(dtype);
      return m;
    };
    auto make_opt = [&](std::shared_ptr<Chain> m) {
      auto opt = std::make_shared<O::Adam>(0.01);
      opt->setup(m);
      opt->use_fp32_update();
      if (dtype == float16) opt->loss_scaling(1000, 256.0);
      return opt;
    };
    const Array x = Array::uniform({5, 4}, -1, 1, float32, device()).astype(dtype);
    auto loss_of = [&](Chain& m) {
      return [&m, x] {
        Variable h = static_cast<Link&>(*m.children()[0].second)(Variable(x));
        h = static_cast<Link&>(*m.children()[1].second)(h);
        return F::sum(F::square(F::cast(h, float32)));
      };
    };
    auto model_a = make_model(1);
    auto opt_a = make_opt(model_a);
    for (int i = 0; i < 3; ++i) opt_a->update(loss_of(*model_a));
    auto opt_store = save(*opt_a);
    auto model_store = save(*model_a);
    EXPECT_EQ(opt_store->entries.count("l1/W/master"), 1u);
    EXPECT_EQ(opt_store->entries.at("l2/W/m").dtype(), float32);

    auto model_b = make_model(2);
    auto opt_b = make_opt(model_b);
    load(*opt_b, opt_store);  // l1/W has no data yet
    load(*model_b, model_store);
    opt_a->update(loss_of(*model_a));
    opt_b->update(loss_of(*model_b));
    auto pa = model_a->namedparams(), pb = model_b->namedparams();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pb[i].second.dtype(), dtype) << pa[i].first;
      EXPECT_TRUE(array_equal(pa[i].second.data(), pb[i].second.data())) << pa[i].first;
    }
    auto& sa = opt_a->param_states();
    auto& sb = opt_b->param_states();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sb.size(); ++i) {
      ASSERT_EQ(sa[i].path, sb[i].path);
      ASSERT_EQ(sb[i].arrays.size(), 3u) << sb[i].path;  // master, m, v
      for (const auto& [name, a] : sb[i].arrays) {
        EXPECT_EQ(a.dtype(), float32) << sb[i].path << "/" << name;
        EXPECT_TRUE(array_equal(a, sa[i].get(name))) << sb[i].path << "/" << name;
      }
    }

    // A snapshot saved without master copies: the moments are widened and the master copies are
    // made from the parameters as loaded.
    auto model_c = make_model(1);
    auto opt_c = std::make_shared<O::Adam>(0.01);
    opt_c->setup(model_c);
    opt_c->update(loss_of(*model_c));
    opt_c->update(loss_of(*model_c));
    auto plain_opt = save(*opt_c);
    auto plain_model = save(*model_c);
    auto model_d = make_model(3);
    auto opt_d = make_opt(model_d);
    load(*opt_d, plain_opt);
    load(*model_d, plain_model);
    const Array w_loaded = model_d->namedparams()[2].second.data().astype(float32);  // /l2/W
    opt_d->update(loss_of(*model_d));
    EXPECT_EQ(opt_d->t(), 3);
    for (ParamState& st : opt_d->param_states()) {
      ASSERT_NE(st.find("master"), nullptr) << st.path;
      EXPECT_EQ(st.get("m").dtype(), float32) << st.path;
    }
    EXPECT_TRUE(testing::ArraysClose(opt_d->param_states()[2].get("master"), w_loaded, 0, 0.05));
  }
}

// --- convergence
// --------------------------------------------------------------------------------------------

TEST_P(OptimizersTest, LinearRegressionConvergesWithEveryOptimizer) {
  Generator gen(7);
  Array x = Array::uniform({64, 3}, -1, 1, float32, device(), &gen);
  Array w_true = Array::from({1.5, -2.0, 0.5}, Shape{3, 1}).to_device(device());
  Array y = matmul(x, w_true) + 0.3;
  struct Conv {
    std::string name;
    std::function<std::unique_ptr<Optimizer>()> make;
  };
  std::vector<Conv> cases = {
      {"SGD", [] { return std::make_unique<O::SGD>(0.1); }},
      {"MomentumSGD", [] { return std::make_unique<O::MomentumSGD>(0.05); }},
      {"NesterovAG", [] { return std::make_unique<O::NesterovAG>(0.05); }},
      {"Adam", [] { return std::make_unique<O::Adam>(0.05); }},
      {"AMSGrad",
       [] { return std::make_unique<O::Adam>(O::AdamOptions{.alpha = 0.05, .amsgrad = true}); }},
      {"AdamW", [] { return std::make_unique<O::AdamW>(0.05, 0.9, 0.999, 1e-8, 1.0, 1e-4); }},
      {"RMSprop", [] { return std::make_unique<O::RMSprop>(0.01); }},
      {"AdaGrad", [] { return std::make_unique<O::AdaGrad>(0.3); }},
  };
  for (const Conv& c : cases) {
    SCOPED_TRACE(c.name);
    auto model =
        std::make_shared<links::Linear>(3, 1, false, std::make_shared<initializers::Constant>(0.0));
    model->to_device(device());
    auto opt = c.make();
    opt->setup(model);
    auto lossfun = [&] {
      Variable d = (*model)(Variable(x)) - Variable(y);
      return F::mean(F::square(d));
    };
    const double initial = lossfun().data().item<double>();
    for (int i = 0; i < 300; ++i) opt->update(lossfun);
    const double final_loss = lossfun().data().item<double>();
    EXPECT_LT(final_loss, 1e-2 * initial) << "initial " << initial << ", final " << final_loss;
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(OptimizersTest);

}  // namespace
}  // namespace kusari
