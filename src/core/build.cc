#include "kusari/core/build.h"

#include "kusari/config.h"

namespace kusari {

const BuildInfo& build_info() {
  static const BuildInfo info{KUSARI_VERSION,       KUSARI_HAVE_CUDA != 0,   KUSARI_HAVE_NCCL != 0,
                              KUSARI_HAVE_DNNL != 0, KUSARI_HAVE_OPENMP != 0, KUSARI_HAVE_MPI != 0,
                              KUSARI_HAVE_CAIRO != 0, KUSARI_BLAS_NAME};
  return info;
}

}  // namespace kusari
