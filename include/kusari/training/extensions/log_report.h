// LogReport: averages the reported values over an interval and appends them to a JSON log
// (Chainer's extensions.LogReport).
//
//   trainer.extend(extensions::LogReport());   // <out>/log, one entry per epoch
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kusari/training/extension.h"
#include "kusari/training/summary.h"
#include "kusari/training/trigger.h"

namespace kusari::training::extensions {

/// Collects every iteration's observation and, each time its own trigger fires, appends the
/// means of the interval plus "epoch", "iteration" and "elapsed_time" to a log that is
/// rewritten to <trainer.out()>/<log_name> as a JSON list.
///
/// Note [LogReport file]
/// Like Chainer, the whole list is rewritten at each interval (indented by 4), atomically (a
/// temporary file renamed over the old one), so the file is always valid JSON. "epoch" and
/// "iteration" are JSON integers. Non-finite means (a diverged loss) are written as null,
/// since JSON has no NaN or Infinity (Python's json module writes the non-standard NaN).
/// The extension runs every iteration (its registration trigger) to gather values; the
/// interval is the `trigger` given to the constructor, as in Chainer.
///
/// Note [LogReport key order]
/// Chainer's log keeps each entry's keys in insertion order (Python dicts; json.dump does not
/// sort): the reported keys in the order they first appeared in the interval, then "epoch",
/// "iteration" and "elapsed_time", then what postprocess added. kusari writes the same order
/// (nlohmann::ordered_json, not the alphabetical nlohmann::json): with `keys` given, their
/// order; otherwise the order in which keys first appeared in the interval's observations
/// (the model's "main/..." keys, reported at every iteration, before an Evaluator's
/// "validation/..." keys, reported at the interval's last one). Keys that appear together in
/// one observation come in the order they were reported (Observation keeps it: Classifier's
/// "main/loss" before "main/accuracy", and the Evaluator reports its means in the model's
/// order). Keys postprocess adds follow, sorted. A resumed run reads the order back from
/// the snapshot's log. Entry itself stays a std::map for lookups.
class LogReport : public Extension {
 public:
  /// One log entry: key -> value ("main/loss" -> 0.25, "epoch" -> 1, ...).
  using Entry = std::map<std::string, double>;

  /// `keys`: the keys to log, in the order the JSON entries list them (every reported key
  /// when std::nullopt; an empty list is a ValueError, since it would log nothing).
  /// `trigger`: when to write an entry (default every epoch). `log_name`: the file name in the
  /// trainer's out folder; it may contain "{key}" fields filled from the entry (e.g.
  /// "log_{iteration}"); empty for no file.
  explicit LogReport(std::optional<std::vector<std::string>> keys = std::nullopt,
                     std::shared_ptr<Trigger> trigger = nullptr, std::string log_name = "log");

  /// Called with each entry before it is appended (Chainer's postprocess).
  void set_postprocess(std::function<void(Entry&)> postprocess) {
    postprocess_ = std::move(postprocess);
  }

  /// Adds the iteration's observation; writes an entry when the interval ends.
  void operator()(Trainer& trainer) override;
  /// "LogReport" (the name PrintReport looks for).
  std::string default_name() const override { return "LogReport"; }
  /// Every iteration: the values of each iteration are gathered.
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }

  /// The entries written so far.
  const std::vector<Entry>& log() const { return log_; }
  /// The log as the JSON text written to the file.
  std::string log_json() const;

  /// Saves or loads the trigger ("_trigger"), the interval's summary ("_summary") and the log
  /// ("_log", a JSON string), so a resumed run continues the same file (Chainer's layout).
  void serialize(Serializer& serializer) override;

 private:
  std::optional<std::vector<std::string>> keys_;
  std::shared_ptr<Trigger> trigger_;
  std::string log_name_;
  std::function<void(Entry&)> postprocess_;
  DictSummary summary_;
  std::vector<std::string> order_;  // the interval's keys, in order of first appearance
  std::vector<Entry> log_;
  std::vector<std::vector<std::string>> orders_;  // each entry's key order, for the JSON
};

}  // namespace kusari::training::extensions
