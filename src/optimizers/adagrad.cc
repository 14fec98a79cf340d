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

void AdaGrad::update_one(ParamState& s) {
  Array p = s.param.data();  // a handle to the parameter's memory
  update_parameter(UpdateRule::kAdaGrad, p, s.param.grad(), {&s.get("h")}, {lr(), eps()},
                   skip_flag());
}

}  // namespace kusari::optimizers
