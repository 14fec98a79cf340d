#include "kusari/optimizers/lars.h"

#include "kusari/core/routines.h"
#include "optimizers/trust_ratio.h"

namespace kusari::optimizers {

// Note [LARS and LAMB]
// Both scale the step of each parameter tensor by a trust ratio ||w|| / ||step direction|| so
// that every layer moves by about the same fraction of its weights whatever the scale of its
// gradients; that lets the global rate grow with the batch (You et al. trained ResNet-50 with
// 32k images per step). Biases and batch normalisation's gamma and beta are left out of the
// adaptation and of the weight decay (LARSOptions::exclude, is_bias_or_norm), as in the usual
// setups (the MLPerf ResNet-50 LARS, NVIDIA's LAMB): their norms say little about a sensible
// step. A ratio whose numerator or denominator is 0 (a tensor of zeros, a zero gradient) is 1.
//
// The ratio needs two reductions over the whole tensor between elementwise passes, so these
// optimizers do not describe their step to the fused update kernels (update_step): a group of
// tensors would need a multi-tensor norm kernel and a kernel that reads a ratio per tensor from
// the device. Each tensor is stepped with array routines instead (update_one), the norms and the
// ratio staying on the parameter's device as 0-d arrays, so a GPU step never waits for the host.
// With dynamic loss scaling the overflow count is then read before the step (skips_on_device()
// is false; Note [Dynamic loss scaling]).
LARS::LARS(const LARSOptions& o) : exclude(o.exclude) {
  declare_hyperparam("lr", o.lr);
  declare_hyperparam("momentum", o.momentum);
  declare_hyperparam("weight_decay_rate", o.weight_decay_rate);
  declare_hyperparam("eta", o.eta);
  declare_hyperparam("eps", o.eps);
}

void LARS::init_state(ParamState& s) { s.add("v", Array()); }

void LARS::update_one(ParamState& s) {
  Array p = s.param.data();  // handles to the parameter's and the state's memory
  const Array& g = s.param.grad();
  Array& v = s.get("v");
  const double lr = hyperparam("lr"), momentum = hyperparam_for(s, "momentum");
  Array step;  // lr x trust x the direction
  if (exclude && exclude(s.path, s.param)) {
    step = g * lr;
  } else {
    const double wd = hyperparam_for(s, "weight_decay_rate");
    const Array w_norm = detail::l2_norm(p), g_norm = detail::l2_norm(g);
    const Array denom = g_norm + w_norm * wd + hyperparam_for(s, "eps");
    const Array trust = detail::trust_ratio(w_norm, g_norm, w_norm * hyperparam_for(s, "eta") / denom);
    step = (wd != 0.0 ? g + p * wd : g) * (trust * lr);
  }
  v.assign(v * momentum - step);
  p.assign(p + v);
}

}  // namespace kusari::optimizers
