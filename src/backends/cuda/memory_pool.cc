// The caching device-memory pool; see Note [Caching memory pool].
#include "backends/cuda/memory_pool.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>

#include "backends/cuda/cuda_backend.h"
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

void* MemoryPool::allocate(int device, size_t nbytes) {
  const size_t size = round_size(nbytes);
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  // A cached block of this class (or, for large blocks, up to 1/4 larger).
  const size_t accept = size <= kSmallLimit ? size : size + size / 4;
  auto it = p.free_blocks.lower_bound(size);
  if (it != p.free_blocks.end() && it->first <= accept) {
    void* ptr = it->second.back();
    const size_t block = it->first;
    it->second.pop_back();
    if (it->second.empty()) p.free_blocks.erase(it);
    p.live.emplace(ptr, block);
    p.stats.in_use_bytes += block;
    p.stats.peak_in_use_bytes = std::max(p.stats.peak_in_use_bytes, p.stats.in_use_bytes);
    return ptr;
  }
  set_device(device);
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation) {
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
                 format_bytes(p.stats.reserved_bytes), " of which ", format_bytes(p.stats.in_use_bytes),
                 " are in use by arrays; the driver reports ", format_bytes(free_bytes), " free of ",
                 format_bytes(total_bytes), ". Release arrays or use a smaller batch.");
  }
  check_cuda(status, "cudaMalloc", __FILE__, __LINE__);
  ++p.stats.device_allocations;
  p.stats.reserved_bytes += size;
  p.live.emplace(ptr, size);
  p.stats.in_use_bytes += size;
  p.stats.peak_in_use_bytes = std::max(p.stats.peak_in_use_bytes, p.stats.in_use_bytes);
  return ptr;
}

void MemoryPool::deallocate(int device, void* ptr) {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.live.find(ptr);
  KUSARI_ASSERT(it != p.live.end(), "memory pool: cuda:", device, " does not own block ", ptr);
  const size_t size = it->second;
  p.live.erase(it);
  p.stats.in_use_bytes -= size;
  p.free_blocks[size].push_back(ptr);
}

MemoryStats MemoryPool::stats(int device) const {
  DevicePool& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.stats;
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
