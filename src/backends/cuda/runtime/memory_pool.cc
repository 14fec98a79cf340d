// The caching device-memory pool; see Note [Caching memory pool].
#include "backends/cuda/runtime/memory_pool.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>

#include "backends/cuda/runtime/cuda_backend.h"
#include "kusari/core/error.h"

namespace kusari::cuda {
namespace {

constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
constexpr size_t kSmallStep = 512;

std::string format_bytes(size_t n) {
  const double mib = static_cast<double>(n) / (1024.0 * 1024.0);
  return detail::concat(n, " bytes (", static_cast<int64_t>(mib * 10.0 + 0.5) / 10.0, " MiB)");
}

}  // namespace

MemoryPool::MemoryPool(int device_count) {
  pools_.reserve(static_cast<size_t>(device_count));
  for (int d = 0; d < device_count; ++d) pools_.push_back(std::make_unique<DevicePool>());
}

size_t MemoryPool::round_size(size_t nbytes) {
  if (nbytes <= kSmallLimit) {
    return std::max<size_t>((nbytes + kSmallStep - 1) / kSmallStep * kSmallStep, kSmallStep);
  }
  const size_t step = std::bit_floor(nbytes) / 8;
  return (nbytes + step - 1) / step * step;
}

MemoryPool::DevicePool& MemoryPool::pool(int device) const {
  KUSARI_ASSERT(device >= 0 && static_cast<size_t>(device) < pools_.size(), "memory pool: device ",
                device, " of ", pools_.size());
  return *pools_[static_cast<size_t>(device)];
}

struct MemoryPool::PrivatePool {
  FreeLists free_blocks;
  bool alive = true;  // false once its graph is gone
};

namespace {

/// Takes a cached block for a request of class `size` from `lists` (a small request takes its
/// exact class, a large one the smallest block up to 1/4 larger); null when there is none.
void* take_cached(std::map<size_t, std::vector<void*>>& lists, size_t size, size_t* block) {
  const size_t accept = size <= kSmallLimit ? size : size + size / 4;
  auto it = lists.lower_bound(size);
  if (it == lists.end() || it->first > accept) return nullptr;
  void* ptr = it->second.back();
  *block = it->first;
  it->second.pop_back();
  if (it->second.empty()) lists.erase(it);
  return ptr;
}

void count_request(MemoryStats& stats, size_t nbytes) {
  stats.requested_bytes += nbytes;
  stats.peak_requested_bytes = std::max(stats.peak_requested_bytes, stats.requested_bytes);
}

}  // namespace

void* MemoryPool::allocate(int device, size_t nbytes) {
  const size_t size = round_size(nbytes);
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  size_t block = 0;
  void* ptr = take_cached(p.capture ? p.capture->free_blocks : p.free_blocks, size, &block);
  if (ptr) {
    p.live.emplace(ptr, Block{block, nbytes, p.capture});
    p.stats.in_use_bytes += block;
    p.stats.peak_in_use_bytes = std::max(p.stats.peak_in_use_bytes, p.stats.in_use_bytes);
    count_request(p.stats, nbytes);
    return ptr;
  }
  set_device(device);
  cudaError_t status = cudaMalloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation && !p.capture) {
    cudaGetLastError();  // clear the (non-sticky) error before retrying
    release_cached_locked(device, p);
    status = cudaMalloc(&ptr, size);
  }
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) cudaGetLastError();
    KUSARI_THROW(DeviceError, "cuda:", device, ": out of memory allocating ", format_bytes(nbytes),
                 " (a block of ", format_bytes(size), "); kusari's pool holds ",
                 format_bytes(p.stats.reserved_bytes), " of which ",
                 format_bytes(p.stats.in_use_bytes), " are in use by arrays; the driver reports ",
                 format_bytes(free_bytes), " free of ", format_bytes(total_bytes),
                 p.capture ? " (during a CUDA graph capture, cached blocks are not released)" : "",
                 ". Release arrays or use a smaller batch.");
  }
  check_cuda(status, "cudaMalloc", __FILE__, __LINE__);
  ++p.stats.device_allocations;
  p.stats.reserved_bytes += size;
  p.live.emplace(ptr, Block{size, nbytes, p.capture});
  p.stats.in_use_bytes += size;
  p.stats.peak_in_use_bytes = std::max(p.stats.peak_in_use_bytes, p.stats.in_use_bytes);
  count_request(p.stats, nbytes);
  return ptr;
}

void MemoryPool::deallocate(int device, void* ptr) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.live.find(ptr);
  KUSARI_ASSERT(it != p.live.end(), "memory pool: cuda:", device, " does not own block ", ptr);
  const size_t size = it->second.size;
  p.stats.requested_bytes -= it->second.requested;
  std::shared_ptr<PrivatePool> owner = std::move(it->second.owner);
  p.live.erase(it);
  p.stats.in_use_bytes -= size;
  // Note [Graph memory pools]: released while capturing, a block becomes the graph's.
  if (p.capture) owner = p.capture;
  if (owner && owner->alive) {
    owner->free_blocks[size].push_back(ptr);
  } else {
    p.free_blocks[size].push_back(ptr);
  }
}

std::shared_ptr<MemoryPool::PrivatePool> MemoryPool::begin_capture(int device) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  KUSARI_ASSERT(!p.capture, "memory pool: cuda:", device, " is already capturing");
  p.capture = std::make_shared<PrivatePool>();
  p.capturing.store(true, std::memory_order_release);
  return p.capture;
}

void MemoryPool::end_capture(int device) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  p.capture.reset();
  p.capturing.store(false, std::memory_order_release);
}

void MemoryPool::release_private(int device, const std::shared_ptr<PrivatePool>& owner) {
  if (!owner) return;
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  owner->alive = false;
  for (auto& [size, blocks] : owner->free_blocks) {
    auto& shared = p.free_blocks[size];
    shared.insert(shared.end(), blocks.begin(), blocks.end());
  }
  owner->free_blocks.clear();
}

bool MemoryPool::capturing(int device) const {
  return pool(device).capturing.load(std::memory_order_acquire);
}

MemoryStats MemoryPool::stats(int device) const {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.stats;
}

void MemoryPool::reset_peaks(int device) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  p.stats.peak_in_use_bytes = p.stats.in_use_bytes;
  p.stats.peak_requested_bytes = p.stats.requested_bytes;
}

void MemoryPool::release_cached(int device) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  release_cached_locked(device, p);
}

void MemoryPool::release_cached_locked(int device, DevicePool& p) {
  if (p.free_blocks.empty()) return;
  set_device(device);
  // Kernels queued before a block was released may still use it.
  KUSARI_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& [size, blocks] : p.free_blocks) {
    for (void* ptr : blocks) {
      KUSARI_CUDA_CHECK(cudaFree(ptr));
      ++p.stats.device_frees;
      p.stats.reserved_bytes -= size;
    }
  }
  p.free_blocks.clear();
}

}  // namespace kusari::cuda
