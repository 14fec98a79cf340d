#include "kusari/core/reporter.h"

#include <stdexcept>

namespace kusari {

namespace {
thread_local Reporter* t_reporter = nullptr;
}  // namespace

void Reporter::add_observer(const std::string& name, const void* observer) { names_[observer] = name; }

void Reporter::add_observers(const std::string& prefix,
                             const std::vector<std::pair<std::string, const void*>>& observers) {
  for (const auto& [name, obs] : observers) names_[obs] = prefix + name;
}

std::string Reporter::observer_name(const void* observer) const {
  auto it = names_.find(observer);
  return it == names_.end() ? std::string() : it->second;
}

void Reporter::report(const Observation& values, const void* observer) {
  if (!observation_) return;
  std::string prefix;
  if (observer) {
    auto it = names_.find(observer);
    KUSARI_CHECK(it != names_.end(), ValueError,
                 "report: the observer is not registered with the current reporter (register the link with "
                 "Reporter::add_observer, as Trainer does for the updater's target)");
    prefix = it->second + "/";
  }
  for (const auto& [key, value] : values) (*observation_)[prefix + key] = value;
}

const Array& Observation::at(const std::string& key) const {
  auto it = find(key);
  if (it == end()) throw std::out_of_range("Observation::at: no value was reported under '" + key + "'");
  return it->second;
}

ReporterScope::ReporterScope(Reporter& reporter, Observation& observation)
    : previous_reporter_(t_reporter), previous_observation_(reporter.observation()), reporter_(reporter) {
  t_reporter = &reporter;
  reporter.set_observation(&observation);
}

ReporterScope::~ReporterScope() {
  reporter_.set_observation(previous_observation_);
  t_reporter = previous_reporter_;
}

Reporter* current_reporter() { return t_reporter; }

void report(const Observation& values, const void* observer) {
  if (t_reporter) t_reporter->report(values, observer);
}

void report_scalar(const std::string& key, double value, const void* observer) {
  if (t_reporter) t_reporter->report({{key, Array::full({}, value, Dtype::kFloat64, Device::cpu())}}, observer);
}

}  // namespace kusari
