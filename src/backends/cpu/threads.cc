#include "kusari/core/threads.h"

#include <thread>

#include "kusari/config.h"
#if KUSARI_HAVE_OPENMP
#include <omp.h>
#endif
#if defined(KUSARI_BLAS_OPENBLAS)
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}
#endif

namespace kusari {

namespace {
int default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}
}  // namespace

void set_num_threads(int n) {
  if (n <= 0) n = default_threads();
#if KUSARI_HAVE_OPENMP
  omp_set_num_threads(n);
#endif
  set_blas_num_threads(n);
}

void set_blas_num_threads(int n) {
  if (n <= 0) n = default_threads();
#if defined(KUSARI_BLAS_OPENBLAS)
  openblas_set_num_threads(n);
#else
  (void)n;
#endif
}

int get_num_threads() {
#if KUSARI_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int get_blas_num_threads() {
#if defined(KUSARI_BLAS_OPENBLAS)
  return openblas_get_num_threads();
#else
  return 1;
#endif
}

}  // namespace kusari
