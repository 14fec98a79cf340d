#include "kusari/optimizers/sgd.h"

#include "kusari/core/routines.h"

namespace kusari::optimizers {

SGD::SGD(double lr) {
  declare_hyperparam("lr", lr);
}

std::optional<Optimizer::UpdateStep> SGD::update_step(ParamState&) {
  return UpdateStep{UpdateRule::kSgd, {lr()}, {}};
}

MomentumSGD::MomentumSGD(double lr, double momentum) {
  declare_hyperparam("lr", lr);
  declare_hyperparam("momentum", momentum);
}

void MomentumSGD::init_state(ParamState& s) {
  s.add("v", Array());
}

std::optional<Optimizer::UpdateStep> MomentumSGD::update_step(ParamState& s) {
  return UpdateStep{UpdateRule::kMomentumSgd, {lr(), momentum()}, {&s.get("v")}};
}

NesterovAG::NesterovAG(double lr, double momentum) {
  declare_hyperparam("lr", lr);
  declare_hyperparam("momentum", momentum);
}

void NesterovAG::init_state(ParamState& s) {
  s.add("v", Array());
}

std::optional<Optimizer::UpdateStep> NesterovAG::update_step(ParamState& s) {
  return UpdateStep{UpdateRule::kNesterov, {lr(), momentum()}, {&s.get("v")}};
}

}  // namespace kusari::optimizers
