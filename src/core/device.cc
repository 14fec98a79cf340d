#include "kusari/core/device.h"

#include <cstdlib>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "core/cuda_runtime.h"

namespace kusari {

Device Device::parse(const std::string& spec) {
  if (spec == "cpu" || spec == "@numpy" || spec == "native" || spec == "native:0") return cpu();
  std::string rest;
  for (const char* prefix : {"cuda:", "@cupy:", "gpu:"}) {
    std::string p(prefix);
    if (spec.rfind(p, 0) == 0) rest = spec.substr(p.size());
  }
  if (spec == "cuda" || spec == "gpu") return cuda(0);
  if (!rest.empty()) {
    char* end = nullptr;
    long idx = std::strtol(rest.c_str(), &end, 10);
    if (end && *end == '\0' && idx >= 0) return cuda(static_cast<int>(idx));
  }
  KUSARI_THROW(ValueError, "Device::parse: cannot parse device '", spec,
               "'; expected 'cpu', 'cuda' or 'cuda:N' (N >= 0)");
}

std::string Device::str() const {
  if (type_ == DeviceType::kCPU) return "cpu";
  return "cuda:" + std::to_string(index_);
}

Backend& Device::backend() const { return get_backend(type_); }

void Device::synchronize() const { get_backend(type_).synchronize(index_); }

Backend& get_backend(DeviceType type) {
  switch (type) {
    case DeviceType::kCPU:
      return cpu::cpu_backend();
    case DeviceType::kCUDA:
      return cuda::require_runtime("CUDA devices").backend();
  }
  KUSARI_THROW(DeviceError, "unknown device type ", static_cast<int>(type));
}

int cuda_device_count() {
  cuda::Runtime* runtime = cuda::runtime();
  return runtime ? runtime->device_count() : 0;
}

bool cuda_available() { return cuda_device_count() > 0; }

namespace {
thread_local Device t_default_device = Device::cpu();
}  // namespace

Device default_device() { return t_default_device; }

DeviceScope::DeviceScope(Device device) : previous_(t_default_device) { t_default_device = device; }

DeviceScope::~DeviceScope() { t_default_device = previous_; }

}  // namespace kusari
