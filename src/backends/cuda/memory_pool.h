// The caching device-memory pool of the CUDA backend: one pool per GPU, CuPy/PyTorch style.
//
// Note [Caching memory pool]
// cudaMalloc and cudaFree are slow (cudaFree synchronises the device), and a training loop asks
// for the same sizes every iteration. So freed blocks are never returned to the driver in the
// steady state: they go to a free list of their device, keyed by block size, and the next request
// of that size class gets one back without a driver call.
//   - Size classes: a request is rounded up to a multiple of 512 bytes up to 1 MiB, and above that
//     to a multiple of 1/8 of its power of two (at most 12.5% slack): 1 MiB + 1 byte becomes
//     1.125 MiB, 100 MiB becomes 104 MiB. Zero-byte requests get a 512-byte block (an Array's
//     storage must be non-null).
//   - Reuse: a small request takes a free block of exactly its class; a large one (> 1 MiB) takes
//     the smallest free block of its class or up to 1/4 larger, so that slightly different large
//     sizes (the last batch of an epoch) still hit the cache. Blocks are not split.
//   - A free block may be handed out again at once, while kernels queued before its release may
//     still read it: that is safe because all work of a device runs on its one compute stream in
//     order (Note [One compute stream per device]). Code that uses a block on another stream (the
//     NCCL communicators) must make the compute stream wait for that work before the block's array
//     is released.
//   - When cudaMalloc fails, the pool synchronises the device, returns every cached free block of
//     that device to the driver and tries once more; a second failure raises DeviceError with the
//     requested size, what the pool holds and what the driver reports as free.
//   - empty_cache() returns all cached free blocks (after synchronising); memory_stats() reports
//     bytes in use (by block size), bytes reserved (in use + cached), the peak in use and the
//     number of driver calls.
// Each device's pool has its own mutex, so arrays may be created and released from any thread.
// The pool is never destroyed (Note [Backend lifetime]), so arrays released during static
// destruction only touch the free lists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kusari/core/cuda.h"

namespace kusari::cuda {

class MemoryPool {
 public:
  /// A pool for `device_count` GPUs (device indices are checked by the backend before use).
  explicit MemoryPool(int device_count);

  /// The size class a request of `nbytes` is served from (see Note [Caching memory pool]).
  static size_t round_size(size_t nbytes);

  /// A block of at least `nbytes` on `device`; throws DeviceError when the GPU is out of memory.
  void* allocate(int device, size_t nbytes);
  /// Returns a block from allocate() to the device's free list (no driver call).
  void deallocate(int device, void* ptr);
  /// Statistics of one device's pool.
  MemoryStats stats(int device) const;
  /// Synchronises `device` and returns its cached free blocks to the driver.
  void release_cached(int device);

 private:
  struct DevicePool {
    mutable std::mutex mutex;
    std::map<size_t, std::vector<void*>> free_blocks;  // block size -> blocks
    std::unordered_map<void*, size_t> live;             // block -> block size
    MemoryStats stats;
  };

  DevicePool& pool(int device) const;
  void release_cached_locked(int device, DevicePool& p);

  std::vector<std::unique_ptr<DevicePool>> pools_;
};

/// The process-wide pool (created with the backend).
MemoryPool& memory_pool();

}  // namespace kusari::cuda
