// Looking up a kernel in a device's table, with a clear error when the backend lacks it.
#pragma once

#include "kusari/core/device.h"
#include "kusari/core/error.h"

namespace kusari::detail {

/// Returns the kernel `member` of `device`'s table or throws NotImplementedError naming it.
template <typename Fn>
Fn kernel_or_throw(Fn fn, const char* name, Device device) {
  if (!fn) [[unlikely]] {
    KUSARI_THROW(NotImplementedError, name, ": no kernel for device ", device.str(), " in this build");
  }
  return fn;
}

}  // namespace kusari::detail

/// KUSARI_KERNEL(device, fill) -> the table's `fill` function pointer of `device`, checked.
#define KUSARI_KERNEL(device, member) \
  ::kusari::detail::kernel_or_throw((device).kernels().member, #member, (device))
