// CPU kernels: fused optimizer updates, one pass over the parameter, its gradient and its state.
//
// Note [Fused updates]
// An optimizer step written with array routines (m = m + (1 - beta1) * (g - m); ...) reads and
// writes every element several times and allocates a temporary per operation. The fused kernel
// reads p, g and the state once, computes the rule for that element in registers, and writes p
// and the state back: one sweep of memory per step. The rules and the layout of `hyper` are in
// Note [Update rule layouts] (kusari/core/kernels.h). Every array is contiguous, so each rule is
// a plain loop over [begin, end) on restrict-qualified pointers, which the compiler vectorises;
// large tensors are split into contiguous chunks over OpenMP threads with parallel_for.
#include <cmath>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/loops.h"

namespace kusari::cpu {
namespace {

// Rough per-element costs (in "simple elementwise ops") for the parallel threshold.
constexpr int64_t kCostSimple = 2;
constexpr int64_t kCostAdaptive = 8;

template <typename T>
using C = compute_t<T>;

template <typename T>
void sgd(T* __restrict p, const T* __restrict g, int64_t n, const double* hyper) {
  const C<T> lr = static_cast<C<T>>(hyper[0]);
  parallel_for(n, kCostSimple, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      p[i] = static_cast<T>(static_cast<C<T>>(p[i]) - lr * static_cast<C<T>>(g[i]));
    }
  });
}

template <typename T>
void momentum_sgd(T* __restrict p, const T* __restrict g, T* __restrict v, int64_t n,
                  const double* hyper) {
  const C<T> lr = static_cast<C<T>>(hyper[0]);
  const C<T> momentum = static_cast<C<T>>(hyper[1]);
  parallel_for(n, kCostSimple, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      v[i] = static_cast<T>(momentum * static_cast<C<T>>(v[i]) - lr * static_cast<C<T>>(g[i]));
      p[i] = static_cast<T>(static_cast<C<T>>(p[i]) + static_cast<C<T>>(v[i]));
    }
  });
}

template <typename T>
void nesterov(T* __restrict p, const T* __restrict g, T* __restrict v, int64_t n,
              const double* hyper) {
  const C<T> lr = static_cast<C<T>>(hyper[0]);
  const C<T> momentum = static_cast<C<T>>(hyper[1]);
  const C<T> momentum_sq = static_cast<C<T>>(hyper[1] * hyper[1]);
  const C<T> grad_coef = static_cast<C<T>>((1.0 + hyper[1]) * hyper[0]);
  parallel_for(n, kCostSimple, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const C<T> gi = static_cast<C<T>>(g[i]);
      v[i] = static_cast<T>(momentum * static_cast<C<T>>(v[i]) - lr * gi);
      p[i] = static_cast<T>(static_cast<C<T>>(p[i]) +
                            (momentum_sq * static_cast<C<T>>(v[i]) - grad_coef * gi));
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
          T* __restrict vhat, int64_t n, const double* hyper) {
  const C<T> alpha_t = static_cast<C<T>>(hyper[0]);
  const C<T> one_minus_beta1 = static_cast<C<T>>(1.0 - hyper[1]);
  const C<T> one_minus_beta2 = static_cast<C<T>>(1.0 - hyper[2]);
  const C<T> eps = static_cast<C<T>>(hyper[3]);
  const C<T> eta = static_cast<C<T>>(hyper[4]);
  const C<T> weight_decay_rate = static_cast<C<T>>(hyper[5]);
  parallel_for(n, kCostAdaptive, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const C<T> gi = static_cast<C<T>>(g[i]);
      C<T> mi = static_cast<C<T>>(m[i]);
      C<T> vi = static_cast<C<T>>(v[i]);
      mi += one_minus_beta1 * (gi - mi);
      vi += one_minus_beta2 * (gi * gi - vi);
      m[i] = static_cast<T>(mi);
      v[i] = static_cast<T>(vi);
      // Read back the stored moments: with 16-bit states the step uses the rounded values, the
      // ones the next step will see (as Chainer's kernels do); a no-op for float and double.
      mi = static_cast<C<T>>(m[i]);
      vi = static_cast<C<T>>(v[i]);
      if (vhat) {
        const C<T> vh = static_cast<C<T>>(vhat[i]);
        vhat[i] = static_cast<T>(nan_max(vh, vi));
        vi = static_cast<C<T>>(vhat[i]);
      }
      const C<T> pi = static_cast<C<T>>(p[i]);
      p[i] = static_cast<T>(pi -
                            eta * (alpha_t * mi / (std::sqrt(vi) + eps) + weight_decay_rate * pi));
    }
  });
}

template <typename T>
void rmsprop(T* __restrict p, const T* __restrict g, T* __restrict ms, int64_t n,
             const double* hyper) {
  const C<T> lr = static_cast<C<T>>(hyper[0]);
  const C<T> alpha = static_cast<C<T>>(hyper[1]);
  const C<T> one_minus_alpha = static_cast<C<T>>(1.0 - hyper[1]);
  const C<T> eps = static_cast<C<T>>(hyper[2]);
  const bool eps_inside_sqrt = hyper[3] != 0.0;
  parallel_for(n, kCostAdaptive, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const C<T> gi = static_cast<C<T>>(g[i]);
      ms[i] = static_cast<T>(alpha * static_cast<C<T>>(ms[i]) + one_minus_alpha * gi * gi);
      const C<T> msi = static_cast<C<T>>(ms[i]);
      const C<T> denom = eps_inside_sqrt ? std::sqrt(msi + eps) : std::sqrt(msi) + eps;
      p[i] = static_cast<T>(static_cast<C<T>>(p[i]) - lr * gi / denom);
    }
  });
}

template <typename T>
void adagrad(T* __restrict p, const T* __restrict g, T* __restrict h, int64_t n,
             const double* hyper) {
  const C<T> lr = static_cast<C<T>>(hyper[0]);
  const C<T> eps = static_cast<C<T>>(hyper[1]);
  parallel_for(n, kCostAdaptive, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const C<T> gi = static_cast<C<T>>(g[i]);
      h[i] = static_cast<T>(static_cast<C<T>>(h[i]) + gi * gi);
      const C<T> hi = static_cast<C<T>>(h[i]);
      p[i] = static_cast<T>(static_cast<C<T>>(p[i]) - lr * gi / (std::sqrt(hi) + eps));
    }
  });
}

/// How many hyperparameters and state arrays `rule` takes (Adam's state count depends on amsgrad).
void expected_counts(UpdateRule rule, const double* hyper, int n_hyper, int& hypers, int& states) {
  switch (rule) {
    case UpdateRule::kSgd:
      hypers = 1, states = 0;
      return;
    case UpdateRule::kMomentumSgd:
      hypers = 2, states = 1;
      return;
    case UpdateRule::kNesterov:
      hypers = 2, states = 1;
      return;
    case UpdateRule::kAdam:
      hypers = 7, states = (n_hyper >= 7 && hyper[6] != 0.0) ? 3 : 2;
      return;
    case UpdateRule::kRmsprop:
      hypers = 4, states = 1;
      return;
    case UpdateRule::kAdaGrad:
      hypers = 2, states = 1;
      return;
  }
  hypers = -1, states = -1;
}

template <typename T>
void update_typed(UpdateRule rule, Array& param, const Array& grad, Array* state,
                  const double* hyper) {
  T* p = static_cast<T*>(param.raw_data());
  const T* g = static_cast<const T*>(grad.raw_data());
  auto st = [&](int k) { return static_cast<T*>(state[k].raw_data()); };
  const int64_t n = param.size();
  switch (rule) {
    case UpdateRule::kSgd:
      return sgd(p, g, n, hyper);
    case UpdateRule::kMomentumSgd:
      return momentum_sgd(p, g, st(0), n, hyper);
    case UpdateRule::kNesterov:
      return nesterov(p, g, st(0), n, hyper);
    case UpdateRule::kAdam:
      return adam(p, g, st(0), st(1), hyper[6] != 0.0 ? st(2) : nullptr, n, hyper);
    case UpdateRule::kRmsprop:
      return rmsprop(p, g, st(0), n, hyper);
    case UpdateRule::kAdaGrad:
      return adagrad(p, g, st(0), n, hyper);
  }
  KUSARI_ASSERT(false, "update_parameter: unknown update rule ", static_cast<int>(rule));
}

void update_parameter(UpdateRule rule, Array& param, const Array& grad, Array* state, int n_state,
                      const double* hyper, int n_hyper) {
  // The routine (kusari::update_parameter) has checked all of this; a failure is our bug.
  int want_hypers = 0, want_states = 0;
  expected_counts(rule, hyper, n_hyper, want_hypers, want_states);
  KUSARI_ASSERT(n_hyper == want_hypers && n_state == want_states, "update_parameter: rule ",
                static_cast<int>(rule), " got ", n_hyper, " hyperparameters and ", n_state,
                " states, expected ", want_hypers, " and ", want_states);
  KUSARI_ASSERT(param.is_contiguous() && grad.is_contiguous(), "update_parameter: param ",
                param.shape(), " and grad ", grad.shape(), " must be contiguous");
  KUSARI_ASSERT(grad.dtype() == param.dtype() && grad.size() == param.size(),
                "update_parameter: grad does not match the parameter");
  for (int k = 0; k < n_state; ++k) {
    KUSARI_ASSERT(state[k].is_contiguous() && state[k].dtype() == param.dtype() &&
                      state[k].size() == param.size(),
                  "update_parameter: state array ", k, " (", state[k].shape(), ", ",
                  dtype_name(state[k].dtype()), ") does not match the contiguous parameter ",
                  param.shape(), " of ", dtype_name(param.dtype()));
  }
  if (param.size() == 0) return;
  switch (param.dtype()) {
    case Dtype::kFloat16:
      return update_typed<Half>(rule, param, grad, state, hyper);
    case Dtype::kBFloat16:
      return update_typed<BFloat16>(rule, param, grad, state, hyper);
    case Dtype::kFloat32:
      return update_typed<float>(rule, param, grad, state, hyper);
    case Dtype::kFloat64:
      return update_typed<double>(rule, param, grad, state, hyper);
    default:
      KUSARI_THROW(DtypeError, "update_parameter: parameters must be floating point, got ",
                   dtype_name(param.dtype()));
  }
}

}  // namespace

void register_update_kernels(KernelTable& table) {
  table.update_parameter = &update_parameter;
}

}  // namespace kusari::cpu
