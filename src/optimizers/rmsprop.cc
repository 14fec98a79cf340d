#include "kusari/optimizers/rmsprop.h"

#include "kusari/core/routines.h"

namespace kusari::optimizers {

RMSprop::RMSprop(double lr, double alpha, double eps, bool eps_inside_sqrt) {
  declare_hyperparam("lr", lr);
  declare_hyperparam("alpha", alpha);
  declare_hyperparam("eps", eps);
  declare_hyperparam("eps_inside_sqrt", eps_inside_sqrt ? 1.0 : 0.0);
}

void RMSprop::init_state(ParamState& s) {
  s.add("ms", Array());
}

std::optional<Optimizer::UpdateStep> RMSprop::update_step(ParamState& s) {
  const Array& data = s.param.data();
  const double e = eps();
  KUSARI_CHECK(e == 0.0 || data.dtype() == Dtype::kFloat64 || static_cast<float>(e) != 0.0f,
               ValueError, type_name(), ": eps (", e, ") is too small for ",
               dtype_name(data.dtype()), " parameters");
  return UpdateStep{
      UpdateRule::kRmsprop, {lr(), alpha(), e, eps_inside_sqrt() ? 1.0 : 0.0}, {&s.get("ms")}};
}

}  // namespace kusari::optimizers
