#include "kusari/training/extensions/log_report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "kusari/training/trainer.h"
#include "training/extensions/extension_util.h"

namespace kusari::training::extensions {

namespace {

bool is_integer_key(const std::string& key) {
  return key == "epoch" || key == "iteration";
}

// One entry as a JSON object whose keys come in `order` (Note [LogReport key order]).
nlohmann::ordered_json entry_to_json(const LogReport::Entry& entry,
                                     const std::vector<std::string>& order) {
  nlohmann::ordered_json obj = nlohmann::ordered_json::object();
  for (const std::string& key : order) {
    auto it = entry.find(key);
    if (it == entry.end()) continue;
    const double value = it->second;
    if (is_integer_key(key) && std::isfinite(value)) {
      obj[key] = static_cast<int64_t>(value);
    } else {
      obj[key] = value;  // nlohmann writes NaN and infinities as null
    }
  }
  return obj;
}

// `order` followed by the entry's other keys (in the map's order): every key exactly once.
std::vector<std::string> complete_order(const LogReport::Entry& entry,
                                        const std::vector<std::string>& order) {
  std::vector<std::string> out;
  out.reserve(entry.size());
  for (const std::string& key : order) {
    if (entry.count(key) && std::find(out.begin(), out.end(), key) == out.end()) out.push_back(key);
  }
  for (const auto& [key, value] : entry) {
    if (std::find(out.begin(), out.end(), key) == out.end()) out.push_back(key);
  }
  return out;
}

void log_from_json(const std::string& text, const std::string& where,
                   std::vector<LogReport::Entry>& log,
                   std::vector<std::vector<std::string>>& orders) {
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  KUSARI_CHECK(j.is_array(), IOError, "LogReport::serialize: '", where,
               "' is not a JSON list of log entries");
  log.clear();
  orders.clear();
  for (const nlohmann::ordered_json& obj : j) {
    KUSARI_CHECK(obj.is_object(), IOError, "LogReport::serialize: '", where,
                 "' holds an entry that is not an object");
    LogReport::Entry entry;
    std::vector<std::string> order;
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (it.value().is_number()) {
        entry[it.key()] = it.value().get<double>();
      } else if (it.value().is_null()) {
        entry[it.key()] = std::numeric_limits<double>::quiet_NaN();
      } else {
        continue;
      }
      order.push_back(it.key());
    }
    log.push_back(std::move(entry));
    orders.push_back(std::move(order));
  }
}

// Fills "{key}" fields of a log name from the entry (Chainer's log_name.format(**stats)).
std::string format_log_name(const std::string& pattern, const LogReport::Entry& entry) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '{') {
      out += pattern[i];
      continue;
    }
    const size_t close = pattern.find('}', i);
    KUSARI_CHECK(close != std::string::npos, ValueError, "LogReport: unbalanced '{' in log_name '",
                 pattern, "'");
    const std::string key = pattern.substr(i + 1, close - i - 1);
    auto it = entry.find(key);
    KUSARI_CHECK(it != entry.end(), ValueError, "LogReport: log_name '", pattern, "' refers to '{",
                 key, "}', which is not in the log entry");
    const double v = it->second;
    if (std::isfinite(v) && v == std::floor(v) && std::abs(v) < 1e15) {
      out += std::to_string(static_cast<int64_t>(v));
    } else {
      out += nlohmann::json(v).dump();
    }
    i = close;
  }
  return out;
}

}  // namespace

LogReport::LogReport(std::optional<std::vector<std::string>> keys, std::shared_ptr<Trigger> trigger,
                     std::string log_name)
    : keys_(std::move(keys)), trigger_(std::move(trigger)), log_name_(std::move(log_name)) {
  KUSARI_CHECK(!keys_ || !keys_->empty(), ValueError,
               "LogReport: the list of keys is empty, so no reported value would be logged (and a "
               "PrintReport of this log would print blank columns); pass std::nullopt (the "
               "default) to log every reported key, or name the keys to log");
  if (!trigger_) trigger_ = interval(1, "epoch");
}

void LogReport::operator()(Trainer& trainer) {
  const Observation& observation = trainer.observation();
  auto seen = [this](const std::string& key) {
    if (std::find(order_.begin(), order_.end(), key) == order_.end()) order_.push_back(key);
  };
  if (keys_) {
    Observation selected;
    for (const std::string& key : *keys_) {
      auto it = observation.find(key);
      if (it != observation.end()) {
        selected.emplace(key, it->second);
        seen(key);
      }
    }
    summary_.add(selected);
  } else {
    for (const auto& [key, value] : observation) seen(key);
    summary_.add(observation);
  }
  if (!(*trigger_)(trainer)) return;

  Entry entry = summary_.compute_mean();
  std::vector<std::string> order = complete_order(entry, order_);
  Updater& updater = trainer.updater();
  entry["epoch"] = static_cast<double>(updater.epoch());
  entry["iteration"] = static_cast<double>(updater.iteration());
  entry["elapsed_time"] = trainer.elapsed_time();
  order.insert(order.end(), {"epoch", "iteration", "elapsed_time"});
  if (postprocess_) postprocess_(entry);
  log_.push_back(std::move(entry));
  orders_.push_back(complete_order(log_.back(), order));

  if (!log_name_.empty()) {
    const std::string name = format_log_name(log_name_, log_.back());
    const std::string path = (std::filesystem::path(trainer.out()) / name).string();
    detail::write_file_atomically(path, log_json() + "\n", "LogReport");
  }
  summary_.clear();
  order_.clear();
}

std::string LogReport::log_json() const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (size_t i = 0; i < log_.size(); ++i) list.push_back(entry_to_json(log_[i], orders_[i]));
  return list.dump(4);
}

void LogReport::serialize(Serializer& s) {
  trigger_->serialize(*s.child("_trigger"));
  summary_.serialize(*s.child("_summary"));
  if (s.is_loading()) {
    std::string text;
    s("_log", text);
    log_from_json(text, s.path() + "_log", log_, orders_);
    order_.clear();
    for (const auto& [key, summary] : summary_.summaries()) order_.push_back(key);
  } else {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (size_t i = 0; i < log_.size(); ++i) list.push_back(entry_to_json(log_[i], orders_[i]));
    std::string text = list.dump();
    s("_log", text);
  }
}

}  // namespace kusari::training::extensions
