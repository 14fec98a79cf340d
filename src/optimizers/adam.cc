#include "kusari/optimizers/adam.h"

#include <cmath>

#include "kusari/core/routines.h"

namespace kusari::optimizers {

Adam::Adam(double alpha, double beta1, double beta2, double eps, double eta,
           double weight_decay_rate, bool amsgrad) {
  declare_hyperparam("alpha", alpha);
  declare_hyperparam("beta1", beta1);
  declare_hyperparam("beta2", beta2);
  declare_hyperparam("eps", eps);
  declare_hyperparam("eta", eta);
  declare_hyperparam("weight_decay_rate", weight_decay_rate);
  declare_hyperparam("amsgrad", amsgrad ? 1.0 : 0.0);
}

Adam::Adam(const AdamOptions& o)
    : Adam(o.alpha, o.beta1, o.beta2, o.eps, o.eta, o.weight_decay_rate, o.amsgrad) {}

namespace {

/// sqrt(1 - beta2^t) / (1 - beta1^t), Adam's bias correction of the step size.
double bias_correction(int64_t t, double beta1, double beta2) {
  return std::sqrt(1.0 - std::pow(beta2, static_cast<double>(t))) / (1.0 - std::pow(beta1, static_cast<double>(t)));
}

}  // namespace

double Adam::bias_corrected_alpha(int64_t t) const {
  KUSARI_CHECK(t >= 1, ValueError, type_name(),
               ": the bias-corrected step size needs a step count t >= 1, got ", t);
  const double fix1 = 1.0 - std::pow(beta1(), static_cast<double>(t));
  const double fix2 = 1.0 - std::pow(beta2(), static_cast<double>(t));
  return alpha() * std::sqrt(fix2) / fix1;
}

// Note [Adam learning rate]
// Chainer's Adam.lr (alias alpha_t) is alpha sqrt(1 - beta2^t) / (1 - beta1^t) at the
// optimizer's t, which Chainer increments before the parameters are updated; so after k updates
// it is the step size of the k-th update, and observe_lr logs exactly that. kusari increments t
// at the same point (Note [Optimizer step order]), so lr() reads t() directly and matches
// Chainer's value everywhere Chainer defines one. Before the first update Chainer raises; lr()
// returns the step size the first update will use (t = 1) instead.
double Adam::lr() const {
  return bias_corrected_alpha(t() > 0 ? t() : 1);
}

void Adam::init_state(ParamState& s) {
  s.add("m", Array());
  s.add("v", Array());
  if (amsgrad()) s.add("vhat", Array());
}

std::optional<Optimizer::UpdateStep> Adam::update_step(ParamState& s) {
  const Array& data = s.param.data();
  // As Chainer does: an eps that rounds to zero in the compute type would divide by zero.
  const double e = hyperparam_for(s, "eps");
  KUSARI_CHECK(e == 0.0 || data.dtype() == Dtype::kFloat64 || static_cast<float>(e) != 0.0f,
               ValueError, type_name(), ": eps (", e, ") is too small for ",
               dtype_name(data.dtype()), " parameters");
  const bool ams = amsgrad();
  if (ams && !s.find("vhat")) s.add("vhat", Array());  // amsgrad switched on after the first step
  std::vector<Array*> state{&s.get("m"), &s.get("v")};
  if (ams) state.push_back(&s.get("vhat"));
  // The betas may be the parameter's own (set_hyperparam_where): so may its bias correction.
  const double b1 = hyperparam_for(s, "beta1"), b2 = hyperparam_for(s, "beta2");
  const double alpha_t =
      b1 == beta1() && b2 == beta2() ? bias_corrected_alpha(s.t) : alpha() * bias_correction(s.t, b1, b2);
  return UpdateStep{UpdateRule::kAdam,
                    {alpha_t, b1, b2, e, hyperparam_for(s, "eta"), hyperparam_for(s, "weight_decay_rate"),
                     ams ? 1.0 : 0.0},
                    std::move(state)};
}

}  // namespace kusari::optimizers
