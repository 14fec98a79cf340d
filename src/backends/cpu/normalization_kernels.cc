// CPU kernels: batch normalization in one reduction and one elementwise pass each way
// (Note [Fused batch normalization]). The data arrays are dense (outer, C, inner) views that the
// routine has checked; sums are taken in float64 whatever the data's dtype.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/common/compute_type.h"
#include "backends/common/dtype_visit.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/loops.h"
#include "kernels/normalization.h"

namespace kusari::cpu {
namespace {

using common::compute_t;
using kernels::BatchNormShape;

/// The statistics' type of element type T: double for double, float otherwise.
template <typename T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
inline double load(const T* p, int64_t i) {
  return static_cast<double>(static_cast<compute_t<T>>(p[i]));
}

template <typename T>
inline void store(T* p, int64_t i, double v) {
  p[i] = static_cast<T>(static_cast<compute_t<T>>(v));
}

// Per-channel sums of f(x, c) and g(x, c) over (outer, inner), in float64; `row` gives the
// elements' values. For inner > 1 each channel is a set of contiguous rows (split by channel);
// for inner == 1 the rows are (outer, C) and are split by row blocks with per-block sums.
template <typename F>
void channel_sums(const BatchNormShape& s, std::vector<double>& a, std::vector<double>& b,
                  F&& term) {
  const int64_t c_count = s.channels;
  a.assign(static_cast<size_t>(c_count), 0.0);
  b.assign(static_cast<size_t>(c_count), 0.0);
  if (s.inner > 1) {
    parallel_for(c_count, s.outer * s.inner * 4, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double sa = 0.0, sb = 0.0;
        for (int64_t o = 0; o < s.outer; ++o) {
          const int64_t base = (o * c_count + c) * s.inner;
          for (int64_t i = 0; i < s.inner; ++i) term(base + i, c, sa, sb);
        }
        a[static_cast<size_t>(c)] = sa;
        b[static_cast<size_t>(c)] = sb;
      }
    });
    return;
  }
  const int chunks = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(max_threads(), s.outer * c_count * 4 / kParallelGrain)));
  std::vector<double> pa(static_cast<size_t>(chunks * c_count), 0.0), pb(pa.size(), 0.0);
  parallel_for(chunks, kParallelGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      double* ra = pa.data() + k * c_count;
      double* rb = pb.data() + k * c_count;
      const int64_t r0 = s.outer * k / chunks, r1 = s.outer * (k + 1) / chunks;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = 0; c < c_count; ++c) term(r * c_count + c, c, ra[c], rb[c]);
      }
    }
  });
  for (int k = 0; k < chunks; ++k) {
    for (int64_t c = 0; c < c_count; ++c) {
      a[static_cast<size_t>(c)] += pa[static_cast<size_t>(k * c_count + c)];
      b[static_cast<size_t>(c)] += pb[static_cast<size_t>(k * c_count + c)];
    }
  }
}

// Runs f(flat index, channel) over every element, in parallel.
template <typename F>
void for_each_element(const BatchNormShape& s, F&& f) {
  const int64_t c_count = s.channels;
  if (s.inner > 1) {
    parallel_for(s.outer * c_count, s.inner * 4, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t c = p % c_count;
        for (int64_t i = p * s.inner, e = i + s.inner; i < e; ++i) f(i, c);
      }
    });
    return;
  }
  parallel_for(s.outer, c_count * 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < c_count; ++c) f(r * c_count + c, c);
    }
  });
}

template <typename T>
void statistics_typed(const Array& x, const BatchNormShape& s,
                      const kernels::BatchNormStatsParams& p, Array& mean, Array& var,
                      Array& inv_std) {
  using S = stat_t<T>;
  const T* xp = x.data<T>();
  const int64_t c_count = s.channels;
  // The shift of each channel: its first element (Note [Fused batch normalization]).
  std::vector<double> shift(static_cast<size_t>(c_count));
  for (int64_t c = 0; c < c_count; ++c) shift[static_cast<size_t>(c)] = load(xp, c * s.inner);
  std::vector<double> s1, s2;
  channel_sums(s, s1, s2, [&](int64_t i, int64_t c, double& a, double& b) {
    const double v = load(xp, i) - shift[static_cast<size_t>(c)];
    a += v;
    b += v * v;
  });
  const double m = static_cast<double>(s.outer * s.inner);
  S* mp = mean.data<S>();
  S* vp = var.data<S>();
  S* ip = inv_std.data<S>();
  S* rm = p.running_mean ? p.running_mean->data<S>() : nullptr;
  S* rv = p.running_var ? p.running_var->data<S>() : nullptr;
  for (int64_t c = 0; c < c_count; ++c) {
    const size_t k = static_cast<size_t>(c);
    const double d = s1[k] / m;
    const double v = std::max(s2[k] / m - d * d, 0.0);
    const double mu = shift[k] + d;
    mp[c] = static_cast<S>(mu);
    vp[c] = static_cast<S>(v);
    ip[c] = static_cast<S>(1.0 / std::sqrt(v + p.eps));
    if (rm) rm[c] = static_cast<S>(p.decay * rm[c] + (1.0 - p.decay) * mu);
    if (rv) rv[c] = static_cast<S>(p.decay * rv[c] + (1.0 - p.decay) * v * p.var_adjust);
  }
}

bool batch_norm_statistics(const Array& x, const BatchNormShape& s,
                           const kernels::BatchNormStatsParams& p, Array& mean, Array& var,
                           Array& inv_std) {
  common::visit_floating_dtype(x.dtype(), "batch_norm_statistics", [&](auto tag) {
    statistics_typed<decltype(tag)>(x, s, p, mean, var, inv_std);
  });
  return true;
}

template <typename T>
void normalize_typed(const Array& x, const BatchNormShape& s, const Array& mean,
                     const Array& inv_std, const Array& gamma, const Array& beta,
                     const Array* residual, bool relu, Array& y) {
  using S = stat_t<T>;
  const int64_t c_count = s.channels;
  // y = (x - mean) * scale + beta with scale = inv_std * gamma, in the statistics' type.
  std::vector<S> scale(static_cast<size_t>(c_count)), mu(scale.size()), shift(scale.size());
  for (int64_t c = 0; c < c_count; ++c) {
    const size_t k = static_cast<size_t>(c);
    scale[k] = inv_std.data<S>()[c] * gamma.data<S>()[c];
    mu[k] = mean.data<S>()[c];
    shift[k] = beta.data<S>()[c];
  }
  const T* xp = x.data<T>();
  const T* rp = residual ? residual->data<T>() : nullptr;
  T* yp = y.data<T>();
  for_each_element(s, [&](int64_t i, int64_t c) {
    const size_t k = static_cast<size_t>(c);
    S v = (static_cast<S>(static_cast<compute_t<T>>(xp[i])) - mu[k]) * scale[k] + shift[k];
    if (rp) v += static_cast<S>(static_cast<compute_t<T>>(rp[i]));
    if (relu) v = v > S(0) ? v : S(0);
    yp[i] = static_cast<T>(static_cast<compute_t<T>>(v));
  });
}

bool batch_norm_normalize(const Array& x, const BatchNormShape& s, const Array& mean,
                          const Array& inv_std, const Array& gamma, const Array& beta,
                          const Array* residual, bool relu, Array& y) {
  common::visit_floating_dtype(x.dtype(), "batch_norm_normalize", [&](auto tag) {
    normalize_typed<decltype(tag)>(x, s, mean, inv_std, gamma, beta, residual, relu, y);
  });
  return true;
}

// The gradient reaching the normalisation: gy, or gy where y > 0 behind a fused relu.
template <typename T>
inline double masked_grad(const T* gy, const T* relu_y, int64_t i) {
  if (relu_y && !(load(relu_y, i) > 0.0)) return 0.0;
  return load(gy, i);
}

template <typename T>
void backward_reduce_typed(const Array& x, const Array& gy, const Array* relu_y,
                           const BatchNormShape& s, const Array& mean, const Array& inv_std,
                           Array& gbeta, Array& ggamma) {
  using S = stat_t<T>;
  const T* xp = x.data<T>();
  const T* gp = gy.data<T>();
  const T* yp = relu_y ? relu_y->data<T>() : nullptr;
  const S* mp = mean.data<S>();
  std::vector<double> sum_g, sum_gx;
  channel_sums(s, sum_g, sum_gx, [&](int64_t i, int64_t c, double& a, double& b) {
    const double g = masked_grad(gp, yp, i);
    a += g;
    b += g * (load(xp, i) - static_cast<double>(mp[c]));
  });
  for (int64_t c = 0; c < s.channels; ++c) {
    const size_t k = static_cast<size_t>(c);
    gbeta.data<S>()[c] = static_cast<S>(sum_g[k]);
    ggamma.data<S>()[c] = static_cast<S>(sum_gx[k] * static_cast<double>(inv_std.data<S>()[c]));
  }
}

bool batch_norm_backward_reduce(const Array& x, const Array& gy, const Array* relu_y,
                                const BatchNormShape& s, const Array& mean, const Array& inv_std,
                                Array& gbeta, Array& ggamma) {
  common::visit_floating_dtype(x.dtype(), "batch_norm_backward_reduce", [&](auto tag) {
    backward_reduce_typed<decltype(tag)>(x, gy, relu_y, s, mean, inv_std, gbeta, ggamma);
  });
  return true;
}

template <typename T>
void backward_data_typed(const Array& x, const Array& gy, const Array* relu_y,
                         const BatchNormShape& s, const Array& mean, const Array& inv_std,
                         const Array& gamma, const Array& gbeta, const Array& ggamma, double inv_m,
                         Array& gx, Array* gm) {
  using S = stat_t<T>;
  const int64_t c_count = s.channels;
  // gx = a * (g - b - (x - mean) * d) per channel.
  std::vector<S> a(static_cast<size_t>(c_count)), b(a.size()), d(a.size()), mu(a.size());
  for (int64_t c = 0; c < c_count; ++c) {
    const size_t k = static_cast<size_t>(c);
    const S istd = inv_std.data<S>()[c];
    a[k] = gamma.data<S>()[c] * istd;
    b[k] = static_cast<S>(gbeta.data<S>()[c] * inv_m);
    d[k] = static_cast<S>(istd * ggamma.data<S>()[c] * inv_m);
    mu[k] = mean.data<S>()[c];
  }
  const T* xp = x.data<T>();
  const T* gp = gy.data<T>();
  const T* yp = relu_y ? relu_y->data<T>() : nullptr;
  T* op = gx.data<T>();
  T* mp = gm ? gm->data<T>() : nullptr;
  for_each_element(s, [&](int64_t i, int64_t c) {
    const size_t k = static_cast<size_t>(c);
    S g = static_cast<S>(static_cast<compute_t<T>>(gp[i]));
    const bool off = yp && !(static_cast<S>(static_cast<compute_t<T>>(yp[i])) > S(0));
    if (off) g = S(0);
    if (mp) mp[i] = off ? static_cast<T>(compute_t<T>(0)) : gp[i];
    const S xc = static_cast<S>(static_cast<compute_t<T>>(xp[i])) - mu[k];
    op[i] = static_cast<T>(static_cast<compute_t<T>>(a[k] * (g - b[k] - xc * d[k])));
  });
}

bool batch_norm_backward_data(const Array& x, const Array& gy, const Array* relu_y,
                              const BatchNormShape& s, const Array& mean, const Array& inv_std,
                              const Array& gamma, const Array& gbeta, const Array& ggamma,
                              double inv_m, Array& gx, Array* gm) {
  common::visit_floating_dtype(x.dtype(), "batch_norm_backward_data", [&](auto tag) {
    backward_data_typed<decltype(tag)>(x, gy, relu_y, s, mean, inv_std, gamma, gbeta, ggamma, inv_m,
                                       gx, gm);
  });
  return true;
}

// --- layer and RMS normalization (Note [Fused layer normalization]) --------------------------

// The row's statistics in float64: mean (0 for rms) and rstd.
template <typename T>
inline void row_statistics(const T* xr, int64_t cols, double eps, bool rms, double& mean, double& rstd) {
  double m = 0.0;
  if (!rms) {
    for (int64_t j = 0; j < cols; ++j) m += load(xr, j);
    m /= static_cast<double>(cols);
  }
  double q = 0.0;
  for (int64_t j = 0; j < cols; ++j) {
    const double d = load(xr, j) - m;
    q += d * d;
  }
  mean = m;
  rstd = 1.0 / std::sqrt(q / static_cast<double>(cols) + eps);
}

template <typename T>
void row_norm_forward_typed(const Array& x, const Array* gamma, const Array* beta,
                            const kernels::RowNormParams& p, Array& y, Array& mean, Array& rstd) {
  using S = stat_t<T>;
  using C = compute_t<T>;
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  const S* gp = gamma ? gamma->data<S>() : nullptr;
  const S* bp = beta ? beta->data<S>() : nullptr;
  S* mp = p.rms ? nullptr : mean.data<S>();
  S* rp = rstd.data<S>();
  const int64_t cols = p.cols;
  parallel_for(p.rows, cols * 6, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = xp + r * cols;
      T* yr = yp + r * cols;
      double m, rs;
      row_statistics(xr, cols, p.eps, p.rms, m, rs);
      if (mp) mp[r] = static_cast<S>(m);
      rp[r] = static_cast<S>(rs);
      const C cm = static_cast<C>(m), cr = static_cast<C>(rs);
      for (int64_t j = 0; j < cols; ++j) {
        C v = (static_cast<C>(xr[j]) - cm) * cr;
        if (gp) v *= static_cast<C>(gp[j]);
        if (bp) v += static_cast<C>(bp[j]);
        yr[j] = static_cast<T>(v);
      }
    }
  });
}

bool row_norm_forward(const Array& x, const Array* gamma, const Array* beta, const kernels::RowNormParams& p,
                      Array& y, Array& mean, Array& rstd) {
  common::visit_floating_dtype(x.dtype(), "row_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    row_norm_forward_typed<T>(x, gamma, beta, p, y, mean, rstd);
  });
  return true;
}

template <typename T>
void row_norm_backward_typed(const Array& x, const Array& gy, const Array* gamma, const Array& mean,
                             const Array& rstd, const kernels::RowNormParams& p, Array& gx, Array* ggamma,
                             Array* gbeta) {
  using S = stat_t<T>;
  const T* xp = x.data<T>();
  const T* gyp = gy.data<T>();
  T* gxp = gx.data<T>();
  const S* gp = gamma ? gamma->data<S>() : nullptr;
  const S* mp = p.rms ? nullptr : mean.data<S>();
  const S* rp = rstd.data<S>();
  const int64_t rows = p.rows, cols = p.cols;
  const bool params = ggamma != nullptr || gbeta != nullptr;
  // Per-chunk sums of the parameters' gradients (float64), merged after the rows.
  const int chunks = params ? static_cast<int>(std::max<int64_t>(
                                  1, std::min<int64_t>(max_threads(), rows * cols * 8 / kParallelGrain)))
                            : 1;
  std::vector<double> pg(params ? static_cast<size_t>(chunks * cols) : 0, 0.0), pb(pg.size(), 0.0);
  const double inv_cols = 1.0 / static_cast<double>(cols);
  auto run_rows = [&](int64_t r0, int64_t r1, double* sg, double* sb) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = xp + r * cols;
      const T* gyr = gyp + r * cols;
      T* gxr = gxp + r * cols;
      const double m = mp ? static_cast<double>(mp[r]) : 0.0, rs = static_cast<double>(rp[r]);
      double sum_g = 0.0, sum_gx = 0.0;
      for (int64_t j = 0; j < cols; ++j) {
        const double xh = (load(xr, j) - m) * rs;
        const double gyv = load(gyr, j);
        const double g = gp ? gyv * static_cast<double>(gp[j]) : gyv;
        sum_g += g;
        sum_gx += g * xh;
        if (sg) sg[j] += gyv * xh;
        if (sb) sb[j] += gyv;
      }
      const double a = p.rms ? 0.0 : sum_g * inv_cols, b = sum_gx * inv_cols;
      for (int64_t j = 0; j < cols; ++j) {
        const double xh = (load(xr, j) - m) * rs;
        const double gyv = load(gyr, j);
        const double g = gp ? gyv * static_cast<double>(gp[j]) : gyv;
        store(gxr, j, rs * (g - a - xh * b));
      }
    }
  };
  if (!params) {
    parallel_for(rows, cols * 10, [&](int64_t r0, int64_t r1) { run_rows(r0, r1, nullptr, nullptr); });
    return;
  }
  parallel_for(chunks, kParallelGrain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      double* sg = ggamma ? pg.data() + k * cols : nullptr;
      double* sb = gbeta ? pb.data() + k * cols : nullptr;
      run_rows(rows * k / chunks, rows * (k + 1) / chunks, sg, sb);
    }
  });
  for (int which = 0; which < 2; ++which) {
    Array* out = which == 0 ? ggamma : gbeta;
    if (out == nullptr) continue;
    const std::vector<double>& part = which == 0 ? pg : pb;
    S* op = out->data<S>();
    for (int64_t j = 0; j < cols; ++j) {
      double v = 0.0;
      for (int k = 0; k < chunks; ++k) v += part[static_cast<size_t>(k * cols + j)];
      op[j] = static_cast<S>(v);
    }
  }
}

bool row_norm_backward(const Array& x, const Array& gy, const Array* gamma, const Array& mean, const Array& rstd,
                       const kernels::RowNormParams& p, Array& gx, Array* ggamma, Array* gbeta) {
  common::visit_floating_dtype(x.dtype(), "row_norm_backward", [&](auto tag) {
    using T = decltype(tag);
    row_norm_backward_typed<T>(x, gy, gamma, mean, rstd, p, gx, ggamma, gbeta);
  });
  return true;
}

}  // namespace

void register_cpu_normalization_kernels() {
  kernels::row_norm_forward.set(DeviceType::kCPU, &row_norm_forward);
  kernels::row_norm_backward.set(DeviceType::kCPU, &row_norm_backward);
  kernels::batch_norm_statistics.set(DeviceType::kCPU, &batch_norm_statistics);
  kernels::batch_norm_normalize.set(DeviceType::kCPU, &batch_norm_normalize);
  kernels::batch_norm_backward_reduce.set(DeviceType::kCPU, &batch_norm_backward_reduce);
  kernels::batch_norm_backward_data.set(DeviceType::kCPU, &batch_norm_backward_data);
}

}  // namespace kusari::cpu
