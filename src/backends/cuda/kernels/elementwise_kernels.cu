// CUDA kernels: elementwise unary and binary operations and where.
//
// Note [Runtime op switch]
// One kernel per (dtype, output kind) serves every op: the op travels as an argument and each
// element goes through a switch on it. The switch is uniform across the grid (every thread takes
// the same branch) and costs a few instructions next to the memory traffic that bounds these
// kernels, while a kernel per (op, dtype) would multiply compile time and binary size by the
// number of ops (about 40). The arithmetic of each op is the CPU's, the same code
// (src/backends/common/scalar_ops.h) in the same compute type, so results agree up to the last bits of
// the transcendental functions (CUDA's libm and glibc differ there) and of contracted
// multiply-adds (nvcc fuses a * b + c).
#include "backends/cuda/kernels/cuda_kernels.h"
#include "kernels/elementwise.h"
#include "backends/common/scalar_ops.h"
#include "backends/cuda/primitives/kernel_util.cuh"

namespace kusari::cuda {
namespace {

// --- per-element operations ----------------------------------------------------------------------

// Each functor switches on the op per element (Note [Runtime op switch]); the arithmetic of every
// case is the CPU's, from src/backends/common/scalar_ops.h.

#define KUSARI_UNARY_CASE(name) \
  case UnaryOp::name:           \
    return common::unary_arith<UnaryOp::name>(v, c0, c1);

/// x -> op(x) for the arithmetic unary ops (the output has x's dtype).
template <typename T>
struct UnaryArith {
  UnaryOp op;
  compute_t<T> c0, c1;

  __device__ __forceinline__ T operator()(T x) const {
    if constexpr (std::is_same_v<T, bool>) {
      return x;  // only kIdentity reaches a bool array
    } else {
      return from_compute<T>(apply(to_compute(x)));
    }
  }

  __device__ __forceinline__ compute_t<T> apply(compute_t<T> v) const {
    switch (op) {
      KUSARI_UNARY_CASE(kNeg)
      KUSARI_UNARY_CASE(kAbs)
      KUSARI_UNARY_CASE(kSign)
      KUSARI_UNARY_CASE(kSquare)
      KUSARI_UNARY_CASE(kRelu)
      KUSARI_UNARY_CASE(kAddScalar)
      KUSARI_UNARY_CASE(kMulScalar)
      KUSARI_UNARY_CASE(kRSubScalar)
      KUSARI_UNARY_CASE(kMaxScalar)
      KUSARI_UNARY_CASE(kMinScalar)
      KUSARI_UNARY_CASE(kClip)
      default:
        if constexpr (is_float_v<T>) return float_op(v);
        return v;  // kIdentity
    }
  }

  __device__ __forceinline__ compute_t<T> float_op(compute_t<T> v) const {
    switch (op) {
      KUSARI_UNARY_CASE(kExp)
      KUSARI_UNARY_CASE(kLog)
      KUSARI_UNARY_CASE(kLog1p)
      KUSARI_UNARY_CASE(kExpm1)
      KUSARI_UNARY_CASE(kSqrt)
      KUSARI_UNARY_CASE(kRsqrt)
      KUSARI_UNARY_CASE(kReciprocal)
      KUSARI_UNARY_CASE(kRDivScalar)
      KUSARI_UNARY_CASE(kSin)
      KUSARI_UNARY_CASE(kCos)
      KUSARI_UNARY_CASE(kTanh)
      KUSARI_UNARY_CASE(kSigmoid)
      KUSARI_UNARY_CASE(kFloor)
      KUSARI_UNARY_CASE(kCeil)
      KUSARI_UNARY_CASE(kErf)
      KUSARI_UNARY_CASE(kSoftplus)
      KUSARI_UNARY_CASE(kLeakyRelu)
      KUSARI_UNARY_CASE(kElu)
      KUSARI_UNARY_CASE(kGelu)
      KUSARI_UNARY_CASE(kGeluTanh)
      KUSARI_UNARY_CASE(kSilu)
      KUSARI_UNARY_CASE(kGeluDerivative)
      KUSARI_UNARY_CASE(kGeluTanhDerivative)
      KUSARI_UNARY_CASE(kSiluDerivative)
      KUSARI_UNARY_CASE(kPowScalar)
      KUSARI_UNARY_CASE(kRPowScalar)
      default:
        return v;
    }
  }
};
#undef KUSARI_UNARY_CASE

/// x -> bool for the predicate unary ops.
template <typename T>
struct UnaryPredicate {
  UnaryOp op;
  compute_t<T> c0;

  __device__ __forceinline__ bool operator()(T x) const {
    const compute_t<T> v = to_compute(x);
#define KUSARI_PREDICATE_CASE(name) \
  case UnaryOp::name:               \
    return common::unary_predicate<UnaryOp::name>(v, c0);
    switch (op) {
      KUSARI_PREDICATE_CASE(kEqScalar)
      KUSARI_PREDICATE_CASE(kNeScalar)
      KUSARI_PREDICATE_CASE(kLtScalar)
      KUSARI_PREDICATE_CASE(kLeScalar)
      KUSARI_PREDICATE_CASE(kGtScalar)
      KUSARI_PREDICATE_CASE(kGeScalar)
      KUSARI_PREDICATE_CASE(kLogicalNot)
      KUSARI_PREDICATE_CASE(kIsNan)
      KUSARI_PREDICATE_CASE(kIsInf)
      KUSARI_PREDICATE_CASE(kIsFinite)
      default:
        return false;
    }
#undef KUSARI_PREDICATE_CASE
  }
};

#define KUSARI_BINARY_CASE(kind, name) \
  case BinaryOp::name:                 \
    return common::kind<BinaryOp::name>(x, y);

/// (a, b) -> op(a, b) for the arithmetic binary ops.
template <typename T>
struct BinaryArith {
  BinaryOp op;

  __device__ __forceinline__ T operator()(T a, T b) const {
    return from_compute<T>(apply(to_compute(a), to_compute(b)));
  }

  __device__ __forceinline__ compute_t<T> apply(compute_t<T> x, compute_t<T> y) const {
    switch (op) {
      KUSARI_BINARY_CASE(binary_arith, kAdd)
      KUSARI_BINARY_CASE(binary_arith, kSub)
      KUSARI_BINARY_CASE(binary_arith, kMul)
      KUSARI_BINARY_CASE(binary_arith, kDiv)
      KUSARI_BINARY_CASE(binary_arith, kPow)
      KUSARI_BINARY_CASE(binary_arith, kMaximum)
      KUSARI_BINARY_CASE(binary_arith, kMinimum)
      default:
        return x;
    }
  }
};

/// (a, b) -> bool for the comparison and logical ops.
template <typename T>
struct BinaryPredicate {
  BinaryOp op;

  __device__ __forceinline__ bool operator()(T a, T b) const {
    const compute_t<T> x = to_compute(a), y = to_compute(b);
    switch (op) {
      KUSARI_BINARY_CASE(binary_predicate, kEq)
      KUSARI_BINARY_CASE(binary_predicate, kNe)
      KUSARI_BINARY_CASE(binary_predicate, kLt)
      KUSARI_BINARY_CASE(binary_predicate, kLe)
      KUSARI_BINARY_CASE(binary_predicate, kGt)
      KUSARI_BINARY_CASE(binary_predicate, kGe)
      KUSARI_BINARY_CASE(binary_predicate, kLogicalAnd)
      KUSARI_BINARY_CASE(binary_predicate, kLogicalOr)
      default:
        return false;
    }
  }
};
#undef KUSARI_BINARY_CASE

// --- kernels -------------------------------------------------------------------------------------

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

// --- launchers -----------------------------------------------------------------------------------

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
    map2_strided_kernel<In, Out, uint32_t, F>
        <<<grid, kBlockSize, 0, stream>>>(n, ix, ap, bp, yp, f);
  } else {
    map2_strided_kernel<In, Out, int64_t, F><<<grid, kBlockSize, 0, stream>>>(n, ix, ap, bp, yp, f);
  }
  KUSARI_CUDA_CHECK_LAUNCH();
}

[[noreturn]] void unsupported(const char* what, Dtype dtype) {
  KUSARI_THROW(DtypeError, what, ": not supported for dtype ", dtype_name(dtype));
}

template <typename T>
void unary_typed(UnaryOp op, const Array& x, Array& out, double p0, double p1) {
  using D = device_t<T>;
  using C = compute_t<T>;
  static_assert(std::is_same_v<C, compute_t<D>>);
  // The scalar parameters are converted on the host, exactly as the CPU kernel converts them.
  const C c0 = static_cast<C>(p0), c1 = static_cast<C>(p1);
  if (unary_op_is_predicate(op)) {
    launch_map1<D, bool>(x, out, UnaryPredicate<D>{op, c0});
    return;
  }
  if (op != UnaryOp::kIdentity) {
    if constexpr (std::is_same_v<T, bool>) unsupported("elementwise arithmetic", Dtype::kBool);
    if (!is_float_v<D> && common::unary_op_needs_float(op)) {
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
  common::visit_dtype(x.dtype(), "unary", [&](auto tag) { unary_typed<decltype(tag)>(op, x, out, p0, p1); });
}

void binary(BinaryOp op, const Array& a, const Array& b, Array& out) {
  common::visit_dtype(a.dtype(), "binary", [&](auto tag) { binary_typed<decltype(tag)>(op, a, b, out); });
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

namespace {

/// (gy, y) -> gy where y > 0, else 0.
template <typename T>
struct ReluGrad {
  __device__ __forceinline__ T operator()(T gy, T y) const {
    return from_compute<T>(common::relu_grad(to_compute(gy), to_compute(y)));
  }
};

}  // namespace

// out = gy where y > 0, else 0, in one vectorised pass. Only contiguous floating operands of
// out's shape are taken; strided or broadcast operands and integer dtypes are declined, and the
// routine's composition (a compare and a where) serves them.
bool relu_grad(const Array& gy, const Array& y, Array& out) {
  if (!is_floating(out.dtype())) return false;
  if (!make_indexer<3>(out.shape(), {&out, &gy, &y}).contiguous()) return false;
  common::visit_floating_dtype(out.dtype(), "relu_grad", [&](auto tag) {
    using D = device_t<decltype(tag)>;
    launch_map2<D, D>(gy, y, out, ReluGrad<D>{});
  });
  return true;
}

void register_cuda_elementwise_kernels() {
  kernels::unary.set(DeviceType::kCUDA, &unary);
  kernels::binary.set(DeviceType::kCUDA, &binary);
  kernels::where.set(DeviceType::kCUDA, &where);
  kernels::relu_grad.set(DeviceType::kCUDA, &relu_grad);
}

}  // namespace kusari::cuda
