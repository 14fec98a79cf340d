// FailOnNonNumber: stops training as soon as a parameter becomes NaN or infinite (Chainer's
// extensions.FailOnNonNumber).
//
//   trainer.extend(extensions::FailOnNonNumber());
#pragma once

#include <string>

#include "kusari/training/extension.h"

namespace kusari::training::extensions {

/// Checks every parameter of the optimizer's target (and, with check_grad, every gradient)
/// after each iteration and throws kusari::Error naming the first parameter path (e.g.
/// "/predictor/l1/W") that holds a NaN or an infinity, so a diverged run ends at once with a
/// message instead of training on garbage.
///
/// Note [FailOnNonNumber cost]
/// The check reduces each parameter to one flag on its device and reads the flags of one
/// device with a single copy to the host, so it waits for the device once per iteration, not
/// once per parameter.
class FailOnNonNumber : public Extension {
 public:
  /// `optimizer`: whose target to check ("main"). `check_grad`: also check the gradients.
  explicit FailOnNonNumber(bool check_grad = true, std::string optimizer = "main");

  /// Checks the parameters (and gradients); throws kusari::Error on the first non-finite one.
  void operator()(Trainer& trainer) override;
  /// "FailOnNonNumber".
  std::string default_name() const override { return "FailOnNonNumber"; }
  /// Every iteration.
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }

 private:
  bool check_grad_;
  std::string optimizer_;
};

}  // namespace kusari::training::extensions
