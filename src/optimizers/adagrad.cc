#include "kusari/optimizers/adagrad.h"

#include "kusari/core/routines.h"

namespace kusari::optimizers {

AdaGrad::AdaGrad(double lr, double eps) {
  declare_hyperparam("lr", lr);
  declare_hyperparam("eps", eps);
}

void AdaGrad::init_state(ParamState& s) {
  s.add("h", Array());
}

std::optional<Optimizer::UpdateStep> AdaGrad::update_step(ParamState& s) {
  return UpdateStep{UpdateRule::kAdaGrad, {lr(), eps()}, {&s.get("h")}};
}

}  // namespace kusari::optimizers
