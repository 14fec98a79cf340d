// Early stopping (Chainer's triggers.EarlyStoppingTrigger).
#pragma once

#include <limits>
#include <memory>
#include <string>

#include "kusari/training/summary.h"
#include "kusari/training/trigger.h"

namespace kusari::training {

/// A stop trigger that fires when a monitored value has not improved for `patience` checks,
/// or when `max_trigger` fires. The monitored value is averaged over each check interval.
class EarlyStoppingTrigger : public Trigger {
 public:
  /// mode "min", "max" or "auto" ("max" when the key contains "accuracy", else "min").
  EarlyStoppingTrigger(std::shared_ptr<Trigger> check_trigger = nullptr, std::string monitor = "main/loss",
                       int patience = 3, std::string mode = "auto", bool verbose = false,
                       std::shared_ptr<Trigger> max_trigger = nullptr);
  bool operator()(Trainer& trainer) override;
  void serialize(Serializer& serializer) override;
  double best() const { return best_; }

 protected:
  /// The value compared against the best; the multi-node version averages it over the ranks.
  virtual double reduce(double local_mean) { return local_mean; }

 private:
  std::shared_ptr<Trigger> check_trigger_;
  std::shared_ptr<Trigger> max_trigger_;
  std::string monitor_;
  int patience_;
  bool maximize_;
  bool verbose_;
  DictSummary summary_;
  double best_;
  int64_t count_ = 0;
};

}  // namespace kusari::training
