#include "backends/cpu/cpu_backend.h"

namespace kusari::cpu {
void register_nn_kernels(KernelTable&) {}
}  // namespace kusari::cpu
