// LinearShift: moves an optimizer hyperparameter linearly from one value to another over a
// range of calls, e.g. a learning-rate warm-up (Chainer's extensions.LinearShift).
//
//   trainer.extend(extensions::LinearShift("lr", {0.0, 0.1}, {0, 1000}));
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "kusari/training/extension.h"

namespace kusari::training::extensions {

/// At its t-th call (every iteration unless extend() gives another trigger) sets `attr` to
/// value_range.first while t <= time_range.first, value_range.second once t >= time_range.second,
/// and the linear interpolation in between. initialize() sets the value for t = 0 (or, after a
/// resume, the last value set).
class LinearShift : public Extension {
 public:
  LinearShift(std::string attr, std::pair<double, double> value_range,
              std::pair<int64_t, int64_t> time_range, std::string optimizer = "main");

  /// Sets the value for the current call count (or the last value set before a snapshot).
  void initialize(Trainer& trainer) override;
  /// Takes the next step of the schedule.
  void operator()(Trainer& trainer) override;
  /// "LinearShift".
  std::string default_name() const override { return "LinearShift"; }
  /// Every iteration (Chainer's default).
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }
  /// Saves or loads "_t" and "_last_value" (Chainer's layout).
  void serialize(Serializer& serializer) override;

  /// The number of calls so far.
  int64_t t() const { return t_; }

 private:
  double value_at(int64_t t) const;
  void set_value(Trainer& trainer, double value);

  std::string attr_;
  std::pair<double, double> value_range_;
  std::pair<int64_t, int64_t> time_range_;
  std::string optimizer_;
  int64_t t_ = 0;
  std::optional<double> last_value_;
};

}  // namespace kusari::training::extensions
