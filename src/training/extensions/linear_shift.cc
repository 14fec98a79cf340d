#include "kusari/training/extensions/linear_shift.h"

#include <cmath>

#include "kusari/training/trainer.h"
#include "training/extensions/extension_util.h"

namespace kusari::training::extensions {

LinearShift::LinearShift(std::string attr, std::pair<double, double> value_range,
                         std::pair<int64_t, int64_t> time_range, std::string optimizer)
    : attr_(std::move(attr)),
      value_range_(value_range),
      time_range_(time_range),
      optimizer_(std::move(optimizer)) {
  KUSARI_CHECK(time_range.first <= time_range.second, ValueError,
               "LinearShift: the time range must be increasing, got (", time_range.first, ", ",
               time_range.second, ")");
}

double LinearShift::value_at(int64_t t) const {
  const auto [t1, t2] = time_range_;
  const auto [v1, v2] = value_range_;
  if (t <= t1) return v1;
  if (t >= t2) return v2;
  const double rate = static_cast<double>(t - t1) / static_cast<double>(t2 - t1);
  return v1 + rate * (v2 - v1);
}

void LinearShift::set_value(Trainer& trainer, double value) {
  trainer.updater().optimizer(optimizer_).hyperparam(attr_) = value;
  last_value_ = value;
}

void LinearShift::initialize(Trainer& trainer) {
  set_value(trainer, last_value_ ? *last_value_ : value_at(t_));
}

void LinearShift::operator()(Trainer& trainer) {
  ++t_;
  set_value(trainer, value_at(t_));
}

void LinearShift::serialize(Serializer& s) {
  s.count("_t", t_);
  detail::serialize_optional(s, "_last_value", last_value_);
}

}  // namespace kusari::training::extensions
