// Adam and AdamW (Chainer's Adam with eta, decoupled weight decay and AMSGrad; AdamW).
#pragma once

#include "kusari/optimizers/optimizer.h"

namespace kusari::optimizers {

/// Adam's hyperparameters, for `Adam({.alpha = 1e-4, .amsgrad = true})`.
struct AdamOptions {
  /// Step size.
  double alpha = 0.001;
  /// Exponential decay rate of the first moment.
  double beta1 = 0.9;
  /// Exponential decay rate of the second moment.
  double beta2 = 0.999;
  /// Small value for numerical stability.
  double eps = 1e-8;
  /// Schedule multiplier (scales the whole step, weight decay included).
  double eta = 1.0;
  /// Decoupled weight decay rate (AdamW); 0 is plain Adam.
  double weight_decay_rate = 0.0;
  /// Use the AMSGrad variant (keeps the running maximum "vhat" of v).
  bool amsgrad = false;
};

/// Adam (Kingma & Ba), with Chainer's extensions:
///
///   m += (1 - beta1) (g - m);  v += (1 - beta2) (g^2 - v)
///   vhat = max(vhat, v) with amsgrad, else vhat = v
///   p -= eta (alpha_t m / (sqrt(vhat) + eps) + weight_decay_rate p)
///   alpha_t = alpha sqrt(1 - beta2^t) / (1 - beta1^t), t = the parameter's step count
///
/// Hyperparameters: "alpha", "beta1", "beta2", "eps", "eta", "weight_decay_rate", "amsgrad"
/// (0 or 1); state: "m", "v" and, with amsgrad, "vhat". See Note [Adam learning rate].
class Adam : public Optimizer {
 public:
  explicit Adam(double alpha = 0.001, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
                double eta = 1.0, double weight_decay_rate = 0.0, bool amsgrad = false);
  /// Adam from an options struct (designated initialisers read well).
  explicit Adam(const AdamOptions& options);

  /// The bias-corrected step size alpha_t at the optimizer's t (Chainer's Adam.lr / alpha_t).
  double lr() const override;
  /// Chainer's spelling of lr().
  double alpha_t() const { return lr(); }

  /// The step size, a reference into the hyperparameter table.
  double& alpha() { return hyperparam("alpha"); }
  /// The step size.
  double alpha() const { return hyperparam("alpha"); }
  /// The first-moment decay rate, a reference into the hyperparameter table.
  double& beta1() { return hyperparam("beta1"); }
  /// The first-moment decay rate.
  double beta1() const { return hyperparam("beta1"); }
  /// The second-moment decay rate, a reference into the hyperparameter table.
  double& beta2() { return hyperparam("beta2"); }
  /// The second-moment decay rate.
  double beta2() const { return hyperparam("beta2"); }
  /// The stability constant, a reference into the hyperparameter table.
  double& eps() { return hyperparam("eps"); }
  /// The stability constant.
  double eps() const { return hyperparam("eps"); }
  /// The schedule multiplier, a reference into the hyperparameter table.
  double& eta() { return hyperparam("eta"); }
  /// The schedule multiplier.
  double eta() const { return hyperparam("eta"); }
  /// The decoupled weight decay rate, a reference into the hyperparameter table.
  double& weight_decay_rate() { return hyperparam("weight_decay_rate"); }
  /// The decoupled weight decay rate.
  double weight_decay_rate() const { return hyperparam("weight_decay_rate"); }
  /// True when the AMSGrad variant is used.
  bool amsgrad() const { return hyperparam("amsgrad") != 0.0; }
  /// Switches the AMSGrad variant on or off (states gain "vhat" at their next update).
  void set_amsgrad(bool value) { hyperparam("amsgrad") = value ? 1.0 : 0.0; }

  /// alpha sqrt(1 - beta2^t) / (1 - beta1^t) for step t >= 1 with this optimizer's hyperparameters.
  double bias_corrected_alpha(int64_t t) const;

  const char* type_name() const override { return "Adam"; }
  bool steps_elementwise() const override { return true; }
  std::vector<std::string> per_parameter_hyperparams() const override {
    return {"beta1", "beta2", "eps", "eta", "weight_decay_rate"};
  }

 protected:
  void init_state(ParamState& state) override;
  std::optional<UpdateStep> update_step(ParamState& state) override;
  bool skips_on_device() const override { return true; }
};

/// AdamW: Adam with decoupled weight decay (Chainer's AdamW, a special case of Adam; the same
/// hyperparameters, weight_decay_rate 0 by default as in Chainer).
class AdamW : public Adam {
 public:
  explicit AdamW(double alpha = 0.001, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
                 double eta = 1.0, double weight_decay_rate = 0.0, bool amsgrad = false)
      : Adam(alpha, beta1, beta2, eps, eta, weight_decay_rate, amsgrad) {}
  /// AdamW from an options struct.
  explicit AdamW(const AdamOptions& options) : Adam(options) {}

  const char* type_name() const override { return "AdamW"; }
};

}  // namespace kusari::optimizers
