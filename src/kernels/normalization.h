// Kernels: batch normalization in a few passes over the data. See Note [Kernel families].
//
// Note [Fused batch normalization]
// Composed from generic routines, a training batch normalization makes several full passes over
// its input forward (a mean, a centred square, its mean, the normalisation, the scale and shift)
// and more backward, each a kernel of its own. These kernels do it in the passes the arithmetic
// needs: forward, one reduction pass for the per-channel statistics and one elementwise pass
// for y; backward, one reduction pass for the two per-channel sums and one elementwise pass for
// gx. The statistics are float32 (float64 for float64 data) whatever the data's dtype.
//
// The data is seen as (outer, C, inner) with the channel the middle axis: a C-ordered (N, C, H, W)
// array is (N, C, H*W), a channels-last one (N*H*W, C, 1), an (N, C) array (N, C, 1). Only those
// dense layouts are taken; every kernel here may decline (a strided view, other axes), and the
// routines (src/routines/normalization.cc) then compute the same values with generic routines.
//
// The statistics are accumulated per thread as sums of (x - K) and (x - K)^2 with K a value of
// the channel (its first element), so data whose mean is large next to its spread does not
// cancel away; the partial (count, mean, M2) triples are merged pairwise (Chan et al.), which is
// exact in real arithmetic and keeps the rounding error of the variance small for any batch.
#pragma once

#include <cstdint>

#include "kernels/kernel.h"
#include "kusari/core/array.h"

namespace kusari::kernels {

/// A dense array seen as (outer, channels, inner); see Note [Fused batch normalization].
struct BatchNormShape {
  int64_t outer = 0;
  int64_t channels = 0;
  int64_t inner = 0;
};

/// What the statistics pass also does once the statistics are known: inv_std = (var + eps)^-1/2,
/// and, when the arrays are given (of the statistics' dtype, contiguous, C elements), the running
/// averages in place: running_mean = decay * running_mean + (1 - decay) * mean, and running_var
/// likewise with var * var_adjust (the unbiased variance).
struct BatchNormStatsParams {
  double eps = 2e-5;
  Array* running_mean = nullptr;
  Array* running_var = nullptr;
  double decay = 0.9;
  double var_adjust = 1.0;
};

/// mean, var (biased) and inv_std per channel of x (outputs: C elements of the statistics' dtype).
inline constinit Kernel<bool(const Array& x, const BatchNormShape& s, const BatchNormStatsParams& p,
                             Array& mean, Array& var, Array& inv_std)>
    batch_norm_statistics{"batch_norm_statistics"};

/// y = (x - mean) * inv_std * gamma + beta (+ residual), then max(y, 0) when `relu`; mean, inv_std,
/// gamma and beta have C elements of the statistics' dtype; residual (may be null) and y are
/// laid out like x, in x's dtype.
inline constinit Kernel<bool(const Array& x, const BatchNormShape& s, const Array& mean,
                             const Array& inv_std, const Array& gamma, const Array& beta,
                             const Array* residual, bool relu, Array& y)>
    batch_norm_normalize{"batch_norm_normalize"};

/// gbeta = sum(g) and ggamma = inv_std * sum(g * (x - mean)) per channel, where g = gy, or gy where
/// relu_y > 0 when relu_y (the output of a normalisation with relu) is given.
inline constinit Kernel<bool(const Array& x, const Array& gy, const Array* relu_y,
                             const BatchNormShape& s, const Array& mean, const Array& inv_std,
                             Array& gbeta, Array& ggamma)>
    batch_norm_backward_reduce{"batch_norm_backward_reduce"};

/// gx = gamma * inv_std * (g - gbeta * inv_m - (x - mean) * inv_std * ggamma * inv_m), g as in
/// batch_norm_backward_reduce; inv_m is 1 / (the number of values each statistic was taken over).
/// With `gm` (laid out like gx), g itself is written there too: the gradient of the residual
/// added before the relu, which then costs no pass of its own.
inline constinit Kernel<bool(const Array& x, const Array& gy, const Array* relu_y,
                             const BatchNormShape& s, const Array& mean, const Array& inv_std,
                             const Array& gamma, const Array& gbeta, const Array& ggamma,
                             double inv_m, Array& gx, Array* gm)>
    batch_norm_backward_data{"batch_norm_backward_data"};

// Note [Fused layer normalization]
// Layer normalization and RMS normalization normalise each row of a dense (rows, cols) view over
// its cols (a transformer's (batch * tokens, features)). Composed from generic routines, the
// forward is five or six passes over x and the backward a dozen; these kernels do forward in one
// pass per row (the row stays in cache, or in registers and shared memory on the GPU) and backward
// in one pass per row for gx plus one column reduction for the parameters' gradients. Per row:
//   layer: mean = sum(x) / cols, rstd = (sum((x - mean)^2) / cols + eps)^-1/2,
//          x_hat = (x - mean) * rstd, y = x_hat * gamma + beta
//   rms:   rstd = (sum(x^2) / cols + eps)^-1/2, x_hat = x * rstd, y = x_hat * gamma
// and backward, with g = gy * gamma:
//   layer: gx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))
//   rms:   gx = rstd * (g - x_hat * mean(g * x_hat))
//   ggamma = sum over rows of gy * x_hat, gbeta = sum over rows of gy.
// mean and rstd (rows elements) and gamma, beta, ggamma, gbeta (cols elements) are of the
// statistics' dtype (float64 for float64 data, else float32); the routine casts the parameters.

/// The geometry of a layer or RMS normalization: a dense C-ordered (rows, cols) view.
struct RowNormParams {
  int64_t rows = 0;
  int64_t cols = 0;
  double eps = 1e-5;
  bool rms = false;  // RMS normalization: no mean is subtracted, and there is no beta
};

/// y (laid out like x) and the per-row statistics; gamma and beta may be null (1 and 0); mean is
/// not written for rms.
inline constinit Kernel<bool(const Array& x, const Array* gamma, const Array* beta, const RowNormParams& p,
                             Array& y, Array& mean, Array& rstd)>
    row_norm_forward{"row_norm_forward"};

/// gx, and the parameters' gradients where asked (ggamma, gbeta: cols elements, may be null).
inline constinit Kernel<bool(const Array& x, const Array& gy, const Array* gamma, const Array& mean,
                             const Array& rstd, const RowNormParams& p, Array& gx, Array* ggamma, Array* gbeta)>
    row_norm_backward{"row_norm_backward"};

}  // namespace kusari::kernels
