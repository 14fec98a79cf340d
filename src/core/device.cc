#include "kusari/core/device.h"

#include <cstdlib>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "kusari/config.h"
#if KUSARI_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif

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
#if KUSARI_HAVE_CUDA
      return cuda::cuda_backend();
#else
      KUSARI_THROW(DeviceError,
                   "this kusari was built without CUDA, so CUDA devices are unavailable; rebuild with a CUDA "
                   "toolkit present (cmake -DKUSARI_WITH_CUDA=ON)");
#endif
  }
  KUSARI_THROW(DeviceError, "unknown device type ", static_cast<int>(type));
}

int cuda_device_count() {
#if KUSARI_HAVE_CUDA
  return cuda::cuda_device_count();
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

namespace {
thread_local Device t_default_device = Device::cpu();
}  // namespace

Device default_device() { return t_default_device; }

DeviceScope::DeviceScope(Device device) : previous_(t_default_device) { t_default_device = device; }

DeviceScope::~DeviceScope() { t_default_device = previous_; }

}  // namespace kusari
