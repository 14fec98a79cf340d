#include "kusari/training/trigger.h"

#include <algorithm>
#include <cmath>

#include "kusari/training/trainer.h"

namespace kusari::training {

namespace {

void check_unit(const std::string& unit, const char* fn) {
  KUSARI_CHECK(unit == "epoch" || unit == "iteration", ValueError, fn, ": unit must be 'epoch' or 'iteration', got '",
               unit, "'");
}

}  // namespace

// Note [Trigger start]
// The previous iteration / epoch_detail start at 0, as in Chainer: the stop trigger is asked
// once before the first update (iteration 0, epoch_detail 0), and a "previous" of -1 there
// would make floor(-1 / period) != floor(0 / period), stopping training before it starts.
// Negative values mean "unknown" (e.g. a snapshot from before these fields were saved); the
// trigger then guesses from the updater. Both values are recorded on every call whatever the
// unit, so a snapshot holds a consistent state.

IntervalTrigger::IntervalTrigger(double period, const std::string& unit) : period_(period), unit_(unit) {
  check_unit(unit, "IntervalTrigger");
  KUSARI_CHECK(period > 0, ValueError, "IntervalTrigger: period must be positive, got ", period);
}

bool IntervalTrigger::operator()(Trainer& trainer) {
  Updater& u = trainer.updater();
  bool fire;
  if (unit_ == "epoch") {
    const double detail = u.epoch_detail();
    double prev = previous_epoch_detail_;
    if (prev < 0) prev = u.previous_epoch_detail();
    fire = std::floor(prev / period_) != std::floor(detail / period_);
  } else {
    const int64_t it = u.iteration();
    int64_t prev = previous_iteration_;
    if (prev < 0) prev = it - 1;
    fire = std::floor(static_cast<double>(prev) / period_) != std::floor(static_cast<double>(it) / period_);
  }
  previous_iteration_ = u.iteration();
  previous_epoch_detail_ = u.epoch_detail();
  return fire;
}

void IntervalTrigger::serialize(Serializer& s) {
  s("previous_iteration", previous_iteration_);
  s("previous_epoch_detail", previous_epoch_detail_);
}

ManualScheduleTrigger::ManualScheduleTrigger(std::vector<double> points, const std::string& unit)
    : points_(std::move(points)), unit_(unit) {
  check_unit(unit, "ManualScheduleTrigger");
  std::sort(points_.begin(), points_.end());
}

bool ManualScheduleTrigger::operator()(Trainer& trainer) {
  Updater& u = trainer.updater();
  double now, prev;
  if (unit_ == "epoch") {
    now = u.epoch_detail();
    prev = previous_epoch_detail_ < 0 ? u.previous_epoch_detail() : previous_epoch_detail_;
  } else {
    now = static_cast<double>(u.iteration());
    prev = previous_iteration_ < 0 ? now - 1 : static_cast<double>(previous_iteration_);
  }
  previous_iteration_ = u.iteration();
  previous_epoch_detail_ = u.epoch_detail();
  for (double p : points_) {
    if (prev < p && p <= now) return true;
  }
  return false;
}

void ManualScheduleTrigger::serialize(Serializer& s) {
  s("previous_iteration", previous_iteration_);
  s("previous_epoch_detail", previous_epoch_detail_);
}

std::shared_ptr<Trigger> interval(double period, const std::string& unit) {
  return std::make_shared<IntervalTrigger>(period, unit);
}

std::shared_ptr<Trigger> manual_schedule(std::vector<double> points, const std::string& unit) {
  return std::make_shared<ManualScheduleTrigger>(std::move(points), unit);
}

}  // namespace kusari::training
