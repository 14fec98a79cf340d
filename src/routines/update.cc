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
    case UpdateRule::kRmspropWarmup:
      return "RMSpropWarmup";
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
    case UpdateRule::kRmspropWarmup:
      return kernels::RmspropWarmupParams{h[0], h[1], h[2], h[3], h[4]};
  }
  KUSARI_ASSERT(false, "update_parameter: unknown update rule ", static_cast<int>(rule));
  return kernels::SgdParams{0.0};
}

}  // namespace

namespace {

// Checks the hyperparameter and state counts of `rule`; see Note [Update rule layouts].
void check_update_counts(const char* fn, UpdateRule rule, const std::vector<double>& hyper,
                         size_t n_state) {
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
    case UpdateRule::kRmspropWarmup:
      want_hyper = 5, want_state = 2, state_names = "ms, v";
      break;
  }
  KUSARI_CHECK(hyper.size() == want_hyper, ValueError, fn, ": expected ", want_hyper,
               " hyperparameters, got ", hyper.size());
  KUSARI_CHECK(n_state == want_state, ValueError, fn, ": expected ", want_state, " state arrays (",
               state_names, "), got ", n_state);
}

void check_skip(const char* fn, const Array* skip, const Device& device) {
  if (!skip) return;
  check_defined(fn, *skip);
  KUSARI_CHECK(skip->size() == 1 && skip->dtype() == Dtype::kInt64 && skip->is_contiguous() &&
                   skip->device() == device,
               ValueError, fn, ": the skip flag must be one int64 on ", device, ", got shape ",
               skip->shape(), " ", dtype_name(skip->dtype()), " on ", skip->device());
}

// Checks one parameter's step and appends the dense views the kernels take: the parameter, its
// gradient (brought to the parameter's layout) and its states.
void append_update_views(const char* fn, Array& param, const Array& grad_in,
                         const std::vector<Array*>& state, std::vector<Array>& params,
                         std::vector<Array>& grads, std::vector<Array>& states) {
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
  KUSARI_CHECK(param.is_contiguous(format), ValueError, fn, ": the parameter (shape ",
               param.shape(), ") must be contiguous (or channels-last) to be updated in place");
  auto dense = [format](const Array& a) {
    return format == MemoryFormat::kChannelsLast ? a.transpose({0, 2, 3, 1}) : a;
  };
  for (size_t k = 0; k < state.size(); ++k) {
    KUSARI_CHECK(state[k] != nullptr, ValueError, fn, ": state array ", k, " is null");
    const Array& s = *state[k];
    check_defined(fn, s);
    check_same_device(fn, {&param, &s});
    check_same_dtype(fn, {&param, &s});
    KUSARI_CHECK(s.shape() == param.shape(), ShapeError, fn, ": state array ", k, " has shape ",
                 s.shape(), " but the parameter has shape ", param.shape());
    KUSARI_CHECK(s.is_contiguous(format), ValueError, fn, ": state array ", k, " (shape ",
                 s.shape(), ") must be ", memory_format_name(format),
                 " like the parameter to be updated in place");
  }
  if (param.size() == 0) return;
  for (const Array* s : state) states.push_back(dense(*s));  // views of the same memory
  params.push_back(dense(param));
  grads.push_back(dense(grad_in.to_memory_format(format)));
}

}  // namespace

void update_parameter(UpdateRule rule, Array& param, const Array& grad,
                      const std::vector<Array*>& state, const std::vector<double>& hyper,
                      const Array* skip) {
  const std::string fn_str = std::string("update_parameter (") + update_rule_name(rule) + ")";
  const char* fn = fn_str.c_str();
  check_update_counts(fn, rule, hyper, state.size());
  std::vector<Array> params, grads, views;
  params.reserve(1);
  grads.reserve(1);
  views.reserve(state.size());
  append_update_views(fn, param, grad, state, params, grads, views);
  check_skip(fn, skip, param.device());
  if (params.empty()) return;  // (an empty parameter)
  kernels::update_parameter(param.device(), params[0], grads[0], views.data(),
                            static_cast<int>(views.size()), update_params(rule, hyper), skip);
}

// Note [Multi-tensor updates]
// A model's update is one step of one rule on each of its parameters; as a launch per parameter
// it costs ResNet-50 161 launches (and 161 passes of host overhead) per step, most of them on
// tensors too small to fill a GPU. update_parameters takes the whole list at once and the kernel
// steps them in a few launches (Note [Multi-tensor launches] on CUDA, Note [Multi-tensor chunks
// on the CPU]). The tensors share the rule, its hyperparameters (so Adam's alpha_t, that is the
// step count t), the dtype and the device; every element is computed by the same code as
// update_parameter's, so the two paths give the same bits. Optimizer::update groups its
// parameters so (Note [Grouped optimizer updates]).
void update_parameters(UpdateRule rule, const std::vector<Array*>& params,
                       const std::vector<Array>& grads,
                       const std::vector<std::vector<Array*>>& states,
                       const std::vector<double>& hyper, const Array* skip) {
  const std::string fn_str = std::string("update_parameters (") + update_rule_name(rule) + ")";
  const char* fn = fn_str.c_str();
  KUSARI_CHECK(grads.size() == params.size() && states.size() == params.size(), ValueError, fn,
               ": expected as many gradients and state lists as parameters, got ", params.size(),
               " parameters, ", grads.size(), " gradients and ", states.size(), " state lists");
  if (params.empty()) return;
  const size_t n_state = states[0].size();
  check_update_counts(fn, rule, hyper, n_state);
  std::vector<Array> param_views, grad_views, state_views;
  param_views.reserve(params.size());
  grad_views.reserve(params.size());
  state_views.reserve(params.size() * n_state);
  Device device = Device::cpu();
  Dtype dtype = Dtype::kFloat32;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string tensor_fn = fn_str + ", tensor " + std::to_string(i);
    KUSARI_CHECK(params[i] != nullptr, ValueError, tensor_fn, ": the parameter is null");
    KUSARI_CHECK(states[i].size() == n_state, ValueError, tensor_fn, ": expected ", n_state,
                 " state arrays like tensor 0, got ", states[i].size());
    Array& p = *params[i];
    check_defined(tensor_fn.c_str(), p);
    if (i == 0) {
      device = p.device();
      dtype = p.dtype();
    }
    KUSARI_CHECK(p.device() == device, DeviceError, tensor_fn, ": the parameter is on ", p.device(),
                 " but tensor 0 is on ", device, " (update each device's parameters apart)");
    KUSARI_CHECK(p.dtype() == dtype, DtypeError, tensor_fn, ": the parameter is ",
                 dtype_name(p.dtype()), " but tensor 0 is ", dtype_name(dtype),
                 " (update each dtype's parameters apart)");
    append_update_views(tensor_fn.c_str(), p, grads[i], states[i], param_views, grad_views,
                        state_views);
  }
  check_skip(fn, skip, device);
  if (param_views.empty()) return;
  kernels::update_parameters(device, param_views.data(), grad_views.data(), state_views.data(),
                             static_cast<int>(param_views.size()), static_cast<int>(n_state),
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
