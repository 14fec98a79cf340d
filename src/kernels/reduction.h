// Kernels: reductions over axes, arg-reductions and softmax. See Note [Kernel families].
#pragma once

#include "kernels/kernel.h"
#include "kusari/core/array.h"
#include "kusari/core/op_types.h"

namespace kusari::kernels {

/// out has x's shape with every reduced axis of length 1 (keepdims form); out is contiguous.
inline constinit Kernel<void(ReduceOp op, const Array& x, Array& out)> reduce{"reduce"};
/// out (int64) has x's shape with `axis` of length 1.
inline constinit Kernel<void(ArgReduceOp op, const Array& x, int axis, Array& out)> arg_reduce{"arg_reduce"};
/// Softmax (or log-softmax) along `axis`; out has x's shape.
inline constinit Kernel<void(const Array& x, int axis, bool log, Array& out)> softmax{"softmax"};

}  // namespace kusari::kernels
