#include "kusari/optimizers/rmsprop_warmup.h"

#include <algorithm>
#include <cmath>

#include "kusari/core/routines.h"

namespace kusari::optimizers {

// Note [RMSprop warm-up]
// What the 15-minute paper (Akiba et al. 2017, "RMSprop warm-up") describes: with its 32k
// minibatch the main difficulty is the optimisation at the start of training, so training starts
// with RMSprop and moves gradually to momentum SGD, through one update that mixes the two: the
// RMSprop mean square m of the gradients (decay mu2) and a momentum buffer (decay mu1) fed by the
// gradient scaled by alpha_SGD eta_SGD + alpha_RMSprop eta_RMSprop / (sqrt(m) + eps), where
// alpha_RMSprop = 1 - alpha_SGD and alpha_SGD grows with the epoch along an ELU-shaped curve with
// a centre and a period (beta_center, beta_period).
//
// What we implement: that step (RMSpropWarmup, the kernels' kRmspropWarmup rule) with alpha_SGD
// as the hyperparameter "sgd_weight", and the curve as RMSpropWarmupTransition:
// alpha_SGD(e) = min(1, elu(2 (e - center) / period) / 2 + 1/2), which is e^(2x) / 2 before the
// centre, 1/2 at it, and linear up to 1 at center + period / 2. The weight is a function of the
// fractional epoch, set every iteration by EpochShift, not a per-epoch step; the learning rate
// "lr" can follow its own schedule (the paper pairs the switch with its "slow-start" rate
// schedule; ours is WarmupSchedule's). After the transition the step is momentum SGD's (the
// RMSprop term is multiplied by 0); the mean square is still kept, so a later schedule could
// weigh it again. The centre, period and eta_RMSprop of our Fashion-MNIST demonstration are in
// docs/imagenet.md and are ours, tuned for a run of a few epochs, not the paper's.
double RMSpropWarmupTransition::operator()(double epoch) const {
  KUSARI_CHECK(period > 0, ValueError, "RMSpropWarmupTransition: period must be positive, got ",
               period);
  const double x = 2.0 * (epoch - center) / period;
  const double elu = x >= 0 ? x : std::expm1(x);
  return std::min(1.0, 0.5 * elu + 0.5);
}

RMSpropWarmup::RMSpropWarmup(double lr, double lr_rmsprop, double momentum, double alpha,
                             double eps, double sgd_weight) {
  declare_hyperparam("lr", lr);
  declare_hyperparam("lr_rmsprop", lr_rmsprop);
  declare_hyperparam("momentum", momentum);
  declare_hyperparam("alpha", alpha);
  declare_hyperparam("eps", eps);
  declare_hyperparam("sgd_weight", sgd_weight);
}

void RMSpropWarmup::init_state(ParamState& s) {
  s.add("ms", Array());
  s.add("v", Array());
}

std::optional<Optimizer::UpdateStep> RMSpropWarmup::update_step(ParamState& s) {
  const double w = sgd_weight();
  KUSARI_CHECK(w >= 0.0 && w <= 1.0, ValueError, type_name(), ": sgd_weight must be in [0, 1], got ",
               w);
  const Array& data = s.param.data();
  const double e = hyperparam("eps");
  KUSARI_CHECK(w == 1.0 || data.dtype() == Dtype::kFloat64 || static_cast<float>(e) != 0.0f,
               ValueError, type_name(), ": eps (", e, ") is too small for ",
               dtype_name(data.dtype()), " parameters");
  return UpdateStep{UpdateRule::kRmspropWarmup,
                    {w * hyperparam("lr"), (1.0 - w) * hyperparam("lr_rmsprop"),
                     hyperparam("momentum"), hyperparam("alpha"), e},
                    {&s.get("ms"), &s.get("v")}};
}

}  // namespace kusari::optimizers
