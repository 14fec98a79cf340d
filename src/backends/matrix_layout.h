// How a matrix operand (the last two axes of a view) is handed to a BLAS library, shared by the
// CPU (CBLAS) and CUDA (cuBLAS) matmul kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kusari/core/array.h"

namespace kusari::backends {

// Note [BLAS operand layout]
// A matrix operand goes to BLAS without a copy when one of its axes is unit-stride: row-major
// with leading dimension = the row stride, or column-major, passed as the transpose, with leading
// dimension = the column stride. That covers the transposed views that backward rules produce
// (x.T @ gy). Other layouts are copied once to be contiguous.
struct MatrixOperand {
  bool transposed = false;
  int64_t ld = 0;
  bool usable = false;
};

/// The BLAS description of the last two axes of `a` (usable == false: copy it first).
inline MatrixOperand describe_matrix(const Array& a) {
  const int nd = a.ndim();
  const int64_t rows = a.shape()[nd - 2], cols = a.shape()[nd - 1];
  const int64_t rs = a.strides()[nd - 2], cs = a.strides()[nd - 1];
  MatrixOperand m;
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1)) {
    m.ld = std::max<int64_t>(rs, std::max<int64_t>(cols, 1));
    m.usable = true;
  } else if ((rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1)) {
    m.transposed = true;
    m.ld = std::max<int64_t>(cs, std::max<int64_t>(rows, 1));
    m.usable = true;
  }
  if (rows == 1 && cols == 1) {
    m.transposed = false;
    m.ld = 1;
    m.usable = true;
  }
  return m;
}

/// `a` as BLAS takes it: `a` itself when describe_matrix finds it usable, else a contiguous copy;
/// `m` receives the description of the array returned.
inline Array blas_operand(const Array& a, MatrixOperand& m) {
  m = describe_matrix(a);
  if (m.usable) return a;
  Array copy = a.copy();
  m = describe_matrix(copy);
  return copy;
}

}  // namespace kusari::backends
