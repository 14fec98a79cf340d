// Kernels: reductions over axes, arg-reductions, softmax and softmax cross entropy. See Note
// [Kernel families].
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

/// The rows of a softmax cross entropy (Note [Fused softmax cross entropy]): x (rows, classes),
/// contiguous, any floating dtype; labels t (rows) int32 or int64, contiguous, each in
/// [0, classes) or ignore_label.
struct CrossEntropyParams {
  int64_t rows = 0;
  int64_t classes = 0;
  /// The length of x's and gx's rows, >= classes: the columns after `classes` are padding, left
  /// out of the softmax, their gradient 0 (Note [Padded classes]).
  int64_t width = 0;
  int64_t ignore_label = -1;
  double label_smoothing = 0.0;
};
/// loss (rows): -sum_k q_k log softmax(x)_k for the target q of each row (0 for an ignored row),
/// and lse (rows): log sum_k exp(x_k); both of the statistics' dtype (float64 for float64 x,
/// else float32). May decline.
inline constinit Kernel<bool(const Array& x, const Array& t, const CrossEntropyParams& p, Array& loss, Array& lse)>
    softmax_cross_entropy_forward{"softmax_cross_entropy_forward"};
/// gx (rows, classes; x's dtype, contiguous) = g_i (softmax(x_i) - q_i), from the forward's lse
/// and g (rows, the statistics' dtype; 0 for an ignored row). May decline.
inline constinit Kernel<bool(const Array& x, const Array& t, const Array& lse, const Array& g,
                             const CrossEntropyParams& p, Array& gx)>
    softmax_cross_entropy_backward{"softmax_cross_entropy_backward"};

}  // namespace kusari::kernels
