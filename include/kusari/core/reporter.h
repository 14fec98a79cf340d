// Reporting observed values (Chainer's chainer.reporter): code anywhere, e.g. a model's forward,
// calls report({{"loss", loss}}, this); the trainer's reporter records it as "main/loss" in the
// current iteration's observation, and extensions (LogReport, PrintReport) summarise them.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kusari/core/array.h"

namespace kusari {

/// One iteration's reported values by key ("main/loss" -> 0-d array). Values stay on their
/// device until a summary needs them, so reporting never waits for a GPU.
using Observation = std::map<std::string, Array>;

/// Maps observers (usually links) to name prefixes and collects reports into an observation.
class Reporter {
 public:
  /// Registers `observer` under `name`: its reports get keys "name/key".
  void add_observer(const std::string& name, const void* observer);
  /// Registers several observers, each as prefix + their name.
  void add_observers(const std::string& prefix, const std::vector<std::pair<std::string, const void*>>& observers);
  /// The name an observer was registered with (empty when unknown).
  std::string observer_name(const void* observer) const;

  /// Records `values` into the current observation, keyed by the observer's name.
  void report(const std::map<std::string, Array>& values, const void* observer = nullptr);

  /// The observation being filled (only valid inside a ReporterScope's ObservationScope).
  Observation* observation() const { return observation_; }
  void set_observation(Observation* obs) { observation_ = obs; }

 private:
  std::map<const void*, std::string> names_;
  Observation* observation_ = nullptr;
};

/// Makes `reporter` the current reporter of this thread and points it at `observation`
/// until the scope ends (Chainer's `with reporter.scope(observation)`).
class ReporterScope {
 public:
  ReporterScope(Reporter& reporter, Observation& observation);
  ~ReporterScope();
  ReporterScope(const ReporterScope&) = delete;
  ReporterScope& operator=(const ReporterScope&) = delete;

 private:
  Reporter* previous_reporter_;
  Observation* previous_observation_;
  Reporter& reporter_;
};

/// The current reporter of this thread (null outside any ReporterScope).
Reporter* current_reporter();

/// Reports values to the current reporter; does nothing when there is none.
void report(const std::map<std::string, Array>& values, const void* observer = nullptr);

/// Reports one scalar (stored as a 0-d float64 CPU array).
void report_scalar(const std::string& key, double value, const void* observer = nullptr);

}  // namespace kusari
