// Kernels: gathers and scatter-adds along an axis. See Note [Kernel families].
#pragma once

#include "kernels/kernel.h"
#include "kusari/core/array.h"

namespace kusari::kernels {

/// out = x.take(indices, axis): out.shape = x.shape[:axis] + indices.shape + x.shape[axis+1:].
inline constinit Kernel<void(const Array& x, const Array& indices, int axis, Array& out)> take{"take"};
/// out[..., indices[j], ...] += values[..., j, ...] along axis (the transpose of take).
inline constinit Kernel<void(Array& out, const Array& indices, int axis, const Array& values)> add_at{"add_at"};

}  // namespace kusari::kernels
