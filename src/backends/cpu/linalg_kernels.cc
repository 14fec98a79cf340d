// CPU kernels: matrix products (Note [The CPU's GEMM] in gemm.h).
#include <vector>

#include "backends/matrix_layout.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gemm.h"
#include "kernels/linalg.h"
#include "backends/cpu/loops.h"
#include "kusari/core/routines.h"

namespace kusari::cpu {
namespace {


template <typename T>
void matmul_blas(const Array& a_in, const Array& b_in, Array& out) {
  backends::MatrixOperand ma, mb;
  const Array a = backends::blas_operand(a_in, ma), b = backends::blas_operand(b_in, mb);
  const int nd = out.ndim();
  const int64_t m = out.shape()[nd - 2], n = out.shape()[nd - 1], k = a.shape()[nd - 1];
  if (m == 0 || n == 0) return;
  T* c = out.data<T>();
  if (k == 0) {
    std::fill(c, c + out.size(), T(0));
    return;
  }
  const int64_t batch = out.size() / (m * n);
  const T* ap = static_cast<const T*>(a.raw_data());
  const T* bp = static_cast<const T*>(b.raw_data());
  // Batch offsets in elements, walking the (broadcast) batch axes in C order.
  Shape batch_shape(out.shape().begin(), out.shape().end() - 2);
  std::vector<int64_t> idx(batch_shape.size(), 0);
  for (int64_t i = 0; i < batch; ++i) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < batch_shape.size(); ++d) {
      oa += idx[d] * a.strides()[d];
      ob += idx[d] * b.strides()[d];
    }
    gemm(ma.transposed, mb.transposed, m, n, k, T(1), ap + oa, ma.ld, bp + ob, mb.ld, T(0), c + i * m * n, n);
    for (int d = batch_shape.size() - 1; d >= 0; --d) {
      if (++idx[d] < batch_shape[d]) break;
      idx[d] = 0;
    }
  }
}

template <typename T>
void matmul_naive(const Array& a, const Array& b, Array& out) {
  // Integer matmul (rare): straightforward triple loop over contiguous copies.
  Array ac = a.contiguous(), bc = b.contiguous();
  const int nd = out.ndim();
  const int64_t m = out.shape()[nd - 2], n = out.shape()[nd - 1], k = a.shape()[nd - 1];
  const int64_t batch = m * n == 0 ? 0 : out.size() / (m * n);
  Shape bshape(out.shape().begin(), out.shape().end() - 2);
  std::vector<int64_t> idx(bshape.size(), 0);
  T* c = out.data<T>();
  for (int64_t i = 0; i < batch; ++i) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < bshape.size(); ++d) {
      oa += idx[d] * ac.strides()[d];
      ob += idx[d] * bc.strides()[d];
    }
    const T* ap = ac.data<T>() + oa;
    const T* bp = bc.data<T>() + ob;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t col = 0; col < n; ++col) {
        compute_t<T> s = 0;
        for (int64_t j = 0; j < k; ++j) s += static_cast<compute_t<T>>(ap[r * k + j]) * static_cast<compute_t<T>>(bp[j * n + col]);
        c[i * m * n + r * n + col] = static_cast<T>(s);
      }
    }
    for (int d = bshape.size() - 1; d >= 0; --d) {
      if (++idx[d] < bshape[d]) break;
      idx[d] = 0;
    }
  }
}

// A float32 copy of a 16-bit operand in the same layout: a transposed view (W.T in linear) is
// converted through its contiguous transpose, so the conversion reads memory in order and BLAS
// gets the transposed flag instead of a strided copy.
Array widen_operand(const Array& a) {
  const int nd = a.ndim();
  const backends::MatrixOperand m = backends::describe_matrix(a);
  if (m.usable && m.transposed && nd >= 2) {
    return a.swapaxes(nd - 1, nd - 2).astype(Dtype::kFloat32).swapaxes(nd - 1, nd - 2);
  }
  return a.astype(Dtype::kFloat32);
}

}  // namespace

void matmul(const Array& a, const Array& b, Array& out) {
  switch (a.dtype()) {
    case Dtype::kFloat32:
      return matmul_blas<float>(a, b, out);
    case Dtype::kFloat64:
      return matmul_blas<double>(a, b, out);
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      // 16-bit floats: compute in float32 with BLAS, round once (Note [Half conversion on the CPU]).
      Array a32 = widen_operand(a), b32 = widen_operand(b);
      Array o32 = Array::empty(out.shape(), Dtype::kFloat32, out.device());
      matmul_blas<float>(a32, b32, o32);
      copy(o32, out);
      return;
    }
    case Dtype::kInt32:
      return matmul_naive<int32_t>(a, b, out);
    case Dtype::kInt64:
      return matmul_naive<int64_t>(a, b, out);
    default:
      KUSARI_THROW(DtypeError, "matmul: not supported for dtype ", dtype_name(a.dtype()));
  }
}

void register_cpu_linalg_kernels() {
  kernels::matmul.set(DeviceType::kCPU, &matmul);
}

}  // namespace kusari::cpu
