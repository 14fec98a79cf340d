// Strided loops over several arrays of one shape, for the CPU kernels.
//
// Note [Strided loops]
// An elementwise kernel sees operands as views of the output's shape (broadcast axes have stride
// 0). StridedLoop drops length-1 axes and merges axes that are contiguous with their inner
// neighbour in every operand, so a contiguous or simply broadcast case becomes one flat row
// that the compiler vectorises. The remaining outer axes are walked with a counter; each call of
// the row function gets N pointers, the row length and N byte strides. Large loops are split
// across OpenMP threads by rows (or, with a single long row, by chunks of it).
// Before merging, the axes are put in the output's stride order (Note [Axis order of strided
// loops]), so channels-last operands merge too; loops whose row function relies on C order
// (the reductions' accumulator walk, the arg-reductions' running index) ask for C order.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "backends/common/axis_order.h"
#include "backends/common/compute_type.h"
#include "kusari/config.h"
#include "kusari/core/array.h"

#if KUSARI_HAVE_OPENMP
#include <omp.h>
#endif

namespace kusari::cpu {

/// Work (elements x cost) below which a kernel stays on one thread: smaller loops do not pay
/// for waking threads, and spinning OpenMP threads hurt when the cores are shared.
inline constexpr int64_t kParallelGrain = 1 << 18;

/// Threads OpenMP would use for a parallel region (1 without OpenMP).
inline int max_threads() {
#if KUSARI_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// Runs f(begin, end) over [0, n) split into contiguous chunks, in parallel when n * cost is large.
template <typename F>
void parallel_for(int64_t n, int64_t cost_per_item, F&& f) {
#if KUSARI_HAVE_OPENMP
  int threads = max_threads();
  if (threads > 1 && n > 1 && n * cost_per_item >= kParallelGrain && !omp_in_parallel()) {
    int chunks = static_cast<int>(std::min<int64_t>(threads, n));
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
    for (int c = 0; c < chunks; ++c) {
      int64_t begin = n * c / chunks;
      int64_t end = n * (c + 1) / chunks;
      f(begin, end);
    }
    return;
  }
#endif
  f(int64_t{0}, n);
}

template <int N>
class StridedLoop {
 public:
  /// `arrays` are views of `shape` (out first by convention). With `order_by_output` the axes
  /// are walked in the output's stride order; without it, in C order.
  StridedLoop(const Shape& shape, const std::array<const Array*, N>& arrays, bool order_by_output = true) {
    for (int k = 0; k < N; ++k) base_[k] = static_cast<char*>(arrays[k]->raw_data());
    // Collect non-trivial axes (in bytes), then merge contiguous neighbours.
    ndim_ = 0;
    for (int d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      shape_[ndim_] = shape[d];
      for (int k = 0; k < N; ++k) strides_[k][ndim_] = arrays[k]->strides()[d] * arrays[k]->itemsize();
      ++ndim_;
    }
    size_ = 1;
    for (int d = 0; d < shape.size(); ++d) size_ *= shape[d];
    if (ndim_ == 0) {
      shape_[0] = 1;
      for (int k = 0; k < N; ++k) strides_[k][0] = 0;
      ndim_ = 1;
      return;
    }
    if (order_by_output) common::order_axes_by_output<N>(ndim_, shape_, strides_);
    int out = ndim_ - 1;
    for (int d = ndim_ - 2; d >= 0; --d) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k) {
        if (strides_[k][d] != strides_[k][out] * shape_[out]) {
          mergeable = false;
          break;
        }
      }
      if (mergeable) {
        shape_[out] *= shape_[d];
      } else {
        --out;
        shape_[out] = shape_[d];
        for (int k = 0; k < N; ++k) strides_[k][out] = strides_[k][d];
      }
    }
    // Shift the merged axes to the front.
    int n = ndim_ - out;
    for (int d = 0; d < n; ++d) {
      shape_[d] = shape_[d + out];
      for (int k = 0; k < N; ++k) strides_[k][d] = strides_[k][d + out];
    }
    ndim_ = n;
  }

  int64_t size() const { return size_; }
  int ndim() const { return ndim_; }
  int64_t inner_size() const { return shape_[ndim_ - 1]; }
  int64_t inner_stride(int k) const { return strides_[k][ndim_ - 1]; }
  int64_t outer_size() const { return size_ == 0 ? 0 : size_ / shape_[ndim_ - 1]; }
  int64_t dim(int d) const { return shape_[d]; }
  int64_t stride(int k, int d) const { return strides_[k][d]; }

  /// Calls row(ptrs, n, strides) for every row; rows split over threads when `parallel`.
  /// `cost` is a rough per-element cost (1 for a simple elementwise op).
  template <typename Row>
  void run(Row&& row, bool parallel = true, int64_t cost = 1) const {
    if (size_ == 0) return;
    const int64_t inner = inner_size();
    std::array<int64_t, N> inner_strides;
    for (int k = 0; k < N; ++k) inner_strides[k] = inner_stride(k);
    const int64_t rows = outer_size();
    if (!parallel) {
      run_rows(0, rows, 0, inner, inner_strides, row);
      return;
    }
    if (rows == 1) {
      // One long row: split the row itself.
      parallel_for(inner, cost, [&](int64_t b, int64_t e) { run_rows(0, 1, b, e, inner_strides, row); });
    } else {
      parallel_for(rows, inner * cost, [&](int64_t b, int64_t e) { run_rows(b, e, 0, inner, inner_strides, row); });
    }
  }

 private:
  template <typename Row>
  void run_rows(int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                const std::array<int64_t, N>& inner_strides, Row& row) const {
    if (row_begin >= row_end) return;
    const int outer_nd = ndim_ - 1;
    std::array<int64_t, kMaxNdim> idx{};
    // Multi-index of row_begin over the outer axes.
    int64_t r = row_begin;
    for (int d = outer_nd - 1; d >= 0; --d) {
      idx[d] = r % shape_[d];
      r /= shape_[d];
    }
    std::array<char*, N> ptrs;
    for (int k = 0; k < N; ++k) {
      char* p = base_[k] + col_begin * inner_strides[k];
      for (int d = 0; d < outer_nd; ++d) p += idx[d] * strides_[k][d];
      ptrs[k] = p;
    }
    const int64_t n = col_end - col_begin;
    for (int64_t rr = row_begin; rr < row_end; ++rr) {
      row(ptrs.data(), n, inner_strides.data());
      // Advance the counter over the outer axes.
      for (int d = outer_nd - 1; d >= 0; --d) {
        ++idx[d];
        for (int k = 0; k < N; ++k) ptrs[k] += strides_[k][d];
        if (idx[d] < shape_[d]) break;
        for (int k = 0; k < N; ++k) ptrs[k] -= strides_[k][d] * shape_[d];
        idx[d] = 0;
      }
    }
  }

  std::array<char*, N> base_{};
  int64_t shape_[kMaxNdim] = {};
  int64_t strides_[N][kMaxNdim] = {};
  int ndim_ = 0;
  int64_t size_ = 0;
};

using common::compute_t;

/// The type sums are accumulated in: double for floats, int64 for integers.
template <typename T>
using accum_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;

}  // namespace kusari::cpu
