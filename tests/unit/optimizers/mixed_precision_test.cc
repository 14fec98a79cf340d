// float16 training support: float32 master weights, dynamic loss scaling, the loss scale undone
// in float32 and hooks on float32 gradients under master weights.
#include <gtest/gtest.h>

#include "kusari/functions.h"
#include "kusari/optimizers/adam.h"
#include "kusari/optimizers/hooks.h"
#include "kusari/optimizers/sgd.h"
#include "kusari/serializers/npz.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;

class OneParam : public Link {
 public:
  explicit OneParam(Array w) { p = add_param("w", Parameter(std::move(w))); }
  Parameter p;
};

class MixedPrecisionTest : public testing::DeviceTest {};

TEST_P(MixedPrecisionTest, MasterWeightsKeepUpdatesThatFloat16WouldRoundAway) {
  for (bool fp32 : {false, true}) {
    auto link = std::make_shared<OneParam>(Array::ones({4}, float16, device()));
    optimizers::SGD opt(0.1);
    opt.setup(link);
    opt.use_fp32_update(fp32);
    for (int i = 0; i < 100; ++i) {
      link->p.set_grad(Array::full({4}, 1e-4, float16, device()));
      opt.update();
    }
    // 100 steps of 1e-5 each: float16 cannot represent 1 - 1e-5, so only the master copy moves.
    const float w = link->p.data().astype(float32).to_vector<float>()[0];
    if (fp32) {
      EXPECT_NEAR(w, 0.999f, 5e-4f);
      EXPECT_NEAR(opt.param_states()[0].get("master").to_vector<float>()[0], 0.999f, 5e-6f);
    } else {
      EXPECT_EQ(w, 1.0f);
    }
  }
}

TEST_P(MixedPrecisionTest, DynamicLossScalingSkipsOverflowingSteps) {
  auto link = std::make_shared<OneParam>(Array::ones({2}, float16, device()));
  optimizers::SGD opt(0.01);
  opt.setup(link);
  opt.loss_scaling(3);
  EXPECT_DOUBLE_EQ(opt.loss_scale(), 65536.0);
  Array x = Array::full({2}, 4.0, float16, device());
  auto lossfun = [&]() { return F::sum(F::mul(Variable(x), link->p)); };
  // grad = 4 * 65536 overflows float16: the step is skipped and the scale halved.
  opt.update(lossfun);
  EXPECT_DOUBLE_EQ(opt.loss_scale(), 32768.0);
  EXPECT_EQ(opt.t(), 0);
  EXPECT_EQ(link->p.data().astype(float32).to_vector<float>(), (std::vector<float>{1, 1}));
  // 4 * 32768 = 131072 still overflows; 4 * 16384 = 65536 too; 4 * 8192 = 32768 fits.
  opt.update(lossfun);
  opt.update(lossfun);
  EXPECT_DOUBLE_EQ(opt.loss_scale(), 8192.0);
  opt.update(lossfun);
  EXPECT_EQ(opt.t(), 1);
  EXPECT_NEAR(link->p.data().astype(float32).to_vector<float>()[0], 1.0f - 0.04f, 1e-3f);
  // After `interval` (3) good steps the scale doubles.
  opt.update(lossfun);
  opt.update(lossfun);
  EXPECT_DOUBLE_EQ(opt.loss_scale(), 16384.0);
  EXPECT_THROW(opt.loss_scaling(0), ValueError);
  opt.loss_scaling(10, 128.0);
  EXPECT_DOUBLE_EQ(opt.loss_scale(), 128.0);
}

/// Adam whose dynamic loss scaling reads the overflow count before its updates (the order every
/// optimizer without skips_on_device() takes).
class AdamCheckingFirst : public optimizers::Adam {
 protected:
  bool skips_on_device() const override { return false; }
};

TEST_P(MixedPrecisionTest, VerdictLearntAfterTheUpdatesMatchesCheckingFirst) {
  // Note [Dynamic loss scaling]: the built-in optimizers skip an overflowing step on the device
  // and learn of it later. Steps, counts (Adam's bias correction uses them), master weights,
  // moments and scales must be those of checking first, through overflows and scale changes.
  auto make = [&](std::unique_ptr<Optimizer> opt) {
    auto link = std::make_shared<OneParam>(Array::full({3}, 0.5, float16, device()));
    opt->setup(link);
    opt->use_fp32_update();
    opt->loss_scaling(2);
    return std::pair{link, std::move(opt)};
  };
  auto [link_a, later] = make(std::make_unique<optimizers::Adam>());
  auto [link_b, first] = make(std::make_unique<AdamCheckingFirst>());
  // x * scale overflows float16 (above 65504) for x = 4 at 2^16 and 2^15, and for x = 1000
  // at the scales reached later; 0.5 fits.
  const std::vector<double> xs = {4, 4, 0.5, 0.5, 0.5, 1000, 0.5, 0.5, 0.5, 1000, 1000, 0.5};
  for (size_t k = 0; k < xs.size(); ++k) {
    SCOPED_TRACE("step " + std::to_string(k) + ", x = " + std::to_string(xs[k]));
    for (auto* run : {&link_a, &link_b}) {
      Optimizer& opt = run == &link_a ? *later : *first;
      Array x = Array::full({3}, xs[k], float16, device());
      Parameter p = (*run)->p;
      opt.update([&] { return F::sum(F::mul(Variable(x), p)); });
    }
    EXPECT_EQ(later->loss_scale(), first->loss_scale());
    EXPECT_EQ(later->t(), first->t());
    ParamState& a = later->param_states()[0];
    ParamState& b = first->param_states()[0];
    EXPECT_EQ(a.t, b.t);
    EXPECT_TRUE(testing::ArraysClose(link_a->p.data(), link_b->p.data(), 0, 0));
    // (A first step skipped on the device has made the state, zeros and the parameter's copy,
    // which checking first makes at the first good step with the same values.)
    for (const char* name : {"master", "m", "v"}) {
      if (!b.find(name)) continue;
      ASSERT_TRUE(a.find(name)) << name;
      EXPECT_TRUE(testing::ArraysClose(a.get(name), b.get(name), 0, 0)) << name;
    }
  }
  // Skipped: steps 0 and 1 (4 x 2^16, 4 x 2^15), 5 (1000 x 2^15), 9 and 10 (1000 x 2^15,
  // 1000 x 2^14); the scale doubled after steps 3 and 7.
  EXPECT_EQ(later->t(), 7);
  EXPECT_EQ(later->param_states()[0].t, 7);
  EXPECT_EQ(later->loss_scale(), 8192.0);
}

TEST_P(MixedPrecisionTest, DynamicLossScaleIsSavedAndLoaded) {
  auto link = std::make_shared<OneParam>(Array::ones({2}, float16, device()));
  // An SGD on `link` with loss_scaling(3, scale), loaded from `saved` when given.
  auto make = [&](std::optional<double> scale, const NamedArrays* saved) {
    auto opt = std::make_unique<optimizers::SGD>(0.01);
    opt->setup(link);
    opt->loss_scaling(3, scale);
    if (saved) NpzDeserializer(*saved).load(*opt);
    return opt;
  };
  auto saved_from = [](Optimizer& opt) {
    DictionarySerializer saver;
    saver.save(opt);
    return saver.target();
  };
  Array x = Array::full({2}, 4.0, float16, device());
  auto lossfun = [&]() { return F::sum(F::mul(Variable(x), link->p)); };
  auto opt = make(std::nullopt, nullptr);
  for (int i = 0; i < 5; ++i)
    opt->update(lossfun);  // three overflows (scale 8192), then 2 good steps
  ASSERT_DOUBLE_EQ(opt->loss_scale(), 8192.0);
  const NamedArrays saved = saved_from(*opt);
  // A fresh optimizer with dynamic scaling goes on from the saved state: one more good step
  // completes the interval of 3 and doubles the scale.
  auto resumed = make(std::nullopt, &saved);
  EXPECT_DOUBLE_EQ(resumed->loss_scale(), 8192.0);
  resumed->update(lossfun);
  EXPECT_DOUBLE_EQ(resumed->loss_scale(), 16384.0);
  // A fixed scale is kept as configured.
  EXPECT_DOUBLE_EQ(make(128.0, &saved)->loss_scale(), 128.0);
  // Without scaling nothing is saved (Chainer's layout) ...
  optimizers::SGD plain(0.01);
  plain.setup(link);
  const NamedArrays plain_saved = saved_from(plain);
  for (const auto& [key, value] : plain_saved) {
    EXPECT_EQ(key.find("loss_scale"), std::string::npos) << key;
  }
  // ... and a snapshot without the keys leaves a dynamic scale at its start.
  EXPECT_DOUBLE_EQ(make(std::nullopt, &plain_saved)->loss_scale(), 65536.0);
}

TEST_P(MixedPrecisionTest, LossScaleIsUndoneInFloat32UnderMasterWeights) {
  // A true gradient of 2e-8 is below float16's smallest subnormal step (6e-8): scaled by 2^16 it
  // is representable (1.3e-3), and it must be unscaled in float32, not back in float16.
  for (bool fp32 : {false, true}) {
    SCOPED_TRACE(fp32 ? "use_fp32_update" : "float16 update");
    auto link = std::make_shared<OneParam>(Array::ones({2}, float16, device()));
    optimizers::SGD opt(1000.0);
    opt.setup(link);
    opt.use_fp32_update(fp32);
    opt.loss_scaling(1000, 65536.0);
    const Array x = Array::full({2}, 2e-8 * 65536.0, float16, device()).astype(float32) * (1.0 / 65536.0);
    // loss = sum(x * w) in float32 with a float16 w, so dloss/dw = x (about 2e-8).
    auto lossfun = [&]() { return F::sum(F::mul(Variable(x), F::cast(link->p, float32))); };
    opt.update(lossfun);
    EXPECT_EQ(opt.t(), 1);
    // The gradient is back in the parameter's dtype after the step.
    EXPECT_EQ(link->p.grad().dtype(), float16);
    if (fp32) {
      // lr * grad = 2e-5 applied to the float32 master copy.
      EXPECT_NEAR(opt.param_states()[0].get("master").to_vector<float>()[0], 1.0f - 2e-5f, 1e-7f);
    } else {
      // Unscaled in float16, the gradient underflowed to zero and nothing moved.
      EXPECT_EQ(link->p.data().astype(float32).to_vector<float>()[0], 1.0f);
    }
  }
}

TEST_P(MixedPrecisionTest, HooksSeeFloat32GradientsAndMasterWeights) {
  // WeightDecay adds rate * w to the gradient: with master weights it runs on the float32
  // gradient against the float32 master copy (after the first update created it).
  auto link = std::make_shared<OneParam>(Array::ones({3}, bfloat16, device()));
  optimizers::SGD opt(0.5);
  opt.setup(link);
  opt.use_fp32_update();
  opt.add_hook(std::make_shared<optimizers::WeightDecay>(0.01));
  for (int i = 0; i < 2; ++i) {
    link->p.set_grad(Array::zeros({3}, bfloat16, device()));
    opt.update();
  }
  // w <- w - 0.5 * 0.01 * w twice: 0.995^2 = 0.990025 (bfloat16 could not hold 0.995).
  EXPECT_NEAR(opt.param_states()[0].get("master").to_vector<float>()[0], 0.990025f, 1e-6f);
  EXPECT_EQ(link->p.grad().dtype(), bfloat16);
}

TEST_P(MixedPrecisionTest, AnUnchangedGradientKeepsItsArrayAfterTheUpdate) {
  // Widened to float32 for the step and not changed (no loss scale, no hooks), a 16-bit gradient
  // is given back as it was rather than rounded again; changed, it is the rounding of the float32
  // gradient the step used.
  for (const bool hook : {false, true}) {
    SCOPED_TRACE(hook ? "with WeightDecay" : "no hooks");
    auto link = std::make_shared<OneParam>(Array::full({3}, 2.0, bfloat16, device()));
    optimizers::SGD opt(0.5);
    opt.setup(link);
    opt.use_fp32_update();
    if (hook) opt.add_hook(std::make_shared<optimizers::WeightDecay>(0.25));
    const Array g = Array::from({0.1, -0.3, 1.7}, std::nullopt, float64, device()).astype(bfloat16);
    link->p.set_grad(g);
    opt.update();
    const Array after = link->p.grad();
    EXPECT_EQ(after.dtype(), bfloat16);
    EXPECT_EQ(after.same_view(g), !hook);
    // The gradient the step used: g, plus 0.25 w with the hook.
    const Array used = hook ? (g.astype(float32) + 0.5).astype(bfloat16) : g;
    EXPECT_TRUE(testing::ArraysClose(after, used, 0, 0));
    const Array used32 = hook ? g.astype(float32) + 0.5 : g.astype(float32);
    const Array expected_master = Array::full({3}, 2.0, float32, device()) - used32 * 0.5;
    EXPECT_TRUE(testing::ArraysClose(opt.param_states()[0].get("master"), expected_master, 1e-6, 1e-6));
    EXPECT_TRUE(testing::ArraysClose(link->p.data(), expected_master.astype(bfloat16), 0, 0));
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(MixedPrecisionTest);

}  // namespace
}  // namespace kusari
