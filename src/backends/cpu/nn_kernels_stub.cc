#include "backends/cpu/cpu_backend.h"

namespace kusari::cpu {
void register_update_kernels(KernelTable&) {}
}  // namespace kusari::cpu
