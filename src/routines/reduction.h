// The reduction family's routines that are not public API: the fused softmax cross entropy (Note
// [Fused softmax cross entropy]), used by functions::softmax_cross_entropy. Each returns an
// undefined array when the backend declines (or has no such kernel), and the caller composes the
// loss from log_softmax instead.
#pragma once

#include "kusari/core/array.h"

namespace kusari::routines {

/// The dtype of the rows' statistics (loss, lse, the rows' gradient scale): float64 for float64
/// x, float32 otherwise.
Dtype cross_entropy_stat_dtype(Dtype x);

/// The per-row loss of x (rows, width) against labels t (rows; int32 or int64, checked in
/// range by the caller), 0 for rows labelled ignore_label, and each row's log-sum-exp in lse.
/// The classes are x's first `classes` columns; the rest are padding (Note [Padded classes]).
Array softmax_cross_entropy_rows(const Array& x, const Array& t, int64_t classes,
                                 int64_t ignore_label, double label_smoothing, Array& lse);

/// The gradient with respect to x, g_i (softmax(x_i) - q_i), from the forward's lse and g (rows);
/// 0 in the padding columns.
Array softmax_cross_entropy_rows_backward(const Array& x, const Array& t, int64_t classes,
                                          const Array& lse, const Array& g, int64_t ignore_label,
                                          double label_smoothing);

}  // namespace kusari::routines
