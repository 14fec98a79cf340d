// CPU kernels: elementwise unary and binary operations and where.
#include <cmath>
#include <type_traits>

#include "backends/common/dtype_visit.h"
#include "backends/common/scalar_ops.h"
#include "backends/cpu/cpu_backend.h"
#include "kernels/elementwise.h"
#include "backends/cpu/loops.h"

namespace kusari::cpu {
namespace {

/// out[i] = f(x[i]) with In/Out element types and f working on compute types.
template <typename In, typename Out, typename F>
void map1(const Array& x, Array& out, int64_t cost, F f) {
  StridedLoop<2> loop(out.shape(), {&out, &x});
  loop.run(
      [&](char** p, int64_t n, const int64_t* s) {
        if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
          Out* o = reinterpret_cast<Out*>(p[0]);
          const In* a = reinterpret_cast<const In*>(p[1]);
          for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(static_cast<compute_t<In>>(a[i])));
        } else if (s[0] == sizeof(Out) && s[1] == 0) {
          Out* o = reinterpret_cast<Out*>(p[0]);
          const Out v = static_cast<Out>(f(static_cast<compute_t<In>>(*reinterpret_cast<const In*>(p[1]))));
          for (int64_t i = 0; i < n; ++i) o[i] = v;
        } else {
          for (int64_t i = 0; i < n; ++i) {
            *reinterpret_cast<Out*>(p[0] + i * s[0]) =
                static_cast<Out>(f(static_cast<compute_t<In>>(*reinterpret_cast<const In*>(p[1] + i * s[1]))));
          }
        }
      },
      true, cost);
}

/// out[i] = f(a[i], b[i]).
template <typename In, typename Out, typename F>
void map2(const Array& a, const Array& b, Array& out, F f) {
  using C = compute_t<In>;
  StridedLoop<3> loop(out.shape(), {&out, &a, &b});
  loop.run([&](char** p, int64_t n, const int64_t* s) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const In* x = reinterpret_cast<const In*>(p[1]);
    const In* y = reinterpret_cast<const In*>(p[2]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(In) && s[2] == sizeof(In)) {
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(static_cast<C>(x[i]), static_cast<C>(y[i])));
    } else if (s[0] == sizeof(Out) && s[1] == sizeof(In) && s[2] == 0) {
      const C yv = static_cast<C>(*y);
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(static_cast<C>(x[i]), yv));
    } else if (s[0] == sizeof(Out) && s[1] == 0 && s[2] == sizeof(In)) {
      const C xv = static_cast<C>(*x);
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<Out>(f(xv, static_cast<C>(y[i])));
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<Out*>(p[0] + i * s[0]) =
            static_cast<Out>(f(static_cast<C>(*reinterpret_cast<const In*>(p[1] + i * s[1])),
                               static_cast<C>(*reinterpret_cast<const In*>(p[2] + i * s[2]))));
      }
    }
  });
}

[[noreturn]] void unsupported(const char* what, Dtype dtype) {
  KUSARI_THROW(DtypeError, what, ": not supported for dtype ", dtype_name(dtype));
}

template <UnaryOp Op, typename T>
void arith1(const Array& x, Array& out, int64_t cost, compute_t<T> c0, compute_t<T> c1) {
  using C = compute_t<T>;
  map1<T, T>(x, out, cost, [=](C v) { return common::unary_arith<Op>(v, c0, c1); });
}

template <UnaryOp Op, typename T>
void predicate1(const Array& x, Array& out, compute_t<T> c0) {
  using C = compute_t<T>;
  map1<T, bool>(x, out, 1, [=](C v) { return common::unary_predicate<Op>(v, c0); });
}

template <BinaryOp Op, typename T>
void arith2(const Array& a, const Array& b, Array& out) {
  using C = compute_t<T>;
  map2<T, T>(a, b, out, [](C x, C y) { return common::binary_arith<Op>(x, y); });
}

template <BinaryOp Op, typename T>
void predicate2(const Array& a, const Array& b, Array& out) {
  using C = compute_t<T>;
  map2<T, bool>(a, b, out, [](C x, C y) { return common::binary_predicate<Op>(x, y); });
}

// The op is switched on once per call, outside the loop, so that every loop body is one op's
// arithmetic (src/backends/common/scalar_ops.h) and vectorises.
template <typename T>
void unary_typed(UnaryOp op, const Array& x, Array& out, double p0, double p1) {
  using C = compute_t<T>;
  constexpr bool kFloat = std::is_floating_point_v<C>;
  constexpr bool kBool = std::is_same_v<T, bool>;
  const C c0 = static_cast<C>(p0);
  const C c1 = static_cast<C>(p1);
#define KUSARI_PREDICATE(name) \
  case UnaryOp::name:          \
    return predicate1<UnaryOp::name, T>(x, out, c0);
#define KUSARI_ARITH(name, cost) \
  case UnaryOp::name:            \
    return arith1<UnaryOp::name, T>(x, out, cost, c0, c1);
  // Predicates write bool.
  switch (op) {
    KUSARI_PREDICATE(kEqScalar)
    KUSARI_PREDICATE(kNeScalar)
    KUSARI_PREDICATE(kLtScalar)
    KUSARI_PREDICATE(kLeScalar)
    KUSARI_PREDICATE(kGtScalar)
    KUSARI_PREDICATE(kGeScalar)
    KUSARI_PREDICATE(kLogicalNot)
    KUSARI_PREDICATE(kIsNan)
    KUSARI_PREDICATE(kIsInf)
    KUSARI_PREDICATE(kIsFinite)
    KUSARI_ARITH(kIdentity, 1)
    default:
      break;
  }
  if constexpr (kBool) {
    unsupported("elementwise arithmetic", Dtype::kBool);
  } else {
    switch (op) {
      KUSARI_ARITH(kNeg, 1)
      KUSARI_ARITH(kAbs, 1)
      KUSARI_ARITH(kSign, 1)
      KUSARI_ARITH(kSquare, 1)
      KUSARI_ARITH(kRelu, 1)
      KUSARI_ARITH(kAddScalar, 1)
      KUSARI_ARITH(kMulScalar, 1)
      KUSARI_ARITH(kRSubScalar, 1)
      KUSARI_ARITH(kMaxScalar, 1)
      KUSARI_ARITH(kMinScalar, 1)
      KUSARI_ARITH(kClip, 1)
      default:
        break;
    }
    if constexpr (!kFloat) {
      unsupported("this elementwise function (it needs a floating dtype)", dtype_of<T>);
    } else {
      switch (op) {
        KUSARI_ARITH(kExp, 8)
        KUSARI_ARITH(kLog, 8)
        KUSARI_ARITH(kLog1p, 8)
        KUSARI_ARITH(kExpm1, 8)
        KUSARI_ARITH(kSqrt, 4)
        KUSARI_ARITH(kRsqrt, 4)
        KUSARI_ARITH(kReciprocal, 2)
        KUSARI_ARITH(kRDivScalar, 2)
        KUSARI_ARITH(kSin, 8)
        KUSARI_ARITH(kCos, 8)
        KUSARI_ARITH(kTanh, 8)
        KUSARI_ARITH(kSigmoid, 8)
        KUSARI_ARITH(kFloor, 2)
        KUSARI_ARITH(kCeil, 2)
        KUSARI_ARITH(kErf, 8)
        KUSARI_ARITH(kSoftplus, 10)
        KUSARI_ARITH(kLeakyRelu, 1)
        KUSARI_ARITH(kElu, 8)
        KUSARI_ARITH(kGelu, 10)
        KUSARI_ARITH(kGeluTanh, 10)
        KUSARI_ARITH(kSilu, 8)
        KUSARI_ARITH(kGeluDerivative, 12)
        KUSARI_ARITH(kGeluTanhDerivative, 12)
        KUSARI_ARITH(kSiluDerivative, 8)
        case UnaryOp::kPowScalar:
          // The exponents with a cheaper exact form take it (the CUDA kernel does the same).
          if (p0 == 2.0) return arith1<UnaryOp::kSquare, T>(x, out, 1, c0, c1);
          if (p0 == 0.5) return arith1<UnaryOp::kSqrt, T>(x, out, 4, c0, c1);
          if (p0 == -1.0) return arith1<UnaryOp::kReciprocal, T>(x, out, 2, c0, c1);
          return arith1<UnaryOp::kPowScalar, T>(x, out, 10, c0, c1);
        KUSARI_ARITH(kRPowScalar, 10)
        default:
          break;
      }
    }
  }
#undef KUSARI_ARITH
#undef KUSARI_PREDICATE
  KUSARI_THROW(NotImplementedError, "cpu unary kernel: op ", static_cast<int>(op), " not implemented for ",
               dtype_name(x.dtype()));
}

template <typename T>
void binary_typed(BinaryOp op, const Array& a, const Array& b, Array& out) {
#define KUSARI_BINARY(kind, name) \
  case BinaryOp::name:            \
    return kind<BinaryOp::name, T>(a, b, out);
  switch (op) {
    KUSARI_BINARY(predicate2, kEq)
    KUSARI_BINARY(predicate2, kNe)
    KUSARI_BINARY(predicate2, kLt)
    KUSARI_BINARY(predicate2, kLe)
    KUSARI_BINARY(predicate2, kGt)
    KUSARI_BINARY(predicate2, kGe)
    KUSARI_BINARY(predicate2, kLogicalAnd)
    KUSARI_BINARY(predicate2, kLogicalOr)
    default:
      break;
  }
  if constexpr (std::is_same_v<T, bool>) {
    unsupported("elementwise arithmetic", Dtype::kBool);
  } else {
    switch (op) {
      KUSARI_BINARY(arith2, kAdd)
      KUSARI_BINARY(arith2, kSub)
      KUSARI_BINARY(arith2, kMul)
      KUSARI_BINARY(arith2, kDiv)
      KUSARI_BINARY(arith2, kPow)
      KUSARI_BINARY(arith2, kMaximum)
      KUSARI_BINARY(arith2, kMinimum)
      default:
        break;
    }
  }
#undef KUSARI_BINARY
  KUSARI_THROW(NotImplementedError, "cpu binary kernel: op ", static_cast<int>(op), " not implemented for ",
               dtype_name(a.dtype()));
}

}  // namespace

void unary(UnaryOp op, const Array& x, Array& out, double p0, double p1) {
  common::visit_dtype(x.dtype(), "unary", [&](auto tag) { unary_typed<decltype(tag)>(op, x, out, p0, p1); });
}

void binary(BinaryOp op, const Array& a, const Array& b, Array& out) {
  common::visit_dtype(a.dtype(), "binary", [&](auto tag) { binary_typed<decltype(tag)>(op, a, b, out); });
}

void where(const Array& cond, const Array& a, const Array& b, Array& out) {
  common::visit_dtype(out.dtype(), "where", [&](auto tag) {
    using T = decltype(tag);
    StridedLoop<4> loop(out.shape(), {&out, &cond, &a, &b});
    loop.run([](char** p, int64_t n, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i) {
        bool c = *reinterpret_cast<const bool*>(p[1] + i * s[1]);
        *reinterpret_cast<T*>(p[0] + i * s[0]) =
            c ? *reinterpret_cast<const T*>(p[2] + i * s[2]) : *reinterpret_cast<const T*>(p[3] + i * s[3]);
      }
    });
  });
}

// out = gy where y > 0, else 0: one pass for relu's gradient, any strides. Integer dtypes are
// declined (the routine's composition serves them).
bool relu_grad(const Array& gy, const Array& y, Array& out) {
  if (!is_floating(out.dtype())) return false;
  common::visit_floating_dtype(out.dtype(), "relu_grad", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    map2<T, T>(gy, y, out, [](C g, C v) { return common::relu_grad(g, v); });
  });
  return true;
}

void register_cpu_elementwise_kernels() {
  kernels::unary.set(DeviceType::kCPU, &unary);
  kernels::binary.set(DeviceType::kCPU, &binary);
  kernels::where.set(DeviceType::kCPU, &where);
  kernels::relu_grad.set(DeviceType::kCPU, &relu_grad);
}

}  // namespace kusari::cpu
