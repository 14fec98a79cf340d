#include "kusari/functions/normalization.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/graph_access.h"
#include "functions/function_util.h"
#include "kusari/core/routines.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/array.h"
#include "kusari/functions/convolution.h"
#include "kusari/functions/math.h"
#include "routines/normalization.h"

namespace kusari::functions {

namespace {

// Which axes a batch normalization reduces, and the shapes involved.
struct BatchNormGeometry {
  Axes axes;             // the reduced axes, sorted
  Shape keepdims_shape;  // x's shape with the reduced axes set to 1 (parameters broadcast from it)
  Shape param_shape;     // x's shape over the other axes: the shape of gamma, beta, mean, var
  int64_t m = 0;         // elements reduced per parameter
};

// Checks x and the per-channel parameters, and resolves `axis` (empty: Chainer's default, the
// axes (0,) + (gamma.ndim + 1, ..., x.ndim - 1)).
BatchNormGeometry batch_norm_geometry(
    const char* fn, const Variable& x, const Axes& axis,
    std::initializer_list<std::pair<const char*, const Variable*>> params) {
  detail::check_floating(fn, x);
  const Variable& gamma = *params.begin()->second;
  for (const auto& [name, p] : params) {
    KUSARI_CHECK(p->defined(), ValueError, fn, ": ", name, " is undefined");
    KUSARI_CHECK(
        p->dtype() == x.dtype() || (is_half_precision(x.dtype()) && p->dtype() == Dtype::kFloat32),
        DtypeError, fn, ": ", name, " is ", dtype_name(p->dtype()), " but x is ",
        dtype_name(x.dtype()), "; expected the same dtype (or float32 for 16-bit x)");
    KUSARI_CHECK(p->device() == x.device(), DeviceError, fn, ": ", name, " is on ", p->device(),
                 " but x is on ", x.device());
  }
  BatchNormGeometry g;
  if (axis.empty()) {
    KUSARI_CHECK(x.ndim() >= gamma.ndim() + 1, ShapeError, fn, ": x of shape ", x.shape(),
                 " needs more than ", gamma.ndim(), " axes for gamma of shape ", gamma.shape());
    g.axes.push_back(0);
    for (int d = gamma.ndim() + 1; d < x.ndim(); ++d) g.axes.push_back(d);
  } else {
    g.axes = normalize_axes(axis, x.ndim(), fn, false);
  }
  g.keepdims_shape = detail::keepdims_shape(x.shape(), g.axes);
  for (int d = 0; d < x.ndim(); ++d) {
    const bool reduced = std::find(g.axes.begin(), g.axes.end(), d) != g.axes.end();
    if (!reduced) g.param_shape.push_back(x.shape()[d]);
  }
  for (const auto& [name, p] : params) {
    KUSARI_CHECK(p->shape() == g.param_shape, ShapeError, fn, ": ", name, " of shape ", p->shape(),
                 " does not match x of shape ", x.shape(), " normalised over axes ", g.axes,
                 " (expected ", g.param_shape, ")");
  }
  g.m = x.size() / std::max<int64_t>(g.param_shape.numel(), 1);
  KUSARI_CHECK(g.m > 0, ValueError, fn, ": x of shape ", x.shape(),
               " has no elements to take statistics over");
  return g;
}

// Note [Batch statistics]
// The batch statistics are computed in this one place so that a fused kernel (cuDNN's
// BatchNormalizationForwardTraining, which also returns the saved mean and inverse standard
// deviation) can replace it without touching the autograd code. Arrays are in keepdims shape.
struct BatchStatistics {
  Array mean;     // mean over the reduced axes
  Array var;      // biased variance (divided by m)
  Array inv_std;  // 1 / sqrt(var + eps)
};

BatchStatistics compute_batch_statistics(const Array& x, const Axes& axes, double eps) {
  BatchStatistics s;
  s.mean = kusari::mean(x, axes, true);
  s.var = kusari::mean(kusari::square(x - s.mean), axes, true);
  s.inv_std = kusari::rsqrt(s.var + eps);
  return s;
}

// Note [Multi-node batch statistics]
// With a reducer, each process packs its element count and its per-channel sums of x and x^2
// (in float64) into one array of 1 + 2C values; one allreduce gives the global count M and sums,
// so mean = S / M and var = Q / M - mean^2 describe the union of all batches even when their
// sizes differ (ChainerMN averages per-process means, which assumes equal sizes). Backward
// sums gy and gy * x_hat per channel the same way (2C values) and uses them with the global M;
// the gradients of gamma and beta are this process's own sums, which the multi-node optimizer
// then averages like every other gradient.
BatchStatistics compute_global_batch_statistics(const Array& x, const Axes& axes, double eps,
                                                int64_t m_local, BatchStatisticsReducer& reducer,
                                                double* total) {
  Array x64 = x.astype(Dtype::kFloat64);
  Array s = kusari::sum(x64, axes, true);
  Array q = kusari::sum(kusari::square(x64), axes, true);
  const int64_t c = s.size();
  Array packed =
      concatenate({Array::full({1}, static_cast<double>(m_local), Dtype::kFloat64, x.device()),
                   s.reshape({c}), q.reshape({c})});
  reducer.sum(packed);
  std::vector<Array> parts = split_at(packed, {1, 1 + c});
  *total = parts[0].item<double>();
  KUSARI_CHECK(*total > 0, ValueError, "batch_normalization: the processes' batches are all empty");
  const Shape ks = s.shape();
  BatchStatistics st;
  Array mean64 = parts[1].reshape(ks) * (1.0 / *total);
  Array var64 =
      kusari::maximum(parts[2].reshape(ks) * (1.0 / *total) - kusari::square(mean64), 0.0);
  st.mean = mean64.astype(x.dtype());
  st.var = var64.astype(x.dtype());
  st.inv_std = kusari::rsqrt(var64 + eps).astype(x.dtype());
  return st;
}

void check_running(const char* fn, const char* name, const Array* running, const Variable& x,
                   const BatchNormGeometry& g) {
  if (running == nullptr) return;
  KUSARI_CHECK(running->defined(), ValueError, fn, ": ", name, " is undefined");
  KUSARI_CHECK(is_floating(running->dtype()), DtypeError, fn, ": ", name,
               " must be floating-point, got ", dtype_name(running->dtype()));
  KUSARI_CHECK(running->shape() == g.param_shape, ShapeError, fn, ": ", name, " of shape ",
               running->shape(), " does not match gamma's shape ", g.param_shape);
  KUSARI_CHECK(running->device() == x.device(), DeviceError, fn, ": ", name, " is on ",
               running->device(), " but x is on ", x.device());
}

// The checks of a training-mode batch normalization's arguments, and its geometry.
BatchNormGeometry train_geometry(const char* fn, const Variable& x, const Variable& gamma,
                                 const Variable& beta, double eps, const Array* running_mean,
                                 const Array* running_var, double decay, const Axes& axis) {
  BatchNormGeometry g = batch_norm_geometry(fn, x, axis, {{"gamma", &gamma}, {"beta", &beta}});
  KUSARI_CHECK(eps > 0.0, ValueError, fn, ": eps must be positive, got ", eps);
  KUSARI_CHECK(decay >= 0.0 && decay <= 1.0, ValueError, fn, ": decay must be in [0, 1], got ",
               decay);
  check_running(fn, "running_mean", running_mean, x, g);
  check_running(fn, "running_var", running_var, x, g);
  return g;
}

// running = decay * running + (1 - decay) * value, in place and in running's dtype.
void update_running(Array* running, const Array& value, const Shape& param_shape, double decay) {
  if (running == nullptr) return;
  Array v = value.reshape(param_shape).astype(running->dtype());
  running->assign(*running * decay + v * (1.0 - decay));
}

// v in `dtype`, differentiably (the gradient comes back in v's dtype).
Variable in_dtype(const Variable& v, Dtype dtype) {
  return v.dtype() == dtype ? v : cast(v, dtype);
}

// Note [Batch normalization gradients]
// With x_hat = (x - mean) * inv_std and sums over the reduced axes (m elements each):
//   gbeta = sum(gy), ggamma = sum(gy * x_hat),
//   gx = gamma * inv_std * (gy - gbeta / m - x_hat * ggamma / m).
// This holds for every x, so writing it with differentiable functions of x, gamma and gy gives
// the second derivatives too, provided mean and inv_std are themselves differentiable functions
// of x there. Plain backward reuses the forward's statistics as constants; double backprop
// recomputes them from x with differentiable functions.
// `gy` is the gradient of the normalised output (the node's output gradient, or that gradient
// through a fused relu).
void batch_norm_backward(BackwardContext& ctx, const BatchNormGeometry& g, double eps,
                         const Array& mean, const Array& inv_std, const Variable& gy) {
  Variable x = ctx.input(0), gamma = in_dtype(ctx.input(1), ctx.input(0).dtype());
  Variable mu, istd;
  if (ctx.is_double_backprop()) {
    mu = functions::mean(x, g.axes, true);
    Variable var = functions::mean(square(sub(x, mu)), g.axes, true);
    istd = pow(add(var, eps), -0.5);
  } else {
    mu = Variable(mean);
    istd = Variable(inv_std);
  }
  Variable x_hat = mul(sub(x, mu), istd);
  Variable gbeta = sum(gy, g.axes, true);
  Variable ggamma = sum(mul(gy, x_hat), g.axes, true);
  if (ctx.needs_input_grad(0)) {
    const double inv_m = 1.0 / static_cast<double>(g.m);
    Variable inner = sub(sub(gy, mul(gbeta, inv_m)), mul(x_hat, mul(ggamma, inv_m)));
    ctx.set_input_grad(0, mul(mul(reshape(gamma, g.keepdims_shape), istd), inner));
  }
  if (ctx.needs_input_grad(1)) {
    ctx.set_input_grad(1, in_dtype(reshape(ggamma, g.param_shape), ctx.input(1).dtype()));
  }
  if (ctx.needs_input_grad(2)) {
    ctx.set_input_grad(2, in_dtype(reshape(gbeta, g.param_shape), ctx.input(2).dtype()));
  }
}

// y = gamma * x_hat + beta with x_hat = (x - mean) * inv_std and inv_std = (var + eps)^(-1/2):
//   gx = gy * gamma * inv_std, gmean = -sum(gx), gbeta = sum(gy), ggamma = sum(gy * x_hat),
//   gvar = -gamma * ggamma * inv_std^2 / 2,
// all differentiable functions of the five inputs and gy.
void fixed_batch_norm_backward(BackwardContext& ctx, const BatchNormGeometry& g, double eps) {
  const Shape& ks = g.keepdims_shape;
  const Variable& gy = ctx.output_grad();
  Variable gamma = reshape(ctx.input(1), ks);
  Variable inv_std = pow(add(reshape(ctx.input(4), ks), eps), -0.5);
  Variable x_hat = mul(sub(ctx.input(0), reshape(ctx.input(3), ks)), inv_std);
  if (ctx.needs_input_grad(0) || ctx.needs_input_grad(3)) {
    Variable gx = mul(gy, mul(gamma, inv_std));
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, gx);
    if (ctx.needs_input_grad(3)) {
      ctx.set_input_grad(3, reshape(neg(sum(gx, g.axes, true)), g.param_shape));
    }
  }
  if (ctx.needs_input_grad(2)) {
    ctx.set_input_grad(2, reshape(sum(gy, g.axes, true), g.param_shape));
  }
  if (ctx.needs_input_grad(1) || ctx.needs_input_grad(4)) {
    Variable ggamma = sum(mul(gy, x_hat), g.axes, true);
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, reshape(ggamma, g.param_shape));
    if (ctx.needs_input_grad(4)) {
      Variable gvar = mul(mul(gamma, ggamma), mul(square(inv_std), -0.5));
      ctx.set_input_grad(4, reshape(gvar, g.param_shape));
    }
  }
}

// Note [Fused batch normalization in autograd]
// When the fused kernels take x (routines::batch_norm_fused_shape: the channel is axis 1 and x is
// dense, C-ordered or channels-last), the forward is the statistics pass and the normalising
// pass, and the backward the two passes of Note [Fused batch normalization]; the statistics
// (mean, inv_std: C elements in float32, float64 for float64 data) are kept for the backward.
// gamma and beta may then be float32 for 16-bit x: the kernels read them as they are, so a
// mixed-precision model casts nothing. Double backprop uses the composed formula of Note [Batch
// normalization gradients]; so does every case the kernels do not take, with the parameters cast
// to x's dtype.
struct FusedStatistics {
  kernels::BatchNormShape shape;
  Array mean, inv_std;
};

// The statistics of the union of all processes' batches from this process's fused statistics:
// one allreduce of [m, m * mean, m * (var + mean^2)] in float64 (Note [Multi-node batch
// statistics]). Returns the global mean, var and inv_std in the statistics' dtype.
void reduce_fused_statistics(BatchStatisticsReducer& reducer, int64_t m_local, double eps,
                             Array& mean, Array& var, Array& inv_std, double* total) {
  const int64_t c = mean.size();
  Array m64 = mean.astype(Dtype::kFloat64), v64 = var.astype(Dtype::kFloat64);
  const double m = static_cast<double>(m_local);
  Array packed = concatenate({Array::full({1}, m, Dtype::kFloat64, mean.device()), m64 * m,
                              (v64 + kusari::square(m64)) * m});
  reducer.sum(packed);
  std::vector<Array> parts = split_at(packed, {1, 1 + c});
  *total = parts[0].item<double>();
  KUSARI_CHECK(*total > 0, ValueError, "batch_normalization: the processes' batches are all empty");
  Array gm = parts[1] * (1.0 / *total);
  Array gv = kusari::maximum(parts[2] * (1.0 / *total) - kusari::square(gm), 0.0);
  const Dtype stat = mean.dtype();
  mean = gm.astype(stat);
  var = gv.astype(stat);
  inv_std = kusari::rsqrt(gv + eps).astype(stat);
}

// The backward through the fused kernels; false when a kernel declined (nothing is set then).
// With relu_y (the output of a fused relu), gy is masked by relu_y > 0 inside the kernels.
bool fused_batch_norm_backward(BackwardContext& ctx, const BatchNormGeometry& g,
                               const FusedStatistics& fs, BatchStatisticsReducer* reducer,
                               double total, const Array& gy, const Array* relu_y,
                               Array* masked_gy = nullptr) {
  const Array& x = ctx.input(0).data();
  Array gbeta, ggamma;
  if (!routines::batch_norm_backward_reduce(x, gy, relu_y, fs.shape, fs.mean, fs.inv_std, gbeta,
                                            ggamma)) {
    return false;
  }
  if (ctx.needs_input_grad(0)) {
    Array sum_beta = gbeta, sum_gamma = ggamma;
    if (reducer) {
      const int64_t c = gbeta.size();
      Array packed = concatenate({gbeta.astype(Dtype::kFloat64), ggamma.astype(Dtype::kFloat64)});
      reducer->sum(packed);
      std::vector<Array> sums = split_at(packed, {c});
      sum_beta = sums[0].astype(gbeta.dtype());
      sum_gamma = sums[1].astype(gbeta.dtype());
    }
    Array gx =
        routines::batch_norm_backward_data(x, gy, relu_y, fs.shape, fs.mean, fs.inv_std,
                                           ctx.input(1).data(), sum_beta, sum_gamma, 1.0 / total,
                                           masked_gy);
    if (!gx.defined()) return false;
    ctx.set_input_grad(0, Variable(std::move(gx)));
  }
  // The parameters' gradients are this process's own sums (Note [Multi-node batch statistics]).
  if (ctx.needs_input_grad(1)) {
    ctx.set_input_grad(1, Variable(ggamma.astype(ctx.input(1).dtype()).reshape(g.param_shape)));
  }
  if (ctx.needs_input_grad(2)) {
    ctx.set_input_grad(2, Variable(gbeta.astype(ctx.input(2).dtype()).reshape(g.param_shape)));
  }
  return true;
}

// The composed backward from fused statistics (for double backprop, or a kernel that declined).
void composed_backward_from_fused(BackwardContext& ctx, const BatchNormGeometry& g, double eps,
                                  const FusedStatistics& fs, const Variable& gy) {
  const Dtype d = ctx.input(0).dtype();
  batch_norm_backward(ctx, g, eps, fs.mean.astype(d).reshape(g.keepdims_shape),
                      fs.inv_std.astype(d).reshape(g.keepdims_shape), gy);
}

// The multi-node composed backward (Note [Multi-node batch statistics]).
void multi_node_composed_backward(BackwardContext& ctx, const BatchNormGeometry& g, double total,
                                  BatchStatisticsReducer* reducer, const Array& mean,
                                  const Array& inv_std, const Array& gy) {
  KUSARI_CHECK(!ctx.is_double_backprop(), NotImplementedError,
               "batch_normalization: the multi-node form is differentiable once; "
               "double backprop through it is not supported");
  const Array& x = ctx.input(0).data();
  Array x_hat = (x - mean) * inv_std;
  Array gbeta = kusari::sum(gy, g.axes, true);
  Array ggamma = kusari::sum(gy * x_hat, g.axes, true);
  const int64_t c = gbeta.size();
  Array packed = concatenate(
      {gbeta.astype(Dtype::kFloat64).reshape({c}), ggamma.astype(Dtype::kFloat64).reshape({c})});
  reducer->sum(packed);
  std::vector<Array> sums = split_at(packed, {c});
  Array gb = (sums[0] * (1.0 / total)).astype(gy.dtype()).reshape(gbeta.shape());
  Array gg = (sums[1] * (1.0 / total)).astype(gy.dtype()).reshape(gbeta.shape());
  Array gamma_k = ctx.input(1).data().astype(x.dtype()).reshape(g.keepdims_shape);
  if (ctx.needs_input_grad(0))
    ctx.set_input_grad(0, Variable(gamma_k * inv_std * ((gy - gb) - x_hat * gg)));
  if (ctx.needs_input_grad(1)) {
    ctx.set_input_grad(1, Variable(ggamma.reshape(g.param_shape).astype(ctx.input(1).dtype())));
  }
  if (ctx.needs_input_grad(2)) {
    ctx.set_input_grad(2, Variable(gbeta.reshape(g.param_shape).astype(ctx.input(2).dtype())));
  }
}

// The training forward through the fused kernels, with an optional residual added and relu
// applied inside the normalising pass (Note [Batch norm epilogues]); undefined when the kernels
// do not take x (nothing has been updated then).
Variable fused_batch_normalization(const char* fn, const Variable& x, const Variable& gamma,
                                   const Variable& beta, const Variable& residual, bool relu,
                                   const BatchNormGeometry& g, double eps, Array* running_mean,
                                   Array* running_var, double decay,
                                   BatchStatisticsReducer* reducer) {
  std::optional<kernels::BatchNormShape> shape = routines::batch_norm_fused_shape(x.data(), g.axes);
  if (!shape) return Variable();
  FusedStatistics fs;
  fs.shape = *shape;
  Array var;
  bool running_done = false;
  // A reducer's running averages take the global statistics: they are updated below.
  const double adjust = static_cast<double>(g.m) / std::max(static_cast<double>(g.m) - 1.0, 1.0);
  if (!routines::batch_norm_statistics(x.data(), *shape, eps, reducer ? nullptr : running_mean,
                                       reducer ? nullptr : running_var, decay, adjust, fs.mean, var,
                                       fs.inv_std, &running_done)) {
    return Variable();
  }
  double total = static_cast<double>(g.m);
  if (reducer) reduce_fused_statistics(*reducer, g.m, eps, fs.mean, var, fs.inv_std, &total);
  const bool has_residual = residual.defined();
  Array y =
      routines::batch_norm_normalize(x.data(), *shape, fs.mean, fs.inv_std, gamma.data(),
                                     beta.data(), has_residual ? &residual.data() : nullptr, relu);
  if (!y.defined()) return Variable();
  if (reducer != nullptr || !running_done) {
    update_running(running_mean, fs.mean, g.param_shape, decay);
    if (running_var != nullptr) {
      update_running(running_var, var * (total / std::max(total - 1.0, 1.0)), g.param_shape, decay);
    }
  }
  // The relu's mask is its output: kept for the backward (as functions::relu keeps it).
  Array relu_y = relu ? y : Array();
  auto rule = [g, eps, fs, reducer, total, relu_y](BackwardContext& ctx) {
    const bool with_relu = relu_y.defined();
    const bool with_residual = ctx.num_inputs() == 4;
    if (!ctx.is_double_backprop()) {
      const Array& gy = ctx.output_grad().data();
      // The residual's gradient is gy masked by the relu: written by the gradient pass of x
      // when it runs (no pass of its own), else by relu_grad.
      const bool residual_grad = with_residual && ctx.needs_input_grad(3);
      Array masked;
      if (fused_batch_norm_backward(ctx, g, fs, reducer, total, gy, with_relu ? &relu_y : nullptr,
                                    residual_grad && with_relu ? &masked : nullptr)) {
        if (residual_grad) {
          if (!masked.defined()) masked = with_relu ? kusari::relu_grad(gy, relu_y) : gy;
          ctx.set_input_grad(3, Variable(std::move(masked)));
        }
        return;
      }
    }
    // The gradient of the normalised output, differentiable in the output's gradient.
    Variable gy = with_relu ? detail::relu_grad(ctx.output_grad(), relu_y) : ctx.output_grad();
    if (with_residual && ctx.needs_input_grad(3)) ctx.set_input_grad(3, gy);
    if (reducer) {
      const Dtype d = ctx.input(0).dtype();
      multi_node_composed_backward(ctx, g, total, reducer,
                                   fs.mean.astype(d).reshape(g.keepdims_shape),
                                   fs.inv_std.astype(d).reshape(g.keepdims_shape), gy.data());
      return;
    }
    composed_backward_from_fused(ctx, g, eps, fs, gy);
  };
  if (has_residual) {
    Variable out = record(fn, {x, gamma, beta, residual}, std::move(y), std::move(rule));
    // The rule passes the residual a gradient and never reads it (Note [Inputs whose data no
    // rule reads]): a downsampling block's shortcut output need not live until backward.
    kusari::detail::input_data_unread(out, 3);
    return out;
  }
  return record(fn, {x, gamma, beta}, std::move(y), std::move(rule));
}

// The training batch normalization composed from generic routines (the fused kernels declined
// x), with the parameters cast to x's dtype; the arguments are checked (`g`).
Variable composed_batch_normalization(const Variable& x, const Variable& gamma_in,
                                      const Variable& beta_in, const BatchNormGeometry& g,
                                      double eps, Array* running_mean, Array* running_var,
                                      double decay, BatchStatisticsReducer* reducer) {
  const char* fn = "batch_normalization";
  const Variable gamma = in_dtype(gamma_in, x.dtype()), beta = in_dtype(beta_in, x.dtype());
  double total = static_cast<double>(g.m);
  BatchStatistics s =
      reducer ? compute_global_batch_statistics(x.data(), g.axes, eps, g.m, *reducer, &total)
              : compute_batch_statistics(x.data(), g.axes, eps);
  Array scale = gamma.data().reshape(g.keepdims_shape) * s.inv_std;
  Array y = (x.data() - s.mean) * scale + beta.data().reshape(g.keepdims_shape);

  update_running(running_mean, s.mean, g.param_shape, decay);
  if (running_var != nullptr) {
    const double adjust = total / std::max(total - 1.0, 1.0);
    update_running(running_var, s.var * adjust, g.param_shape, decay);
  }

  if (reducer) {
    return record(fn, {x, gamma, beta}, std::move(y),
                  [g, total, reducer, mean = s.mean, inv_std = s.inv_std](BackwardContext& ctx) {
                    multi_node_composed_backward(ctx, g, total, reducer, mean, inv_std,
                                                 ctx.output_grad().data());
                  });
  }
  return record(fn, {x, gamma, beta}, std::move(y),
                [g, eps, mean = s.mean, inv_std = s.inv_std](BackwardContext& ctx) {
                  batch_norm_backward(ctx, g, eps, mean, inv_std, ctx.output_grad());
                });
}

}  // namespace

Variable batch_normalization(const Variable& x, const Variable& gamma, const Variable& beta,
                             double eps, Array* running_mean, Array* running_var, double decay,
                             const Axes& axis, BatchStatisticsReducer* reducer) {
  const char* fn = "batch_normalization";
  BatchNormGeometry g =
      train_geometry(fn, x, gamma, beta, eps, running_mean, running_var, decay, axis);

  // The fused kernels (Note [Fused batch normalization in autograd]).
  Variable fused = fused_batch_normalization(fn, x, gamma, beta, Variable(), false, g, eps,
                                             running_mean, running_var, decay, reducer);
  if (fused.defined()) return fused;

  return composed_batch_normalization(x, gamma, beta, g, eps, running_mean, running_var, decay,
                                      reducer);
}

namespace {

// Note [Batch norm epilogues]
// A residual block ends in relu(bn(x) + shortcut) and its other batch norms are followed by a
// relu. Composed, each is one more full pass over the activation forward (the add, the relu) and
// more backward (the relu's mask, the add's gradient), plus an activation-sized temporary. With
// the fused kernels the addition and the relu happen inside the normalising pass, and backward
// the relu's mask is applied inside the two batch norm passes; the shortcut's gradient is gy
// masked by y > 0 (one pass), and y itself is what is kept for the mask, as functions::relu
// keeps its output. Anything the kernels do not take is computed by composing the three
// functions, which is also what double backprop differentiates.
void check_residual(const char* fn, const Variable& x, const Variable& residual) {
  if (!residual.defined()) return;
  KUSARI_CHECK(residual.shape() == x.shape(), ShapeError, fn, ": the residual of shape ",
               residual.shape(), " does not match x of shape ", x.shape());
  KUSARI_CHECK(residual.dtype() == x.dtype(), DtypeError, fn, ": the residual is ",
               dtype_name(residual.dtype()), " but x is ", dtype_name(x.dtype()));
  KUSARI_CHECK(residual.device() == x.device(), DeviceError, fn, ": the residual is on ",
               residual.device(), " but x is on ", x.device());
}

Variable add_relu(const Variable& y, const Variable& residual) {
  return relu(residual.defined() ? add(y, residual) : y);
}

}  // namespace

Variable batch_normalization_relu(const Variable& x, const Variable& gamma, const Variable& beta,
                                  const Variable& residual, double eps, Array* running_mean,
                                  Array* running_var, double decay, const Axes& axis,
                                  BatchStatisticsReducer* reducer) {
  const char* fn = "batch_normalization_relu";
  BatchNormGeometry g =
      train_geometry(fn, x, gamma, beta, eps, running_mean, running_var, decay, axis);
  check_residual(fn, x, residual);
  Variable fused = fused_batch_normalization(fn, x, gamma, beta, residual, true, g, eps,
                                             running_mean, running_var, decay, reducer);
  if (fused.defined()) return fused;
  return add_relu(composed_batch_normalization(x, gamma, beta, g, eps, running_mean, running_var,
                                               decay, reducer),
                  residual);
}

Variable fixed_batch_normalization_relu(const Variable& x, const Variable& gamma,
                                        const Variable& beta, const Variable& mean,
                                        const Variable& var, const Variable& residual, double eps,
                                        const Axes& axis) {
  check_residual("fixed_batch_normalization_relu", x, residual);
  return add_relu(fixed_batch_normalization(x, gamma, beta, mean, var, eps, axis), residual);
}

Variable fixed_batch_normalization(const Variable& x, const Variable& gamma, const Variable& beta,
                                   const Variable& mean, const Variable& var, double eps,
                                   const Axes& axis) {
  const char* fn = "fixed_batch_normalization";
  BatchNormGeometry g = batch_norm_geometry(
      fn, x, axis, {{"gamma", &gamma}, {"beta", &beta}, {"mean", &mean}, {"var", &var}});
  KUSARI_CHECK(eps > 0.0, ValueError, fn, ": eps must be positive, got ", eps);
  const Shape& ks = g.keepdims_shape;
  const Dtype d = x.dtype();
  if (gamma.dtype() != d || beta.dtype() != d || mean.dtype() != d || var.dtype() != d) {
    // The backward is composed, in x's dtype; a fused forward reads the cast values alike.
    return fixed_batch_normalization(x, in_dtype(gamma, d), in_dtype(beta, d), in_dtype(mean, d),
                                     in_dtype(var, d), eps, axis);
  }
  Array y;
  if (std::optional<kernels::BatchNormShape> shape =
          routines::batch_norm_fused_shape(x.data(), g.axes)) {
    const Dtype stat = routines::batch_norm_stat_dtype(d);
    Array inv_std = kusari::rsqrt(var.data().astype(stat) + eps);
    y = routines::batch_norm_normalize(x.data(), *shape, mean.data(), inv_std, gamma.data(),
                                       beta.data());
  }
  if (!y.defined()) {
    Array inv_std = kusari::rsqrt(var.data().reshape(ks) + eps);
    y = (x.data() - mean.data().reshape(ks)) * (gamma.data().reshape(ks) * inv_std) +
        beta.data().reshape(ks);
  }
  return record(fn, {x, gamma, beta, mean, var}, std::move(y),
                [g, eps](BackwardContext& ctx) { fixed_batch_norm_backward(ctx, g, eps); });
}

// --- layer and RMS normalization (Note [Fused layer normalization]) ------------------------

namespace {

// Which trailing axes a layer or RMS normalization normalises over, and its parameters' slots.
struct RowNormGeometry {
  Shape norm_shape;    // the trailing shape (gamma's)
  Axes norm_axes;      // x's last norm_shape.size() axes
  Axes batch_axes;     // the others
  Shape keepdims;      // x's shape with the normalised axes set to 1
  int64_t cols = 0;    // elements per row
  int gamma = -1;      // input index of gamma, -1 when undefined
  int beta = -1;
};

RowNormGeometry row_norm_geometry(const char* fn, const Variable& x, const Variable& gamma, const Variable& beta,
                                  double eps) {
  detail::check_floating(fn, x);
  KUSARI_CHECK(eps > 0.0, ValueError, fn, ": eps must be positive, got ", eps);
  KUSARI_CHECK(x.ndim() >= 1, ShapeError, fn, ": x must have at least one axis, got shape ", x.shape());
  RowNormGeometry g;
  if (gamma.defined()) {
    g.norm_shape = gamma.shape();
  } else if (beta.defined()) {
    g.norm_shape = beta.shape();
  } else {
    g.norm_shape = Shape{x.shape()[x.ndim() - 1]};
  }
  int next = 1;
  for (const auto& [name, p, index] : {std::tuple<const char*, const Variable*, int*>{"gamma", &gamma, &g.gamma},
                                       std::tuple<const char*, const Variable*, int*>{"beta", &beta, &g.beta}}) {
    if (!p->defined()) continue;
    *index = next++;
    KUSARI_CHECK(p->dtype() == x.dtype() || (is_half_precision(x.dtype()) && p->dtype() == Dtype::kFloat32),
                 DtypeError, fn, ": ", name, " is ", dtype_name(p->dtype()), " but x is ", dtype_name(x.dtype()),
                 "; expected the same dtype (or float32 for 16-bit x)");
    KUSARI_CHECK(p->device() == x.device(), DeviceError, fn, ": ", name, " is on ", p->device(), " but x is on ",
                 x.device());
    KUSARI_CHECK(p->shape() == g.norm_shape, ShapeError, fn, ": ", name, " of shape ", p->shape(),
                 " differs from gamma's shape ", g.norm_shape);
  }
  const int k = static_cast<int>(g.norm_shape.size());
  bool trailing = k >= 1 && k <= x.ndim();
  for (int d = 0; trailing && d < k; ++d) trailing = x.shape()[x.ndim() - k + d] == g.norm_shape[d];
  KUSARI_CHECK(trailing, ShapeError, fn, ": gamma/beta of shape ", g.norm_shape,
               " must be the trailing shape of x, got x of shape ", x.shape());
  for (int d = 0; d < x.ndim(); ++d) (d < x.ndim() - k ? g.batch_axes : g.norm_axes).push_back(d);
  g.keepdims = detail::keepdims_shape(x.shape(), g.norm_axes);
  g.cols = g.norm_shape.numel();
  return g;
}

// sum of v over the batch axes, as a variable of the normalised shape (v itself when x has no
// batch axes).
Variable sum_over_batch(const Variable& v, const RowNormGeometry& g) {
  return g.batch_axes.empty() ? v : sum(v, g.batch_axes);
}

// Note [Layer normalization gradients]
// With x_hat = (x - mean) * rstd (x * rstd for rms), g = gy * gamma and means over the normalised
// axes: gx = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) (no mean(g) term for rms),
// ggamma = sum over the batch axes of gy * x_hat, gbeta = sum of gy. Written with differentiable
// functions; for double backprop mean and rstd are recomputed from x differentiably, otherwise
// the forward's statistics (keepdims shape, x's dtype) are constants.
void row_norm_composed_backward(BackwardContext& ctx, const RowNormGeometry& g, double eps, bool rms,
                                const Array& mean, const Array& rstd) {
  Variable x = ctx.input(0);
  const Variable& gy = ctx.output_grad();
  Variable mu, rs;
  if (ctx.is_double_backprop() || !rstd.defined()) {
    if (!rms) mu = functions::mean(x, g.norm_axes, true);
    Variable centred = rms ? x : sub(x, mu);
    rs = pow(add(functions::mean(square(centred), g.norm_axes, true), eps), -0.5);
  } else {
    if (!rms) mu = Variable(mean);
    rs = Variable(rstd);
  }
  Variable x_hat = mul(rms ? x : sub(x, mu), rs);
  Variable gamma = g.gamma >= 0 ? in_dtype(ctx.input(g.gamma), x.dtype()) : Variable();
  if (ctx.needs_input_grad(0)) {
    Variable gg = gamma.defined() ? mul(gy, gamma) : gy;
    Variable inner = sub(gg, mul(x_hat, functions::mean(mul(gg, x_hat), g.norm_axes, true)));
    if (!rms) inner = sub(inner, functions::mean(gg, g.norm_axes, true));
    ctx.set_input_grad(0, mul(rs, inner));
  }
  if (g.gamma >= 0 && ctx.needs_input_grad(g.gamma)) {
    ctx.set_input_grad(g.gamma, in_dtype(sum_over_batch(mul(gy, x_hat), g), ctx.input(g.gamma).dtype()));
  }
  if (g.beta >= 0 && ctx.needs_input_grad(g.beta)) {
    ctx.set_input_grad(g.beta, in_dtype(sum_over_batch(gy, g), ctx.input(g.beta).dtype()));
  }
}

Variable row_normalization(const char* fn, const Variable& x, const Variable& gamma, const Variable& beta,
                           double eps, bool rms) {
  const RowNormGeometry g = row_norm_geometry(fn, x, gamma, beta, eps);
  std::vector<Variable> inputs{x};
  if (gamma.defined()) inputs.push_back(gamma);
  if (beta.defined()) inputs.push_back(beta);
  Array gamma_a = gamma.defined() ? gamma.data() : Array(), beta_a = beta.defined() ? beta.data() : Array();
  Array mean, rstd;
  Array y = routines::row_norm_forward(x.data(), gamma.defined() ? &gamma_a : nullptr,
                                       beta.defined() ? &beta_a : nullptr, g.cols, eps, rms, mean, rstd);
  const bool fused = y.defined();
  if (!fused) {
    // Composed from generic routines, the statistics kept in keepdims shape and x's dtype.
    const Array& xa = x.data();
    Array centred = rms ? xa : xa - (mean = kusari::mean(xa, g.norm_axes, true));
    rstd = kusari::rsqrt(kusari::mean(kusari::square(centred), g.norm_axes, true) + eps);
    y = centred * rstd;
    if (gamma.defined()) y = y * gamma_a.astype(x.dtype());
    if (beta.defined()) y = y + beta_a.astype(x.dtype());
  }
  auto rule = [g, eps, rms, fused, mean, rstd](BackwardContext& ctx) {
    if (fused && !ctx.is_double_backprop()) {
      const bool need_gamma = g.gamma >= 0 && ctx.needs_input_grad(g.gamma);
      const bool need_beta = g.beta >= 0 && ctx.needs_input_grad(g.beta);
      Array gamma_a = g.gamma >= 0 ? ctx.input(g.gamma).data() : Array();
      Array gx, ggamma, gbeta;
      if (routines::row_norm_backward(ctx.input(0).data(), ctx.output_grad().data(),
                                      g.gamma >= 0 ? &gamma_a : nullptr, mean, rstd, g.cols, eps, rms, gx,
                                      need_gamma ? &ggamma : nullptr, need_beta ? &gbeta : nullptr)) {
        if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, Variable(std::move(gx)));
        if (need_gamma) {
          ctx.set_input_grad(g.gamma, Variable(ggamma.astype(ctx.input(g.gamma).dtype()).reshape(g.norm_shape)));
        }
        if (need_beta) {
          ctx.set_input_grad(g.beta, Variable(gbeta.astype(ctx.input(g.beta).dtype()).reshape(g.norm_shape)));
        }
        return;
      }
    }
    const Dtype d = ctx.input(0).dtype();
    row_norm_composed_backward(ctx, g, eps, rms,
                               fused && !rms ? mean.astype(d).reshape(g.keepdims) : (fused ? Array() : mean),
                               fused ? rstd.astype(d).reshape(g.keepdims) : rstd);
  };
  return record_multi(fn, inputs, {std::move(y)}, std::move(rule))[0];
}

}  // namespace

Variable layer_normalization(const Variable& x, const Variable& gamma, const Variable& beta, double eps) {
  return row_normalization("layer_normalization", x, gamma, beta, eps, false);
}

Variable rms_normalization(const Variable& x, const Variable& gamma, double eps) {
  return row_normalization("rms_normalization", x, gamma, Variable(), eps, true);
}

// (Note [Composed Chainer functions] in activation.cc.)
Variable group_normalization(const Variable& x, int64_t groups, const Variable& gamma, const Variable& beta,
                             double eps) {
  detail::check_floating("group_normalization", x);
  KUSARI_CHECK(x.ndim() >= 2, ValueError, "group_normalization: x must be (N, C, ...), got shape ", x.shape());
  const int64_t n = x.shape()[0], c = x.shape()[1];
  KUSARI_CHECK(groups > 0 && c % groups == 0, ValueError, "group_normalization: groups ", groups,
               " must be positive and divide the channels ", c, " of x ", x.shape());
  KUSARI_CHECK(gamma.defined() && beta.defined() && gamma.shape() == Shape{c} && beta.shape() == Shape{c},
               ValueError, "group_normalization: gamma and beta must be (", c, ",), got ",
               gamma.defined() ? gamma.shape() : Shape{}, " and ", beta.defined() ? beta.shape() : Shape{});
  KUSARI_CHECK(eps > 0, ValueError, "group_normalization: eps must be positive, got ", eps);
  const bool half = x.dtype() == Dtype::kFloat16 || x.dtype() == Dtype::kBFloat16;
  const Variable xf = half ? cast(x, float32) : x;
  const Variable g = reshape(xf, {n, groups, -1});
  const Variable centred = sub(g, mean(g, {2}, true));
  const Variable y = mul(centred, pow(add(mean(square(centred), {2}, true), eps), -0.5));
  Shape affine;
  for (int d = 0; d < x.ndim(); ++d) affine.push_back(d == 1 ? c : 1);
  const Variable gm = gamma.dtype() == xf.dtype() ? gamma : cast(gamma, xf.dtype());
  const Variable bt = beta.dtype() == xf.dtype() ? beta : cast(beta, xf.dtype());
  Variable out = add(mul(reshape(y, x.shape()), reshape(gm, affine)), reshape(bt, affine));
  return half ? cast(out, x.dtype()) : out;
}

Variable local_response_normalization(const Variable& x, int64_t n, double k, double alpha, double beta) {
  detail::check_floating("local_response_normalization", x);
  KUSARI_CHECK(x.ndim() >= 2, ValueError, "local_response_normalization: x must be (N, C, ...), got shape ",
               x.shape());
  KUSARI_CHECK(n > 0, ValueError, "local_response_normalization: n must be positive, got ", n);
  const int64_t half_n = n / 2, batch = x.shape()[0], c = x.shape()[1];
  const int64_t rest = c == 0 ? 0 : x.size() / (batch * c);
  // The window sums over channels as a convolution of x^2, seen as (N, 1, C, rest), with a
  // (2 half_n + 1) x 1 kernel of ones, padded by half_n channels of zeros on each side.
  const Variable sq = reshape(square(x), {batch, 1, c, rest});
  const Variable ones(Array::ones({1, 1, 2 * half_n + 1, 1}, x.dtype(), x.device()));
  const Variable s = reshape(convolution_2d(sq, ones, Variable(), 1, IntPair{half_n, 0}), x.shape());
  return mul(x, pow(add(mul(s, alpha), k), -beta));
}

}  // namespace kusari::functions
