// CPU kernels: fused optimizer updates, one pass over the parameter, its gradient and its state.
//
// Note [Fused updates]
// An optimizer step written with array routines (m = m + (1 - beta1) * (g - m); ...) reads and
// writes every element several times and allocates a temporary per operation. The fused kernel
// reads p, g and the state once, computes the rule for that element in registers, and writes p
// and the state back: one sweep of memory per step. The rules and their parameter structs are in
// Note [Update rule layouts] (src/kernels/update.h). Every array is contiguous, so each rule is
// a plain loop over [begin, end) on restrict-qualified pointers, which the compiler vectorises;
// large tensors are split into contiguous chunks over OpenMP threads with parallel_for.
#include <cmath>
#include <type_traits>

#include "backends/cpu/cpu_backend.h"
#include "kernels/update.h"
#include "backends/cpu/loops.h"

namespace kusari::cpu {
namespace {

// Rough per-element costs (in "simple elementwise ops") for the parallel threshold.
constexpr int64_t kCostSimple = 2;
constexpr int64_t kCostAdaptive = 8;

template <typename T>
using C = compute_t<T>;

template <typename T>
void sgd(T* __restrict p, const T* __restrict g, int64_t n, const kernels::SgdParams& h) {
  const C<T> lr = static_cast<C<T>>(h.lr);
  parallel_for(n, kCostSimple, [=](int64_t b, int64_t e) {
    auto* __restrict p_ = p;
    auto* __restrict g_ = g;
    const auto lr_ = lr;
    for (int64_t i = b; i < e; ++i) {
      p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) - lr_ * static_cast<C<T>>(g_[i]));
    }
  });
}

template <typename T>
void momentum_sgd(T* __restrict p, const T* __restrict g, T* __restrict v, int64_t n,
                  const kernels::MomentumSgdParams& h) {
  const C<T> lr = static_cast<C<T>>(h.lr);
  const C<T> momentum = static_cast<C<T>>(h.momentum);
  parallel_for(n, kCostSimple, [=](int64_t b, int64_t e) {
    auto* __restrict p_ = p;
    auto* __restrict g_ = g;
    auto* __restrict v_ = v;
    const auto lr_ = lr;
    const auto momentum_ = momentum;
    for (int64_t i = b; i < e; ++i) {
      v_[i] = static_cast<T>(momentum_ * static_cast<C<T>>(v_[i]) - lr_ * static_cast<C<T>>(g_[i]));
      p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) + static_cast<C<T>>(v_[i]));
    }
  });
}

template <typename T>
void nesterov(T* __restrict p, const T* __restrict g, T* __restrict v, int64_t n,
              const kernels::NesterovParams& h) {
  const C<T> lr = static_cast<C<T>>(h.lr);
  const C<T> momentum = static_cast<C<T>>(h.momentum);
  const C<T> momentum_sq = static_cast<C<T>>(h.momentum * h.momentum);
  const C<T> grad_coef = static_cast<C<T>>((1.0 + h.momentum) * h.lr);
  parallel_for(n, kCostSimple, [=](int64_t b, int64_t e) {
    auto* __restrict p_ = p;
    auto* __restrict g_ = g;
    auto* __restrict v_ = v;
    const auto lr_ = lr;
    const auto momentum_ = momentum;
    const auto momentum_sq_ = momentum_sq;
    const auto grad_coef_ = grad_coef;
    for (int64_t i = b; i < e; ++i) {
      const C<T> gi = static_cast<C<T>>(g_[i]);
      v_[i] = static_cast<T>(momentum_ * static_cast<C<T>>(v_[i]) - lr_ * gi);
      p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) +
                            (momentum_sq_ * static_cast<C<T>>(v_[i]) - grad_coef_ * gi));
    }
  });
}

/// max(a, b) that propagates a NaN in either operand (numpy.maximum's behaviour).
template <typename F>
F nan_max(F a, F b) {
  return (b != b || b > a) ? b : a;
}

template <typename T>
void adam(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
          T* __restrict vhat, int64_t n, const kernels::AdamParams& h) {
  const C<T> alpha_t = static_cast<C<T>>(h.alpha_t);
  const C<T> one_minus_beta1 = static_cast<C<T>>(1.0 - h.beta1);
  const C<T> one_minus_beta2 = static_cast<C<T>>(1.0 - h.beta2);
  const C<T> eps = static_cast<C<T>>(h.eps);
  const C<T> eta = static_cast<C<T>>(h.eta);
  const C<T> weight_decay_rate = static_cast<C<T>>(h.weight_decay_rate);
  // The AMSGrad branch is hoisted out of the loop, and the loop works on local copies of the
  // pointers (restrict) and constants, so that the common case vectorises.
  auto step = [=](auto with_vhat) {
    parallel_for(n, kCostAdaptive, [=](int64_t b, int64_t e) {
      T* __restrict pp = p;
      const T* __restrict gp = g;
      T* __restrict mp = m;
      T* __restrict vp = v;
      T* __restrict hp = vhat;
      const C<T> a = alpha_t, b1 = one_minus_beta1, b2 = one_minus_beta2, ep = eps, et = eta,
                 wd = weight_decay_rate;
      for (int64_t i = b; i < e; ++i) {
        const C<T> gi = static_cast<C<T>>(gp[i]);
        C<T> mi = static_cast<C<T>>(mp[i]);
        C<T> vi = static_cast<C<T>>(vp[i]);
        mi += b1 * (gi - mi);
        vi += b2 * (gi * gi - vi);
        mp[i] = static_cast<T>(mi);
        vp[i] = static_cast<T>(vi);
        // Read back the stored moments: with 16-bit states the step uses the rounded values, the
        // ones the next step will see (as Chainer's kernels do); a no-op for float and double.
        mi = static_cast<C<T>>(mp[i]);
        vi = static_cast<C<T>>(vp[i]);
        if constexpr (decltype(with_vhat)::value) {
          const C<T> vh = static_cast<C<T>>(hp[i]);
          hp[i] = static_cast<T>(nan_max(vh, vi));
          vi = static_cast<C<T>>(hp[i]);
        }
        const C<T> pi = static_cast<C<T>>(pp[i]);
        pp[i] = static_cast<T>(pi - et * (a * mi / (std::sqrt(vi) + ep) + wd * pi));
      }
    });
  };
  if (vhat) {
    step(std::true_type{});
  } else {
    step(std::false_type{});
  }
}

template <typename T>
void rmsprop(T* __restrict p, const T* __restrict g, T* __restrict ms, int64_t n,
             const kernels::RmspropParams& h) {
  const C<T> lr = static_cast<C<T>>(h.lr);
  const C<T> alpha = static_cast<C<T>>(h.alpha);
  const C<T> one_minus_alpha = static_cast<C<T>>(1.0 - h.alpha);
  const C<T> eps = static_cast<C<T>>(h.eps);
  const bool eps_inside_sqrt = h.eps_inside_sqrt;
  parallel_for(n, kCostAdaptive, [=](int64_t b, int64_t e) {
    auto* __restrict p_ = p;
    auto* __restrict g_ = g;
    auto* __restrict ms_ = ms;
    const auto lr_ = lr;
    const auto alpha_ = alpha;
    const auto one_minus_alpha_ = one_minus_alpha;
    const auto eps_ = eps;
    const auto eps_inside_sqrt_ = eps_inside_sqrt;
    for (int64_t i = b; i < e; ++i) {
      const C<T> gi = static_cast<C<T>>(g_[i]);
      ms_[i] = static_cast<T>(alpha_ * static_cast<C<T>>(ms_[i]) + one_minus_alpha_ * gi * gi);
      const C<T> msi = static_cast<C<T>>(ms_[i]);
      const C<T> denom = eps_inside_sqrt_ ? std::sqrt(msi + eps_) : std::sqrt(msi) + eps_;
      p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) - lr_ * gi / denom);
    }
  });
}

template <typename T>
void adagrad(T* __restrict p, const T* __restrict g, T* __restrict h, int64_t n,
             const kernels::AdaGradParams& hp) {
  const C<T> lr = static_cast<C<T>>(hp.lr);
  const C<T> eps = static_cast<C<T>>(hp.eps);
  parallel_for(n, kCostAdaptive, [=](int64_t b, int64_t e) {
    auto* __restrict p_ = p;
    auto* __restrict g_ = g;
    auto* __restrict h_ = h;
    const auto lr_ = lr;
    const auto eps_ = eps;
    for (int64_t i = b; i < e; ++i) {
      const C<T> gi = static_cast<C<T>>(g_[i]);
      h_[i] = static_cast<T>(static_cast<C<T>>(h_[i]) + gi * gi);
      const C<T> hi = static_cast<C<T>>(h_[i]);
      p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) - lr_ * gi / (std::sqrt(hi) + eps_));
    }
  });
}

template <typename T>
void update_typed(Array& param, const Array& grad, Array* state, const kernels::UpdateParams& params) {
  T* p = static_cast<T*>(param.raw_data());
  const T* g = static_cast<const T*>(grad.raw_data());
  auto st = [&](int k) { return static_cast<T*>(state[k].raw_data()); };
  const int64_t n = param.size();
  if (const auto* h = std::get_if<kernels::SgdParams>(&params)) return sgd(p, g, n, *h);
  if (const auto* h = std::get_if<kernels::MomentumSgdParams>(&params)) return momentum_sgd(p, g, st(0), n, *h);
  if (const auto* h = std::get_if<kernels::NesterovParams>(&params)) return nesterov(p, g, st(0), n, *h);
  if (const auto* h = std::get_if<kernels::AdamParams>(&params)) {
    return adam(p, g, st(0), st(1), h->amsgrad ? st(2) : nullptr, n, *h);
  }
  if (const auto* h = std::get_if<kernels::RmspropParams>(&params)) return rmsprop(p, g, st(0), n, *h);
  if (const auto* h = std::get_if<kernels::AdaGradParams>(&params)) return adagrad(p, g, st(0), n, *h);
  KUSARI_ASSERT(false, "update_parameter: unknown update rule ", params.index());
}

void update_parameter(Array& param, const Array& grad, Array* state, int n_state,
                      const kernels::UpdateParams& params, const Array* skip) {
  // kusari::update_parameter (the routine) checked the counts, shapes, dtypes and layout.
  if (param.size() == 0) return;
  if (skip && *static_cast<const int64_t*>(skip->raw_data()) != 0) return;
  switch (param.dtype()) {
    case Dtype::kFloat16:
      return update_typed<Half>(param, grad, state, params);
    case Dtype::kBFloat16:
      return update_typed<BFloat16>(param, grad, state, params);
    case Dtype::kFloat32:
      return update_typed<float>(param, grad, state, params);
    case Dtype::kFloat64:
      return update_typed<double>(param, grad, state, params);
    default:
      KUSARI_THROW(DtypeError, "update_parameter: parameters must be floating point, got ",
                   dtype_name(param.dtype()));
  }
}

void count_nonfinite(const Array* arrays, int n, Array& out) {
  int64_t bad = 0;
  for (int k = 0; k < n; ++k) {
    const Array& a = arrays[k];
    common::visit_floating_dtype(a.dtype(), "count_nonfinite", [&](auto tag) {
      using T = decltype(tag);
      const T* p = static_cast<const T*>(a.raw_data());
      const int64_t m = a.size();
      int64_t here = 0;
      for (int64_t i = 0; i < m; ++i) here += std::isfinite(static_cast<C<T>>(p[i])) ? 0 : 1;
      bad += here;
    });
  }
  *static_cast<int64_t*>(out.raw_data()) = bad;
}

}  // namespace

void register_cpu_update_kernels() {
  kernels::update_parameter.set(DeviceType::kCPU, &update_parameter);
  kernels::count_nonfinite.set(DeviceType::kCPU, &count_nonfinite);
}

}  // namespace kusari::cpu
