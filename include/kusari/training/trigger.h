// Triggers decide when the trainer stops and when extensions run (Chainer's triggers).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kusari/serializers/serializer.h"

namespace kusari::training {

class Trainer;

/// A predicate on the trainer's state, asked once per iteration.
class Trigger : public Serializable {
 public:
  ~Trigger() override = default;
  virtual bool operator()(Trainer& trainer) = 0;
  void serialize(Serializer&) override {}
};

/// Fires every `period` epochs or iterations ("epoch" / "iteration").
class IntervalTrigger : public Trigger {
 public:
  IntervalTrigger(double period, const std::string& unit);
  bool operator()(Trainer& trainer) override;
  void serialize(Serializer& serializer) override;
  double period() const { return period_; }
  const std::string& unit() const { return unit_; }

 private:
  double period_;
  std::string unit_;
  // Start at 0 like Chainer; -1 marks "unknown" (guess from the updater). See Note [Trigger start].
  int64_t previous_iteration_ = 0;
  double previous_epoch_detail_ = 0;
};

/// Fires at the listed epochs or iterations.
class ManualScheduleTrigger : public Trigger {
 public:
  ManualScheduleTrigger(std::vector<double> points, const std::string& unit);
  bool operator()(Trainer& trainer) override;
  void serialize(Serializer& serializer) override;

 private:
  std::vector<double> points_;
  std::string unit_;
  // Start at 0 like Chainer; -1 marks "unknown" (guess from the updater). See Note [Trigger start].
  int64_t previous_iteration_ = 0;
  double previous_epoch_detail_ = 0;
};

/// Shorthand: `training::interval(1, "epoch")`.
std::shared_ptr<Trigger> interval(double period, const std::string& unit);
/// Shorthand for ManualScheduleTrigger.
std::shared_ptr<Trigger> manual_schedule(std::vector<double> points, const std::string& unit);

}  // namespace kusari::training
