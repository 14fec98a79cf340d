// Differentiable normalization functions (Chainer's F.normalization family).
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// Combines batch statistics over several processes (multi-node batch normalization): sum()
/// replaces a packed array of per-channel sums by its elementwise sum over the processes. Every
/// process must call it in the same order.
class BatchStatisticsReducer {
 public:
  virtual ~BatchStatisticsReducer() = default;
  virtual void sum(Array& packed) = 0;
};

/// Batch normalization with the statistics of the batch:
///   y = gamma * (x - mean) / sqrt(var + eps) + beta,
/// where mean and the (biased) var are taken over `axis`. An empty `axis` means Chainer's default,
/// (0,) + the axes after gamma's (all axes but 1 for a 1-d gamma); gamma and beta have the shape of
/// x over the remaining axes. When given, running_mean and running_var (gamma's shape) are updated
/// in place: running_mean = decay * running_mean + (1 - decay) * mean, and likewise running_var
/// with the unbiased variance var * m / (m - 1), m being the number of elements reduced.
/// With a `reducer`, the statistics are those of the union of all processes' batches (see
/// Note [Multi-node batch statistics]); that form is differentiable once, not twice.
/// gamma, beta and the running statistics have x's dtype, or float32 for a float16 or bfloat16 x
/// (mixed precision: the statistics are then computed and kept in float32). On 4-d inputs
/// normalised per channel (NCHW or channels-last) it runs as fused kernels: one statistics pass
/// and one normalising pass forward, one reduction and one elementwise pass backward; other
/// forms, and double backprop, use the composed formula.
Variable batch_normalization(const Variable& x, const Variable& gamma, const Variable& beta,
                             double eps = 2e-5, Array* running_mean = nullptr,
                             Array* running_var = nullptr, double decay = 0.9,
                             const Axes& axis = {}, BatchStatisticsReducer* reducer = nullptr);

/// relu(batch_normalization(x, gamma, beta, ...) + residual), the end of a residual block; an
/// undefined `residual` gives relu(batch_normalization(...)). The arguments are as in
/// batch_normalization; the residual has x's shape, dtype and device. Where the fused kernels
/// take x the addition and the relu run inside the normalising pass and their gradients inside
/// the backward passes (Note [Batch norm epilogues]); otherwise, and for double backprop, it is
/// the three functions composed.
Variable batch_normalization_relu(const Variable& x, const Variable& gamma, const Variable& beta,
                                  const Variable& residual = Variable(), double eps = 2e-5,
                                  Array* running_mean = nullptr, Array* running_var = nullptr,
                                  double decay = 0.9, const Axes& axis = {},
                                  BatchStatisticsReducer* reducer = nullptr);

/// Batch normalization with given statistics (Chainer's fixed_batch_normalization, used at test
/// time): y = gamma * (x - mean) / sqrt(var + eps) + beta. mean and var have gamma's shape and are
/// differentiable like the other inputs. `axis` is as in batch_normalization.
Variable fixed_batch_normalization(const Variable& x, const Variable& gamma, const Variable& beta,
                                   const Variable& mean, const Variable& var, double eps = 2e-5,
                                   const Axes& axis = {});

/// relu(fixed_batch_normalization(x, gamma, beta, mean, var, ...) + residual) (residual may be
/// undefined), the test-time form of batch_normalization_relu.
Variable fixed_batch_normalization_relu(const Variable& x, const Variable& gamma,
                                        const Variable& beta, const Variable& mean,
                                        const Variable& var, const Variable& residual = Variable(),
                                        double eps = 2e-5, const Axes& axis = {});

/// Layer normalization (Ba et al. 2016), as in Chainer and PyTorch: each sample is normalised over
/// the trailing axes that gamma spans (x's last axis when gamma and beta are both undefined),
///   y = (x - mean) / sqrt(var + eps) * gamma + beta,
/// mean and the biased var taken over those axes. gamma and beta (either may be undefined: 1 and
/// 0) have that trailing shape and x's dtype, or float32 for a float16 or bfloat16 x. Runs as
/// fused kernels on the CPU and the GPU, one pass per row each way (Note [Fused layer
/// normalization]); double backprop uses the composed formula.
Variable layer_normalization(const Variable& x, const Variable& gamma, const Variable& beta, double eps = 1e-5);

/// RMS normalization (Zhang and Sennrich 2019), as LLaMA uses it: y = x / sqrt(mean(x^2) + eps) *
/// gamma over the trailing axes gamma spans (x's last axis when gamma is undefined). Arguments
/// and kernels as in layer_normalization.
Variable rms_normalization(const Variable& x, const Variable& gamma, double eps = 1e-6);

/// Group normalization (Wu and He 2018, Chainer's group_normalization): x (N, C, ...) is
/// normalized over each group of C / groups channels and every spatial position, then scaled by
/// gamma (C) and shifted by beta (C) per channel. ValueError unless groups divides C; 16-bit x is
/// normalized in float32 and returned in its dtype.
Variable group_normalization(const Variable& x, int64_t groups, const Variable& gamma, const Variable& beta,
                             double eps = 1e-5);

/// Local response normalization across channels (Krizhevsky et al. 2012, Chainer's): for x
/// (N, C, ...), y = x / (k + alpha s)^beta with s the sum of x^2 over the channels c - n/2 ..
/// c + n/2 (n/2 rounded down; missing channels count 0).
Variable local_response_normalization(const Variable& x, int64_t n = 5, double k = 2.0, double alpha = 1e-4,
                                      double beta = 0.75);

}  // namespace kusari::functions
