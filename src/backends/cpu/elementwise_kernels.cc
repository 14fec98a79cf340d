// CPU kernels: elementwise unary and binary operations and where.
#include <cmath>
#include <type_traits>

#include "backends/cpu/cpu_backend.h"
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

template <typename T>
void unary_typed(UnaryOp op, const Array& x, Array& out, double p0, double p1) {
  using C = compute_t<T>;
  constexpr bool kFloat = std::is_floating_point_v<C>;
  constexpr bool kBool = std::is_same_v<T, bool>;
  const C c0 = static_cast<C>(p0);
  const C c1 = static_cast<C>(p1);
  // Predicates write bool.
  switch (op) {
    case UnaryOp::kEqScalar:
      return map1<T, bool>(x, out, 1, [=](C v) { return v == c0; });
    case UnaryOp::kNeScalar:
      return map1<T, bool>(x, out, 1, [=](C v) { return v != c0; });
    case UnaryOp::kLtScalar:
      return map1<T, bool>(x, out, 1, [=](C v) { return v < c0; });
    case UnaryOp::kLeScalar:
      return map1<T, bool>(x, out, 1, [=](C v) { return v <= c0; });
    case UnaryOp::kGtScalar:
      return map1<T, bool>(x, out, 1, [=](C v) { return v > c0; });
    case UnaryOp::kGeScalar:
      return map1<T, bool>(x, out, 1, [=](C v) { return v >= c0; });
    case UnaryOp::kLogicalNot:
      return map1<T, bool>(x, out, 1, [](C v) { return !static_cast<bool>(v); });
    case UnaryOp::kIsNan:
      if constexpr (kFloat) return map1<T, bool>(x, out, 1, [](C v) { return std::isnan(v); });
      return map1<T, bool>(x, out, 1, [](C) { return false; });
    case UnaryOp::kIsInf:
      if constexpr (kFloat) return map1<T, bool>(x, out, 1, [](C v) { return std::isinf(v); });
      return map1<T, bool>(x, out, 1, [](C) { return false; });
    case UnaryOp::kIsFinite:
      if constexpr (kFloat) return map1<T, bool>(x, out, 1, [](C v) { return std::isfinite(v); });
      return map1<T, bool>(x, out, 1, [](C) { return true; });
    case UnaryOp::kIdentity:
      return map1<T, T>(x, out, 1, [](C v) { return v; });
    default:
      break;
  }
  if constexpr (kBool) {
    unsupported("elementwise arithmetic", Dtype::kBool);
  } else {
    switch (op) {
      case UnaryOp::kNeg:
        return map1<T, T>(x, out, 1, [](C v) { return static_cast<C>(-v); });
      case UnaryOp::kAbs:
        return map1<T, T>(x, out, 1, [](C v) { return v < C(0) ? static_cast<C>(-v) : v; });
      case UnaryOp::kSign:
        return map1<T, T>(x, out, 1, [](C v) { return static_cast<C>((C(0) < v) - (v < C(0))); });
      case UnaryOp::kSquare:
        return map1<T, T>(x, out, 1, [](C v) { return static_cast<C>(v * v); });
      case UnaryOp::kRelu:
        return map1<T, T>(x, out, 1, [](C v) { return v > C(0) ? v : C(0); });
      case UnaryOp::kAddScalar:
        return map1<T, T>(x, out, 1, [=](C v) { return static_cast<C>(v + c0); });
      case UnaryOp::kMulScalar:
        return map1<T, T>(x, out, 1, [=](C v) { return static_cast<C>(v * c0); });
      case UnaryOp::kRSubScalar:
        return map1<T, T>(x, out, 1, [=](C v) { return static_cast<C>(c0 - v); });
      case UnaryOp::kMaxScalar:
        return map1<T, T>(x, out, 1, [=](C v) { return (v > c0 || v != v) ? v : c0; });
      case UnaryOp::kMinScalar:
        return map1<T, T>(x, out, 1, [=](C v) { return (v < c0 || v != v) ? v : c0; });
      case UnaryOp::kClip:
        return map1<T, T>(x, out, 1, [=](C v) { return v < c0 ? c0 : (v > c1 ? c1 : v); });
      default:
        break;
    }
    if constexpr (!kFloat) {
      unsupported("this elementwise function (it needs a floating dtype)", dtype_of<T>);
    } else {
      switch (op) {
        case UnaryOp::kExp:
          return map1<T, T>(x, out, 8, [](C v) { return std::exp(v); });
        case UnaryOp::kLog:
          return map1<T, T>(x, out, 8, [](C v) { return std::log(v); });
        case UnaryOp::kLog1p:
          return map1<T, T>(x, out, 8, [](C v) { return std::log1p(v); });
        case UnaryOp::kExpm1:
          return map1<T, T>(x, out, 8, [](C v) { return std::expm1(v); });
        case UnaryOp::kSqrt:
          return map1<T, T>(x, out, 4, [](C v) { return std::sqrt(v); });
        case UnaryOp::kRsqrt:
          return map1<T, T>(x, out, 4, [](C v) { return C(1) / std::sqrt(v); });
        case UnaryOp::kReciprocal:
          return map1<T, T>(x, out, 2, [](C v) { return C(1) / v; });
        case UnaryOp::kRDivScalar:
          return map1<T, T>(x, out, 2, [=](C v) { return c0 / v; });
        case UnaryOp::kSin:
          return map1<T, T>(x, out, 8, [](C v) { return std::sin(v); });
        case UnaryOp::kCos:
          return map1<T, T>(x, out, 8, [](C v) { return std::cos(v); });
        case UnaryOp::kTanh:
          return map1<T, T>(x, out, 8, [](C v) { return std::tanh(v); });
        case UnaryOp::kSigmoid:
          // Stable in both tails: exp of a non-positive number only.
          return map1<T, T>(x, out, 8, [](C v) {
            if (v >= C(0)) return C(1) / (C(1) + std::exp(-v));
            C e = std::exp(v);
            return e / (C(1) + e);
          });
        case UnaryOp::kFloor:
          return map1<T, T>(x, out, 2, [](C v) { return std::floor(v); });
        case UnaryOp::kCeil:
          return map1<T, T>(x, out, 2, [](C v) { return std::ceil(v); });
        case UnaryOp::kErf:
          return map1<T, T>(x, out, 8, [](C v) { return std::erf(v); });
        case UnaryOp::kSoftplus:
          // log(1 + exp(b v)) / b = max(b v, 0) / b + log1p(exp(-|b v|)) / b
          return map1<T, T>(x, out, 10, [=](C v) {
            C bv = c0 * v;
            return (std::max(bv, C(0)) + std::log1p(std::exp(-std::abs(bv)))) / c0;
          });
        case UnaryOp::kLeakyRelu:
          return map1<T, T>(x, out, 1, [=](C v) { return v >= C(0) ? v : c0 * v; });
        case UnaryOp::kElu:
          return map1<T, T>(x, out, 8, [=](C v) { return v >= C(0) ? v : c0 * std::expm1(v); });
        case UnaryOp::kPowScalar:
          if (p0 == 2.0) return map1<T, T>(x, out, 1, [](C v) { return v * v; });
          if (p0 == 0.5) return map1<T, T>(x, out, 4, [](C v) { return std::sqrt(v); });
          if (p0 == -1.0) return map1<T, T>(x, out, 2, [](C v) { return C(1) / v; });
          return map1<T, T>(x, out, 10, [=](C v) { return std::pow(v, c0); });
        case UnaryOp::kRPowScalar:
          return map1<T, T>(x, out, 10, [=](C v) { return std::pow(c0, v); });
        default:
          break;
      }
    }
  }
  KUSARI_THROW(NotImplementedError, "cpu unary kernel: op ", static_cast<int>(op), " not implemented for ",
               dtype_name(x.dtype()));
}

template <typename T>
void binary_typed(BinaryOp op, const Array& a, const Array& b, Array& out) {
  using C = compute_t<T>;
  constexpr bool kFloat = std::is_floating_point_v<C>;
  switch (op) {
    case BinaryOp::kEq:
      return map2<T, bool>(a, b, out, [](C x, C y) { return x == y; });
    case BinaryOp::kNe:
      return map2<T, bool>(a, b, out, [](C x, C y) { return x != y; });
    case BinaryOp::kLt:
      return map2<T, bool>(a, b, out, [](C x, C y) { return x < y; });
    case BinaryOp::kLe:
      return map2<T, bool>(a, b, out, [](C x, C y) { return x <= y; });
    case BinaryOp::kGt:
      return map2<T, bool>(a, b, out, [](C x, C y) { return x > y; });
    case BinaryOp::kGe:
      return map2<T, bool>(a, b, out, [](C x, C y) { return x >= y; });
    case BinaryOp::kLogicalAnd:
      return map2<T, bool>(a, b, out, [](C x, C y) { return static_cast<bool>(x) && static_cast<bool>(y); });
    case BinaryOp::kLogicalOr:
      return map2<T, bool>(a, b, out, [](C x, C y) { return static_cast<bool>(x) || static_cast<bool>(y); });
    default:
      break;
  }
  if constexpr (std::is_same_v<T, bool>) {
    unsupported("elementwise arithmetic", Dtype::kBool);
  } else {
    switch (op) {
      case BinaryOp::kAdd:
        return map2<T, T>(a, b, out, [](C x, C y) { return static_cast<C>(x + y); });
      case BinaryOp::kSub:
        return map2<T, T>(a, b, out, [](C x, C y) { return static_cast<C>(x - y); });
      case BinaryOp::kMul:
        return map2<T, T>(a, b, out, [](C x, C y) { return static_cast<C>(x * y); });
      case BinaryOp::kDiv:
        if constexpr (kFloat) {
          return map2<T, T>(a, b, out, [](C x, C y) { return x / y; });
        } else {
          // Integer division floors like NumPy's floor_divide; division by zero gives 0.
          return map2<T, T>(a, b, out, [](C x, C y) {
            if (y == 0) return C(0);
            C q = static_cast<C>(x / y);
            if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
            return q;
          });
        }
      case BinaryOp::kPow:
        if constexpr (kFloat) {
          return map2<T, T>(a, b, out, [](C x, C y) { return std::pow(x, y); });
        } else {
          return map2<T, T>(a, b, out, [](C x, C y) {
            C r = 1;
            for (C i = 0; i < y; ++i) r = static_cast<C>(r * x);
            return r;
          });
        }
      case BinaryOp::kMaximum:
        return map2<T, T>(a, b, out, [](C x, C y) { return (x > y || x != x) ? x : y; });
      case BinaryOp::kMinimum:
        return map2<T, T>(a, b, out, [](C x, C y) { return (x < y || x != x) ? x : y; });
      default:
        break;
    }
  }
  KUSARI_THROW(NotImplementedError, "cpu binary kernel: op ", static_cast<int>(op), " not implemented for ",
               dtype_name(a.dtype()));
}

}  // namespace

void unary(UnaryOp op, const Array& x, Array& out, double p0, double p1) {
  visit_dtype(x.dtype(), [&](auto tag) { unary_typed<decltype(tag)>(op, x, out, p0, p1); });
}

void binary(BinaryOp op, const Array& a, const Array& b, Array& out) {
  visit_dtype(a.dtype(), [&](auto tag) { binary_typed<decltype(tag)>(op, a, b, out); });
}

void where(const Array& cond, const Array& a, const Array& b, Array& out) {
  visit_dtype(out.dtype(), [&](auto tag) {
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

}  // namespace kusari::cpu
