#include "routines/normalization.h"

#include "kusari/core/error.h"

namespace kusari::routines {

namespace {

// The layout x was taken in: the other data arrays must match it.
MemoryFormat fused_format(const Array& x) {
  return x.is_contiguous() ? MemoryFormat::kContiguous : MemoryFormat::kChannelsLast;
}

// `a` laid out like x (a copy when it is not), with x's shape and dtype.
Array like_x(const char* fn, const Array& a, const Array& x, const char* name) {
  KUSARI_CHECK(a.shape() == x.shape(), ShapeError, fn, ": ", name, " of shape ", a.shape(),
               " does not match x ", x.shape());
  KUSARI_CHECK(a.dtype() == x.dtype(), DtypeError, fn, ": ", name, " is ", dtype_name(a.dtype()),
               " but x is ", dtype_name(x.dtype()));
  KUSARI_CHECK(a.device() == x.device(), DeviceError, fn, ": ", name, " is on ", a.device(),
               " but x is on ", x.device());
  const MemoryFormat f = fused_format(x);
  return a.is_contiguous(f) ? a : a.to_memory_format(f);
}

// A per-channel array as C contiguous elements of the statistics' dtype.
Array channel_vector(const char* fn, const Array& a, const kernels::BatchNormShape& s, Dtype stat,
                     const Array& x, const char* name) {
  KUSARI_CHECK(a.size() == s.channels, ShapeError, fn, ": ", name, " of shape ", a.shape(),
               " does not have ", s.channels, " elements (one per channel)");
  KUSARI_CHECK(a.device() == x.device(), DeviceError, fn, ": ", name, " is on ", a.device(),
               " but x is on ", x.device());
  Array v = a.astype(stat);
  if (!v.is_contiguous()) v = v.astype(stat, true);
  return v.reshape({s.channels});
}

// The operands both backward kernels read: gy and relu_y laid out like x, mean and inv_std as
// channel vectors.
struct BackwardOperands {
  Array gy, relu_y, mean, inv_std;
};

BackwardOperands backward_operands(const char* fn, const Array& x, const Array& gy,
                                   const Array* relu_y, const kernels::BatchNormShape& s,
                                   const Array& mean, const Array& inv_std) {
  const Dtype stat = batch_norm_stat_dtype(x.dtype());
  BackwardOperands o;
  o.gy = like_x(fn, gy, x, "gy");
  if (relu_y) o.relu_y = like_x(fn, *relu_y, x, "y");
  o.mean = channel_vector(fn, mean, s, stat, x, "mean");
  o.inv_std = channel_vector(fn, inv_std, s, stat, x, "inv_std");
  return o;
}

bool usable_running(const Array* r, Dtype stat, int64_t channels) {
  return r != nullptr && r->dtype() == stat && r->is_contiguous() && r->size() == channels;
}

}  // namespace

std::optional<kernels::BatchNormShape> batch_norm_fused_shape(const Array& x, const Axes& axes) {
  const int nd = x.ndim();
  if (nd < 2 || x.size() == 0 || !is_floating(x.dtype())) return std::nullopt;
  if (static_cast<int>(axes.size()) != nd - 1 || axes[0] != 0) return std::nullopt;
  for (int k = 1; k < nd - 1; ++k) {
    if (axes[static_cast<size_t>(k)] != k + 1) return std::nullopt;
  }
  kernels::BatchNormShape s;
  s.channels = x.shape()[1];
  if (x.is_contiguous()) {
    s.outer = x.shape()[0];
    s.inner = x.size() / (s.outer * s.channels);
    return s;
  }
  if (nd == 4 && x.is_contiguous(MemoryFormat::kChannelsLast)) {
    s.outer = x.size() / s.channels;
    s.inner = 1;
    return s;
  }
  return std::nullopt;
}

Dtype batch_norm_stat_dtype(Dtype x_dtype) {
  return x_dtype == Dtype::kFloat64 ? Dtype::kFloat64 : Dtype::kFloat32;
}

bool batch_norm_statistics(const Array& x, const kernels::BatchNormShape& s, double eps,
                           Array* running_mean, Array* running_var, double decay, double var_adjust,
                           Array& mean, Array& var, Array& inv_std, bool* running_done) {
  const Dtype stat = batch_norm_stat_dtype(x.dtype());
  kernels::BatchNormStatsParams p;
  p.eps = eps;
  p.decay = decay;
  p.var_adjust = var_adjust;
  const bool in_kernel =
      (running_mean == nullptr || usable_running(running_mean, stat, s.channels)) &&
      (running_var == nullptr || usable_running(running_var, stat, s.channels)) &&
      (running_mean == nullptr || running_mean->device() == x.device()) &&
      (running_var == nullptr || running_var->device() == x.device());
  if (in_kernel) {
    p.running_mean = running_mean;
    p.running_var = running_var;
  }
  Array m = Array::empty({s.channels}, stat, x.device());
  Array v = Array::empty({s.channels}, stat, x.device());
  Array is = Array::empty({s.channels}, stat, x.device());
  if (!kernels::batch_norm_statistics.try_run(x.device(), x, s, p, m, v, is)) return false;
  mean = std::move(m);
  var = std::move(v);
  inv_std = std::move(is);
  *running_done = in_kernel;
  return true;
}

Array batch_norm_normalize(const Array& x, const kernels::BatchNormShape& s, const Array& mean,
                           const Array& inv_std, const Array& gamma, const Array& beta,
                           const Array* residual, bool relu) {
  const char* fn = "batch_normalization";
  const Dtype stat = batch_norm_stat_dtype(x.dtype());
  Array g = channel_vector(fn, gamma, s, stat, x, "gamma");
  Array b = channel_vector(fn, beta, s, stat, x, "beta");
  Array mu = channel_vector(fn, mean, s, stat, x, "mean");
  Array is = channel_vector(fn, inv_std, s, stat, x, "inv_std");
  Array r;
  if (residual) r = like_x(fn, *residual, x, "the residual");
  Array y = Array::empty(x.shape(), x.dtype(), x.device(), fused_format(x));
  if (!kernels::batch_norm_normalize.try_run(x.device(), x, s, mu, is, g, b,
                                             residual ? &r : nullptr, relu, y)) {
    return Array();
  }
  return y;
}

bool batch_norm_backward_reduce(const Array& x, const Array& gy, const Array* relu_y,
                                const kernels::BatchNormShape& s, const Array& mean,
                                const Array& inv_std, Array& gbeta, Array& ggamma) {
  const char* fn = "batch_normalization (gradient)";
  const Dtype stat = batch_norm_stat_dtype(x.dtype());
  const BackwardOperands o = backward_operands(fn, x, gy, relu_y, s, mean, inv_std);
  Array gb = Array::empty({s.channels}, stat, x.device());
  Array gg = Array::empty({s.channels}, stat, x.device());
  if (!kernels::batch_norm_backward_reduce.try_run(
          x.device(), x, o.gy, relu_y ? &o.relu_y : nullptr, s, o.mean, o.inv_std, gb, gg)) {
    return false;
  }
  gbeta = std::move(gb);
  ggamma = std::move(gg);
  return true;
}

Array batch_norm_backward_data(const Array& x, const Array& gy, const Array* relu_y,
                               const kernels::BatchNormShape& s, const Array& mean,
                               const Array& inv_std, const Array& gamma, const Array& gbeta,
                               const Array& ggamma, double inv_m, Array* masked_gy) {
  const char* fn = "batch_normalization (gradient)";
  const Dtype stat = batch_norm_stat_dtype(x.dtype());
  const BackwardOperands o = backward_operands(fn, x, gy, relu_y, s, mean, inv_std);
  Array ga = channel_vector(fn, gamma, s, stat, x, "gamma");
  Array gb = channel_vector(fn, gbeta, s, stat, x, "gbeta");
  Array gg = channel_vector(fn, ggamma, s, stat, x, "ggamma");
  Array gx = Array::empty(x.shape(), x.dtype(), x.device(), fused_format(x));
  Array gm = masked_gy ? Array::empty(x.shape(), x.dtype(), x.device(), fused_format(x)) : Array();
  if (!kernels::batch_norm_backward_data.try_run(x.device(), x, o.gy, relu_y ? &o.relu_y : nullptr,
                                                 s, o.mean, o.inv_std, ga, gb, gg, inv_m, gx,
                                                 masked_gy ? &gm : nullptr)) {
    return Array();
  }
  if (masked_gy) *masked_gy = std::move(gm);
  return gx;
}

namespace {

// A parameter of a layer normalization as `cols` contiguous elements of the statistics' dtype.
Array row_vector(const char* fn, const Array& a, int64_t cols, Dtype stat, const Array& x, const char* name) {
  KUSARI_CHECK(a.size() == cols, ShapeError, fn, ": ", name, " of shape ", a.shape(), " does not have ", cols,
               " elements (one per normalised element)");
  KUSARI_CHECK(a.device() == x.device(), DeviceError, fn, ": ", name, " is on ", a.device(), " but x is on ",
               x.device());
  Array v = a.astype(stat);
  if (!v.is_contiguous()) v = v.astype(stat, true);
  return v.reshape({cols});
}

kernels::RowNormParams row_norm_params(const Array& x, int64_t cols, double eps, bool rms) {
  kernels::RowNormParams p;
  p.cols = cols;
  p.rows = cols > 0 ? x.size() / cols : 0;
  p.eps = eps;
  p.rms = rms;
  return p;
}

}  // namespace

Array row_norm_forward(const Array& x, const Array* gamma, const Array* beta, int64_t cols, double eps, bool rms,
                       Array& mean, Array& rstd) {
  const char* fn = rms ? "rms_normalization" : "layer_normalization";
  KUSARI_CHECK(cols > 0 && x.size() % cols == 0, ShapeError, fn, ": x of shape ", x.shape(),
               " cannot be seen as rows of ", cols, " elements");
  const Dtype stat = batch_norm_stat_dtype(x.dtype());
  Array g, b;
  if (gamma) g = row_vector(fn, *gamma, cols, stat, x, "gamma");
  if (beta) b = row_vector(fn, *beta, cols, stat, x, "beta");
  const Array xc = x.is_contiguous() ? x : x.to_memory_format(MemoryFormat::kContiguous);
  const kernels::RowNormParams p = row_norm_params(xc, cols, eps, rms);
  Array y = Array::empty(x.shape(), x.dtype(), x.device());
  mean = rms ? Array() : Array::empty({p.rows}, stat, x.device());
  rstd = Array::empty({p.rows}, stat, x.device());
  if (p.rows == 0) return y;
  if (!kernels::row_norm_forward.try_run(x.device(), xc, gamma ? &g : nullptr, beta ? &b : nullptr, p, y, mean,
                                         rstd)) {
    mean = rstd = Array();
    return Array();
  }
  return y;
}

bool row_norm_backward(const Array& x, const Array& gy, const Array* gamma, const Array& mean, const Array& rstd,
                       int64_t cols, double eps, bool rms, Array& gx, Array* ggamma, Array* gbeta) {
  const char* fn = rms ? "rms_normalization (gradient)" : "layer_normalization (gradient)";
  KUSARI_CHECK(gy.shape() == x.shape(), ShapeError, fn, ": gy of shape ", gy.shape(), " does not match x ",
               x.shape());
  KUSARI_CHECK(gy.dtype() == x.dtype(), DtypeError, fn, ": gy is ", dtype_name(gy.dtype()), " but x is ",
               dtype_name(x.dtype()));
  const Dtype stat = batch_norm_stat_dtype(x.dtype());
  Array g;
  if (gamma) g = row_vector(fn, *gamma, cols, stat, x, "gamma");
  const Array xc = x.is_contiguous() ? x : x.to_memory_format(MemoryFormat::kContiguous);
  const Array gyc = gy.is_contiguous() ? gy : gy.to_memory_format(MemoryFormat::kContiguous);
  const kernels::RowNormParams p = row_norm_params(xc, cols, eps, rms);
  gx = Array::empty(x.shape(), x.dtype(), x.device());
  if (ggamma) *ggamma = Array::zeros({cols}, stat, x.device());
  if (gbeta) *gbeta = Array::zeros({cols}, stat, x.device());
  if (p.rows == 0) return true;
  if (!kernels::row_norm_backward.try_run(x.device(), xc, gyc, gamma ? &g : nullptr, mean, rstd, p, gx, ggamma,
                                          gbeta)) {
    gx = Array();
    return false;
  }
  return true;
}

}  // namespace kusari::routines
