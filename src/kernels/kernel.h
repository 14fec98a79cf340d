// Kernel slots: the private interface between the routines (src/routines/) and the backends.
//
// Note [Kernel families]
// A kernel is declared once, in the header of its family (src/kernels/creation.h, elementwise.h,
// reduction.h, linalg.h, indexing.h, nn.h, update.h), as a Kernel<Signature>: a named object
// with one slot, a plain function pointer, per backend. Its arguments have been checked by the
// routine (same device, agreed dtypes, broadcast operands as stride-0 views of the output's
// shape, an allocated output); parameters travel in typed structs (Conv2dParams, UpdateParams).
//
// Registration. Each backend fills its slots from its constructor, one call per family
// (register_cpu_elementwise_kernels(), register_cuda_elementwise_kernels(), ...), each defined at
// the bottom of that family's kernel file, next to the kernels it registers. The slots are
// constant-initialised (constinit, all null), so there are no static initialisers and nothing
// to link with --whole-archive; a backend that is never used registers nothing. A slot left
// null means "not implemented on this backend": calling it throws NotImplementedError naming
// the kernel and the device. Calling a slot costs one pointer load and an indirect call, as the
// old kernel table did: no map lookup, no lock, no dynamic_cast.
//
// Declining. A kernel whose signature returns bool may decline a case it does not handle (a
// layout, a dtype, a shape) by returning false before it writes anything. Its routine calls it
// with try_run(), which is false when the kernel declined or the backend has none, and then runs
// a generic composition of other routines that computes the same result. Fused kernels are
// written this way (relu_grad: one pass instead of a compare, a fill and a where), so a backend
// can implement the common cases only, and a new backend works before it has any fused kernel.
//
// Adding a kernel to an existing family touches four files:
//   1. src/kernels/<family>.h              the slot: `inline constinit Kernel<Sig> name{"name"};`
//   2. src/backends/cpu/<family>_kernels.cc the CPU kernel and one line in register_cpu_<family>_kernels
//   3. src/backends/cuda/<family>_kernels.cu the CUDA kernel and one line in register_cuda_<family>_kernels
//   4. src/routines/<family>.cc              the routine: checks once, calls the slot (and, for a
//                                          kernel that may decline, the fallback composition)
// plus, when the routine is new public API, its declaration in kusari/core/routines.h. A backend
// may skip step 2 or 3: a declining kernel then always takes the fallback there.
#pragma once

#include <type_traits>
#include <utility>

#include "kusari/core/device.h"

namespace kusari::kernels {

/// One slot per DeviceType.
inline constexpr int kBackendSlots = 2;

namespace detail {
/// Constructs the backend of `device` (its constructor registers its kernels) and throws
/// DeviceError when that backend is unavailable in this build or on this machine.
void ensure_backend(Device device);
[[noreturn]] void throw_missing_kernel(const char* name, Device device);
}  // namespace detail

template <typename Signature>
class Kernel;

/// A kernel with one function pointer per backend. See Note [Kernel families].
template <typename R, typename... Args>
class Kernel<R(Args...)> {
 public:
  using Fn = R (*)(Args...);

  constexpr explicit Kernel(const char* name) : name_(name) {}
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  const char* name() const { return name_; }

  /// Installs (or, with nullptr, removes) the kernel of a backend; called by the backends'
  /// register_<backend>_<family>_kernels() functions.
  void set(DeviceType type, Fn fn) { slots_[static_cast<int>(type)] = fn; }

  /// The kernel of `device`'s backend, or nullptr when that backend has none.
  Fn find(Device device) const {
    Fn fn = slots_[static_cast<int>(device.type())];
    if (!fn) [[unlikely]] {
      detail::ensure_backend(device);
      fn = slots_[static_cast<int>(device.type())];
    }
    return fn;
  }

  /// Runs the kernel of `device`'s backend; throws NotImplementedError when it has none.
  R operator()(Device device, Args... args) const {
    Fn fn = slots_[static_cast<int>(device.type())];
    if (!fn) [[unlikely]] {
      fn = find(device);
      if (!fn) detail::throw_missing_kernel(name_, device);
    }
    return fn(std::forward<Args>(args)...);
  }

  /// For kernels that may decline: true when `device`'s backend has the kernel and it handled
  /// the call; false when it declined (and wrote nothing) or is absent.
  bool try_run(Device device, Args... args) const
    requires std::is_same_v<R, bool>
  {
    Fn fn = slots_[static_cast<int>(device.type())];
    if (!fn) [[unlikely]] {
      fn = find(device);
      if (!fn) return false;
    }
    return fn(std::forward<Args>(args)...);
  }

 private:
  const char* name_;
  Fn slots_[kBackendSlots] = {};
};

}  // namespace kusari::kernels
