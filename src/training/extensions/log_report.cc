#include "kusari/training/extensions/log_report.h"

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

nlohmann::json entry_to_json(const LogReport::Entry& entry) {
  nlohmann::json obj = nlohmann::json::object();
  for (const auto& [key, value] : entry) {
    if (is_integer_key(key) && std::isfinite(value)) {
      obj[key] = static_cast<int64_t>(value);
    } else {
      obj[key] = value;  // nlohmann writes NaN and infinities as null
    }
  }
  return obj;
}

std::vector<LogReport::Entry> log_from_json(const std::string& text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  KUSARI_CHECK(j.is_array(), IOError, "LogReport::serialize: '", where,
               "' is not a JSON list of log entries");
  std::vector<LogReport::Entry> log;
  for (const nlohmann::json& obj : j) {
    KUSARI_CHECK(obj.is_object(), IOError, "LogReport::serialize: '", where,
                 "' holds an entry that is not an object");
    LogReport::Entry entry;
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (it.value().is_number()) {
        entry[it.key()] = it.value().get<double>();
      } else if (it.value().is_null()) {
        entry[it.key()] = std::numeric_limits<double>::quiet_NaN();
      }
    }
    log.push_back(std::move(entry));
  }
  return log;
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
  if (!trigger_) trigger_ = interval(1, "epoch");
}

void LogReport::operator()(Trainer& trainer) {
  const Observation& observation = trainer.observation();
  if (keys_) {
    Observation selected;
    for (const std::string& key : *keys_) {
      auto it = observation.find(key);
      if (it != observation.end()) selected.emplace(key, it->second);
    }
    summary_.add(selected);
  } else {
    summary_.add(observation);
  }
  if (!(*trigger_)(trainer)) return;

  Entry entry = summary_.compute_mean();
  Updater& updater = trainer.updater();
  entry["epoch"] = static_cast<double>(updater.epoch());
  entry["iteration"] = static_cast<double>(updater.iteration());
  entry["elapsed_time"] = trainer.elapsed_time();
  if (postprocess_) postprocess_(entry);
  log_.push_back(std::move(entry));

  if (!log_name_.empty()) {
    const std::string name = format_log_name(log_name_, log_.back());
    const std::string path = (std::filesystem::path(trainer.out()) / name).string();
    detail::write_file_atomically(path, log_json() + "\n", "LogReport");
  }
  summary_.clear();
}

std::string LogReport::log_json() const {
  nlohmann::json list = nlohmann::json::array();
  for (const Entry& entry : log_) list.push_back(entry_to_json(entry));
  return list.dump(4);
}

void LogReport::serialize(Serializer& s) {
  trigger_->serialize(*s.child("_trigger"));
  summary_.serialize(*s.child("_summary"));
  if (s.is_loading()) {
    std::string text;
    s("_log", text);
    log_ = log_from_json(text, s.path() + "_log");
  } else {
    nlohmann::json list = nlohmann::json::array();
    for (const Entry& entry : log_) list.push_back(entry_to_json(entry));
    std::string text = list.dump();
    s("_log", text);
  }
}

}  // namespace kusari::training::extensions
