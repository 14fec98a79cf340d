// Schedules of an optimizer hyperparameter as a function of the position in the training (the
// fractional epoch), and the large-minibatch learning-rate schedule of Goyal et al., "Accurate,
// Large Minibatch SGD: Training ImageNet in 1 Hour" (2017): the rate scaled linearly with the
// global batch, a gradual warm-up, then a step or cosine decay.
//
//   namespace ext = kusari::training::extensions;
//   ext::WarmupSchedule schedule;
//   schedule.peak = ext::linear_scaled_lr(0.1, global_batch);   // 0.1 per 256 images
//   schedule.warmup_start = 0.1 * batch_of_one_process / 256;  // Goyal et al. start from eta
//   schedule.warmup_epochs = 5;
//   schedule.decay = ext::WarmupSchedule::Decay::kStep;
//   schedule.decay_epochs = {30, 60, 80};
//   trainer.extend(std::make_shared<ext::EpochShift>("lr", schedule));
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kusari/training/extension.h"

namespace kusari::training::extensions {

/// Goyal et al.'s linear scaling rule: `base_lr` per `base_batch` images, so `base_lr` *
/// global_batch / base_batch for a step over `global_batch` images (ValueError unless both
/// batches are positive).
double linear_scaled_lr(double base_lr, int64_t global_batch, int64_t base_batch = 256);

/// A learning-rate schedule over the (fractional) epoch: a linear warm-up from `warmup_start` to
/// `peak` over the first `warmup_epochs`, then constant (kNone), multiplied by `decay_factor` at
/// each of `decay_epochs` (kStep), or a half cosine from `peak` at the end of the warm-up down to
/// `final_value` at `total_epochs` (kCosine). See Note [Large-minibatch schedule].
struct WarmupSchedule {
  /// What follows the warm-up.
  enum class Decay { kNone, kStep, kCosine };
  /// The rate after the warm-up (e.g. linear_scaled_lr(0.1, global_batch)).
  double peak = 0.1;
  /// The rate at epoch 0; the warm-up ramps linearly from it to `peak`.
  double warmup_start = 0.0;
  /// Length of the warm-up in epochs (0: none, `peak` from the start).
  double warmup_epochs = 0.0;
  /// The decay after the warm-up.
  Decay decay = Decay::kNone;
  /// kStep: the epochs at which the rate is multiplied by `decay_factor` (after the warm-up).
  std::vector<double> decay_epochs;
  /// kStep: the factor of each step.
  double decay_factor = 0.1;
  /// kCosine: the epoch at which the cosine reaches `final_value` (after the warm-up).
  double total_epochs = 0.0;
  /// kCosine: the rate at `total_epochs` and after.
  double final_value = 0.0;

  /// The rate at `epoch` (fractional; epoch 1.5 is half-way through the second epoch).
  double operator()(double epoch) const;
  /// ValueError naming the field when the schedule is inconsistent: a negative warm-up, a
  /// step-decay epoch inside the warm-up, a cosine that ends before the warm-up does.
  void validate() const;
};

/// Sets hyperparameter `attr` of the optimizer `optimizer` to schedule(epoch) at every call
/// (every iteration unless extend() gives another trigger), where epoch is the updater's
/// epoch_detail(): the position after the iterations done so far, so the value set is the one
/// the next iteration steps with. initialize() sets the value for the current position, so a
/// fresh run starts at schedule(0) and a resumed one where it stopped; the schedule keeps no
/// state of its own.
class EpochShift : public Extension {
 public:
  /// A schedule given as a function of the epoch (a WarmupSchedule is one; it is validated).
  EpochShift(std::string attr, std::function<double(double epoch)> schedule,
             std::string optimizer = "main");
  /// The schedule `schedule`, validated first.
  EpochShift(std::string attr, const WarmupSchedule& schedule, std::string optimizer = "main");

  /// Sets the value for the current position.
  void initialize(Trainer& trainer) override;
  /// Sets the value for the position after the last iteration.
  void operator()(Trainer& trainer) override;
  /// "EpochShift".
  std::string default_name() const override { return "EpochShift"; }
  /// Every iteration.
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }
  /// The last value set (nullopt before the first).
  std::optional<double> last_value() const { return last_value_; }

 protected:
  /// The schedule's argument: the updater's epoch_detail().
  virtual double position(Trainer& trainer) const;

 private:
  void set_value(Trainer& trainer);

  std::string attr_;
  std::function<double(double)> schedule_;
  std::string optimizer_;
  std::optional<double> last_value_;
};

/// EpochShift over iterations: sets `attr` to schedule(i), i the number of iterations done (the
/// step the next update takes is i + 1). A WarmupSchedule given here counts its warmup_epochs,
/// decay_epochs and total_epochs in iterations, which is how language models are scheduled:
///
///   ext::WarmupSchedule s;                       // GPT-2 style: warm-up, then a cosine to 10%
///   s.peak = 6e-4; s.warmup_epochs = 700; s.decay = ext::WarmupSchedule::Decay::kCosine;
///   s.total_epochs = 19073; s.final_value = 6e-5;
///   trainer.extend(std::make_shared<ext::IterationShift>("alpha", s));   // Adam's rate
class IterationShift : public EpochShift {
 public:
  using EpochShift::EpochShift;
  /// "IterationShift".
  std::string default_name() const override { return "IterationShift"; }

 protected:
  double position(Trainer& trainer) const override;
};

}  // namespace kusari::training::extensions
