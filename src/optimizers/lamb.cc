#include "kusari/optimizers/lamb.h"

#include <cmath>

#include "kusari/core/routines.h"
#include "optimizers/trust_ratio.h"

namespace kusari::optimizers {

// See Note [LARS and LAMB] in lars.cc.
LAMB::LAMB(const LAMBOptions& o) : exclude(o.exclude) {
  declare_hyperparam("lr", o.lr);
  declare_hyperparam("beta1", o.beta1);
  declare_hyperparam("beta2", o.beta2);
  declare_hyperparam("eps", o.eps);
  declare_hyperparam("weight_decay_rate", o.weight_decay_rate);
  declare_hyperparam("bias_correction", o.bias_correction ? 1.0 : 0.0);
}

void LAMB::init_state(ParamState& s) {
  s.add("m", Array());
  s.add("v", Array());
}

void LAMB::update_one(ParamState& s) {
  Array p = s.param.data();
  const Array& g = s.param.grad();
  Array& m = s.get("m");
  Array& v = s.get("v");
  const double beta1 = hyperparam_for(s, "beta1"), beta2 = hyperparam_for(s, "beta2");
  m.assign(m * beta1 + g * (1.0 - beta1));
  v.assign(v * beta2 + g * g * (1.0 - beta2));
  double c1 = 1.0, c2 = 1.0;  // bias corrections from the parameter's step count
  if (hyperparam("bias_correction") != 0.0) {
    c1 = 1.0 - std::pow(beta1, static_cast<double>(s.t));
    c2 = 1.0 - std::pow(beta2, static_cast<double>(s.t));
  }
  Array direction = (m * (1.0 / c1)) / (sqrt(v * (1.0 / c2)) + hyperparam_for(s, "eps"));
  const double lr = hyperparam("lr");
  if (exclude && exclude(s.path, s.param)) {
    p.assign(p - direction * lr);
    return;
  }
  const double wd = hyperparam_for(s, "weight_decay_rate");
  if (wd != 0.0) direction = direction + p * wd;
  const Array w_norm = detail::l2_norm(p), r_norm = detail::l2_norm(direction);
  const Array trust = detail::trust_ratio(w_norm, r_norm, w_norm / r_norm);
  p.assign(p - direction * (trust * lr));
}

}  // namespace kusari::optimizers
