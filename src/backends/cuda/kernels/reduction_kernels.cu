// CUDA kernels: reductions over axes, arg-reductions, softmax and softmax cross entropy (Note
// [Fused softmax cross entropy] in the CPU's file; here the sums are in the statistics' dtype,
// float32 but for float64 data).
//
// Note [GPU reductions]
// x's axes split into kept axes (the output's) and reduced axes, each compacted to a strided
// indexer, so output o and reduction index r address x at kept.offset(o) + red.offset(r) for any
// strides. One kernel serves every reduction through a small reducer policy (identity, load,
// combine, finish) and a launch plan:
//   - a group of G threads produces one output over one chunk of r: G = 1 (a thread per output)
//     when the kept axes hold x's unit-stride axis, so neighbouring threads read neighbouring
//     outputs; otherwise G is a power of two from 32 to 512, so neighbouring threads read
//     neighbouring r, and the group ends with a shuffle tree (plus shared memory above a warp);
//   - when outputs x G threads would not fill the GPU, r is cut into `splits` chunks whose
//     partial accumulators go to a scratch buffer, and a second kernel combines them in chunk
//     order.
// Every thread folds its elements in a fixed order, the trees have a fixed shape, and the plan
// depends only on the shapes and the GPU's SM count, so a result is the same from run to run.
// Accumulators follow the CPU (Note [CPU reductions]): sums and products of floats in double, of
// integers and bools in int64; max/min in the compute type; any/all on truth values.
#include <bit>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "kernels/reduction.h"
#include "backends/cuda/primitives/kernel_util.cuh"
#include "backends/cuda/primitives/reduce.cuh"

namespace kusari::cuda {
namespace {

// --- reducer policies ----------------------------------------------------------------------------

/// sum / prod.
template <typename T>
struct SumProdReducer {
  using Acc = std::conditional_t<is_float_v<T>, double, int64_t>;
  using Out = std::conditional_t<std::is_same_v<T, bool>, int64_t, T>;
  bool prod;

  __device__ __forceinline__ Acc identity() const { return prod ? Acc(1) : Acc(0); }
  __device__ __forceinline__ Acc load(T x, int64_t) const {
    return static_cast<Acc>(to_compute(x));
  }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const {
    if constexpr (std::is_same_v<Acc, int64_t>) {
      // Wrapping integer arithmetic, like the CPU in practice (without signed overflow).
      const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
      return static_cast<int64_t>(prod ? ua * ub : ua + ub);
    } else {
      return prod ? a * b : a + b;
    }
  }
  __device__ __forceinline__ Out finish(Acc a) const {
    if constexpr (is_float_v<Out>) {
      return from_double<Out>(a);
    } else {
      return static_cast<Out>(a);
    }
  }
};

/// max / min; a NaN wins (it propagates) like the CPU.
template <typename T>
struct MaxMinReducer {
  using Acc = std::conditional_t<is_float_v<T>, compute_t<T>, int64_t>;
  using Out = T;
  bool max;

  __device__ __forceinline__ Acc identity() const {
    if constexpr (is_float_v<T>) {
      return max ? -static_cast<Acc>(INFINITY) : static_cast<Acc>(INFINITY);
    } else {
      return max ? INT64_MIN : INT64_MAX;
    }
  }
  __device__ __forceinline__ Acc load(T x, int64_t) const {
    return static_cast<Acc>(to_compute(x));
  }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const {
    if (max) return (b > a || b != b) ? b : a;
    return (b < a || b != b) ? b : a;
  }
  __device__ __forceinline__ Out finish(Acc a) const {
    if constexpr (std::is_same_v<T, bool>) {
      return a != 0;
    } else if constexpr (is_float_v<T>) {
      return from_compute<T>(a);
    } else {
      return static_cast<T>(a);
    }
  }
};

/// any / all.
template <typename T>
struct AnyAllReducer {
  using Acc = int;
  using Out = bool;
  bool all;

  __device__ __forceinline__ Acc identity() const { return all ? 1 : 0; }
  __device__ __forceinline__ Acc load(T x, int64_t) const {
    if constexpr (is_float_v<T>) {
      // The CPU folds static_cast<int64_t>(value), so a float counts as true when it truncates
      // to a non-zero integer (|v| >= 1), or is NaN (x86 turns NaN into INT64_MIN).
      const compute_t<T> v = to_compute(x);
      return !(dmath::fabs(v) < compute_t<T>(1)) ? 1 : 0;
    } else {
      return x != T(0) ? 1 : 0;
    }
  }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const { return all ? (a & b) : (a | b); }
  __device__ __forceinline__ Out finish(Acc a) const { return a != 0; }
};

/// A value and its index along the reduced axis.
template <typename V>
struct ArgAcc {
  V v;
  int64_t i;  // -1: no element yet
};

/// argmax / argmin: the first NaN if there is one, else the first extreme value (the CPU's scan).
template <typename T>
struct ArgReducer {
  using V = std::conditional_t<is_float_v<T>, compute_t<T>, int64_t>;
  using Acc = ArgAcc<V>;
  using Out = int64_t;
  bool max;

  __device__ __forceinline__ Acc identity() const { return {V(0), -1}; }
  __device__ __forceinline__ Acc load(T x, int64_t r) const {
    return {static_cast<V>(to_compute(x)), r};
  }
  __device__ __forceinline__ Acc combine(Acc a, Acc b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool a_nan = a.v != a.v, b_nan = b.v != b.v;
    if (a_nan || b_nan) {
      if (a_nan && b_nan) return a.i < b.i ? a : b;
      return a_nan ? a : b;
    }
    if (max ? b.v > a.v : b.v < a.v) return b;
    if (max ? a.v > b.v : a.v < b.v) return a;
    return a.i < b.i ? a : b;
  }
  __device__ __forceinline__ Out finish(Acc a) const { return a.i < 0 ? 0 : a.i; }
};

// --- group reductions (src/backends/cuda/primitives/reduce.cuh) --------------------------------

/// Shuffles an ArgAcc (value and index) for group_reduce; found by argument-dependent lookup.
template <typename V>
__device__ __forceinline__ ArgAcc<V> shfl_down(ArgAcc<V> v, int offset) {
  return {__shfl_down_sync(0xffffffffu, v.v, offset), __shfl_down_sync(0xffffffffu, v.i, offset)};
}

// --- kernels -------------------------------------------------------------------------------------

/// The launch plan of a reduction (see Note [GPU reductions]).
struct ReducePlan {
  StridedIndexer<1> kept;  // the output's axes, strides of x
  StridedIndexer<1> red;   // the reduced axes, strides of x
  int64_t n_out = 1, n_red = 1;
  int64_t splits = 1, chunk = 1;
  int group = 1;
  bool index32 = true;  // 32-bit index arithmetic suffices (Note [Strided indexing on the GPU])
  int block = kBlockSize;
  unsigned grid = 1;
};

// out (n_out,) = reduce over r of x[kept(o) + red(r)], or the partial accumulators
// partial (splits, n_out) when the plan splits r.
template <typename T, typename R>
__global__ void reduce_kernel(const T* x, ReducePlan plan, R reducer, typename R::Acc* partial,
                              typename R::Out* out) {
  using Acc = typename R::Acc;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);
  const int group = plan.group;
  const int lane = threadIdx.x % group;
  const int64_t groups_per_block = blockDim.x / group;
  const int64_t groups = plan.n_out * plan.splits;
  const auto combine = [&](Acc a, Acc b) { return reducer.combine(a, b); };
  // Whole blocks step together so that every thread reaches the group reduction's barriers.
  for (int64_t base = blockIdx.x * groups_per_block; base < groups;
       base += static_cast<int64_t>(gridDim.x) * groups_per_block) {
    const int64_t gi = base + threadIdx.x / group;
    Acc acc = reducer.identity();
    int64_t o = 0, c = 0;
    if (gi < groups) {
      o = gi % plan.n_out;
      c = gi / plan.n_out;
      int64_t kept_off[1];
      if (plan.index32) {
        plan.kept.offsets<uint32_t>(o, kept_off);
      } else {
        plan.kept.offsets<int64_t>(o, kept_off);
      }
      const T* xo = x + kept_off[0];
      const int64_t begin = c * plan.chunk;
      const int64_t end = min(begin + plan.chunk, plan.n_red);
      int64_t red_off[1];
      if (plan.index32) {
        for (int64_t r = begin + lane; r < end; r += group) {
          plan.red.offsets<uint32_t>(r, red_off);
          acc = reducer.combine(acc, reducer.load(xo[red_off[0]], r));
        }
      } else {
        for (int64_t r = begin + lane; r < end; r += group) {
          plan.red.offsets<int64_t>(r, red_off);
          acc = reducer.combine(acc, reducer.load(xo[red_off[0]], r));
        }
      }
    }
    acc = group_reduce(acc, combine, group, smem);
    if (lane == 0 && gi < groups) {
      if (plan.splits == 1) {
        out[o] = reducer.finish(acc);
      } else {
        partial[c * plan.n_out + o] = acc;
      }
    }
  }
}

// out (n_out,) = finish(combine over c of partial (splits, n_out)), in chunk order.
template <typename R>
__global__ void reduce_partials_kernel(int64_t n_out, int64_t splits,
                                       const typename R::Acc* partial, R reducer,
                                       typename R::Out* out) {
  for (int64_t o = grid_start(); o < n_out; o += grid_step()) {
    typename R::Acc acc = reducer.identity();
    for (int64_t c = 0; c < splits; ++c) acc = reducer.combine(acc, partial[c * n_out + o]);
    out[o] = reducer.finish(acc);
  }
}

// The maximum of a row (NaN wins) over a group of `group` threads, every thread of the block
// taking part (inactive ones with no row); every thread of the group gets it.
template <typename S, typename T>
__device__ __forceinline__ S group_row_max(const T* xr, int64_t n, bool active, int group, int lane, S* smem) {
  const auto max_op = [](S a, S b) { return (b > a || b != b) ? b : a; };
  S m = -static_cast<S>(INFINITY);
  if (active) {
    for (int64_t j = lane; j < n; j += group) m = max_op(m, static_cast<S>(to_compute(xr[j])));
  }
  return group_allreduce(m, max_op, group, smem);
}

// Softmax rows along the last axis: x, y (rows, n) contiguous; a group of G threads per row.
template <typename T>
__global__ void softmax_rows_kernel(int64_t rows, int64_t n, const T* x, T* y, bool log) {
  using C = compute_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  double* smem_d = reinterpret_cast<double*>(smem_raw);
  C* smem_c = reinterpret_cast<C*>(smem_raw);
  const int group = blockDim.x <= 256 ? 32 : static_cast<int>(blockDim.x);
  const int lane = threadIdx.x % group;
  const int64_t groups_per_block = blockDim.x / group;
  const auto sum_op = [](double a, double b) { return a + b; };
  for (int64_t base = blockIdx.x * groups_per_block; base < rows;
       base += static_cast<int64_t>(gridDim.x) * groups_per_block) {
    const int64_t row = base + threadIdx.x / group;
    const bool active = row < rows;
    const T* xr = x + (active ? row : 0) * n;
    const C m = group_row_max<C>(xr, n, active, group, lane, smem_c);
    double sum = 0.0;
    if (active) {
      for (int64_t j = lane; j < n; j += group) {
        sum += ::exp(static_cast<double>(to_compute(xr[j]) - m));
      }
    }
    sum = group_allreduce(sum, sum_op, group, smem_d);
    if (active) {
      T* yr = y + row * n;
      if (log) {
        const C lse = m + static_cast<C>(::log(sum));
        for (int64_t j = lane; j < n; j += group) yr[j] = from_compute<T>(to_compute(xr[j]) - lse);
      } else {
        const C inv = static_cast<C>(1.0 / sum);
        for (int64_t j = lane; j < n; j += group) {
          yr[j] = from_compute<T>(dmath::exp(to_compute(xr[j]) - m) * inv);
        }
      }
    }
  }
}

// Softmax along a middle axis: x, y (outer, n, inner) contiguous, a thread per (outer, inner).
template <typename T>
__global__ void softmax_columns_kernel(int64_t outer, int64_t n, int64_t inner, const T* x, T* y,
                                       bool log) {
  using C = compute_t<T>;
  for (int64_t col = grid_start(); col < outer * inner; col += grid_step()) {
    const int64_t o = col / inner, in = col % inner;
    const T* xr = x + o * n * inner + in;
    T* yr = y + o * n * inner + in;
    C m = -static_cast<C>(INFINITY);
    for (int64_t j = 0; j < n; ++j) {
      const C v = to_compute(xr[j * inner]);
      m = (v > m || v != v) ? v : m;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j)
      sum += ::exp(static_cast<double>(to_compute(xr[j * inner]) - m));
    if (log) {
      const C lse = m + static_cast<C>(::log(sum));
      for (int64_t j = 0; j < n; ++j)
        yr[j * inner] = from_compute<T>(to_compute(xr[j * inner]) - lse);
    } else {
      const C inv = static_cast<C>(1.0 / sum);
      for (int64_t j = 0; j < n; ++j) {
        yr[j * inner] = from_compute<T>(dmath::exp(to_compute(xr[j * inner]) - m) * inv);
      }
    }
  }
}

// Softmax cross entropy, a group of G threads per row as softmax_rows_kernel: loss and lse.
template <typename T, typename S>
__global__ void cross_entropy_rows_kernel(int64_t rows, int64_t classes, int64_t width, const T* x,
                                          const int64_t* t, int64_t ignore_label, S eps, S* loss, S* lse) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  S* smem = reinterpret_cast<S*>(smem_raw);
  const int group = blockDim.x <= 256 ? 32 : static_cast<int>(blockDim.x);
  const int lane = threadIdx.x % group;
  const int64_t groups_per_block = blockDim.x / group;
  const auto sum_op = [](S a, S b) { return a + b; };
  for (int64_t base = blockIdx.x * groups_per_block; base < rows;
       base += static_cast<int64_t>(gridDim.x) * groups_per_block) {
    const int64_t row = base + threadIdx.x / group;
    const bool active = row < rows;
    const T* xr = x + (active ? row : 0) * width;
    const S m = group_row_max<S>(xr, classes, active, group, lane, smem);
    S sum = S(0), total = S(0);
    if (active) {
      for (int64_t j = lane; j < classes; j += group) {
        const S v = static_cast<S>(to_compute(xr[j]));
        sum += exp(v - m);
        total += v;
      }
    }
    sum = group_allreduce(sum, sum_op, group, smem);
    total = group_allreduce(total, sum_op, group, smem);
    if (active && lane == 0) {
      const S l = m + log(sum);
      lse[row] = l;
      const int64_t label = t[row];
      S out = S(0);
      if (label != ignore_label && (label < 0 || label >= classes)) {
        out = static_cast<S>(NAN);  // (labels are checked on the host in debug mode only: never read past the row)
      } else if (label != ignore_label) {
        out = l - (S(1) - eps) * static_cast<S>(to_compute(xr[label]));
        if (eps != S(0)) out -= eps / static_cast<S>(classes) * total;
      }
      loss[row] = out;
    }
  }
}

// gx = g (softmax(x) - q), a group of threads per row; 0 in the padding columns.
template <typename T, typename S>
__global__ void cross_entropy_grad_kernel(int64_t rows, int64_t classes, int64_t width, const T* x,
                                          const int64_t* t, const S* lse, const S* g, S eps, T* gx) {
  const int group = blockDim.x <= 256 ? 32 : static_cast<int>(blockDim.x);
  const int lane = threadIdx.x % group;
  const int64_t groups_per_block = blockDim.x / group;
  const S uniform = eps / static_cast<S>(classes);
  for (int64_t base = blockIdx.x * groups_per_block; base < rows;
       base += static_cast<int64_t>(gridDim.x) * groups_per_block) {
    const int64_t row = base + threadIdx.x / group;
    if (row >= rows) continue;
    const T* xr = x + row * width;
    T* gr = gx + row * width;
    const S gi = g[row], l = lse[row];
    const int64_t label = t[row];
    for (int64_t j = lane; j < classes; j += group) {
      const S q = (j == label ? S(1) - eps : S(0)) + uniform;
      gr[j] = from_compute<T>(static_cast<compute_t<T>>(gi * (exp(static_cast<S>(to_compute(xr[j])) - l) - q)));
    }
    for (int64_t j = classes + lane; j < width; j += group) gr[j] = from_compute<T>(compute_t<T>(0));
  }
}

// --- launchers -----------------------------------------------------------------------------------

/// The plan for reducing x over the axes where `reduced[d]` is true.
ReducePlan make_plan(const Array& x, const bool* reduced) {
  const int nd = x.ndim();
  const int device = x.device().index();
  int64_t kept_sizes[kMaxNdim], kept_strides[kMaxNdim], red_sizes[kMaxNdim], red_strides[kMaxNdim];
  int nk = 0, nr = 0;
  ReducePlan plan;
  int64_t min_stride = INT64_MAX;
  bool unit_axis_reduced = false;
  for (int d = 0; d < nd; ++d) {
    const int64_t size = x.shape()[d], stride = x.strides()[d];
    if (reduced[d]) {
      red_sizes[nr] = size;
      red_strides[nr++] = stride;
      plan.n_red *= size;
    } else {
      kept_sizes[nk] = size;
      kept_strides[nk++] = stride;
      plan.n_out *= size;
    }
    const int64_t mag = stride < 0 ? -stride : stride;
    if (size > 1 && mag < min_stride) {
      min_stride = mag;
      unit_axis_reduced = reduced[d];
    }
  }
  plan.kept = compact_geometry<1>(nk, kept_sizes, {kept_strides});
  plan.red = compact_geometry<1>(nr, red_sizes, {red_strides});
  plan.index32 = fits_uint32(plan.n_out) && fits_uint32(plan.n_red);
  const int64_t sms = sm_count(device);
  const int64_t target_threads = sms * 2048;
  if (plan.n_out == 1 || unit_axis_reduced) {
    plan.group = static_cast<int>(std::clamp<int64_t>(
        static_cast<int64_t>(
            std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(plan.n_red, 1)))),
        32, 512));
  } else {
    plan.group = 1;
  }
  // Split r when the outputs alone leave the GPU idle, keeping >= 16 elements per thread.
  const int64_t per_thread = plan.group == 1 ? 32 : 16;
  const int64_t max_splits = std::max<int64_t>(1, plan.n_red / (plan.group * per_thread));
  const int64_t want = (target_threads + plan.n_out * plan.group - 1) / (plan.n_out * plan.group);
  plan.splits = std::clamp<int64_t>(want, 1, std::min<int64_t>(max_splits, 65536));
  plan.chunk = (plan.n_red + plan.splits - 1) / plan.splits;
  if (plan.chunk > 0) plan.splits = (plan.n_red + plan.chunk - 1) / plan.chunk;
  if (plan.splits < 1) plan.splits = 1;
  plan.block = plan.group > kBlockSize ? plan.group : kBlockSize;
  const int64_t groups_per_block = plan.block / plan.group;
  const int64_t blocks = (plan.n_out * plan.splits + groups_per_block - 1) / groups_per_block;
  plan.grid = static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, sms * 32));
  return plan;
}

template <typename T, typename R>
void launch_reduce(const Array& x, const bool* reduced, R reducer, Array& out) {
  using Acc = typename R::Acc;
  using Out = typename R::Out;
  cudaStream_t stream = prepare(x);
  const int device = x.device().index();
  const ReducePlan plan = make_plan(x, reduced);
  const size_t smem = static_cast<size_t>(plan.block / 32) * sizeof(Acc);
  const T* xp = static_cast<const T*>(x.raw_data());
  Out* op = static_cast<Out*>(out.raw_data());
  if (plan.splits == 1) {
    reduce_kernel<T, R><<<plan.grid, plan.block, smem, stream>>>(xp, plan, reducer, nullptr, op);
    KUSARI_CUDA_CHECK_LAUNCH();
    return;
  }
  // Scratch for the partial accumulators, returned to the pool in stream order.
  const Array scratch = Array::empty({static_cast<int64_t>(plan.splits * plan.n_out * sizeof(Acc))},
                                     Dtype::kUInt8, x.device());
  Acc* partial = static_cast<Acc*>(scratch.raw_data());
  reduce_kernel<T, R><<<plan.grid, plan.block, smem, stream>>>(xp, plan, reducer, partial, op);
  KUSARI_CUDA_CHECK_LAUNCH();
  reduce_partials_kernel<R><<<grid_for(plan.n_out, device), kBlockSize, 0, stream>>>(
      plan.n_out, plan.splits, partial, reducer, op);
  KUSARI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void reduce(ReduceOp op, const Array& x, Array& out) {
  KUSARI_ASSERT(out.is_contiguous());
  bool reduced[kMaxNdim] = {};
  for (int d = 0; d < x.ndim(); ++d) reduced[d] = out.shape()[d] == 1 && x.shape()[d] != 1;
  if (op == ReduceOp::kMax || op == ReduceOp::kMin) {
    KUSARI_CHECK(x.size() > 0, ValueError, op == ReduceOp::kMax ? "max" : "min",
                 ": zero-size array has no maximum or minimum");
  }
  visit_device_dtype(x.dtype(), "reduce", [&](auto tag) {
    using T = decltype(tag);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kProd:
        return launch_reduce<T>(x, reduced, SumProdReducer<T>{op == ReduceOp::kProd}, out);
      case ReduceOp::kMax:
      case ReduceOp::kMin:
        return launch_reduce<T>(x, reduced, MaxMinReducer<T>{op == ReduceOp::kMax}, out);
      case ReduceOp::kAny:
      case ReduceOp::kAll:
        return launch_reduce<T>(x, reduced, AnyAllReducer<T>{op == ReduceOp::kAll}, out);
    }
  });
}

void arg_reduce(ArgReduceOp op, const Array& x, int axis, Array& out) {
  KUSARI_ASSERT(out.is_contiguous());
  const int64_t len = x.shape()[axis];
  KUSARI_CHECK(len > 0, ValueError, op == ArgReduceOp::kArgMax ? "argmax" : "argmin",
               ": attempt to take the index of an empty axis");
  bool reduced[kMaxNdim] = {};
  reduced[axis] = true;
  visit_device_dtype(x.dtype(), "arg_reduce", [&](auto tag) {
    using T = decltype(tag);
    launch_reduce<T>(x, reduced, ArgReducer<T>{op == ArgReduceOp::kArgMax}, out);
  });
}

/// The row geometry of softmax and the cross entropy kernels: a warp per row, or a block of 512
/// per long row.
struct RowLaunch {
  unsigned grid;
  int block;
};
RowLaunch row_launch(int64_t rows, int64_t classes, int device) {
  const int block = classes > 8192 ? 512 : kBlockSize;
  const int64_t rows_per_block = block == 512 ? 1 : block / 32;
  return {static_cast<unsigned>(std::clamp<int64_t>((rows + rows_per_block - 1) / rows_per_block, 1,
                                                    static_cast<int64_t>(sm_count(device)) * 32)),
          block};
}

void softmax(const Array& x_in, int axis, bool log, Array& out) {
  KUSARI_ASSERT(out.is_contiguous());
  const Array x = x_in.contiguous();
  const Shape& shape = x.shape();
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= shape[d];
  for (int d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[axis];
  const int device = x.device().index();
  cudaStream_t stream = prepare(x);
  common::visit_floating_dtype(x.dtype(), "softmax", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    const T* xp = static_cast<const T*>(x.raw_data());
    T* yp = static_cast<T*>(out.raw_data());
    if (inner == 1) {
      const RowLaunch launch = row_launch(outer, n, device);
      const size_t smem = static_cast<size_t>(launch.block / 32) * sizeof(double);
      softmax_rows_kernel<T><<<launch.grid, launch.block, smem, stream>>>(outer, n, xp, yp, log);
    } else {
      softmax_columns_kernel<T><<<grid_for(outer * inner, device), kBlockSize, 0, stream>>>(
          outer, n, inner, xp, yp, log);
    }
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

bool softmax_cross_entropy_forward(const Array& x, const Array& t_in, const kernels::CrossEntropyParams& p,
                                   Array& loss, Array& lse) {
  const Array t = t_in.astype(int64);
  const RowLaunch launch = row_launch(p.rows, p.classes, x.device().index());
  cudaStream_t stream = prepare(x);
  common::visit_floating_dtype(x.dtype(), "softmax_cross_entropy_forward", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const size_t smem = static_cast<size_t>(launch.block / 32) * sizeof(S);
    cross_entropy_rows_kernel<T, S><<<launch.grid, launch.block, smem, stream>>>(
        p.rows, p.classes, p.width, static_cast<const T*>(x.raw_data()), t.data<int64_t>(), p.ignore_label,
        static_cast<S>(p.label_smoothing), loss.data<S>(), lse.data<S>());
  });
  KUSARI_CUDA_CHECK_LAUNCH();
  return true;
}

bool softmax_cross_entropy_backward(const Array& x, const Array& t_in, const Array& lse, const Array& g,
                                    const kernels::CrossEntropyParams& p, Array& gx) {
  const Array t = t_in.astype(int64);
  const RowLaunch launch = row_launch(p.rows, p.classes, x.device().index());
  cudaStream_t stream = prepare(x);
  common::visit_floating_dtype(x.dtype(), "softmax_cross_entropy_backward", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    cross_entropy_grad_kernel<T, S><<<launch.grid, launch.block, 0, stream>>>(
        p.rows, p.classes, p.width, static_cast<const T*>(x.raw_data()), t.data<int64_t>(), lse.data<S>(), g.data<S>(),
        static_cast<S>(p.label_smoothing), static_cast<T*>(gx.raw_data()));
  });
  KUSARI_CUDA_CHECK_LAUNCH();
  return true;
}

void register_cuda_reduction_kernels() {
  kernels::reduce.set(DeviceType::kCUDA, &reduce);
  kernels::arg_reduce.set(DeviceType::kCUDA, &arg_reduce);
  kernels::softmax.set(DeviceType::kCUDA, &softmax);
  kernels::softmax_cross_entropy_forward.set(DeviceType::kCUDA, &softmax_cross_entropy_forward);
  kernels::softmax_cross_entropy_backward.set(DeviceType::kCUDA, &softmax_cross_entropy_backward);
}

}  // namespace kusari::cuda
