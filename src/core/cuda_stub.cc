// The CUDA utilities of a build without CUDA (see kusari/core/cuda.h).
#include "kusari/config.h"
#include "kusari/core/cuda.h"

#if !KUSARI_HAVE_CUDA
namespace kusari::cuda {

MemoryStats memory_stats(int) { return {}; }
void empty_cache() {}
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }

}  // namespace kusari::cuda
#endif
