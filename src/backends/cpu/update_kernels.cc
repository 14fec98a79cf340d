// CPU kernels: fused optimizer updates, one pass over the parameter, its gradient and its state.
//
// Note [Fused updates]
// An optimizer step written with array routines (m = m + (1 - beta1) * (g - m); ...) reads and
// writes every element several times and allocates a temporary per operation. The fused kernel
// reads p, g and the state once, computes the rule for that element in registers, and writes p
// and the state back: one sweep of memory per step. The rules and their parameter structs are in
// Note [Update rule layouts] (src/kernels/update.h). Every array is contiguous, so each rule is
// a plain loop over [begin, end) on restrict-qualified pointers, which the compiler vectorises;
// large tensors are split into contiguous chunks over OpenMP threads with parallel_for. The
// multi-tensor kernel runs the same range functions over chunks of many tensors at once (Note
// [Multi-tensor chunks on the CPU]).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/loops.h"
#include "kernels/update.h"

namespace kusari::cpu {
namespace {

// Rough per-element costs (in "simple elementwise ops") for the parallel threshold.
constexpr int64_t kCostSimple = 2;
constexpr int64_t kCostAdaptive = 8;

// Note [Multi-tensor chunks on the CPU]
// update_parameters splits every tensor into chunks of kChunk elements (the last one shorter)
// and hands the chunks of all tensors to parallel_for as one range, so that a model of many
// small parameters keeps every thread busy in one parallel region instead of one region (or one
// serial loop) per parameter. A chunk runs the same range function (step_range) as the
// per-parameter kernel, on the same pointers: each element is computed by the same code in the
// same order whichever path runs it, so the two agree bit for bit.
constexpr int64_t kChunk = 4096;

template <typename T>
using C = compute_t<T>;

/// The arrays of one tensor's step (state pointers beyond the rule's count are null).
template <typename T>
struct Pointers {
  T* p;
  const T* g;
  T* s0;
  T* s1;
  T* s2;
};

template <typename T>
void sgd(const Pointers<T>& x, int64_t b, int64_t e, const kernels::SgdParams& h) {
  T* __restrict p_ = x.p;
  const T* __restrict g_ = x.g;
  const C<T> lr_ = static_cast<C<T>>(h.lr);
  for (int64_t i = b; i < e; ++i) {
    p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) - lr_ * static_cast<C<T>>(g_[i]));
  }
}

template <typename T>
void momentum_sgd(const Pointers<T>& x, int64_t b, int64_t e, const kernels::MomentumSgdParams& h) {
  T* __restrict p_ = x.p;
  const T* __restrict g_ = x.g;
  T* __restrict v_ = x.s0;
  const C<T> lr_ = static_cast<C<T>>(h.lr);
  const C<T> momentum_ = static_cast<C<T>>(h.momentum);
  for (int64_t i = b; i < e; ++i) {
    v_[i] = static_cast<T>(momentum_ * static_cast<C<T>>(v_[i]) - lr_ * static_cast<C<T>>(g_[i]));
    p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) + static_cast<C<T>>(v_[i]));
  }
}

template <typename T>
void nesterov(const Pointers<T>& x, int64_t b, int64_t e, const kernels::NesterovParams& h) {
  T* __restrict p_ = x.p;
  const T* __restrict g_ = x.g;
  T* __restrict v_ = x.s0;
  const C<T> lr_ = static_cast<C<T>>(h.lr);
  const C<T> momentum_ = static_cast<C<T>>(h.momentum);
  const C<T> momentum_sq_ = static_cast<C<T>>(h.momentum * h.momentum);
  const C<T> grad_coef_ = static_cast<C<T>>((1.0 + h.momentum) * h.lr);
  for (int64_t i = b; i < e; ++i) {
    const C<T> gi = static_cast<C<T>>(g_[i]);
    v_[i] = static_cast<T>(momentum_ * static_cast<C<T>>(v_[i]) - lr_ * gi);
    p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) +
                           (momentum_sq_ * static_cast<C<T>>(v_[i]) - grad_coef_ * gi));
  }
}

/// max(a, b) that propagates a NaN in either operand (numpy.maximum's behaviour).
template <typename F>
F nan_max(F a, F b) {
  return (b != b || b > a) ? b : a;
}

template <typename T, bool kWithVhat>
void adam_loop(const Pointers<T>& x, int64_t b, int64_t e, const kernels::AdamParams& h) {
  // The loop works on local copies of the pointers (restrict) and constants, and the AMSGrad
  // branch is a template argument, so that the common case vectorises.
  T* __restrict pp = x.p;
  const T* __restrict gp = x.g;
  T* __restrict mp = x.s0;
  T* __restrict vp = x.s1;
  T* __restrict hp = x.s2;
  const C<T> a = static_cast<C<T>>(h.alpha_t);
  const C<T> b1 = static_cast<C<T>>(1.0 - h.beta1);
  const C<T> b2 = static_cast<C<T>>(1.0 - h.beta2);
  const C<T> ep = static_cast<C<T>>(h.eps);
  const C<T> et = static_cast<C<T>>(h.eta);
  const C<T> wd = static_cast<C<T>>(h.weight_decay_rate);
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
    if constexpr (kWithVhat) {
      const C<T> vh = static_cast<C<T>>(hp[i]);
      hp[i] = static_cast<T>(nan_max(vh, vi));
      vi = static_cast<C<T>>(hp[i]);
    }
    const C<T> pi = static_cast<C<T>>(pp[i]);
    pp[i] = static_cast<T>(pi - et * (a * mi / (std::sqrt(vi) + ep) + wd * pi));
  }
}

template <typename T>
void adam(const Pointers<T>& x, int64_t b, int64_t e, const kernels::AdamParams& h) {
  if (h.amsgrad) {
    adam_loop<T, true>(x, b, e, h);
  } else {
    adam_loop<T, false>(x, b, e, h);
  }
}

template <typename T>
void rmsprop(const Pointers<T>& x, int64_t b, int64_t e, const kernels::RmspropParams& h) {
  T* __restrict p_ = x.p;
  const T* __restrict g_ = x.g;
  T* __restrict ms_ = x.s0;
  const C<T> lr_ = static_cast<C<T>>(h.lr);
  const C<T> alpha_ = static_cast<C<T>>(h.alpha);
  const C<T> one_minus_alpha_ = static_cast<C<T>>(1.0 - h.alpha);
  const C<T> eps_ = static_cast<C<T>>(h.eps);
  const bool eps_inside_sqrt_ = h.eps_inside_sqrt;
  for (int64_t i = b; i < e; ++i) {
    const C<T> gi = static_cast<C<T>>(g_[i]);
    ms_[i] = static_cast<T>(alpha_ * static_cast<C<T>>(ms_[i]) + one_minus_alpha_ * gi * gi);
    const C<T> msi = static_cast<C<T>>(ms_[i]);
    const C<T> denom = eps_inside_sqrt_ ? std::sqrt(msi + eps_) : std::sqrt(msi) + eps_;
    p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) - lr_ * gi / denom);
  }
}

template <typename T>
void adagrad(const Pointers<T>& x, int64_t b, int64_t e, const kernels::AdaGradParams& hp) {
  T* __restrict p_ = x.p;
  const T* __restrict g_ = x.g;
  T* __restrict h_ = x.s0;
  const C<T> lr_ = static_cast<C<T>>(hp.lr);
  const C<T> eps_ = static_cast<C<T>>(hp.eps);
  for (int64_t i = b; i < e; ++i) {
    const C<T> gi = static_cast<C<T>>(g_[i]);
    h_[i] = static_cast<T>(static_cast<C<T>>(h_[i]) + gi * gi);
    const C<T> hi = static_cast<C<T>>(h_[i]);
    p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) - lr_ * gi / (std::sqrt(hi) + eps_));
  }
}

template <typename T>
void rmsprop_warmup(const Pointers<T>& x, int64_t b, int64_t e,
                    const kernels::RmspropWarmupParams& h) {
  T* __restrict p_ = x.p;
  const T* __restrict g_ = x.g;
  T* __restrict ms_ = x.s0;
  T* __restrict v_ = x.s1;
  const C<T> sgd_lr_ = static_cast<C<T>>(h.sgd_lr);
  const C<T> rmsprop_lr_ = static_cast<C<T>>(h.rmsprop_lr);
  const C<T> momentum_ = static_cast<C<T>>(h.momentum);
  const C<T> alpha_ = static_cast<C<T>>(h.alpha);
  const C<T> one_minus_alpha_ = static_cast<C<T>>(1.0 - h.alpha);
  const C<T> eps_ = static_cast<C<T>>(h.eps);
  for (int64_t i = b; i < e; ++i) {
    const C<T> gi = static_cast<C<T>>(g_[i]);
    ms_[i] = static_cast<T>(alpha_ * static_cast<C<T>>(ms_[i]) + one_minus_alpha_ * gi * gi);
    const C<T> msi = static_cast<C<T>>(ms_[i]);
    const C<T> rate = sgd_lr_ + rmsprop_lr_ / (std::sqrt(msi) + eps_);
    v_[i] = static_cast<T>(momentum_ * static_cast<C<T>>(v_[i]) - rate * gi);
    p_[i] = static_cast<T>(static_cast<C<T>>(p_[i]) + static_cast<C<T>>(v_[i]));
  }
}

/// One step of the rule on elements [b, e) of one tensor: the code both kernels run.
template <typename T>
void step_range(const Pointers<T>& x, int64_t b, int64_t e, const kernels::UpdateParams& params) {
  std::visit(
      [&](const auto& h) {
        using H = std::decay_t<decltype(h)>;
        if constexpr (std::is_same_v<H, kernels::SgdParams>) {
          sgd(x, b, e, h);
        } else if constexpr (std::is_same_v<H, kernels::MomentumSgdParams>) {
          momentum_sgd(x, b, e, h);
        } else if constexpr (std::is_same_v<H, kernels::NesterovParams>) {
          nesterov(x, b, e, h);
        } else if constexpr (std::is_same_v<H, kernels::AdamParams>) {
          adam(x, b, e, h);
        } else if constexpr (std::is_same_v<H, kernels::RmspropParams>) {
          rmsprop(x, b, e, h);
        } else if constexpr (std::is_same_v<H, kernels::AdaGradParams>) {
          adagrad(x, b, e, h);
        } else {
          static_assert(std::is_same_v<H, kernels::RmspropWarmupParams>);
          rmsprop_warmup(x, b, e, h);
        }
      },
      params);
}

int64_t rule_cost(const kernels::UpdateParams& params) {
  switch (kernels::update_rule(params)) {
    case UpdateRule::kSgd:
    case UpdateRule::kMomentumSgd:
    case UpdateRule::kNesterov:
      return kCostSimple;
    default:
      return kCostAdaptive;
  }
}

template <typename T>
Pointers<T> pointers(Array& param, const Array& grad, Array* state, int n_state) {
  auto st = [&](int k) { return k < n_state ? static_cast<T*>(state[k].raw_data()) : nullptr; };
  return {static_cast<T*>(param.raw_data()), static_cast<const T*>(grad.raw_data()), st(0), st(1),
          st(2)};
}

template <typename F>
void visit_update_dtype(Dtype dtype, const char* fn, F f) {
  switch (dtype) {
    case Dtype::kFloat16:
      return f(Half{});
    case Dtype::kBFloat16:
      return f(BFloat16{});
    case Dtype::kFloat32:
      return f(float{});
    case Dtype::kFloat64:
      return f(double{});
    default:
      KUSARI_THROW(DtypeError, fn, ": parameters must be floating point, got ", dtype_name(dtype));
  }
}

void update_parameter(Array& param, const Array& grad, Array* state, int n_state,
                      const kernels::UpdateParams& params, const Array* skip) {
  // kusari::update_parameter (the routine) checked the counts, shapes, dtypes and layout.
  const int64_t n = param.size();
  if (n == 0) return;
  if (skip && *static_cast<const int64_t*>(skip->raw_data()) != 0) return;
  visit_update_dtype(param.dtype(), "update_parameter", [&](auto tag) {
    using T = decltype(tag);
    const Pointers<T> x = pointers<T>(param, grad, state, n_state);
    parallel_for(n, rule_cost(params), [&](int64_t b, int64_t e) { step_range(x, b, e, params); });
  });
}

void update_parameters(Array* param, const Array* grad, Array* state, int n_tensors, int n_state,
                       const kernels::UpdateParams& params, const Array* skip) {
  // kusari::update_parameters (the routine) checked every tensor as update_parameter does.
  if (n_tensors == 0) return;
  if (skip && *static_cast<const int64_t*>(skip->raw_data()) != 0) return;
  visit_update_dtype(param[0].dtype(), "update_parameters", [&](auto tag) {
    using T = decltype(tag);
    // chunk_end[k]: the number of chunks of tensors 0..k (Note [Multi-tensor chunks on the CPU]).
    std::vector<Pointers<T>> x(n_tensors);
    std::vector<int64_t> size(n_tensors), chunk_end(n_tensors);
    int64_t chunks = 0;
    for (int k = 0; k < n_tensors; ++k) {
      x[k] = pointers<T>(param[k], grad[k], state + static_cast<ptrdiff_t>(k) * n_state, n_state);
      size[k] = param[k].size();
      chunks += (size[k] + kChunk - 1) / kChunk;
      chunk_end[k] = chunks;
    }
    parallel_for(chunks, rule_cost(params) * kChunk, [&](int64_t cb, int64_t ce) {
      // The tensor holding chunk cb, then walk forward chunk by chunk.
      int k = static_cast<int>(std::upper_bound(chunk_end.begin(), chunk_end.end(), cb) -
                               chunk_end.begin());
      for (int64_t c = cb; c < ce; ++c) {
        while (chunk_end[k] <= c) ++k;
        const int64_t first = k == 0 ? 0 : chunk_end[k - 1];
        const int64_t b = (c - first) * kChunk;
        step_range(x[k], b, std::min(b + kChunk, size[k]), params);
      }
    });
  });
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
  kernels::update_parameters.set(DeviceType::kCPU, &update_parameters);
  kernels::count_nonfinite.set(DeviceType::kCPU, &count_nonfinite);
}

}  // namespace kusari::cpu
