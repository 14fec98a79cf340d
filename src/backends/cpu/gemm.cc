// The CPU's GEMM (Note [The CPU's GEMM] in gemm.h).
#include "backends/cpu/gemm.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <limits>

#include "kusari/config.h"
#include "kusari/core/error.h"
#include "kusari/core/threads.h"

#if KUSARI_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif
#if KUSARI_HAVE_OPENMP
#include <omp.h>
#endif

namespace kusari::cpu {
namespace {

CBLAS_TRANSPOSE cblas_op(bool t) { return t ? CblasTrans : CblasNoTrans; }

int blas_int(int64_t v, const char* what) {
  if (v > std::numeric_limits<int>::max()) {
    KUSARI_THROW(ValueError, "gemm: ", what, " = ", v, " exceeds CBLAS's 32-bit sizes (at most ",
                 std::numeric_limits<int>::max(), ")");
  }
  return static_cast<int>(v);
}

bool use_onednn() {
#if KUSARI_HAVE_DNNL
  static const bool use = [] {
    const char* env = std::getenv("KUSARI_CPU_GEMM");
    return env == nullptr || std::strcmp(env, "blas") != 0;
  }();
  return use;
#else
  return false;
#endif
}

}  // namespace

const char* float32_gemm_library() { return use_onednn() ? "onednn" : "blas"; }

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
#if KUSARI_HAVE_DNNL
  if (use_onednn()) {
    // oneDNN runs on OpenMP's threads: give it the BLAS thread count (set_blas_num_threads) for
    // this call, so that the kernels' and the GEMM's counts stay separate, as with OpenBLAS.
    // (Inside a parallel region it runs on the calling thread alone.)
#if KUSARI_HAVE_OPENMP
    const int kernel_threads = omp_get_max_threads(), gemm_threads = get_blas_num_threads();
    const bool switch_threads = gemm_threads != kernel_threads && !omp_in_parallel();
    if (switch_threads) omp_set_num_threads(gemm_threads);
    struct Restore {
      bool on;
      int n;
      ~Restore() {
        if (on) omp_set_num_threads(n);
      }
    } restore{switch_threads, kernel_threads};
#endif
    const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb,
                                            beta, c, ldc);
    if (status != dnnl_success) {
      KUSARI_THROW(Error, "gemm: oneDNN's sgemm failed (status ", static_cast<int>(status), ") for m ", m,
                   ", n ", n, ", k ", k, ", lda ", lda, ", ldb ", ldb, ", ldc ", ldc);
    }
    return;
  }
#endif
  cblas_sgemm(CblasRowMajor, cblas_op(trans_a), cblas_op(trans_b), blas_int(m, "m"), blas_int(n, "n"),
              blas_int(k, "k"), alpha, a, blas_int(lda, "lda"), b, blas_int(ldb, "ldb"), beta, c,
              blas_int(ldc, "ldc"));
}

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, cblas_op(trans_a), cblas_op(trans_b), blas_int(m, "m"), blas_int(n, "n"),
              blas_int(k, "k"), alpha, a, blas_int(lda, "lda"), b, blas_int(ldb, "ldb"), beta, c,
              blas_int(ldc, "ldc"));
}

}  // namespace kusari::cpu
