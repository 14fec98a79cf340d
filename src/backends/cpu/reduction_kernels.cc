// CPU kernels: reductions over axes, arg-reductions and softmax.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "kernels/reduction.h"
#include "backends/cpu/loops.h"

namespace kusari::cpu {
namespace {

// Note [CPU reductions]
// The output, in keepdims form, is broadcast back to x's shape (stride 0 along reduced axes) and
// x is walked in memory order, so each row either folds into one accumulator (the inner axis is
// reduced) or updates a row of accumulators (it is kept). Sums and products accumulate in double
// (int64 for integers) in a scratch buffer, then are rounded once into the output's dtype.
// Rows are split over threads only along an outer axis that the output keeps, so no two threads
// write the same accumulator.

template <typename Acc, typename T, typename Fold>
void reduce_into(const Array& x, const Shape& out_shape, Acc init, Fold fold, std::vector<Acc>& acc) {
  const int64_t out_size = out_shape.numel();
  acc.assign(static_cast<size_t>(out_size), init);
  // A contiguous accumulator view of out's shape, broadcast to x's shape.
  std::shared_ptr<void> holder(acc.data(), [](void*) {});
  Array acc_view = Array::from_blob(holder, acc.data(), out_shape, dtype_of<Acc>);
  Strides bstrides = acc_view.strides();
  for (int d = 0; d < x.ndim(); ++d) {
    if (out_shape[d] == 1 && x.shape()[d] != 1) bstrides[d] = 0;
  }
  Array acc_b = acc_view.as_strided(x.shape(), bstrides, 0);
  StridedLoop<2> loop(x.shape(), {&acc_b, &x}, /*order_by_output=*/false);
  // Parallel only if the outermost loop axis is kept (non-zero accumulator stride).
  const bool parallel = loop.ndim() > 1 && loop.stride(0, 0) != 0;
  loop.run(
      [&](char** p, int64_t n, const int64_t* s) {
        const char* xp = p[1];
        if (s[0] == 0) {
          Acc a = *reinterpret_cast<Acc*>(p[0]);
          if (s[1] == sizeof(T)) {
            const T* xv = reinterpret_cast<const T*>(xp);
            for (int64_t i = 0; i < n; ++i) a = fold(a, static_cast<Acc>(static_cast<compute_t<T>>(xv[i])));
          } else {
            for (int64_t i = 0; i < n; ++i) {
              a = fold(a, static_cast<Acc>(static_cast<compute_t<T>>(*reinterpret_cast<const T*>(xp + i * s[1]))));
            }
          }
          *reinterpret_cast<Acc*>(p[0]) = a;
        } else {
          for (int64_t i = 0; i < n; ++i) {
            Acc& a = *reinterpret_cast<Acc*>(p[0] + i * s[0]);
            a = fold(a, static_cast<Acc>(static_cast<compute_t<T>>(*reinterpret_cast<const T*>(xp + i * s[1]))));
          }
        }
      },
      parallel, 1);
}

// Rounds the accumulators into the output's dtype (out is contiguous, made by the routine).
template <typename Acc>
void store(const std::vector<Acc>& acc, Array& out) {
  common::visit_dtype(out.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    for (size_t i = 0; i < acc.size(); ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        o[i] = acc[i] != Acc(0);
      } else {
        o[i] = static_cast<T>(static_cast<compute_t<T>>(acc[i]));
      }
    }
  });
}

}  // namespace

void reduce(ReduceOp op, const Array& x, Array& out) {
  KUSARI_ASSERT(out.is_contiguous());
  common::visit_dtype(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kProd: {
        using Acc = std::conditional_t<std::is_same_v<T, bool>, int64_t, accum_t<T>>;
        std::vector<Acc> acc;
        if (op == ReduceOp::kSum) {
          reduce_into<Acc, T>(x, out.shape(), Acc(0), [](Acc a, Acc v) { return a + v; }, acc);
        } else {
          reduce_into<Acc, T>(x, out.shape(), Acc(1), [](Acc a, Acc v) { return a * v; }, acc);
        }
        store<Acc>(acc, out);
        return;
      }
      case ReduceOp::kMax:
      case ReduceOp::kMin: {
        using Acc = std::conditional_t<std::is_same_v<T, bool>, int64_t, C>;
        KUSARI_CHECK(x.size() > 0, ValueError, op == ReduceOp::kMax ? "max" : "min",
                     ": zero-size array has no maximum or minimum");
        std::vector<Acc> acc;
        if (op == ReduceOp::kMax) {
          Acc init = std::numeric_limits<Acc>::has_infinity ? -std::numeric_limits<Acc>::infinity()
                                                             : std::numeric_limits<Acc>::lowest();
          reduce_into<Acc, T>(x, out.shape(), init, [](Acc a, Acc v) { return (v > a || v != v) ? v : a; }, acc);
        } else {
          Acc init = std::numeric_limits<Acc>::has_infinity ? std::numeric_limits<Acc>::infinity()
                                                             : std::numeric_limits<Acc>::max();
          reduce_into<Acc, T>(x, out.shape(), init, [](Acc a, Acc v) { return (v < a || v != v) ? v : a; }, acc);
        }
        store<Acc>(acc, out);
        return;
      }
      case ReduceOp::kAny:
      case ReduceOp::kAll: {
        std::vector<int64_t> acc;
        if (op == ReduceOp::kAny) {
          reduce_into<int64_t, T>(x, out.shape(), 0, [](int64_t a, int64_t v) { return (a || v) ? 1 : 0; }, acc);
        } else {
          reduce_into<int64_t, T>(x, out.shape(), 1, [](int64_t a, int64_t v) { return (a && v) ? 1 : 0; }, acc);
        }
        bool* o = out.data<bool>();
        for (size_t i = 0; i < acc.size(); ++i) o[i] = acc[i] != 0;
        return;
      }
    }
  });
}

void arg_reduce(ArgReduceOp op, const Array& x, int axis, Array& out) {
  KUSARI_ASSERT(out.is_contiguous());
  const int64_t len = x.shape()[axis];
  KUSARI_CHECK(len > 0, ValueError, op == ArgReduceOp::kArgMax ? "argmax" : "argmin",
               ": attempt to take the index of an empty axis");
  // Iterate output positions; for each, scan along the axis.
  Shape outer_shape = x.shape();
  outer_shape[axis] = 1;
  Array x0 = x.as_strided(outer_shape, x.strides(), x.offset());
  int64_t* o = out.data<int64_t>();
  const int64_t step = x.strides()[axis];
  common::visit_dtype(x.dtype(), "arg_reduce", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    // Walk x0 (one element per output) in C order alongside a running output index.
    StridedLoop<1> loop(outer_shape, {&x0}, /*order_by_output=*/false);
    int64_t out_index = 0;
    loop.run(
        [&](char** p, int64_t n, const int64_t* s) {
          for (int64_t i = 0; i < n; ++i) {
            const T* base = reinterpret_cast<const T*>(p[0] + i * s[0]);
            C best = static_cast<C>(base[0]);
            int64_t best_j = 0;
            for (int64_t j = 1; j < len; ++j) {
              C v = static_cast<C>(base[j * step]);
              if (best != best) break;  // NaN wins, like NumPy
              bool better = op == ArgReduceOp::kArgMax ? (v > best || v != v) : (v < best || v != v);
              if (better) {
                best = v;
                best_j = j;
              }
            }
            o[out_index++] = best_j;
          }
        },
        false);
  });
}

void softmax(const Array& x_in, int axis, bool log, Array& out) {
  KUSARI_ASSERT(out.is_contiguous());
  Array x = x_in.contiguous();
  const Shape& shape = x.shape();
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[d];
  for (int d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[axis];
  common::visit_floating_dtype(x.dtype(), "softmax", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const T* xp = x.data<T>();
    T* op = out.data<T>();
    parallel_for(outer * inner, n * 10, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t o = r / inner, in = r % inner;
        const T* xr = xp + o * n * inner + in;
        T* yr = op + o * n * inner + in;
        C m = -std::numeric_limits<C>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, static_cast<C>(xr[j * inner]));
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(static_cast<C>(xr[j * inner]) - m));
        if (log) {
          C lse = m + static_cast<C>(std::log(sum));
          for (int64_t j = 0; j < n; ++j) yr[j * inner] = static_cast<T>(static_cast<C>(xr[j * inner]) - lse);
        } else {
          C inv = static_cast<C>(1.0 / sum);
          for (int64_t j = 0; j < n; ++j) yr[j * inner] = static_cast<T>(std::exp(static_cast<C>(xr[j * inner]) - m) * inv);
        }
      }
    });
  });
}

// Note [Fused softmax cross entropy]
// Per row, with m the maximum, lse = m + log(sum_k exp(x_k - m)) and the target
// q = (1 - eps) onehot(t) + eps / K (Note [Label smoothing]):
//   loss = -sum_k q_k (x_k - lse) = lse - (1 - eps) x_t - (eps / K) sum_k x_k,
//   gx_k = g (exp(x_k - lse) - q_k).
// Forward reads x once (its maximum first, then the sums) and keeps only lse per row; backward
// reads x once more and writes gx in x's dtype. Nothing of (rows, classes) is held between them
// but x itself, which the caller's graph holds anyway. The sums are float64 on the CPU.
template <typename T, typename S>
void cross_entropy_rows(const T* x, const int64_t* t, const kernels::CrossEntropyParams& p, S* loss, S* lse,
                        int64_t b, int64_t e) {
  using C = compute_t<T>;
  const double eps = p.label_smoothing, k = static_cast<double>(p.classes);
  for (int64_t r = b; r < e; ++r) {
    const T* xr = x + r * p.width;
    C m = -std::numeric_limits<C>::infinity();
    for (int64_t j = 0; j < p.classes; ++j) m = std::max(m, static_cast<C>(xr[j]));
    double sum = 0.0, total = 0.0;
    for (int64_t j = 0; j < p.classes; ++j) {
      const double v = static_cast<double>(static_cast<C>(xr[j]));
      sum += std::exp(v - static_cast<double>(m));
      total += v;
    }
    const double l = static_cast<double>(m) + std::log(sum);
    lse[r] = static_cast<S>(l);
    if (t[r] == p.ignore_label) {
      loss[r] = S(0);
      continue;
    }
    double out = l - (1.0 - eps) * static_cast<double>(static_cast<C>(xr[t[r]]));
    if (eps != 0.0) out -= eps / k * total;
    loss[r] = static_cast<S>(out);
  }
}

template <typename T, typename S>
void cross_entropy_grad_rows(const T* x, const int64_t* t, const S* lse, const S* g,
                             const kernels::CrossEntropyParams& p, T* gx, int64_t b, int64_t e) {
  using C = compute_t<T>;
  const double eps = p.label_smoothing, uniform = eps / static_cast<double>(p.classes);
  for (int64_t r = b; r < e; ++r) {
    const T* xr = x + r * p.width;
    T* gr = gx + r * p.width;
    const double gi = static_cast<double>(g[r]), l = static_cast<double>(lse[r]);
    for (int64_t j = 0; j < p.classes; ++j) {
      const double q = (j == t[r] ? 1.0 - eps : 0.0) + uniform;
      gr[j] = static_cast<T>(static_cast<C>(gi * (std::exp(static_cast<double>(static_cast<C>(xr[j])) - l) - q)));
    }
    std::fill(gr + p.classes, gr + p.width,
              static_cast<T>(0.0f));  // padding (Note [Padded classes])
  }
}

bool softmax_cross_entropy_forward(const Array& x, const Array& t_in, const kernels::CrossEntropyParams& p,
                                   Array& loss, Array& lse) {
  const Array t = t_in.astype(int64);
  common::visit_floating_dtype(x.dtype(), "softmax_cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* xp = x.data<T>();
    const int64_t* tp = t.data<int64_t>();
    S* lp = loss.data<S>();
    S* ep = lse.data<S>();
    parallel_for(p.rows, p.classes * 10, [&](int64_t b, int64_t e) { cross_entropy_rows<T, S>(xp, tp, p, lp, ep, b, e); });
  });
  return true;
}

bool softmax_cross_entropy_backward(const Array& x, const Array& t_in, const Array& lse, const Array& g,
                                    const kernels::CrossEntropyParams& p, Array& gx) {
  const Array t = t_in.astype(int64);
  common::visit_floating_dtype(x.dtype(), "softmax_cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* xp = x.data<T>();
    const int64_t* tp = t.data<int64_t>();
    const S* ep = lse.data<S>();
    const S* gp = g.data<S>();
    T* op = gx.data<T>();
    parallel_for(p.rows, p.classes * 10,
                 [&](int64_t b, int64_t e) { cross_entropy_grad_rows<T, S>(xp, tp, ep, gp, p, op, b, e); });
  });
  return true;
}

void register_cpu_reduction_kernels() {
  kernels::reduce.set(DeviceType::kCPU, &reduce);
  kernels::arg_reduce.set(DeviceType::kCPU, &arg_reduce);
  kernels::softmax.set(DeviceType::kCPU, &softmax);
  kernels::softmax_cross_entropy_forward.set(DeviceType::kCPU, &softmax_cross_entropy_forward);
  kernels::softmax_cross_entropy_backward.set(DeviceType::kCPU, &softmax_cross_entropy_backward);
}

}  // namespace kusari::cpu
