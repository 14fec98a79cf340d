// Kernels: matrix products. See Note [Kernel families].
#pragma once

#include "kernels/kernel.h"
#include "kusari/core/array.h"

namespace kusari::kernels {

/// out = a @ b over the last two axes; batch axes already broadcast; out is contiguous.
inline constinit Kernel<void(const Array& a, const Array& b, Array& out)> matmul{"matmul"};

}  // namespace kusari::kernels
