// ExponentialShift: multiplies an optimizer hyperparameter by a rate at each call, e.g. a
// learning-rate decay (Chainer's extensions.ExponentialShift).
//
//   trainer.extend(extensions::ExponentialShift("lr", 0.5), "", training::interval(10, "epoch"));
#pragma once

#include <optional>
#include <string>

#include "kusari/training/extension.h"

namespace kusari::training::extensions {

/// Sets hyperparameter `attr` of the optimizer `optimizer` to init * rate^t at its t-th call
/// (every iteration unless extend() gives another trigger), stopping at `target` once reached.
/// initialize() sets the starting value (init, or the value the optimizer has when init is
/// absent), and after a resume the last value set.
class ExponentialShift : public Extension {
 public:
  /// `rate` must be non-negative.
  ExponentialShift(std::string attr, double rate, std::optional<double> init = std::nullopt,
                   std::optional<double> target = std::nullopt, std::string optimizer = "main");

  /// Sets the starting value (init, or the last value set before a snapshot).
  void initialize(Trainer& trainer) override;
  /// Takes the next step of the schedule.
  void operator()(Trainer& trainer) override;
  /// "ExponentialShift".
  std::string default_name() const override { return "ExponentialShift"; }
  /// Every iteration (Chainer's default); decays are usually registered per epoch.
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }
  /// Saves or loads the call count "_t" and the last value set "_last_value" (Chainer's layout).
  void serialize(Serializer& serializer) override;

  /// The number of calls so far.
  int64_t t() const { return t_; }

 private:
  void set_value(Trainer& trainer, double value);

  std::string attr_;
  double rate_;
  std::optional<double> init_;
  std::optional<double> target_;
  std::string optimizer_;
  int64_t t_ = 0;
  std::optional<double> last_value_;
};

}  // namespace kusari::training::extensions
