// CUDA kernels: elementwise unary and binary operations and where.
//
// Note [Runtime op switch]
// One kernel per (dtype, output kind) serves every op: the op travels as an argument and each
// element goes through a switch on it. The switch is uniform across the grid (every thread takes
// the same branch) and costs a few instructions next to the memory traffic that bounds these
// kernels, while a kernel per (op, dtype) would multiply compile time and binary size by the
// number of ops (about 40). The arithmetic of each op is the CPU's (src/backends/cpu/
// elementwise_kernels.cc) in the same compute type, so results agree up to the last bits of
// the transcendental functions (CUDA's libm and glibc differ there) and of contracted
// multiply-adds (nvcc fuses a * b + c).
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernel_util.cuh"

namespace kusari::cuda {
namespace {

// --- per-element operations ------------------------------------------------------------------------

/// x -> op(x) for the arithmetic unary ops (the output has x's dtype).
template <typename T>
struct UnaryArith {
  UnaryOp op;
  compute_t<T> c0, c1;

  __device__ __forceinline__ T operator()(T x) const {
    using C = compute_t<T>;
    if constexpr (std::is_same_v<T, bool>) {
      return x;  // only kIdentity reaches a bool array
    } else {
      const C v = to_compute(x);
      C r = v;
      switch (op) {
        case UnaryOp::kIdentity:
          break;
        case UnaryOp::kNeg:
          r = static_cast<C>(-v);
          break;
        case UnaryOp::kAbs:
          r = dmath::negative(v) ? static_cast<C>(-v) : v;
          break;
        case UnaryOp::kSign:
          r = static_cast<C>((C(0) < v) - dmath::negative(v));
          break;
        case UnaryOp::kSquare:
          r = static_cast<C>(v * v);
          break;
        case UnaryOp::kRelu:
          r = v > C(0) ? v : C(0);
          break;
        case UnaryOp::kAddScalar:
          r = static_cast<C>(v + c0);
          break;
        case UnaryOp::kMulScalar:
          r = static_cast<C>(v * c0);
          break;
        case UnaryOp::kRSubScalar:
          r = static_cast<C>(c0 - v);
          break;
        case UnaryOp::kMaxScalar:
          r = (v > c0 || v != v) ? v : c0;
          break;
        case UnaryOp::kMinScalar:
          r = (v < c0 || v != v) ? v : c0;
          break;
        case UnaryOp::kClip:
          r = v < c0 ? c0 : (v > c1 ? c1 : v);
          break;
        default:
          if constexpr (is_float_v<T>) r = float_op(v);
          break;
      }
      return from_compute<T>(r);
    }
  }

  __device__ __forceinline__ compute_t<T> float_op(compute_t<T> v) const {
    using C = compute_t<T>;
    switch (op) {
      case UnaryOp::kExp:
        return dmath::exp(v);
      case UnaryOp::kLog:
        return dmath::log(v);
      case UnaryOp::kLog1p:
        return dmath::log1p(v);
      case UnaryOp::kExpm1:
        return dmath::expm1(v);
      case UnaryOp::kSqrt:
        return dmath::sqrt(v);
      case UnaryOp::kRsqrt:
        return C(1) / dmath::sqrt(v);
      case UnaryOp::kReciprocal:
        return C(1) / v;
      case UnaryOp::kRDivScalar:
        return c0 / v;
      case UnaryOp::kSin:
        return dmath::sin(v);
      case UnaryOp::kCos:
        return dmath::cos(v);
      case UnaryOp::kTanh:
        return dmath::tanh(v);
      case UnaryOp::kSigmoid: {
        // Stable in both tails: exp of a non-positive number only.
        if (v >= C(0)) return C(1) / (C(1) + dmath::exp(-v));
        const C e = dmath::exp(v);
        return e / (C(1) + e);
      }
      case UnaryOp::kFloor:
        return dmath::floor(v);
      case UnaryOp::kCeil:
        return dmath::ceil(v);
      case UnaryOp::kErf:
        return dmath::erf(v);
      case UnaryOp::kSoftplus: {
        // log(1 + exp(b v)) / b = max(b v, 0) / b + log1p(exp(-|b v|)) / b
        const C bv = c0 * v;
        return ((bv > C(0) ? bv : C(0)) + dmath::log1p(dmath::exp(-dmath::fabs(bv)))) / c0;
      }
      case UnaryOp::kLeakyRelu:
        return v >= C(0) ? v : c0 * v;
      case UnaryOp::kElu:
        return v >= C(0) ? v : c0 * dmath::expm1(v);
      case UnaryOp::kPowScalar:
        return dmath::pow(v, c0);
      case UnaryOp::kRPowScalar:
        return dmath::pow(c0, v);
      default:
        return v;
    }
  }
};

/// x -> bool for the predicate unary ops.
template <typename T>
struct UnaryPredicate {
  UnaryOp op;
  compute_t<T> c0;

  __device__ __forceinline__ bool operator()(T x) const {
    using C = compute_t<T>;
    const C v = to_compute(x);
    switch (op) {
      case UnaryOp::kEqScalar:
        return v == c0;
      case UnaryOp::kNeScalar:
        return v != c0;
      case UnaryOp::kLtScalar:
        return v < c0;
      case UnaryOp::kLeScalar:
        return v <= c0;
      case UnaryOp::kGtScalar:
        return v > c0;
      case UnaryOp::kGeScalar:
        return v >= c0;
      case UnaryOp::kLogicalNot:
        return !static_cast<bool>(v);
      case UnaryOp::kIsNan:
        if constexpr (is_float_v<T>) return dmath::isnan(v);
        return false;
      case UnaryOp::kIsInf:
        if constexpr (is_float_v<T>) return dmath::isinf(v);
        return false;
      case UnaryOp::kIsFinite:
        if constexpr (is_float_v<T>) return !dmath::isnan(v) && !dmath::isinf(v);
        return true;
      default:
        return false;
    }
  }
};

/// x ** y for integers by squaring, in unsigned arithmetic (wraps exactly like the CPU's repeated
/// multiplication, without its y-long loop); y <= 0 gives 1 like the CPU.
template <typename C>
__device__ __forceinline__ C integer_pow(C x, C y) {
  if (!(y > C(0))) return C(1);
  uint64_t base = static_cast<uint64_t>(static_cast<int64_t>(x));
  uint64_t e = static_cast<uint64_t>(y);
  uint64_t r = 1;
  while (e) {
    if (e & 1u) r *= base;
    base *= base;
    e >>= 1;
  }
  return static_cast<C>(r);
}

/// (a, b) -> op(a, b) for the arithmetic binary ops.
template <typename T>
struct BinaryArith {
  BinaryOp op;

  __device__ __forceinline__ T operator()(T a, T b) const {
    using C = compute_t<T>;
    {
      const C x = to_compute(a), y = to_compute(b);
      C r = x;
      switch (op) {
        case BinaryOp::kAdd:
          r = static_cast<C>(x + y);
          break;
        case BinaryOp::kSub:
          r = static_cast<C>(x - y);
          break;
        case BinaryOp::kMul:
          r = static_cast<C>(x * y);
          break;
        case BinaryOp::kDiv:
          if constexpr (is_float_v<T>) {
            r = x / y;
          } else {
            // Floor division like NumPy's floor_divide; division by zero gives 0.
            if (y == C(0)) {
              r = C(0);
            } else {
              r = static_cast<C>(x / y);
              if ((x % y != 0) && (dmath::negative(x) != dmath::negative(y))) --r;
            }
          }
          break;
        case BinaryOp::kPow:
          if constexpr (is_float_v<T>) {
            r = dmath::pow(x, y);
          } else {
            r = integer_pow(x, y);
          }
          break;
        case BinaryOp::kMaximum:
          r = (x > y || x != x) ? x : y;
          break;
        case BinaryOp::kMinimum:
          r = (x < y || x != x) ? x : y;
          break;
        default:
          break;
      }
      return from_compute<T>(r);
    }
  }
};

/// (a, b) -> bool for the comparison and logical ops.
template <typename T>
struct BinaryPredicate {
  BinaryOp op;

  __device__ __forceinline__ bool operator()(T a, T b) const {
    using C = compute_t<T>;
    const C x = to_compute(a), y = to_compute(b);
    switch (op) {
      case BinaryOp::kEq:
        return x == y;
      case BinaryOp::kNe:
        return x != y;
      case BinaryOp::kLt:
        return x < y;
      case BinaryOp::kLe:
        return x <= y;
      case BinaryOp::kGt:
        return x > y;
      case BinaryOp::kGe:
        return x >= y;
      case BinaryOp::kLogicalAnd:
        return static_cast<bool>(x) && static_cast<bool>(y);
      case BinaryOp::kLogicalOr:
        return static_cast<bool>(x) || static_cast<bool>(y);
      default:
        return false;
    }
  }
};

// --- kernels -----------------------------------------------------------------------------------

// y (n,) = f(x (n,)), both contiguous; `vec` when both are aligned for Vec access.
template <typename In, typename Out, typename F>
__global__ void map1_contiguous_kernel(int64_t n, const In* x, Out* y, F f, bool vec) {
  int64_t head = 0;
  if (vec) {
    const int64_t nv = n / kVec;
    const Vec<In>* xv = reinterpret_cast<const Vec<In>*>(x);
    Vec<Out>* yv = reinterpret_cast<Vec<Out>*>(y);
    for (int64_t i = grid_start(); i < nv; i += grid_step()) {
      const Vec<In> a = xv[i];
      Vec<Out> o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) o.v[j] = f(a.v[j]);
      yv[i] = o;
    }
    head = nv * kVec;
  }
  for (int64_t i = head + grid_start(); i < n; i += grid_step()) y[i] = f(x[i]);
}

// y = f(x), views of one shape with any strides (ix: y, x).
template <typename In, typename Out, typename Index, typename F>
__global__ void map1_strided_kernel(int64_t n, StridedIndexer<2> ix, const In* x, Out* y, F f) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    int64_t off[2];
    ix.offsets<Index>(i, off);
    y[off[0]] = f(x[off[1]]);
  }
}

// y (n,) = f(a (n,), b (n,)), all contiguous.
template <typename In, typename Out, typename F>
__global__ void map2_contiguous_kernel(int64_t n, const In* a, const In* b, Out* y, F f, bool vec) {
  int64_t head = 0;
  if (vec) {
    const int64_t nv = n / kVec;
    const Vec<In>* av = reinterpret_cast<const Vec<In>*>(a);
    const Vec<In>* bv = reinterpret_cast<const Vec<In>*>(b);
    Vec<Out>* yv = reinterpret_cast<Vec<Out>*>(y);
    for (int64_t i = grid_start(); i < nv; i += grid_step()) {
      const Vec<In> p = av[i], q = bv[i];
      Vec<Out> o;
#pragma unroll
      for (int j = 0; j < kVec; ++j) o.v[j] = f(p.v[j], q.v[j]);
      yv[i] = o;
    }
    head = nv * kVec;
  }
  for (int64_t i = head + grid_start(); i < n; i += grid_step()) y[i] = f(a[i], b[i]);
}

// y = f(a, b), views of one shape (broadcast operands have stride 0; ix: y, a, b).
template <typename In, typename Out, typename Index, typename F>
__global__ void map2_strided_kernel(int64_t n, StridedIndexer<3> ix, const In* a, const In* b,
                                    Out* y, F f) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    int64_t off[3];
    ix.offsets<Index>(i, off);
    y[off[0]] = f(a[off[1]], b[off[2]]);
  }
}

// y = cond ? a : b for one element size (raw bits U); ix: y, cond, a, b.
template <typename U, typename Index>
__global__ void where_kernel(int64_t n, StridedIndexer<4> ix, const bool* cond, const U* a,
                             const U* b, U* y) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    int64_t off[4];
    ix.offsets<Index>(i, off);
    y[off[0]] = cond[off[1]] ? a[off[2]] : b[off[3]];
  }
}

// --- launchers ---------------------------------------------------------------------------------

template <typename In, typename Out, typename F>
void launch_map1(const Array& x, Array& out, F f) {
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  const int64_t n = out.size();
  const StridedIndexer<2> ix = make_indexer<2>(out.shape(), {&out, &x});
  const In* xp = static_cast<const In*>(x.raw_data());
  Out* yp = static_cast<Out*>(out.raw_data());
  const unsigned grid = grid_for(n, device);
  if (ix.contiguous()) {
    const bool vec = vec_aligned<In>(xp) && vec_aligned<Out>(yp);
    map1_contiguous_kernel<In, Out, F><<<grid, kBlockSize, 0, stream>>>(n, xp, yp, f, vec);
  } else if (fits_uint32(n)) {
    map1_strided_kernel<In, Out, uint32_t, F><<<grid, kBlockSize, 0, stream>>>(n, ix, xp, yp, f);
  } else {
    map1_strided_kernel<In, Out, int64_t, F><<<grid, kBlockSize, 0, stream>>>(n, ix, xp, yp, f);
  }
  KUSARI_CUDA_CHECK_LAUNCH();
}

template <typename In, typename Out, typename F>
void launch_map2(const Array& a, const Array& b, Array& out, F f) {
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  const int64_t n = out.size();
  const StridedIndexer<3> ix = make_indexer<3>(out.shape(), {&out, &a, &b});
  const In* ap = static_cast<const In*>(a.raw_data());
  const In* bp = static_cast<const In*>(b.raw_data());
  Out* yp = static_cast<Out*>(out.raw_data());
  const unsigned grid = grid_for(n, device);
  if (ix.contiguous()) {
    const bool vec = vec_aligned<In>(ap) && vec_aligned<In>(bp) && vec_aligned<Out>(yp);
    map2_contiguous_kernel<In, Out, F><<<grid, kBlockSize, 0, stream>>>(n, ap, bp, yp, f, vec);
  } else if (fits_uint32(n)) {
    map2_strided_kernel<In, Out, uint32_t, F><<<grid, kBlockSize, 0, stream>>>(n, ix, ap, bp, yp, f);
  } else {
    map2_strided_kernel<In, Out, int64_t, F><<<grid, kBlockSize, 0, stream>>>(n, ix, ap, bp, yp, f);
  }
  KUSARI_CUDA_CHECK_LAUNCH();
}

[[noreturn]] void unsupported(const char* what, Dtype dtype) {
  KUSARI_THROW(DtypeError, what, ": not supported for dtype ", dtype_name(dtype));
}

bool unary_needs_float(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp:
    case UnaryOp::kLog:
    case UnaryOp::kLog1p:
    case UnaryOp::kExpm1:
    case UnaryOp::kSqrt:
    case UnaryOp::kRsqrt:
    case UnaryOp::kReciprocal:
    case UnaryOp::kRDivScalar:
    case UnaryOp::kSin:
    case UnaryOp::kCos:
    case UnaryOp::kTanh:
    case UnaryOp::kSigmoid:
    case UnaryOp::kFloor:
    case UnaryOp::kCeil:
    case UnaryOp::kErf:
    case UnaryOp::kSoftplus:
    case UnaryOp::kLeakyRelu:
    case UnaryOp::kElu:
    case UnaryOp::kPowScalar:
    case UnaryOp::kRPowScalar:
      return true;
    default:
      return false;
  }
}

/// The CPU's compute type of a kusari element type (float for the 16-bit floats).
template <typename T>
using host_compute_t =
    std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

template <typename T>
void unary_typed(UnaryOp op, const Array& x, Array& out, double p0, double p1) {
  using D = device_t<T>;
  using C = host_compute_t<T>;
  static_assert(std::is_same_v<C, compute_t<D>>);
  // The scalar parameters are converted on the host, exactly as the CPU kernel converts them.
  const C c0 = static_cast<C>(p0), c1 = static_cast<C>(p1);
  if (unary_op_is_predicate(op)) {
    launch_map1<D, bool>(x, out, UnaryPredicate<D>{op, c0});
    return;
  }
  if (op != UnaryOp::kIdentity) {
    if constexpr (std::is_same_v<T, bool>) unsupported("elementwise arithmetic", Dtype::kBool);
    if (!is_float_v<D> && unary_needs_float(op)) {
      unsupported("this elementwise function (it needs a floating dtype)", dtype_of<T>);
    }
  }
  // Powers with the exponents the CPU special-cases take the same shortcuts.
  if (op == UnaryOp::kPowScalar) {
    if (p0 == 2.0) op = UnaryOp::kSquare;
    if (p0 == 0.5) op = UnaryOp::kSqrt;
    if (p0 == -1.0) op = UnaryOp::kReciprocal;
  }
  launch_map1<D, D>(x, out, UnaryArith<D>{op, c0, c1});
}

template <typename T>
void binary_typed(BinaryOp op, const Array& a, const Array& b, Array& out) {
  using D = device_t<T>;
  if (binary_op_is_predicate(op)) {
    launch_map2<D, bool>(a, b, out, BinaryPredicate<D>{op});
    return;
  }
  if constexpr (std::is_same_v<T, bool>) {
    unsupported("elementwise arithmetic", Dtype::kBool);
  } else {
    launch_map2<D, D>(a, b, out, BinaryArith<D>{op});
  }
}

}  // namespace

void unary(UnaryOp op, const Array& x, Array& out, double p0, double p1) {
  visit_dtype(x.dtype(), [&](auto tag) { unary_typed<decltype(tag)>(op, x, out, p0, p1); });
}

void binary(BinaryOp op, const Array& a, const Array& b, Array& out) {
  visit_dtype(a.dtype(), [&](auto tag) { binary_typed<decltype(tag)>(op, a, b, out); });
}

void where(const Array& cond, const Array& a, const Array& b, Array& out) {
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  const int64_t n = out.size();
  const StridedIndexer<4> ix = make_indexer<4>(out.shape(), {&out, &cond, &a, &b});
  const unsigned grid = grid_for(n, device);
  visit_itemsize(out.itemsize(), [&](auto tag) {
    using U = decltype(tag);
    const bool* c = static_cast<const bool*>(cond.raw_data());
    const U* ap = static_cast<const U*>(a.raw_data());
    const U* bp = static_cast<const U*>(b.raw_data());
    U* yp = static_cast<U*>(out.raw_data());
    if (fits_uint32(n)) {
      where_kernel<U, uint32_t><<<grid, kBlockSize, 0, stream>>>(n, ix, c, ap, bp, yp);
    } else {
      where_kernel<U, int64_t><<<grid, kBlockSize, 0, stream>>>(n, ix, c, ap, bp, yp);
    }
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

}  // namespace kusari::cuda
