#include "kusari/serializers/serializer.h"

#include <cstring>

namespace kusari {

void Serializer::operator()(const std::string& key, double& value) {
  Array a;
  if (!is_loading()) a = Array::full({}, value, Dtype::kFloat64, Device::cpu());
  (*this)(key, a);
  if (is_loading() && a.defined()) value = a.item<double>();
}

void Serializer::operator()(const std::string& key, int64_t& value) {
  Array a;
  if (!is_loading()) a = Array::full({}, value, Dtype::kInt64, Device::cpu());
  (*this)(key, a);
  if (is_loading() && a.defined()) value = a.item<int64_t>();
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
