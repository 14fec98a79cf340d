#include "kusari/training/extensions/epoch_shift.h"

#include <cmath>
#include <numbers>

#include "kusari/core/error.h"
#include "kusari/training/trainer.h"

namespace kusari::training::extensions {

double linear_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch) {
  KUSARI_CHECK(global_batch > 0 && base_batch > 0, ValueError,
               "linear_scaled_lr: the batch sizes must be positive, got global_batch ",
               global_batch, " and base_batch ", base_batch);
  return base_lr * static_cast<double>(global_batch) / static_cast<double>(base_batch);
}

// Note [Large-minibatch schedule]
// Goyal et al. keep the per-image contribution of a step constant when the batch grows k times
// by multiplying the learning rate by k (linear scaling), and because that rate is too large
// while the weights change quickly at the start, ramp the rate linearly from the small-batch
// rate to the scaled one over the first epochs (5 for ImageNet: "gradual warm-up"), per
// iteration rather than per epoch. The schedule is a function of the fractional epoch, so a
// run resumed from a snapshot continues it exactly and it depends on neither the batch size nor
// the number of processes. After the warm-up: the classic step decay (x0.1 at epochs 30, 60, 80
// for ImageNet), or a half cosine (Loshchilov and Hutter's SGDR without restarts) that starts
// at the end of the warm-up, so that the warm-up's last value and the cosine's first agree.
double WarmupSchedule::operator()(double epoch) const {
  if (warmup_epochs > 0 && epoch < warmup_epochs) {
    return warmup_start + (peak - warmup_start) * (epoch / warmup_epochs);
  }
  switch (decay) {
    case Decay::kNone:
      return peak;
    case Decay::kStep: {
      double value = peak;
      for (double d : decay_epochs) {
        if (epoch >= d) value *= decay_factor;
      }
      return value;
    }
    case Decay::kCosine: {
      if (epoch >= total_epochs) return final_value;
      const double progress = (epoch - warmup_epochs) / (total_epochs - warmup_epochs);
      return final_value +
             (peak - final_value) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return peak;
}

void WarmupSchedule::validate() const {
  const char* fn = "WarmupSchedule";
  KUSARI_CHECK(warmup_epochs >= 0, ValueError, fn, ": warmup_epochs must be non-negative, got ",
               warmup_epochs);
  if (decay == Decay::kStep) {
    for (double d : decay_epochs) {
      KUSARI_CHECK(d >= warmup_epochs, ValueError, fn, ": the step decay at epoch ", d,
                   " comes before the end of the warm-up (warmup_epochs ", warmup_epochs,
                   "); expected decay epochs after it");
    }
  }
  if (decay == Decay::kCosine) {
    KUSARI_CHECK(total_epochs > warmup_epochs, ValueError, fn,
                 ": a cosine decay needs total_epochs after the warm-up, got total_epochs ",
                 total_epochs, " and warmup_epochs ", warmup_epochs);
  }
}

EpochShift::EpochShift(std::string attr, std::function<double(double)> schedule,
                       std::string optimizer)
    : attr_(std::move(attr)), schedule_(std::move(schedule)), optimizer_(std::move(optimizer)) {
  KUSARI_CHECK(static_cast<bool>(schedule_), ValueError, "EpochShift(", attr_,
               "): the schedule is empty");
}

EpochShift::EpochShift(std::string attr, const WarmupSchedule& schedule, std::string optimizer)
    : EpochShift(std::move(attr), (schedule.validate(), std::function<double(double)>(schedule)),
                 std::move(optimizer)) {}

double EpochShift::position(Trainer& trainer) const { return trainer.updater().epoch_detail(); }

double IterationShift::position(Trainer& trainer) const {
  return static_cast<double>(trainer.updater().iteration());
}

void EpochShift::set_value(Trainer& trainer) {
  const double value = schedule_(position(trainer));
  trainer.updater().optimizer(optimizer_).hyperparam(attr_) = value;
  last_value_ = value;
}

void EpochShift::initialize(Trainer& trainer) { set_value(trainer); }

void EpochShift::operator()(Trainer& trainer) { set_value(trainer); }

}  // namespace kusari::training::extensions
