// CUDA device utilities that user code may need: memory-pool statistics, releasing the cache,
// the TF32 switch. In a build without CUDA they report no devices and do nothing.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kusari::cuda {

/// Statistics of one device's caching memory pool.
struct MemoryStats {
  /// Bytes handed out to arrays right now.
  size_t in_use_bytes = 0;
  /// Bytes held by the pool (in use + cached free blocks).
  size_t reserved_bytes = 0;
  /// The largest in_use_bytes seen.
  size_t peak_in_use_bytes = 0;
  /// Calls to cudaMalloc / cudaFree made by the pool.
  int64_t device_allocations = 0;
  int64_t device_frees = 0;
};

/// The pool statistics of GPU `device`.
MemoryStats memory_stats(int device = 0);
/// Returns every cached free block of every device to the driver (never done in the hot loop).
void empty_cache();
/// Lets float32 matrix products and convolutions use TF32 tensor cores (faster, ~10 bits of
/// mantissa in the products). Off by default; also KUSARI_ALLOW_TF32=1.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace kusari::cuda
