#include "kusari/training/early_stopping.h"

#include <cstdio>

#include "kusari/training/trainer.h"

namespace kusari::training {

EarlyStoppingTrigger::EarlyStoppingTrigger(std::shared_ptr<Trigger> check_trigger, std::string monitor, int patience,
                                           std::string mode, bool verbose, std::shared_ptr<Trigger> max_trigger)
    : check_trigger_(check_trigger ? std::move(check_trigger) : interval(1, "epoch")),
      max_trigger_(max_trigger ? std::move(max_trigger) : interval(100, "epoch")),
      monitor_(std::move(monitor)),
      patience_(patience),
      verbose_(verbose) {
  KUSARI_CHECK(patience > 0, ValueError, "EarlyStoppingTrigger: patience must be positive, got ", patience);
  KUSARI_CHECK(mode == "min" || mode == "max" || mode == "auto", ValueError,
               "EarlyStoppingTrigger: mode must be 'min', 'max' or 'auto', got '", mode, "'");
  maximize_ = mode == "max" || (mode == "auto" && monitor_.find("accuracy") != std::string::npos);
  best_ = maximize_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
}

bool EarlyStoppingTrigger::operator()(Trainer& trainer) {
  const Observation& obs = trainer.observation();
  auto it = obs.find(monitor_);
  if (it != obs.end()) summary_.add(monitor_, it->second);
  if ((*max_trigger_)(trainer)) return true;
  if (!(*check_trigger_)(trainer)) return false;
  auto means = summary_.compute_mean();
  summary_.clear();
  auto m = means.find(monitor_);
  if (m == means.end()) {
    if (verbose_) std::fprintf(stderr, "EarlyStoppingTrigger: '%s' was not reported; not stopping\n", monitor_.c_str());
    return false;
  }
  const double current = reduce(m->second);
  const bool better = maximize_ ? current > best_ : current < best_;
  if (better) {
    best_ = current;
    count_ = 0;
  } else {
    ++count_;
  }
  if (count_ >= patience_) {
    if (verbose_) std::fprintf(stderr, "EarlyStoppingTrigger: '%s' did not improve for %d checks; stopping\n",
                               monitor_.c_str(), patience_);
    return true;
  }
  return false;
}

void EarlyStoppingTrigger::serialize(Serializer& s) {
  check_trigger_->serialize(*s.child("check_trigger"));
  max_trigger_->serialize(*s.child("max_trigger"));
  summary_.serialize(*s.child("summary"));
  s("best", best_);
  s.count("count", count_);
}

}  // namespace kusari::training
