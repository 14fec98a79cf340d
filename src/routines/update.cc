#include "kusari/core/routines.h"

#include <string>

#include "kernels/update.h"
#include "routines/routine_util.h"

namespace kusari {

using routines::check_defined;

// --- optimizer updates ---------------------------------------------------------------------------

const char* update_rule_name(UpdateRule rule) {
  switch (rule) {
    case UpdateRule::kSgd:
      return "SGD";
    case UpdateRule::kMomentumSgd:
      return "MomentumSGD";
    case UpdateRule::kNesterov:
      return "NesterovAG";
    case UpdateRule::kAdam:
      return "Adam";
    case UpdateRule::kRmsprop:
      return "RMSprop";
    case UpdateRule::kAdaGrad:
      return "AdaGrad";
  }
  return "update";
}

namespace {

// The typed parameters of a rule from the public list of doubles (its count already checked), in
// the order of Note [Update rule layouts].
kernels::UpdateParams update_params(UpdateRule rule, const std::vector<double>& h) {
  switch (rule) {
    case UpdateRule::kSgd:
      return kernels::SgdParams{h[0]};
    case UpdateRule::kMomentumSgd:
      return kernels::MomentumSgdParams{h[0], h[1]};
    case UpdateRule::kNesterov:
      return kernels::NesterovParams{h[0], h[1]};
    case UpdateRule::kAdam:
      return kernels::AdamParams{h[0], h[1], h[2], h[3], h[4], h[5], h[6] != 0.0};
    case UpdateRule::kRmsprop:
      return kernels::RmspropParams{h[0], h[1], h[2], h[3] != 0.0};
    case UpdateRule::kAdaGrad:
      return kernels::AdaGradParams{h[0], h[1]};
  }
  KUSARI_ASSERT(false, "update_parameter: unknown update rule ", static_cast<int>(rule));
  return kernels::SgdParams{0.0};
}

}  // namespace

void update_parameter(UpdateRule rule, Array& param, const Array& grad_in,
                      const std::vector<Array*>& state, const std::vector<double>& hyper,
                      const Array* skip) {
  const std::string fn_str = std::string("update_parameter (") + update_rule_name(rule) + ")";
  const char* fn = fn_str.c_str();
  // How many hyperparameters and state arrays the rule takes; see Note [Update rule layouts].
  size_t want_hyper = 0, want_state = 0;
  const char* state_names = "";
  switch (rule) {
    case UpdateRule::kSgd:
      want_hyper = 1, want_state = 0, state_names = "none";
      break;
    case UpdateRule::kMomentumSgd:
      want_hyper = 2, want_state = 1, state_names = "v";
      break;
    case UpdateRule::kNesterov:
      want_hyper = 2, want_state = 1, state_names = "v";
      break;
    case UpdateRule::kAdam:
      want_hyper = 7;
      want_state = hyper.size() == 7 && hyper[6] != 0.0 ? 3 : 2;
      state_names = want_state == 3 ? "m, v, vhat (amsgrad)" : "m, v";
      break;
    case UpdateRule::kRmsprop:
      want_hyper = 4, want_state = 1, state_names = "ms";
      break;
    case UpdateRule::kAdaGrad:
      want_hyper = 2, want_state = 1, state_names = "h";
      break;
  }
  KUSARI_CHECK(hyper.size() == want_hyper, ValueError, fn, ": expected ", want_hyper,
               " hyperparameters, got ", hyper.size());
  KUSARI_CHECK(state.size() == want_state, ValueError, fn, ": expected ", want_state,
               " state arrays (", state_names, "), got ", state.size());
  check_defined(fn, param);
  check_defined(fn, grad_in);
  check_floating(fn, param);
  check_same_device(fn, {&param, &grad_in});
  check_same_dtype(fn, {&param, &grad_in});
  KUSARI_CHECK(grad_in.shape() == param.shape(), ShapeError, fn, ": the gradient has shape ",
               grad_in.shape(), " but the parameter has shape ", param.shape());
  // A channels-last parameter (Note [Memory formats]) is updated through its dense NHWC view;
  // its state arrays must share its layout, and the gradient is brought to it.
  const MemoryFormat format = param.memory_format();
  KUSARI_CHECK(param.is_contiguous(format), ValueError, fn, ": the parameter (shape ", param.shape(),
               ") must be contiguous (or channels-last) to be updated in place");
  auto dense = [format](const Array& a) {
    return format == MemoryFormat::kChannelsLast ? a.transpose({0, 2, 3, 1}) : a;
  };
  std::vector<Array> views;
  views.reserve(state.size());
  for (size_t k = 0; k < state.size(); ++k) {
    KUSARI_CHECK(state[k] != nullptr, ValueError, fn, ": state array ", k, " is null");
    const Array& s = *state[k];
    check_defined(fn, s);
    check_same_device(fn, {&param, &s});
    check_same_dtype(fn, {&param, &s});
    KUSARI_CHECK(s.shape() == param.shape(), ShapeError, fn, ": state array ", k, " has shape ",
                 s.shape(), " but the parameter has shape ", param.shape());
    KUSARI_CHECK(s.is_contiguous(format), ValueError, fn, ": state array ", k, " (shape ", s.shape(),
                 ") must be ", memory_format_name(format), " like the parameter to be updated in place");
    views.push_back(dense(s));  // a view of the same memory
  }
  if (skip) {
    check_defined(fn, *skip);
    KUSARI_CHECK(skip->size() == 1 && skip->dtype() == Dtype::kInt64 && skip->is_contiguous() &&
                     skip->device() == param.device(),
                 ValueError, fn, ": the skip flag must be one int64 on ", param.device(),
                 ", got shape ", skip->shape(), " ", dtype_name(skip->dtype()), " on ",
                 skip->device());
  }
  if (param.size() == 0) return;
  const Array grad = dense(grad_in.to_memory_format(format));
  Array param_view = dense(param);
  kernels::update_parameter(param.device(), param_view, grad, views.data(), static_cast<int>(views.size()),
                            update_params(rule, hyper), skip);
}

Array count_nonfinite(const std::vector<Array>& arrays) {
  const char* fn = "count_nonfinite";
  KUSARI_CHECK(!arrays.empty(), ValueError, fn, ": no arrays were given");
  const Device device = arrays.front().device();
  std::vector<Array> inputs;
  inputs.reserve(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) {
    const Array& a = arrays[i];
    check_defined(fn, a);
    check_floating(fn, a);
    KUSARI_CHECK(a.device() == device, DeviceError, fn, ": array ", i, " is on ", a.device(),
                 " but array 0 is on ", device, " (count each device's arrays apart)");
    if (a.size() > 0) inputs.push_back(a.contiguous());
  }
  Array out = Array::empty({}, Dtype::kInt64, device);
  kernels::count_nonfinite(device, inputs.data(), static_cast<int>(inputs.size()), out);
  return out;
}

}  // namespace kusari
