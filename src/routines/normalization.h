// Routines of the fused batch normalization (Note [Fused batch normalization]), used by
// functions::batch_normalization and fixed_batch_normalization. Each checks its operands once
// and calls its kernel; when a backend declines (or has no such kernel) it returns false or an
// undefined array and writes nothing, and the caller computes the same values with generic
// routines.
#pragma once

#include <optional>

#include "kernels/normalization.h"
#include "kusari/core/array.h"
#include "kusari/core/shape.h"

namespace kusari::routines {

/// The (outer, C, inner) view of x for a batch normalization over `axes` (sorted), when the
/// fused kernels can take it: axes are (0, 2, 3, ...), so the channel is axis 1, and x is dense,
/// C-ordered or channels-last. std::nullopt otherwise.
std::optional<kernels::BatchNormShape> batch_norm_fused_shape(const Array& x, const Axes& axes);

/// The dtype of the fused statistics of x: float64 for float64 data, else float32.
Dtype batch_norm_stat_dtype(Dtype x_dtype);

/// Per-channel statistics of x: mean, biased var, inv_std = (var + eps)^-1/2 (C elements of the
/// statistics' dtype). Running averages are updated as BatchNormStatsParams says when they are of
/// the statistics' dtype and contiguous; `*running_done` tells whether they were (the caller
/// updates them otherwise). False when the backend declined.
bool batch_norm_statistics(const Array& x, const kernels::BatchNormShape& s, double eps,
                           Array* running_mean, Array* running_var, double decay, double var_adjust,
                           Array& mean, Array& var, Array& inv_std, bool* running_done);

/// y = (x - mean) * inv_std * gamma + beta (+ residual), then relu when asked; gamma and beta of
/// any floating dtype with C elements. Undefined when the backend declined.
Array batch_norm_normalize(const Array& x, const kernels::BatchNormShape& s, const Array& mean,
                           const Array& inv_std, const Array& gamma, const Array& beta,
                           const Array* residual = nullptr, bool relu = false);

/// gbeta = sum(g), ggamma = inv_std * sum(g * (x - mean)) per channel (statistics' dtype), g being
/// gy masked by relu_y > 0 when relu_y is given. False when the backend declined.
bool batch_norm_backward_reduce(const Array& x, const Array& gy, const Array* relu_y,
                                const kernels::BatchNormShape& s, const Array& mean,
                                const Array& inv_std, Array& gbeta, Array& ggamma);

/// gx of the batch normalization from the sums above; inv_m = 1 / (values per statistic).
/// Undefined when the backend declined. With `masked_gy`, it also receives gy masked by relu_y
/// (gy itself without relu_y), written in the same pass.
Array batch_norm_backward_data(const Array& x, const Array& gy, const Array* relu_y,
                               const kernels::BatchNormShape& s, const Array& mean,
                               const Array& inv_std, const Array& gamma, const Array& gbeta,
                               const Array& ggamma, double inv_m, Array* masked_gy = nullptr);

/// Layer or RMS normalization of x over its last `cols` elements by the fused kernels (Note [Fused
/// layer normalization]): y, and the rows' mean (layer only) and rstd in the statistics' dtype.
/// gamma and beta (may be null) have cols elements of any floating dtype. x need not be
/// contiguous (it is copied then). Undefined y when the backend declined.
Array row_norm_forward(const Array& x, const Array* gamma, const Array* beta, int64_t cols, double eps, bool rms,
                       Array& mean, Array& rstd);

/// gx of the normalization above (from its x, mean and rstd), and ggamma, gbeta (cols elements of
/// the statistics' dtype) where asked. False when the backend declined.
bool row_norm_backward(const Array& x, const Array& gy, const Array* gamma, const Array& mean, const Array& rstd,
                       int64_t cols, double eps, bool rms, Array& gx, Array* ggamma, Array* gbeta);

}  // namespace kusari::routines
