// Reporting observed values (Chainer's chainer.reporter): code anywhere, e.g. a model's forward,
// calls report({{"loss", loss}}, this); the trainer's reporter records it as "main/loss" in the
// current iteration's observation, and extensions (LogReport, PrintReport) summarise them.
#pragma once

#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kusari/core/array.h"

namespace kusari {

/// One iteration's reported values by key ("main/loss" -> 0-d array), in the order they were
/// first reported, as in Chainer's observation dicts: a log lists "main/loss" before
/// "main/accuracy" because Classifier reports them so. A map's interface over a short vector
/// (an observation holds a handful of keys). Values stay on their device until a summary needs
/// them, so reporting never waits for a GPU.
class Observation {
 public:
  using value_type = std::pair<std::string, Array>;
  using iterator = std::vector<value_type>::iterator;
  using const_iterator = std::vector<value_type>::const_iterator;

  Observation() = default;
  /// The values in the order given; a repeated key keeps its first place and its last value.
  Observation(std::initializer_list<value_type> values) {
    for (const value_type& v : values) (*this)[v.first] = v.second;
  }

  /// The value of `key`, added at the end (undefined) when it is new.
  Array& operator[](const std::string& key) {
    auto it = find(key);
    if (it != end()) return it->second;
    values_.emplace_back(key, Array());
    return values_.back().second;
  }
  iterator find(const std::string& key) {
    for (auto it = values_.begin(); it != values_.end(); ++it)
      if (it->first == key) return it;
    return values_.end();
  }
  const_iterator find(const std::string& key) const {
    for (auto it = values_.begin(); it != values_.end(); ++it)
      if (it->first == key) return it;
    return values_.end();
  }
  size_t count(const std::string& key) const { return find(key) == end() ? 0 : 1; }
  bool contains(const std::string& key) const { return find(key) != end(); }
  /// The value of `key`; throws std::out_of_range when there is none (as std::map::at).
  const Array& at(const std::string& key) const;
  /// Adds `value` under `key` unless the key is there already (as std::map::emplace).
  std::pair<iterator, bool> emplace(const std::string& key, Array value) {
    auto it = find(key);
    if (it != end()) return {it, false};
    values_.emplace_back(key, std::move(value));
    return {values_.end() - 1, true};
  }
  /// Removes `key`; returns how many values were removed (0 or 1).
  size_t erase(const std::string& key) {
    auto it = find(key);
    if (it == end()) return 0;
    values_.erase(it);
    return 1;
  }
  void clear() { values_.clear(); }
  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  iterator begin() { return values_.begin(); }
  iterator end() { return values_.end(); }
  const_iterator begin() const { return values_.begin(); }
  const_iterator end() const { return values_.end(); }

 private:
  std::vector<value_type> values_;
};

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
  void report(const Observation& values, const void* observer = nullptr);

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
void report(const Observation& values, const void* observer = nullptr);

/// Reports one scalar (stored as a 0-d float64 CPU array).
void report_scalar(const std::string& key, double value, const void* observer = nullptr);

}  // namespace kusari
