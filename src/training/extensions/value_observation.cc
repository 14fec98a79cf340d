#include "kusari/training/extensions/value_observation.h"

#include "kusari/training/trainer.h"

namespace kusari::training::extensions {

std::shared_ptr<Extension> observe_value(const std::string& observation_key,
                                         std::function<double(Trainer&)> fn) {
  KUSARI_CHECK(fn, ValueError, "observe_value: the function for '", observation_key, "' is empty");
  KUSARI_CHECK(!observation_key.empty(), ValueError, "observe_value: the observation key is empty");
  return make_extension(
      [observation_key, fn = std::move(fn)](Trainer& trainer) {
        trainer.observation()[observation_key] =
            Array::full({}, fn(trainer), Dtype::kFloat64, Device::cpu());
      },
      "observe_" + observation_key, interval(1, "epoch"), kPriorityWriter);
}

std::shared_ptr<Extension> observe_lr(const std::string& optimizer_name,
                                      const std::string& observation_key) {
  return observe_value(observation_key, [optimizer_name](Trainer& trainer) {
    return trainer.updater().optimizer(optimizer_name).lr();
  });
}

}  // namespace kusari::training::extensions
