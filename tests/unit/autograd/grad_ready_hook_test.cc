// Gradient-ready hooks: Variable::add_grad_ready_hook (Note [Gradient-ready hooks] in
// src/autograd/backward.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kusari/autograd/function_node.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;

class GradReadyHookTest : public testing::DeviceTest {
 protected:
  Parameter param(std::initializer_list<double> v) {
    return Parameter(Array::from(v, std::nullopt, float64, device()));
  }
  /// Adds a hook to `p` that appends `name` and the gradient it sees to the log.
  int64_t watch(const Variable& p, const std::string& name) {
    return Variable(p).add_grad_ready_hook([this, name](const Variable& leaf) {
      order_.push_back(name);
      seen_.push_back(leaf.grad().copy().to_vector<double>());
    });
  }
  std::vector<std::string> order_;
  std::vector<std::vector<double>> seen_;
};

/// y = x with a rule that gives x no gradient (as a function of an integer result would).
Variable no_gradient(const Variable& x) {
  return record("no_gradient", {x}, x.data().copy(), [](BackwardContext&) {});
}

TEST_P(GradReadyHookTest, FiresOnceWithTheGradientSummedOverEveryUse) {
  Parameter w = param({1, 2});
  watch(w, "w");
  // Three uses in three nodes of different generations: the hook waits for the last.
  Variable h = F::exp(w * 0.5);
  Variable loss = F::sum(w * 3.0) + F::sum(h * h) + F::sum(w);
  loss.backward();
  ASSERT_EQ(order_.size(), 1u);
  EXPECT_EQ(seen_[0], w.grad().to_vector<double>());
  const std::vector<double> g = w.grad().to_vector<double>();
  EXPECT_NEAR(g[0], 4.0 + std::exp(1.0), 1e-12);
}

TEST_P(GradReadyHookTest, ParameterUsedTwiceByOneFunction) {
  Parameter w = param({3});
  watch(w, "w");
  F::sum(w * w).backward();
  ASSERT_EQ(order_.size(), 1u);
  EXPECT_EQ(seen_[0], (std::vector<double>{6}));
}

TEST_P(GradReadyHookTest, FiresInReverseOrderOfUseWhileBackwardGoesOn) {
  Parameter a = param({1}), b = param({2}), c = param({3});
  std::vector<bool> a_had_grad_when_c_was_ready;
  watch(a, "a");
  watch(b, "b");
  Variable(c).add_grad_ready_hook([&](const Variable&) {
    order_.push_back("c");
    a_had_grad_when_c_was_ready.push_back(a.grad().defined());
  });
  // a is used first, c last: backward finishes c first, and a has no gradient yet then.
  Variable h1 = F::tanh(a * 2.0);
  Variable h2 = F::tanh(h1 * b);
  Variable h3 = F::sum(F::tanh(h2 * c));
  h3.backward();
  EXPECT_EQ(order_, (std::vector<std::string>{"c", "b", "a"}));
  EXPECT_EQ(a_had_grad_when_c_was_ready, (std::vector<bool>{false}));
}

TEST_P(GradReadyHookTest, UnusedAndGradientlessLeavesDoNotFire) {
  Parameter used = param({1}), unused = param({2}), blocked = param({3});
  watch(used, "used");
  watch(unused, "unused");
  watch(blocked, "blocked");
  // `blocked` is reached only through a function that gives it no gradient.
  F::sum(used * 2.0 + no_gradient(blocked * 4.0)).backward();
  EXPECT_EQ(order_, (std::vector<std::string>{"used"}));
  EXPECT_FALSE(blocked.grad().defined());
  EXPECT_FALSE(unused.grad().defined());
}

TEST_P(GradReadyHookTest, LeafBehindAFunctionThatGetsNoGradientStillFiresForItsOtherUse) {
  // The tanh node of w is never queued (its output gets no gradient); its edge into w must still
  // be counted off, or w would wait forever.
  Parameter w = param({0.5});
  watch(w, "w");
  Variable dead = no_gradient(F::tanh(w));
  F::sum(dead + w * 5.0).backward();
  ASSERT_EQ(order_.size(), 1u);
  EXPECT_EQ(seen_[0], (std::vector<double>{5}));
}

TEST_P(GradReadyHookTest, FiresInEveryBackwardOfAnAccumulation) {
  Parameter w = param({1, 1});
  watch(w, "w");
  F::sum(w * 2.0).backward();
  F::sum(w * 3.0).backward();  // no cleargrad: the gradients add up
  ASSERT_EQ(order_.size(), 2u);
  EXPECT_EQ(seen_[0], (std::vector<double>{2, 2}));
  EXPECT_EQ(seen_[1], (std::vector<double>{5, 5}));
}

TEST_P(GradReadyHookTest, DoubleBackpropKeepsFiring) {
  Parameter x = param({2});
  watch(x, "x");
  BackwardOptions options;
  options.enable_double_backprop = true;
  Variable y = F::sum(x * x * x);  // dy/dx = 3x^2 = 12, d2y/dx2 = 6x = 12
  y.backward(options);
  ASSERT_EQ(order_.size(), 1u);
  EXPECT_EQ(seen_[0], (std::vector<double>{12}));
  Variable gx = x.grad_var();
  EXPECT_TRUE(gx.requires_grad());
  x.cleargrad();
  F::sum(gx).backward();
  ASSERT_EQ(order_.size(), 2u);
  EXPECT_EQ(seen_[1], (std::vector<double>{12}));
}

TEST_P(GradReadyHookTest, FiresWhenBackwardFreesTheGraphAsItGoes) {
  // retain_graph = false drops each node's inputs once it has run (Note [Freeing the graph
  // during backward]); the counts must be taken before that.
  Parameter a = param({1, 2}), b = param({3});
  watch(a, "a");
  watch(b, "b");
  Variable h = F::tanh(a * 0.5);
  Variable loss = F::sum(h * h + a) + F::sum(b * b) + F::sum(no_gradient(h) * 2.0);
  BackwardOptions options;
  options.retain_graph = false;
  loss.backward(options);
  ASSERT_EQ(order_.size(), 2u);
  EXPECT_EQ(seen_[order_[0] == "a" ? 0 : 1], a.grad().to_vector<double>());
  EXPECT_EQ(seen_[order_[0] == "b" ? 0 : 1], (std::vector<double>{6}));
}

TEST_P(GradReadyHookTest, FunctionalGradDoesNotFire) {
  Parameter x = param({2});
  watch(x, "x");
  auto g = grad({F::sum(x * x)}, {x});
  EXPECT_EQ(g[0].data().to_vector<double>(), (std::vector<double>{4}));
  EXPECT_TRUE(order_.empty());
}

TEST_P(GradReadyHookTest, RemovedHooksDoNotFire) {
  Parameter w = param({1});
  const int64_t first = watch(w, "first");
  watch(w, "second");
  EXPECT_EQ(w.grad_ready_hook_count(), 2);
  EXPECT_TRUE(w.remove_grad_ready_hook(first));
  EXPECT_FALSE(w.remove_grad_ready_hook(first));
  F::sum(w * 2.0).backward();
  EXPECT_EQ(order_, (std::vector<std::string>{"second"}));
  // A hook may remove itself: it runs this once and never again.
  int64_t self = 0;
  int runs = 0;
  self = w.add_grad_ready_hook([&](const Variable& leaf) {
    ++runs;
    EXPECT_TRUE(Variable(leaf).remove_grad_ready_hook(self));
  });
  F::sum(w * 2.0).backward();
  F::sum(w * 2.0).backward();
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(order_, (std::vector<std::string>{"second", "second", "second"}));
}

TEST_P(GradReadyHookTest, HooksAreCountedWhileTheyLive) {
  const int64_t before = detail::live_grad_ready_hooks();
  {
    Parameter w = param({1});
    watch(w, "w");
    watch(w, "w2");
    EXPECT_EQ(detail::live_grad_ready_hooks(), before + 2);
  }
  EXPECT_EQ(detail::live_grad_ready_hooks(), before);
}

TEST_P(GradReadyHookTest, AnExceptionFromAHookEndsBackward) {
  Parameter w = param({1});
  w.add_grad_ready_hook([](const Variable&) { throw ValueError("from the hook"); });
  EXPECT_THROW(F::sum(w * 2.0).backward(), ValueError);
}

KUSARI_INSTANTIATE_DEVICE_TEST(GradReadyHookTest);

}  // namespace
}  // namespace kusari
