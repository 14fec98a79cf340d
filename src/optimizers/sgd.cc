#include "kusari/optimizers/sgd.h"

#include "kusari/core/routines.h"

namespace kusari::optimizers {

SGD::SGD(double lr) {
  declare_hyperparam("lr", lr);
}

void SGD::update_one(ParamState& s) {
  Array p = s.param.data();  // a handle to the parameter's memory
  update_parameter(UpdateRule::kSgd, p, s.param.grad(), {}, {lr()}, skip_flag());
}

MomentumSGD::MomentumSGD(double lr, double momentum) {
  declare_hyperparam("lr", lr);
  declare_hyperparam("momentum", momentum);
}

void MomentumSGD::init_state(ParamState& s) {
  s.add("v", Array());
}

void MomentumSGD::update_one(ParamState& s) {
  Array p = s.param.data();
  update_parameter(UpdateRule::kMomentumSgd, p, s.param.grad(), {&s.get("v")}, {lr(), momentum()},
                   skip_flag());
}

NesterovAG::NesterovAG(double lr, double momentum) {
  declare_hyperparam("lr", lr);
  declare_hyperparam("momentum", momentum);
}

void NesterovAG::init_state(ParamState& s) {
  s.add("v", Array());
}

void NesterovAG::update_one(ParamState& s) {
  Array p = s.param.data();
  update_parameter(UpdateRule::kNesterov, p, s.param.grad(), {&s.get("v")}, {lr(), momentum()},
                   skip_flag());
}

}  // namespace kusari::optimizers
