// observe_value / observe_lr: put a value computed from the trainer into the current
// observation, so LogReport and PrintReport show it (Chainer's extensions.observe_value).
//
//   trainer.extend(extensions::observe_lr());   // "lr" in every epoch's log entry
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kusari/training/extension.h"

namespace kusari::training::extensions {

/// An extension that stores fn(trainer) as `observation_key` in the trainer's observation.
/// It runs every epoch by default, as a writer (before LogReport reads the observation);
/// its default name is "observe_<observation_key>".
std::shared_ptr<Extension> observe_value(const std::string& observation_key,
                                         std::function<double(Trainer&)> fn);

/// Records the learning rate of the optimizer `optimizer_name` (its Optimizer::lr(), which for
/// Adam is the effective step size) as `observation_key`.
std::shared_ptr<Extension> observe_lr(const std::string& optimizer_name = "main",
                                      const std::string& observation_key = "lr");

}  // namespace kusari::training::extensions
