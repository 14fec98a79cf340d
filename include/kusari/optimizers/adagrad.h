// AdaGrad (Chainer's AdaGrad).
#pragma once

#include "kusari/optimizers/optimizer.h"

namespace kusari::optimizers {

/// AdaGrad: h += g^2; p -= lr g / (sqrt(h) + eps). Hyperparameters: "lr", "eps"; state: "h".
class AdaGrad : public Optimizer {
 public:
  explicit AdaGrad(double lr = 0.001, double eps = 1e-8);

  /// The learning rate, a reference into the hyperparameter table.
  double& lr() { return hyperparam("lr"); }
  using Optimizer::lr;
  /// The stability constant, a reference into the hyperparameter table.
  double& eps() { return hyperparam("eps"); }
  /// The stability constant.
  double eps() const { return hyperparam("eps"); }
  const char* type_name() const override { return "AdaGrad"; }
  bool steps_elementwise() const override { return true; }

 protected:
  void init_state(ParamState& state) override;
  std::optional<UpdateStep> update_step(ParamState& state) override;
  bool skips_on_device() const override { return true; }
};

}  // namespace kusari::optimizers
