// The fused update routine (kusari::update_parameter) against independent double-precision
// references of every rule, for each floating dtype, on small and large (multi-threaded) arrays.
#include <gtest/gtest.h>

#include <limits>
#include <tuple>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "kusari/core/routines.h"
#include "test_util.h"

namespace kusari {
namespace {

using Vec = std::vector<double>;

// One step of a rule in double precision: p, g and the states (in the kernel's order), t >= 1.
using RefStep = std::function<void(Vec& p, const Vec& g, std::vector<Vec>& st, int t)>;

struct RuleCase {
  std::string name;
  UpdateRule rule;
  std::vector<double> hyper;  // for step t = 1; `hyper_at` recomputes t-dependent entries
  int n_state;
  RefStep ref;
  std::function<std::vector<double>(int t)> hyper_at;  // null when hyper does not depend on t
};

double adam_alpha_t(double alpha, double beta1, double beta2, int t) {
  return alpha * std::sqrt(1.0 - std::pow(beta2, t)) / (1.0 - std::pow(beta1, t));
}

RefStep adam_ref(double alpha, double beta1, double beta2, double eps, double eta, double wd,
                 bool ams) {
  return [=](Vec& p, const Vec& g, std::vector<Vec>& st, int t) {
    Vec& m = st[0];
    Vec& v = st[1];
    const double at = adam_alpha_t(alpha, beta1, beta2, t);
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] += (1 - beta1) * (g[i] - m[i]);
      v[i] += (1 - beta2) * (g[i] * g[i] - v[i]);
      double vh = v[i];
      if (ams) {
        st[2][i] = std::max(st[2][i], v[i]);
        vh = st[2][i];
      }
      p[i] -= eta * (at * m[i] / (std::sqrt(vh) + eps) + wd * p[i]);
    }
  };
}

std::vector<RuleCase> rule_cases() {
  std::vector<RuleCase> cases;
  cases.push_back({"SGD",
                   UpdateRule::kSgd,
                   {0.1},
                   0,
                   [](Vec& p, const Vec& g, std::vector<Vec>&, int) {
                     for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.1 * g[i];
                   },
                   nullptr});
  cases.push_back({"MomentumSGD",
                   UpdateRule::kMomentumSgd,
                   {0.1, 0.8},
                   1,
                   [](Vec& p, const Vec& g, std::vector<Vec>& st, int) {
                     for (size_t i = 0; i < p.size(); ++i) {
                       st[0][i] = 0.8 * st[0][i] - 0.1 * g[i];
                       p[i] += st[0][i];
                     }
                   },
                   nullptr});
  cases.push_back({"NesterovAG",
                   UpdateRule::kNesterov,
                   {0.1, 0.8},
                   1,
                   [](Vec& p, const Vec& g, std::vector<Vec>& st, int) {
                     for (size_t i = 0; i < p.size(); ++i) {
                       st[0][i] = 0.8 * st[0][i] - 0.1 * g[i];
                       p[i] += 0.8 * 0.8 * st[0][i] - (1 + 0.8) * 0.1 * g[i];
                     }
                   },
                   nullptr});
  for (bool ams : {false, true}) {
    // beta2 = 0.5 makes v shrink on the small later gradients, so vhat differs from v.
    const double alpha = 0.01, b1 = 0.9, b2 = 0.5, eps = 1e-3, eta = 0.7, wd = 0.05;
    cases.push_back({ams ? "AMSGrad" : "Adam",
                     UpdateRule::kAdam,
                     {},
                     ams ? 3 : 2,
                     adam_ref(alpha, b1, b2, eps, eta, wd, ams),
                     [=](int t) {
                       return std::vector<double>{
                           adam_alpha_t(alpha, b1, b2, t), b1, b2, eps, eta, wd, ams ? 1.0 : 0.0};
                     }});
  }
  for (bool inside : {false, true}) {
    cases.push_back({inside ? "RMSpropEpsInsideSqrt" : "RMSprop",
                     UpdateRule::kRmsprop,
                     {0.01, 0.9, 1e-2, inside ? 1.0 : 0.0},
                     1,
                     [inside](Vec& p, const Vec& g, std::vector<Vec>& st, int) {
                       for (size_t i = 0; i < p.size(); ++i) {
                         st[0][i] = 0.9 * st[0][i] + (1 - 0.9) * g[i] * g[i];
                         const double denom =
                             inside ? std::sqrt(st[0][i] + 1e-2) : std::sqrt(st[0][i]) + 1e-2;
                         p[i] -= 0.01 * g[i] / denom;
                       }
                     },
                     nullptr});
  }
  cases.push_back({"AdaGrad",
                   UpdateRule::kAdaGrad,
                   {0.1, 1e-2},
                   1,
                   [](Vec& p, const Vec& g, std::vector<Vec>& st, int) {
                     for (size_t i = 0; i < p.size(); ++i) {
                       st[0][i] += g[i] * g[i];
                       p[i] -= 0.1 * g[i] / (std::sqrt(st[0][i]) + 1e-2);
                     }
                   },
                   nullptr});
  // Akiba et al.'s RMSprop warm-up half-way through its transition: both terms of the rate.
  cases.push_back({"RMSpropWarmup",
                   UpdateRule::kRmspropWarmup,
                   {0.05, 0.002, 0.9, 0.9, 1e-2},
                   2,
                   [](Vec& p, const Vec& g, std::vector<Vec>& st, int) {
                     for (size_t i = 0; i < p.size(); ++i) {
                       st[0][i] = 0.9 * st[0][i] + (1 - 0.9) * g[i] * g[i];
                       const double rate = 0.05 + 0.002 / (std::sqrt(st[0][i]) + 1e-2);
                       st[1][i] = 0.9 * st[1][i] - rate * g[i];
                       p[i] += st[1][i];
                     }
                   },
                   nullptr});
  return cases;
}

// Deterministic test values in [-1, 1) (and some exact zeros).
Vec pattern(size_t n, int seed) {
  Vec v(n);
  for (size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>((i * 7919 + static_cast<size_t>(seed) * 104729) % 2001);
    v[i] = (k % 17 == 0) ? 0.0 : (k - 1000) / 1000.0;
  }
  return v;
}

class UpdateParameterTest : public testing::DeviceTest {
 protected:
  Array make(const Vec& v, Dtype dtype) {
    return Array::from_vector(v).astype(dtype).to_device(device());
  }

  // Runs three steps of `c` on n elements of `dtype` and compares with the double reference.
  void check_rule(const RuleCase& c, size_t n, Dtype dtype, double rtol, double atol) {
    SCOPED_TRACE(c.name + " " + dtype_name(dtype) + " n=" + std::to_string(n));
    Vec p = pattern(n, 1);
    // Round the reference start to the dtype so that both sides begin from the same values.
    p = Array::from_vector(p).astype(dtype).to_vector<double>();
    std::vector<Vec> st(c.n_state, Vec(n, 0.0));
    Array param = make(p, dtype);
    std::vector<Array> states;
    for (int k = 0; k < c.n_state; ++k)
      states.push_back(Array::zeros({static_cast<int64_t>(n)}, dtype, device()));
    std::vector<Array*> state_ptrs;
    for (Array& s : states) state_ptrs.push_back(&s);
    for (int t = 1; t <= 3; ++t) {
      // Large gradients first, then small ones (so that AMSGrad's maximum matters).
      Vec g = pattern(n, 10 + t);
      for (double& x : g) x *= (t == 1 ? 1.0 : 0.05);
      g = Array::from_vector(g).astype(dtype).to_vector<double>();
      const std::vector<double> hyper = c.hyper_at ? c.hyper_at(t) : c.hyper;
      update_parameter(c.rule, param, make(g, dtype), state_ptrs, hyper);
      c.ref(p, g, st, t);
      ASSERT_TRUE(
          testing::ArraysClose(param, Array::from_vector(p).to_device(device()), rtol, atol))
          << "step " << t;
      for (int k = 0; k < c.n_state; ++k) {
        ASSERT_TRUE(testing::ArraysClose(states[k], Array::from_vector(st[k]).to_device(device()),
                                         rtol, atol))
            << "state " << k << ", step " << t;
      }
    }
  }
};

TEST_P(UpdateParameterTest, EveryRuleMatchesDoubleReference) {
  for (const RuleCase& c : rule_cases()) {
    check_rule(c, 37, float64, 1e-12, 1e-15);
    check_rule(c, 37, float32, 2e-5, 1e-7);
  }
}

TEST_P(UpdateParameterTest, SixteenBitParametersComputeInFloat32) {
  // The states are stored in 16 bits too, so the tolerance is that of a few roundings.
  for (const RuleCase& c : rule_cases()) {
    check_rule(c, 37, float16, 1e-2, 2e-3);
    check_rule(c, 37, bfloat16, 4e-2, 2e-2);
  }
}

TEST_P(UpdateParameterTest, LargeTensorsSplitAcrossThreadsGiveTheSameResult) {
  // 100k elements exceed the parallel threshold, so the chunk boundaries are exercised.
  for (const RuleCase& c : rule_cases()) check_rule(c, 100003, float32, 2e-5, 1e-7);
}

TEST_P(UpdateParameterTest, AmsgradKeepsTheRunningMaximum) {
  // v shrinks after a large first gradient; vhat keeps the first value and the step uses it.
  Array p = make({1.0}, float64);
  Array m = Array::zeros({1}, float64, device()), v = Array::zeros({1}, float64, device()),
        vhat = Array::zeros({1}, float64, device());
  const double b1 = 0.9, b2 = 0.5;
  update_parameter(UpdateRule::kAdam, p, make({1.0}, float64), {&m, &v, &vhat},
                   {adam_alpha_t(0.1, b1, b2, 1), b1, b2, 0.0, 1.0, 0.0, 1.0});
  update_parameter(UpdateRule::kAdam, p, make({0.0}, float64), {&m, &v, &vhat},
                   {adam_alpha_t(0.1, b1, b2, 2), b1, b2, 0.0, 1.0, 0.0, 1.0});
  EXPECT_DOUBLE_EQ(v.item<double>(), 0.25);
  EXPECT_DOUBLE_EQ(vhat.item<double>(), 0.5);
}

TEST_P(UpdateParameterTest, NonContiguousGradientIsAccepted) {
  Array p = make({1, 2, 3, 4, 5, 6}, float32).reshape({2, 3});
  Array g =
      make({1, 2, 3, 4, 5, 6}, float32).reshape({3, 2}).transpose();  // (2, 3), not contiguous
  ASSERT_FALSE(g.is_contiguous());
  update_parameter(UpdateRule::kSgd, p, g, {}, {1.0});
  EXPECT_TRUE(testing::ArraysClose(
      p, make({0, 2 - 3, 3 - 5, 4 - 2, 5 - 4, 6 - 6}, float32).reshape({2, 3})));
}

TEST_P(UpdateParameterTest, SkipFlagDecidesOnTheDevice) {
  // Note [Dynamic loss scaling]: a nonzero count leaves the parameter and its state untouched; a
  // zero count gives the step taken without a flag.
  auto step = [&](const Array* skip, Array& p, Array& m, Array& v) {
    update_parameter(UpdateRule::kAdam, p, make({1.0, -2.0, 0.5}, float32), {&m, &v},
                     {adam_alpha_t(0.1, 0.9, 0.999, 1), 0.9, 0.999, 1e-8, 1.0, 0.0, 0.0}, skip);
  };
  auto fresh = [&] {
    return std::tuple{make({1, 2, 3}, float32), Array::zeros({3}, float32, device()),
                      Array::zeros({3}, float32, device())};
  };
  auto [p0, m0, v0] = fresh();
  step(nullptr, p0, m0, v0);
  const Array skip = Array::full({}, 2, int64, device()), take = Array::zeros({}, int64, device());
  auto [p1, m1, v1] = fresh();
  step(&skip, p1, m1, v1);
  EXPECT_TRUE(testing::ArraysClose(p1, make({1, 2, 3}, float32), 0, 0));
  EXPECT_TRUE(testing::ArraysClose(m1, Array::zeros({3}, float32, device()), 0, 0));
  EXPECT_TRUE(testing::ArraysClose(v1, Array::zeros({3}, float32, device()), 0, 0));
  auto [p2, m2, v2] = fresh();
  step(&take, p2, m2, v2);
  EXPECT_TRUE(testing::ArraysClose(p2, p0, 0, 0));
  EXPECT_TRUE(testing::ArraysClose(m2, m0, 0, 0));
  EXPECT_TRUE(testing::ArraysClose(v2, v0, 0, 0));
  // The flag must be one int64 on the parameter's device.
  const Array wrong = Array::zeros({}, int32, device());
  EXPECT_TRUE(testing::ThrowsWith<ValueError>([&] { step(&wrong, p2, m2, v2); },
                                              {"update_parameter (Adam)", "skip flag", "int32"}));
}

TEST_P(UpdateParameterTest, CountNonfiniteCountsAcrossManyArraysAndDtypes) {
  // Note [Counting over many arrays]: more arrays than one launch takes (48), four dtypes, a
  // large array, an empty one and a non-contiguous view.
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<Array> arrays;
  int64_t expected = 0;
  const Dtype dtypes[] = {float16, bfloat16, float32, float64};
  for (int k = 0; k < 120; ++k) {
    std::vector<double> v(static_cast<size_t>(2 + k % 7), 0.5 * k);
    if (k % 5 == 0) v[0] = inf, ++expected;
    if (k % 11 == 0) v.back() = k % 2 ? -inf : nan, ++expected;
    arrays.push_back(make(v, dtypes[k % 4]));
  }
  Array big = Array::full({100003}, 1.0, float32, device());
  Array hit = big.at({Slice(99990, 99993)});
  hit.fill(nan);
  expected += 3;
  arrays.push_back(big);
  arrays.push_back(Array::zeros({0}, float16, device()));
  Array wide = make({1, inf, 3, 4, nan, 6}, float32).reshape({3, 2}).transpose();
  ASSERT_FALSE(wide.is_contiguous());
  arrays.push_back(wide);
  expected += 2;
  const Array count = count_nonfinite(arrays);
  EXPECT_EQ(count.device(), device());
  EXPECT_EQ(count.dtype(), int64);
  EXPECT_EQ(count.item<int64_t>(), expected);
  EXPECT_EQ(count_nonfinite({make({1, 2, 3}, float16)}).item<int64_t>(), 0);
  // Large finite float16 values are finite: 65504 is float16's largest.
  EXPECT_EQ(count_nonfinite({make({65504, -65504}, float16)}).item<int64_t>(), 0);
  EXPECT_TRUE(testing::ThrowsWith<DtypeError>(
      [&] { count_nonfinite({Array::zeros({2}, int32, device())}); }, {"count_nonfinite"}));
  EXPECT_TRUE(testing::ThrowsWith<ValueError>([&] { count_nonfinite({}); }, {"no arrays"}));
}

TEST_P(UpdateParameterTest, EmptyArraysAreANoOp) {
  Array p = Array::zeros({0}, float32, device());
  Array g = Array::zeros({0}, float32, device());
  EXPECT_NO_THROW(update_parameter(UpdateRule::kSgd, p, g, {}, {0.1}));
}

TEST_P(UpdateParameterTest, ArgumentErrorsAreReported) {
  Array p = Array::zeros({4}, float32, device());
  Array g = Array::ones({4}, float32, device());
  Array v = Array::zeros({4}, float32, device());
  EXPECT_THROW(update_parameter(UpdateRule::kMomentumSgd, p, g, {}, {0.1, 0.9}),
               ValueError);  // no state
  EXPECT_THROW(update_parameter(UpdateRule::kMomentumSgd, p, g, {&v}, {0.1}),
               ValueError);  // one hyper
  EXPECT_THROW(update_parameter(UpdateRule::kAdam, p, g, {&v, &v}, {1, 1, 1, 1, 1, 1, 1}),
               ValueError);  // vhat
  Array g3 = Array::ones({3}, float32, device());
  EXPECT_THROW(update_parameter(UpdateRule::kSgd, p, g3, {}, {0.1}), ShapeError);
  Array g64 = Array::ones({4}, float64, device());
  EXPECT_THROW(update_parameter(UpdateRule::kSgd, p, g64, {}, {0.1}), DtypeError);
  Array v3 = Array::zeros({3}, float32, device());
  EXPECT_THROW(update_parameter(UpdateRule::kMomentumSgd, p, g, {&v3}, {0.1, 0.9}), ShapeError);
  Array pi = Array::zeros({4}, int32, device());
  Array gi = Array::zeros({4}, int32, device());
  EXPECT_THROW(update_parameter(UpdateRule::kSgd, pi, gi, {}, {0.1}), DtypeError);
  Array q = Array::zeros({3, 2}, float32, device()).transpose();
  Array gq = Array::zeros({2, 3}, float32, device());
  try {
    update_parameter(UpdateRule::kSgd, q, gq, {}, {0.1});
    FAIL() << "a non-contiguous parameter must be rejected";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("contiguous"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("SGD"), std::string::npos) << e.what();
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(UpdateParameterTest);

}  // namespace
}  // namespace kusari
