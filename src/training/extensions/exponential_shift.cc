#include "kusari/training/extensions/exponential_shift.h"

#include <cmath>

#include "kusari/training/trainer.h"
#include "training/extensions/extension_util.h"

namespace kusari::training::extensions {

ExponentialShift::ExponentialShift(std::string attr, double rate, std::optional<double> init,
                                   std::optional<double> target, std::string optimizer)
    : attr_(std::move(attr)),
      rate_(rate),
      init_(init),
      target_(target),
      optimizer_(std::move(optimizer)) {
  KUSARI_CHECK(rate >= 0, ValueError, "ExponentialShift: the rate must be non-negative, got ",
               rate);
  KUSARI_CHECK(!target || *target != 0, ValueError,
               "ExponentialShift: a target of 0 is never reached by init * rate^t; leave it out");
}

void ExponentialShift::set_value(Trainer& trainer, double value) {
  trainer.updater().optimizer(optimizer_).hyperparam(attr_) = value;
  last_value_ = value;
}

void ExponentialShift::initialize(Trainer& trainer) {
  if (!init_) init_ = trainer.updater().optimizer(optimizer_).hyperparam(attr_);
  set_value(trainer,
            last_value_ ? *last_value_ : *init_);  // a resumed run continues from the last value
}

void ExponentialShift::operator()(Trainer& trainer) {
  ++t_;
  if (!init_) init_ = trainer.updater().optimizer(optimizer_).hyperparam(attr_);
  double value = *init_ * std::pow(rate_, static_cast<double>(t_));
  if (target_) {
    // Like min/max against the target, written to work for negative values too (Chainer).
    if (rate_ > 1) {
      if (value / *target_ > 1) value = *target_;
    } else if (value / *target_ < 1) {
      value = *target_;
    }
  }
  set_value(trainer, value);
}

void ExponentialShift::serialize(Serializer& s) {
  s.count("_t", t_);
  detail::serialize_optional(s, "_last_value", last_value_);
}

}  // namespace kusari::training::extensions
