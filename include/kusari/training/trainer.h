// The training loop (Chainer's Trainer): run the updater until the stop trigger fires, running
// extensions whose triggers fire, with every report of an iteration gathered into one observation.
#pragma once

#include <chrono>
#include <concepts>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kusari/core/reporter.h"
#include "kusari/training/extension.h"
#include "kusari/training/trigger.h"
#include "kusari/training/updater.h"

namespace kusari::training {

class Trainer : public Serializable {
 public:
  /// stop_trigger defaults to 20 epochs; `out` is the folder logs and snapshots go to.
  Trainer(std::shared_ptr<Updater> updater, std::shared_ptr<Trigger> stop_trigger = nullptr,
          std::string out = "result");

  /// Registers an extension; name, trigger and priority default to the extension's own.
  void extend(std::shared_ptr<Extension> extension, const std::string& name = "",
              std::shared_ptr<Trigger> trigger = nullptr, std::optional<int> priority = std::nullopt);
  /// Registers an extension given by value, as in Chainer: `trainer.extend(LogReport())`.
  /// The trainer keeps its own copy; to read an extension later (e.g. LogReport::log()),
  /// pass a shared_ptr or use get_extension(name).
  template <typename E>
    requires std::derived_from<std::remove_cvref_t<E>, Extension>
  void extend(E&& extension, const std::string& name = "",
              std::shared_ptr<Trigger> trigger = nullptr,
              std::optional<int> priority = std::nullopt) {
    auto owned = std::make_shared<std::remove_cvref_t<E>>(std::forward<E>(extension));
    extend(std::static_pointer_cast<Extension>(std::move(owned)), name, std::move(trigger),
           priority);
  }
  /// Runs the loop until the stop trigger fires. Exceptions propagate after extensions'
  /// on_error and finalize have run.
  void run();

  Updater& updater() { return *updater_; }
  Reporter& reporter() { return reporter_; }
  /// The current iteration's observation ("main/loss" -> value, ...).
  Observation& observation() { return observation_; }
  const std::string& out() const { return out_; }
  /// Seconds of training so far (kept across a resume from a snapshot).
  double elapsed_time() const;
  Trigger& stop_trigger() { return *stop_trigger_; }
  /// The extension registered as `name` (ValueError when none).
  Extension& get_extension(const std::string& name);

  /// Saves or loads the updater, the stop trigger and every extension (Chainer's layout).
  void serialize(Serializer& serializer) override;

 private:
  struct Entry {
    std::string name;
    std::shared_ptr<Extension> extension;
    std::shared_ptr<Trigger> trigger;
    int priority;
    size_t order;
  };

  std::shared_ptr<Updater> updater_;
  std::shared_ptr<Trigger> stop_trigger_;
  std::string out_;
  Reporter reporter_;
  Observation observation_;
  std::vector<Entry> extensions_;
  std::optional<std::chrono::steady_clock::time_point> start_;
  double elapsed_before_ = 0.0;  // from a loaded snapshot
  bool done_ = false;
};

}  // namespace kusari::training
