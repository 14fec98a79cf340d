// LAMB (You et al., "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes",
// 2019): Adam's direction with decoupled weight decay, scaled per tensor by a trust ratio.
//
//   auto opt = std::make_shared<kusari::optimizers::LAMB>(
//       kusari::optimizers::LAMBOptions{.lr = 0.01, .weight_decay_rate = 0.01});
#pragma once

#include "kusari/optimizers/hooks.h"
#include "kusari/optimizers/optimizer.h"

namespace kusari::optimizers {

/// LAMB's hyperparameters, for `LAMB({.lr = 0.01})`.
struct LAMBOptions {
  /// Global learning rate (schedules set "lr").
  double lr = 0.001;
  /// Exponential decay rate of the first moment.
  double beta1 = 0.9;
  /// Exponential decay rate of the second moment.
  double beta2 = 0.999;
  /// Added to sqrt(v) in Adam's direction.
  double eps = 1e-6;
  /// Decoupled weight decay, added to the direction of the adapted tensors only.
  double weight_decay_rate = 0.01;
  /// Divide the moments by 1 - beta^t (Adam's bias correction).
  bool bias_correction = true;
  /// The tensors stepped without trust ratio and without weight decay; by default biases and
  /// normalisation parameters (is_bias_or_norm). Empty: none.
  ParamPredicate exclude = is_bias_or_norm;
};

/// LAMB, per parameter tensor w with gradient g and step count t (Note [LARS and LAMB]):
///
///   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
///   r = m_hat / (sqrt(v_hat) + eps) + weight_decay_rate w    (m_hat = m / (1 - beta1^t), ...)
///   w -= lr trust r,   trust = ||w|| / ||r||   (1 when either norm is 0)
///
/// and, for a tensor that `exclude` selects, w -= lr m_hat / (sqrt(v_hat) + eps) (trust 1, no
/// decay). Hyperparameters: "lr", "beta1", "beta2", "eps", "weight_decay_rate",
/// "bias_correction" (0 or 1); state: "m", "v".
class LAMB : public Optimizer {
 public:
  explicit LAMB(const LAMBOptions& options = {});

  /// The learning rate, a reference into the hyperparameter table.
  double& lr() { return hyperparam("lr"); }
  using Optimizer::lr;
  /// The tensors left out of the adaptation and the weight decay.
  ParamPredicate exclude;
  const char* type_name() const override { return "LAMB"; }
  std::vector<std::string> per_parameter_hyperparams() const override {
    return {"beta1", "beta2", "eps", "weight_decay_rate"};
  }

 protected:
  void init_state(ParamState& state) override;
  void update_one(ParamState& state) override;
};

}  // namespace kusari::optimizers
