// Stochastic gradient descent and its momentum variants (Chainer's SGD, MomentumSGD, NesterovAG).
#pragma once

#include "kusari/optimizers/optimizer.h"

namespace kusari::optimizers {

/// Plain SGD: p -= lr g. Hyperparameters: "lr".
class SGD : public Optimizer {
 public:
  explicit SGD(double lr = 0.01);

  /// The learning rate, a reference into the hyperparameter table.
  double& lr() { return hyperparam("lr"); }
  using Optimizer::lr;
  const char* type_name() const override { return "SGD"; }
  bool steps_elementwise() const override { return true; }

 protected:
  std::optional<UpdateStep> update_step(ParamState& state) override;
  bool skips_on_device() const override { return true; }
};

/// SGD with classical momentum: v = momentum v - lr g; p += v. Hyperparameters: "lr",
/// "momentum"; state: "v".
class MomentumSGD : public Optimizer {
 public:
  explicit MomentumSGD(double lr = 0.01, double momentum = 0.9);

  /// The learning rate, a reference into the hyperparameter table.
  double& lr() { return hyperparam("lr"); }
  using Optimizer::lr;
  /// The momentum coefficient, a reference into the hyperparameter table.
  double& momentum() { return hyperparam("momentum"); }
  /// The momentum coefficient.
  double momentum() const { return hyperparam("momentum"); }
  const char* type_name() const override { return "MomentumSGD"; }
  bool steps_elementwise() const override { return true; }

 protected:
  void init_state(ParamState& state) override;
  std::optional<UpdateStep> update_step(ParamState& state) override;
  bool skips_on_device() const override { return true; }
};

/// Nesterov's accelerated gradient in Chainer's form: v = momentum v - lr g;
/// p += momentum^2 v - (1 + momentum) lr g. Hyperparameters: "lr", "momentum"; state: "v".
class NesterovAG : public Optimizer {
 public:
  explicit NesterovAG(double lr = 0.01, double momentum = 0.9);

  /// The learning rate, a reference into the hyperparameter table.
  double& lr() { return hyperparam("lr"); }
  using Optimizer::lr;
  /// The momentum coefficient, a reference into the hyperparameter table.
  double& momentum() { return hyperparam("momentum"); }
  /// The momentum coefficient.
  double momentum() const { return hyperparam("momentum"); }
  const char* type_name() const override { return "NesterovAG"; }
  bool steps_elementwise() const override { return true; }

 protected:
  void init_state(ParamState& state) override;
  std::optional<UpdateStep> update_step(ParamState& state) override;
  bool skips_on_device() const override { return true; }
};

}  // namespace kusari::optimizers
