#include "kusari/serializers/serializer.h"

#include <cmath>
#include <cstring>

#include "kusari/core/error.h"

namespace kusari {

void Serializer::operator()(const std::string& key, double& value) {
  Array a;
  if (!is_loading()) a = Array::full({}, value, Dtype::kFloat64, Device::cpu());
  (*this)(key, a);
  if (is_loading() && a.defined()) value = a.item<double>();
}

// Note [Integers read from a snapshot]
// A snapshot is a file from outside: an integer entry may be stored as any dtype (Chainer and
// NumPy write counters as int64, but a hand-edited or foreign file may hold float64 1e30 or
// 2.5). Converting such a value to int64_t unchecked is undefined behaviour and, in
// practice, a silent garbage counter (a snapshot named "snapshot_iter_-9223372036854775788").
// So every integer entry goes through this one overload, which accepts only a single value
// that is an exact integer inside the int64 range, and raises an IOError naming the key and the
// value otherwise. Counters that must not be negative use `count`, which adds that check.
void Serializer::operator()(const std::string& key, int64_t& value) {
  Array a;
  if (!is_loading()) a = Array::full({}, value, Dtype::kInt64, Device::cpu());
  (*this)(key, a);
  if (!is_loading() || !a.defined()) return;
  KUSARI_CHECK(a.size() == 1, IOError, "Serializer: the snapshot entry '", path(), key, "' has shape ",
               a.shape(), " (", a.dtype(), "), expected a single integer");
  if (is_floating(a.dtype())) {
    const double d = a.astype(Dtype::kFloat64).to_device(Device::cpu()).item<double>();
    // 2^63 is exactly representable; int64 holds [-2^63, 2^63).
    constexpr double kLimit = 9223372036854775808.0;
    KUSARI_CHECK(std::isfinite(d) && std::trunc(d) == d && d >= -kLimit && d < kLimit, IOError,
                 "Serializer: the snapshot entry '", path(), key, "' is ", d, " (", a.dtype(),
                 "), expected an integer in the int64 range");
    value = static_cast<int64_t>(d);
  } else {
    value = a.to_device(Device::cpu()).item<int64_t>();
  }
}

void Serializer::count(const std::string& key, int64_t& value) {
  int64_t v = value;
  (*this)(key, v);
  if (!is_loading()) return;
  KUSARI_CHECK(v >= 0, IOError, "Serializer: the snapshot entry '", path(), key, "' is ", v,
               ", expected a non-negative count");
  value = v;
}

void Serializer::operator()(const std::string& key, bool& value) {
  Array a;
  if (!is_loading()) a = Array::full({}, value, Dtype::kBool, Device::cpu());
  (*this)(key, a);
  if (is_loading() && a.defined()) value = a.item<bool>();
}

void Serializer::operator()(const std::string& key, std::string& value) {
  Array a;
  if (!is_loading()) {
    a = Array::from_buffer(value.data(), {static_cast<int64_t>(value.size())}, Dtype::kUInt8, Device::cpu());
  }
  (*this)(key, a);
  if (is_loading() && a.defined()) {
    Array h = a.to_device(Device::cpu()).astype(Dtype::kUInt8).contiguous();
    value.assign(static_cast<const char*>(h.raw_data()), static_cast<size_t>(h.size()));
  }
}

}  // namespace kusari
