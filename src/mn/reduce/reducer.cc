#include "mn/reduce/reducer.h"

#include "kusari/core/error.h"

namespace kusari::mn::detail {

std::string gradient_settings(const CommunicatorOptions& options) {
  return kusari::detail::concat(
      "gradients_in_buffer ", options.gradients_in_buffer ? "on" : "off", ", allreduce_grad_dtype ",
      options.allreduce_grad_dtype ? dtype_name(*options.allreduce_grad_dtype) : "unset");
}

Dtype widest_dtype(const std::vector<Dtype>& dtypes) {
  Dtype first = dtypes.front();
  bool same = true, any64 = false;
  for (Dtype d : dtypes) {
    same = same && d == first;
    any64 = any64 || d == Dtype::kFloat64;
  }
  if (same) return first;
  return any64 ? Dtype::kFloat64 : Dtype::kFloat32;
}

Dtype wire_dtype(const NamedParams& params, const CommunicatorOptions& options) {
  if (options.allreduce_grad_dtype) return *options.allreduce_grad_dtype;
  std::vector<Dtype> dtypes;
  for (const auto& [path, p] : params) dtypes.push_back(p.grad().dtype());
  return widest_dtype(dtypes);
}

std::optional<Dtype> buffer_dtype(GradientBuffer& buffer, const NamedParams& params, Device device,
                                  const CommunicatorOptions& options) {
  const std::optional<Dtype> dtype =
      options.gradients_in_buffer ? common_gradient_dtype(params, device) : std::nullopt;
  if (!dtype || (options.allreduce_grad_dtype && *options.allreduce_grad_dtype != *dtype)) {
    buffer.release();
    return std::nullopt;
  }
  return dtype;
}

}  // namespace kusari::mn::detail
