// Row-major matrix products on the CPU for every kernel that needs one (matmul, the blocked
// attention, im2col convolutions): C = alpha op(A) op(B) + beta C.
//
// Note [The CPU's GEMM]: float32 goes through oneDNN's sgemm when the build has oneDNN, and
// through CBLAS otherwise; float64 always through CBLAS. oneDNN chooses its kernels from the
// instruction sets the running CPU reports (AVX-512, AMX), while OpenBLAS 0.3.21, Debian 12's,
// identifies CPUs by model and runs its generic SSE3 kernels on those it does not know (virtual
// machines that hide the model, processors newer than the release): 5-6 times slower on the
// transformer's shapes on a 2-core Xeon VM (docs/benchmarks.md, "The CPU's GEMM").
// KUSARI_CPU_GEMM=blas in the environment forces CBLAS for float32 too (for comparisons).
#pragma once

#include <cstdint>

namespace kusari::cpu {

void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
          const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

/// "onednn" or "blas": what float32 products run on in this process.
const char* float32_gemm_library();

}  // namespace kusari::cpu
