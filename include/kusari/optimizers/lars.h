// LARS (You, Gitman and Ginsburg, "Large Batch Training of Convolutional Networks", 2017):
// momentum SGD whose step on each weight tensor is scaled by a layer-wise trust ratio.
//
//   auto opt = std::make_shared<kusari::optimizers::LARS>(
//       kusari::optimizers::LARSOptions{.lr = 3.2, .weight_decay_rate = 5e-5});
#pragma once

#include "kusari/optimizers/hooks.h"
#include "kusari/optimizers/optimizer.h"

namespace kusari::optimizers {

/// LARS's hyperparameters, for `LARS({.lr = 3.2, .eta = 0.001})`.
struct LARSOptions {
  /// Global learning rate (schedules set "lr").
  double lr = 0.1;
  /// Momentum coefficient.
  double momentum = 0.9;
  /// L2 weight decay, applied inside the step to the adapted tensors only.
  double weight_decay_rate = 0.0;
  /// Trust coefficient (You et al.'s eta).
  double eta = 0.001;
  /// Added to the denominator of the trust ratio.
  double eps = 1e-9;
  /// The tensors stepped without trust ratio and without weight decay (plain momentum SGD);
  /// by default biases and normalisation parameters (is_bias_or_norm). Empty: none.
  ParamPredicate exclude = is_bias_or_norm;
};

/// LARS, per parameter tensor w with gradient g (Note [LARS and LAMB]):
///
///   trust = eta ||w|| / (||g|| + weight_decay_rate ||w|| + eps)   (1 when ||w|| or ||g|| is 0)
///   v = momentum v - lr trust (g + weight_decay_rate w);   w += v
///
/// and, for a tensor that `exclude` selects, v = momentum v - lr g; w += v. Hyperparameters:
/// "lr", "momentum", "weight_decay_rate", "eta", "eps"; state: "v".
class LARS : public Optimizer {
 public:
  explicit LARS(const LARSOptions& options = {});

  /// The learning rate, a reference into the hyperparameter table.
  double& lr() { return hyperparam("lr"); }
  using Optimizer::lr;
  /// The tensors left out of the adaptation and the weight decay.
  ParamPredicate exclude;
  const char* type_name() const override { return "LARS"; }
  std::vector<std::string> per_parameter_hyperparams() const override {
    return {"momentum", "eps", "eta", "weight_decay_rate"};
  }

 protected:
  void init_state(ParamState& state) override;
  void update_one(ParamState& state) override;
};

}  // namespace kusari::optimizers
