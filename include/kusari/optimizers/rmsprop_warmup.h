// RMSprop warm-up (Akiba, Suzuki and Fukuda, "Extremely Large Minibatch SGD: Training ResNet-50
// on ImageNet in 15 Minutes", 2017): RMSprop at the start of training, moving smoothly to
// momentum SGD.
//
//   auto opt = std::make_shared<kusari::optimizers::RMSpropWarmup>(lr);
//   trainer.extend(std::make_shared<ext::EpochShift>(
//       "sgd_weight", kusari::optimizers::RMSpropWarmupTransition{.center = 10, .period = 5}));
#pragma once

#include "kusari/optimizers/optimizer.h"

namespace kusari::optimizers {

/// The weight of momentum SGD in RMSpropWarmup's step at `epoch`: 1/2 elu(2 (epoch - center) /
/// period) + 1/2, at most 1. It rises from near 0 like an exponential, is 1/2 at `center` and
/// reaches 1 (pure momentum SGD) at center + period / 2 (Note [RMSprop warm-up]). Give it to
/// EpochShift("sgd_weight", ...).
struct RMSpropWarmupTransition {
  /// The epoch at which both updates weigh the same.
  double center = 10.0;
  /// The width of the transition in epochs (> 0).
  double period = 5.0;
  /// The weight of momentum SGD at `epoch` (ValueError when period is not positive).
  double operator()(double epoch) const;
};

/// A step that mixes RMSprop and momentum SGD:
///
///   ms = alpha ms + (1 - alpha) g^2
///   v  = momentum v - (w lr + (1 - w) lr_rmsprop / (sqrt(ms) + eps)) g;   p += v
///
/// with w = "sgd_weight" in [0, 1]: RMSprop with momentum at w = 0, exactly MomentumSGD(lr,
/// momentum) at w = 1. Hyperparameters: "lr" (the momentum SGD rate, which schedules such as a
/// warm-up set), "lr_rmsprop", "momentum", "alpha", "eps", "sgd_weight"; state: "ms", "v".
/// Stepped by the fused update kernels, in groups (Note [Grouped optimizer updates]).
class RMSpropWarmup : public Optimizer {
 public:
  explicit RMSpropWarmup(double lr = 0.1, double lr_rmsprop = 0.001, double momentum = 0.9,
                         double alpha = 0.99, double eps = 1e-8, double sgd_weight = 0.0);

  /// The momentum SGD learning rate, a reference into the hyperparameter table.
  double& lr() { return hyperparam("lr"); }
  using Optimizer::lr;
  /// The weight of momentum SGD in the step, a reference into the hyperparameter table.
  double& sgd_weight() { return hyperparam("sgd_weight"); }
  /// The weight of momentum SGD in the step.
  double sgd_weight() const { return hyperparam("sgd_weight"); }
  const char* type_name() const override { return "RMSpropWarmup"; }
  bool steps_elementwise() const override { return true; }

 protected:
  void init_state(ParamState& state) override;
  std::optional<UpdateStep> update_step(ParamState& state) override;
  bool skips_on_device() const override { return true; }
};

}  // namespace kusari::optimizers
