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
//
// Note [Graph memory pools]
// A CUDA graph (kusari::cuda::Graph) replays the kernels it recorded with the addresses they had
// at capture time, so the memory those kernels touch must stay the graph's for as long as the
// graph may be replayed. While a device is capturing, its pool therefore serves every request
// from a private pool of the graph:
//   - a request takes a free block of the private pool (same size classes and reuse rule), else
//     a new block from the driver (captures run in relaxed mode, where cudaMalloc is allowed);
//   - a block released during the capture goes to the private pool's free list, wherever it
//     came from: the recorded kernels may have read it, so it must not be handed to arrays
//     outside the graph; reusing it inside the capture is safe because a graph built from one
//     stream replays in the order it was recorded;
//   - after the capture, blocks of the private pool that arrays still hold (the gradients and
//     outputs the graph rewrites on every replay) return to the private pool when released, so
//     eager code never gets memory a replay writes into;
//   - when the graph is destroyed its private pool is dissolved: its free blocks join the
//     device's free lists and the blocks still held return there when released.
// Each device's pool has its own mutex, so arrays may be created and released from any thread.
// The pool is never destroyed (Note [Backend lifetime]), so arrays released during static
// destruction only touch the free lists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <atomic>
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
  /// Sets the device's peaks to the current values.
  void reset_peaks(int device);
  /// Synchronises `device` and returns its cached free blocks to the driver.
  void release_cached(int device);

  /// The memory of one CUDA graph (see Note [Graph memory pools]); opaque outside the pool.
  struct PrivatePool;
  /// Serves `device`'s requests from a new private pool until end_capture(); returns it.
  std::shared_ptr<PrivatePool> begin_capture(int device);
  /// Serves `device`'s requests from its shared free lists again.
  void end_capture(int device);
  /// Dissolves a private pool whose graph is gone (its memory returns to the device's pool).
  void release_private(int device, const std::shared_ptr<PrivatePool>& pool);
  /// True while `device` is capturing (lock-free; for the checks of the backend).
  bool capturing(int device) const;

 private:
  using FreeLists = std::map<size_t, std::vector<void*>>;  // block size -> blocks
  struct Block {
    size_t size = 0;       // the block's bytes
    size_t requested = 0;  // the bytes the array asked for
    std::shared_ptr<PrivatePool> owner;  // null: the device's shared free lists
  };
  struct DevicePool {
    mutable std::mutex mutex;
    FreeLists free_blocks;
    std::unordered_map<void*, Block> live;  // block -> size and owner
    MemoryStats stats;
    std::shared_ptr<PrivatePool> capture;   // the pool requests go to while capturing
    std::atomic<bool> capturing{false};
  };

  DevicePool& pool(int device) const;
  void release_cached_locked(int device, DevicePool& p);

  std::vector<std::unique_ptr<DevicePool>> pools_;
};

/// The process-wide pool (created with the backend).
MemoryPool& memory_pool();

}  // namespace kusari::cuda
