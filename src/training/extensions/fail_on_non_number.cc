#include "kusari/training/extensions/fail_on_non_number.h"

#include <map>
#include <vector>

#include "kusari/core/routines.h"
#include "kusari/training/trainer.h"

namespace kusari::training::extensions {

FailOnNonNumber::FailOnNonNumber(bool check_grad, std::string optimizer)
    : check_grad_(check_grad), optimizer_(std::move(optimizer)) {}

void FailOnNonNumber::operator()(Trainer& trainer) {
  Link* target = trainer.updater().optimizer(optimizer_).target();
  if (!target) return;
  struct Check {
    std::string what;  // "parameter '/l1/W'" or "the gradient of parameter '/l1/W'"
    Array flag;        // 0-d bool on the parameter's device: all finite
  };
  // Flags grouped by device, so each device is read once (Note [FailOnNonNumber cost]).
  std::map<std::pair<int, int>, std::vector<Check>> checks;
  auto add = [&](const std::string& what, const Array& a) {
    if (!a.defined() || a.size() == 0) return;
    if (!is_floating(a.dtype())) return;
    checks[{static_cast<int>(a.device().type()), a.device().index()}].push_back(
        {what, all(isfinite(a))});
  };
  for (const auto& [path, param] : target->namedparams(/*include_uninit=*/false)) {
    add("parameter '" + path + "'", param.data());
    if (check_grad_) add("the gradient of parameter '" + path + "'", param.grad());
  }
  for (auto& [device, list] : checks) {
    std::vector<Array> flags;
    for (const Check& c : list) flags.push_back(c.flag.reshape({1}));
    const std::vector<uint8_t> finite =
        concatenate(flags).astype(Dtype::kUInt8).to_vector<uint8_t>();
    for (size_t i = 0; i < list.size(); ++i) {
      KUSARI_CHECK(finite[i], Error, "FailOnNonNumber: ", list[i].what, " of optimizer '",
                   optimizer_, "' holds NaN or infinity at iteration ",
                   trainer.updater().iteration(),
                   ": training diverged (lower the learning rate, or check the data and the loss)");
    }
  }
}

}  // namespace kusari::training::extensions
