// CPU thread counts for kusari's own kernels (OpenMP) and for BLAS.
#pragma once

namespace kusari {

/// Sets the threads used by CPU kernels and by BLAS (0 restores the defaults).
void set_num_threads(int n);
/// Sets only the GEMM's threads (OpenBLAS's, and oneDNN's float32 GEMM's: Note [The CPU's GEMM]),
/// e.g. to give the GEMM both cores while small kernels use one.
void set_blas_num_threads(int n);
/// Threads CPU kernels use.
int get_num_threads();
/// Threads BLAS uses (1 when unknown).
int get_blas_num_threads();

}  // namespace kusari
