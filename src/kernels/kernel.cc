#include "kernels/kernel.h"

#include "kusari/core/error.h"

namespace kusari::kernels::detail {

void ensure_backend(Device device) { (void)get_backend(device.type()); }

void throw_missing_kernel(const char* name, Device device) {
  KUSARI_THROW(NotImplementedError, name, ": no kernel for device ", device.str(), " in this build");
}

}  // namespace kusari::kernels::detail
