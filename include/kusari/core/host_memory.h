// Statistics of the host memory that CPU arrays hold (the counterpart of kusari::cuda's
// memory_stats), and the release of the cache of large free blocks (Note [CPU allocation]).
#pragma once

#include <cstddef>

namespace kusari {

/// The host memory of CPU arrays.
struct HostMemoryStats {
  /// Bytes of the blocks handed out to arrays right now (each request rounded up to its block).
  size_t in_use_bytes = 0;
  /// Bytes of large free blocks kept for reuse.
  size_t cached_bytes = 0;
  /// The largest in_use_bytes seen (since the last reset_cpu_peak_memory_stats).
  size_t peak_in_use_bytes = 0;
  /// Bytes the arrays in use asked for, and the largest value seen.
  size_t requested_bytes = 0;
  size_t peak_requested_bytes = 0;
};

/// The statistics now (thread-safe).
HostMemoryStats cpu_memory_stats();
/// Makes the peaks the current values, so that later peaks are those of what runs next.
void reset_cpu_peak_memory_stats();
/// Frees the cached large blocks (never needed in a training loop; before measuring a new phase).
void cpu_empty_cache();

}  // namespace kusari
