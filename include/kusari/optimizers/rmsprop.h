// RMSprop (Chainer's RMSprop).
#pragma once

#include "kusari/optimizers/optimizer.h"

namespace kusari::optimizers {

/// RMSprop: ms = alpha ms + (1 - alpha) g^2; p -= lr g / (sqrt(ms) + eps), or
/// lr g / sqrt(ms + eps) with eps_inside_sqrt. Hyperparameters: "lr", "alpha", "eps",
/// "eps_inside_sqrt" (0 or 1); state: "ms".
class RMSprop : public Optimizer {
 public:
  explicit RMSprop(double lr = 0.01, double alpha = 0.99, double eps = 1e-8,
                   bool eps_inside_sqrt = false);

  /// The learning rate, a reference into the hyperparameter table.
  double& lr() { return hyperparam("lr"); }
  using Optimizer::lr;
  /// The decay rate of the mean square, a reference into the hyperparameter table.
  double& alpha() { return hyperparam("alpha"); }
  /// The decay rate of the mean square.
  double alpha() const { return hyperparam("alpha"); }
  /// The stability constant, a reference into the hyperparameter table.
  double& eps() { return hyperparam("eps"); }
  /// The stability constant.
  double eps() const { return hyperparam("eps"); }
  /// True when eps is added inside the square root.
  bool eps_inside_sqrt() const { return hyperparam("eps_inside_sqrt") != 0.0; }
  /// Chooses where eps is added.
  void set_eps_inside_sqrt(bool value) { hyperparam("eps_inside_sqrt") = value ? 1.0 : 0.0; }
  const char* type_name() const override { return "RMSprop"; }
  bool steps_elementwise() const override { return true; }

 protected:
  void init_state(ParamState& state) override;
  std::optional<UpdateStep> update_step(ParamState& state) override;
  bool skips_on_device() const override { return true; }
};

}  // namespace kusari::optimizers
