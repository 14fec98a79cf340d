// CUDA kernels: matrix products through cuBLAS (floating dtypes) and a plain kernel for integers.
//
// Note [cuBLAS operand layout]
// cuBLAS is column-major, so the row-major product C (m, n) = A (m, k) B (k, n) is computed as
// the column-major C^T (n, m) = B^T A^T. An operand goes in without a copy under the CPU's rule
// (Note [BLAS operand layout]): a matrix whose columns are unit-stride (row stride ld) reads,
// column-major, as its own transpose with leading dimension ld, which is exactly what the swapped
// product wants (CUBLAS_OP_N); a transposed view (rows unit-stride, column stride ld) reads as
// the matrix itself and goes in with CUBLAS_OP_T. Other layouts are copied once. The batch axes
// (broadcast ones have stride 0) are compacted like an elementwise loop; the innermost becomes
// the batch of one cublasGemmStridedBatchedEx_64 call (a stride of 0 is allowed there) and any
// others are walked on the host.
// Precision: float32 computes in float32 (CUBLAS_COMPUTE_32F) unless allow_tf32_matmul() permits
// TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32); float16 and bfloat16 read and write 16 bits and
// accumulate in float32 (the handle also forbids reduced-precision split-K reductions), so the
// result is rounded once like the CPU's; float64 computes in float64.
//
// Note [Aligning 16-bit GEMM operands]
// For float16 and bfloat16, cuBLAS's fast kernels (TMA-fed on Hopper) need 16-byte aligned
// pointers, leading dimensions that are multiples of 8 elements, and extents along contiguous axes
// that are multiples of 8; otherwise it falls back to kernels that load one element at a time,
// several times slower. A language model's output layer has exactly that shape: GPT-2's
// 50,257-word vocabulary makes the logits' rows, and the rows of their gradient, 50,257 elements
// long, and on an H100 its three products (cuBLAS's `cutlass_75_..._align1` kernels) took a third
// of the training step; padding the leading dimensions alone left two of the three on those
// kernels. So a large 16-bit product (at least kPadMinFlops) with such an operand or output runs
// on copies in zeroed buffers whose contiguous extents and leading dimensions are rounded up to 8
// (cudaMemcpy2DAsync): the zeros padding the inner axis add nothing, the extra rows and columns of
// the padded output are dropped when it is copied out. The copies cost a pass or two over each
// padded matrix, far less than the slow kernels; the values are the same sums.
// Status: off unless KUSARI_CUBLAS_PAD=1 (read at each large product, so a test can switch it).
// Padding the leading dimensions alone was measured on an H100 (GPT-2 small's step: no change,
// 46.4 against 46.5 ms, and 0.8 GB more at the peak); the extents' padding above has tests
// (tests/unit/cuda/matmul_test.cc) that have not run on a GPU yet, and no measurement: it becomes
// the default once both show the output layer's products right and on the fast kernels.
#include <algorithm>
#include <cstdlib>
#include <vector>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/primitives/kernel_util.cuh"
#include "backends/matrix_layout.h"
#include "kernels/linalg.h"
#include "kusari/core/cuda.h"

namespace kusari::cuda {
namespace {

// --- kernels -------------------------------------------------------------------------------------

// c (batch, m, n) contiguous = a @ b for integers, wrapping like the CPU; batch offsets of a and b
// from `batch_ix` (operands a, b), matrix strides a_rs/a_cs and b_rs/b_cs.
template <typename T>
__global__ void matmul_integer_kernel(int64_t batch, int64_t m, int64_t n, int64_t k,
                                      StridedIndexer<2> batch_ix, const T* a, int64_t a_rs,
                                      int64_t a_cs, const T* b, int64_t b_rs, int64_t b_cs, T* c) {
  const int64_t total = batch * m * n;
  for (int64_t e = grid_start(); e < total; e += grid_step()) {
    const int64_t col = e % n, row = (e / n) % m, bi = e / (m * n);
    int64_t off[2];
    batch_ix.offsets<int64_t>(bi, off);
    const T* ap = a + off[0] + row * a_rs;
    const T* bp = b + off[1] + col * b_cs;
    uint64_t s = 0;
    for (int64_t j = 0; j < k; ++j) {
      s += static_cast<uint64_t>(static_cast<int64_t>(ap[j * a_cs])) *
           static_cast<uint64_t>(static_cast<int64_t>(bp[j * b_rs]));
    }
    c[e] = static_cast<T>(s);
  }
}

// --- launchers -----------------------------------------------------------------------------------

/// Batch geometry of out, a, b over the batch axes (all but the last two), compacted.
StridedIndexer<3> batch_geometry(const Array& out, const Array& a, const Array& b) {
  const int nb = out.ndim() - 2;
  const int64_t m = out.shape()[nb], n = out.shape()[nb + 1];
  int64_t out_strides[kMaxNdim];
  int64_t s = m * n;
  for (int d = nb - 1; d >= 0; --d) {
    out_strides[d] = s;
    s *= out.shape()[d];
  }
  return compact_geometry<3>(nb, out.shape().data(),
                             {out_strides, a.strides().data(), b.strides().data()});
}

struct GemmTypes {
  cudaDataType data;
  cublasComputeType_t compute;
};

/// Products of at least this many multiply-adds have their 16-bit operands aligned (Note
/// [Aligning 16-bit GEMM operands]); below it the copies would cost more than they save.
constexpr double kPadMinFlops = 1 << 26;

/// KUSARI_CUBLAS_PAD=1: Note [Aligning 16-bit GEMM operands] is applied.
bool padding_on() {
  const char* v = std::getenv("KUSARI_CUBLAS_PAD");
  return v != nullptr && v[0] == '1' && v[1] == '\0';
}

int64_t round_up_8(int64_t x) { return (x + 7) / 8 * 8; }

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

/// A cuBLAS operand (`count` vectors of `length` elements, `ld` apart) as it will be read with
/// `plength` x `pcount` extents: itself when those are its own, ld is a multiple of 8 and the data
/// 16-byte aligned; else a copy into a zeroed buffer of the padded extents (kept in `hold`), so
/// that padding along the products' inner axis adds zeros.
const char* padded_operand(const char* p, int64_t length, int64_t count, int64_t plength, int64_t pcount, int64_t& ld,
                           int64_t item, const Array& like, Array& hold, cudaStream_t stream) {
  if (plength == length && pcount == count && ld % 8 == 0 && aligned_16(p)) return p;
  hold = Array::empty({pcount, plength}, like.dtype(), like.device());
  KUSARI_CUDA_CHECK(cudaMemsetAsync(hold.raw_data(), 0, static_cast<size_t>(hold.nbytes()), stream));
  KUSARI_CUDA_CHECK(cudaMemcpy2DAsync(hold.raw_data(), static_cast<size_t>(plength * item), p,
                                      static_cast<size_t>(ld * item), static_cast<size_t>(length * item),
                                      static_cast<size_t>(count), cudaMemcpyDeviceToDevice, stream));
  ld = plength;
  return static_cast<const char*>(hold.raw_data());
}

/// One 2-d 16-bit product C^T (n, m) = op(B^T) op(A^T) run on padded copies (Note [Aligning 16-bit
/// GEMM operands]): every extent that lies along a contiguous axis (n always, as the output's;
/// k where an operand is stored k-contiguous; m where A is) is rounded up to 8, and so is every
/// leading dimension. False when nothing needs it (the caller then runs the product as it is).
bool gemm_aligned_copies(cublasHandle_t handle, cudaStream_t stream, const backends::MatrixOperand& ma,
                         const backends::MatrixOperand& mb, int64_t m, int64_t n, int64_t k, const char* ap,
                         const char* bp, char* cp, int64_t item, const GemmTypes& types, const void* alpha,
                         const void* beta, const Array& out) {
  const bool k_contiguous = mb.transposed || !ma.transposed, m_contiguous = ma.transposed;
  const int64_t np = round_up_8(n), kp = k_contiguous ? round_up_8(k) : k, mp = m_contiguous ? round_up_8(m) : m;
  const bool c_ok = np == n && mp == m && aligned_16(cp);
  if (c_ok && kp == k && ma.ld % 8 == 0 && mb.ld % 8 == 0 && aligned_16(ap) && aligned_16(bp)) return false;
  Array a_hold, b_hold, c_hold;
  int64_t lda = ma.ld, ldb = mb.ld;
  // B^T is (n, k) column-major: k vectors of n (or, stored transposed, n vectors of k); A^T (k, m)
  // likewise.
  bp = mb.transposed ? padded_operand(bp, k, n, kp, np, ldb, item, out, b_hold, stream)
                     : padded_operand(bp, n, k, np, kp, ldb, item, out, b_hold, stream);
  ap = ma.transposed ? padded_operand(ap, m, k, mp, kp, lda, item, out, a_hold, stream)
                     : padded_operand(ap, k, m, kp, mp, lda, item, out, a_hold, stream);
  char* c = cp;
  if (!c_ok) {
    c_hold = Array::empty({mp, np}, out.dtype(), out.device());
    c = static_cast<char*>(c_hold.raw_data());
  }
  KUSARI_CUBLAS_CHECK(cublasGemmEx_64(handle, mb.transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
                                      ma.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, np, mp, kp, alpha, bp, types.data,
                                      ldb, ap, types.data, lda, beta, c, types.data, c_ok ? n : np, types.compute,
                                      CUBLAS_GEMM_DEFAULT));
  if (!c_ok) {
    KUSARI_CUDA_CHECK(cudaMemcpy2DAsync(cp, static_cast<size_t>(n * item), c, static_cast<size_t>(np * item),
                                        static_cast<size_t>(n * item), static_cast<size_t>(m),
                                        cudaMemcpyDeviceToDevice, stream));
  }
  return true;
}

void matmul_cublas(const Array& a_in, const Array& b_in, Array& out) {
  backends::MatrixOperand ma, mb;
  const Array a = backends::blas_operand(a_in, ma), b = backends::blas_operand(b_in, mb);
  const int nd = out.ndim();
  const int64_t m = out.shape()[nd - 2], n = out.shape()[nd - 1], k = a.shape()[nd - 1];
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  if (k == 0) {
    KUSARI_CUDA_CHECK(
        cudaMemsetAsync(out.raw_data(), 0, static_cast<size_t>(out.nbytes()), stream));
    return;
  }
  GemmTypes types{};
  const float alpha_f = 1.0f, beta_f = 0.0f;
  const double alpha_d = 1.0, beta_d = 0.0;
  const void* alpha = &alpha_f;
  const void* beta = &beta_f;
  switch (out.dtype()) {
    case Dtype::kFloat32:
      types = {CUDA_R_32F, allow_tf32_matmul() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F};
      break;
    case Dtype::kFloat16:
      types = {CUDA_R_16F, CUBLAS_COMPUTE_32F};
      break;
    case Dtype::kBFloat16:
      types = {CUDA_R_16BF, CUBLAS_COMPUTE_32F};
      break;
    case Dtype::kFloat64:
      types = {CUDA_R_64F, CUBLAS_COMPUTE_64F};
      alpha = &alpha_d;
      beta = &beta_d;
      break;
    default:
      KUSARI_ASSERT(false, "matmul_cublas: dtype ", dtype_name(out.dtype()));
  }
  cublasHandle_t handle = cublas_handle(device);
  const StridedIndexer<3> bix = batch_geometry(out, a, b);
  const int inner = bix.ndim - 1;
  int64_t batch = bix.sizes[inner];
  int64_t outer = 1;
  for (int d = 0; d < inner; ++d) outer *= bix.sizes[d];
  const int64_t item = out.itemsize();
  const char* ap = static_cast<const char*>(a.raw_data());
  const char* bp = static_cast<const char*>(b.raw_data());
  char* cp = static_cast<char*>(out.raw_data());
  // A batch of products sharing one b (batch stride 0) whose rows of a and of the output follow
  // one another in memory, as a Linear layer applied to (batch, length, features), is one product
  // of batch * m rows: one GEMM instead of a strided batch, and eligible for aligned copies.
  int64_t rows = m;
  if (outer == 1 && batch > 1 && bix.strides[2][inner] == 0 && !ma.transposed &&
      bix.strides[1][inner] == m * ma.ld && bix.strides[0][inner] == m * n) {
    rows = batch * m;
    batch = 1;
  }
  if (outer == 1 && batch == 1 && item == 2 && static_cast<double>(rows) * n * k >= kPadMinFlops && padding_on() &&
      gemm_aligned_copies(handle, stream, ma, mb, rows, n, k, ap, bp, cp, item, types, alpha, beta, out)) {
    return;
  }
  for (int64_t o = 0; o < outer; ++o) {
    // Offsets of this outer batch position (walking the outer batch axes in C order).
    int64_t off_c = 0, off_a = 0, off_b = 0, rest = o;
    for (int d = inner - 1; d >= 0; --d) {
      const int64_t i = rest % bix.sizes[d];
      rest /= bix.sizes[d];
      off_c += i * bix.strides[0][d];
      off_a += i * bix.strides[1][d];
      off_b += i * bix.strides[2][d];
    }
    // C^T (n, m) = op(B^T) (n, k) op(A^T) (k, m); see Note [cuBLAS operand layout].
    KUSARI_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
        handle, mb.transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
        ma.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, n, rows, k, alpha, bp + off_b * item, types.data,
        mb.ld, bix.strides[2][inner], ap + off_a * item, types.data, ma.ld, bix.strides[1][inner],
        beta, cp + off_c * item, types.data, n, bix.strides[0][inner], batch, types.compute,
        CUBLAS_GEMM_DEFAULT));
  }
}

template <typename T>
void matmul_integer(const Array& a, const Array& b, Array& out) {
  const int nd = out.ndim();
  const int64_t m = out.shape()[nd - 2], n = out.shape()[nd - 1], k = a.shape()[nd - 1];
  const int64_t batch = out.size() / (m * n);
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  const StridedIndexer<2> bix =
      compact_geometry<2>(nd - 2, out.shape().data(), {a.strides().data(), b.strides().data()});
  matmul_integer_kernel<T><<<grid_for(out.size(), device), kBlockSize, 0, stream>>>(
      batch, m, n, k, bix, static_cast<const T*>(a.raw_data()), a.strides()[nd - 2],
      a.strides()[nd - 1], static_cast<const T*>(b.raw_data()), b.strides()[nd - 2],
      b.strides()[nd - 1], static_cast<T*>(out.raw_data()));
  KUSARI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void matmul(const Array& a, const Array& b, Array& out) {
  const int nd = out.ndim();
  if (out.shape()[nd - 2] == 0 || out.shape()[nd - 1] == 0) return;
  switch (a.dtype()) {
    case Dtype::kFloat32:
    case Dtype::kFloat64:
    case Dtype::kFloat16:
    case Dtype::kBFloat16:
      return matmul_cublas(a, b, out);
    case Dtype::kInt32:
      return matmul_integer<int32_t>(a, b, out);
    case Dtype::kInt64:
      return matmul_integer<int64_t>(a, b, out);
    default:
      KUSARI_THROW(DtypeError, "matmul: not supported for dtype ", dtype_name(a.dtype()));
  }
}

void register_cuda_linalg_kernels() {
  kernels::matmul.set(DeviceType::kCUDA, &matmul);
}

}  // namespace kusari::cuda
