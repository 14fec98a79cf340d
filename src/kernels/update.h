// Kernels: fused optimizer updates and the non-finite count of dynamic loss scaling.
// See Note [Kernel families].
#pragma once

#include <variant>

#include "kernels/kernel.h"
#include "kusari/core/array.h"
#include "kusari/core/op_types.h"

namespace kusari::kernels {

// Note [Update rule layouts]
// Each rule is Chainer's, element by element (g the gradient, p the parameter), with the
// hyperparameters of its parameter struct below:
//   SgdParams          p -= lr g
//   MomentumSgdParams  v = momentum v - lr g;  p += v
//   NesterovParams     v = momentum v - lr g;  p += momentum^2 v - (1 + momentum) lr g
//   AdamParams         m += (1 - beta1) (g - m);  v += (1 - beta2) (g^2 - v);
//                      vhat = max(vhat, v) with amsgrad, else vhat = v;
//                      p -= eta (alpha_t m / (sqrt(vhat) + eps) + weight_decay_rate p)
//                      where alpha_t = alpha sqrt(1 - beta2^t) / (1 - beta1^t) is computed by the
//                      caller from the parameter's step count t (bias correction).
//   RmspropParams      ms = alpha ms + (1 - alpha) g^2;
//                      p -= lr g / (sqrt(ms) + eps), or lr g / sqrt(ms + eps) with eps_inside_sqrt
//   AdaGradParams      h += g^2;  p -= lr g / (sqrt(h) + eps)
//   RmspropWarmupParams ms = alpha ms + (1 - alpha) g^2;
//                      v = momentum v - (sgd_lr + rmsprop_lr / (sqrt(ms) + eps)) g;  p += v
//                      (Akiba et al.'s RMSprop warm-up: see Note [RMSprop warm-up] in
//                      src/optimizers/rmsprop_warmup.cc; with rmsprop_lr = 0 it is MomentumSGD)
// The public routine update_parameter takes the same values as a list of doubles in the order
// of each struct's fields (flags as 0 or 1) and builds the struct after checking the count.

struct SgdParams {
  double lr;
};
struct MomentumSgdParams {
  double lr, momentum;  // state: v
};
struct NesterovParams {
  double lr, momentum;  // state: v
};
struct AdamParams {
  double alpha_t, beta1, beta2, eps, eta, weight_decay_rate;
  bool amsgrad;  // state: m, v (, vhat with amsgrad)
};
struct RmspropParams {
  double lr, alpha, eps;
  bool eps_inside_sqrt;  // state: ms
};
struct AdaGradParams {
  double lr, eps;  // state: h
};
struct RmspropWarmupParams {
  double sgd_lr, rmsprop_lr, momentum, alpha, eps;  // state: ms, v
};

/// The hyperparameters of one update rule; the alternatives are in UpdateRule's order.
using UpdateParams =
    std::variant<SgdParams, MomentumSgdParams, NesterovParams, AdamParams, RmspropParams, AdaGradParams,
                 RmspropWarmupParams>;

/// The rule that `p` holds the parameters of.
inline UpdateRule update_rule(const UpdateParams& p) { return static_cast<UpdateRule>(p.index()); }

/// One fused optimizer step on a parameter: updates `param` and the n_state `state` arrays in
/// place. param, grad and the state arrays are contiguous, of one floating dtype and one size;
/// 16-bit floats compute in float32. With `skip` (one int64 on the parameter's device; may be
/// null), nothing is written when *skip is nonzero at the time the kernel runs.
inline constinit Kernel<void(Array& param, const Array& grad, Array* state, int n_state, const UpdateParams& params,
                             const Array* skip)>
    update_parameter{"update_parameter"};
/// Multi-tensor form of update_parameter: one step of one rule on n_tensors parameters of one
/// floating dtype and device, in a few passes for all of them (Note [Multi-tensor updates] in
/// src/routines/update.cc). `state` holds n_state arrays per tensor, tensor-major
/// (state[k * n_state + j] is state j of tensor k); param[k], grad[k] and tensor k's states are
/// contiguous, of one size (nonzero). Each element is computed exactly as update_parameter
/// computes it, so the results are the same bit for bit.
inline constinit Kernel<void(Array* param, const Array* grad, Array* state, int n_tensors,
                             int n_state, const UpdateParams& params, const Array* skip)>
    update_parameters{"update_parameters"};
/// out (one int64) = the number of Inf and NaN values in the n contiguous floating arrays (all
/// on out's device), in one pass; on a GPU a few launches for all of them.
inline constinit Kernel<void(const Array* arrays, int n, Array& out)> count_nonfinite{"count_nonfinite"};

}  // namespace kusari::kernels
