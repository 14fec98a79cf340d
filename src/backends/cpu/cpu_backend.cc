#include "backends/cpu/cpu_backend.h"

#include "kusari/core/host_memory.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>
#include <cstring>
#include <new>

namespace kusari::cpu {
namespace {

// Note [CPU allocation]
// Host buffers are 64-byte aligned (a cache line; full AVX-512 vectors) so that kernels and BLAS
// see aligned rows. Small blocks come from malloc, which recycles them well. Large blocks (from
// 256 KiB) are kept in a cache of their own once freed and reused for requests of the same size
// class: glibc serves such sizes with fresh mmap()s (the aligned request always lands just above
// its adaptive mmap threshold), so every training step would otherwise fault its weight
// gradients and activations in again, page by page - a third of an MLP step on a small machine.
// The cache holds at most KUSARI_CPU_CACHE_BYTES (default 4 GiB) of free blocks.
constexpr size_t kAlignment = 64;
constexpr size_t kLargeBlock = size_t{256} << 10;

size_t size_class(size_t n) {
  // Round up to 1/8 of the next power of two: at most 12.5% waste, few distinct classes.
  size_t p = 1;
  while (p < n) p <<= 1;
  const size_t step = std::max<size_t>(p / 8, kAlignment);
  return (n + step - 1) / step * step;
}

class LargeBlockCache {
 public:
  LargeBlockCache() {
    if (const char* env = std::getenv("KUSARI_CPU_CACHE_BYTES")) limit_ = static_cast<size_t>(std::atoll(env));
  }
  ~LargeBlockCache() {
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
  }
  void* take(size_t cls) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    cached_ -= cls;
    return p;
  }
  bool give(void* p, size_t cls) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ + cls > limit_) return false;
    free_[cls].push_back(p);
    cached_ += cls;
    return true;
  }
  size_t cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_;
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) std::free(p);
    }
    free_.clear();
    cached_ = 0;
  }

 private:
  std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  size_t limit_ = size_t{4} << 30;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    register_cpu_creation_kernels();
    register_cpu_elementwise_kernels();
    register_cpu_reduction_kernels();
    register_cpu_linalg_kernels();
    register_cpu_indexing_kernels();
    register_cpu_nn_kernels();
    register_cpu_update_kernels();
    register_cpu_normalization_kernels();
    register_cpu_attention_kernels();
  }

  DeviceType type() const override { return DeviceType::kCPU; }
  const char* name() const override { return "cpu"; }
  int device_count() const override { return 1; }

  void* allocate(int, size_t nbytes) override {
    const size_t block = block_size(nbytes);
    void* p = nbytes >= kLargeBlock ? cache_.take(block) : nullptr;
    if (!p) p = std::aligned_alloc(kAlignment, block);
    if (!p) KUSARI_THROW(Error, "cpu: out of memory allocating ", nbytes, " bytes");
    count(in_use_, peak_in_use_, block);
    count(requested_, peak_requested_, nbytes);
    return p;
  }
  void deallocate(int, void* ptr, size_t nbytes) override {
    in_use_.fetch_sub(block_size(nbytes), std::memory_order_relaxed);
    requested_.fetch_sub(nbytes, std::memory_order_relaxed);
    if (nbytes >= kLargeBlock && cache_.give(ptr, size_class(nbytes))) return;
    std::free(ptr);
  }
  HostMemoryStats stats() {
    HostMemoryStats s;
    s.in_use_bytes = in_use_.load(std::memory_order_relaxed);
    s.peak_in_use_bytes = peak_in_use_.load(std::memory_order_relaxed);
    s.requested_bytes = requested_.load(std::memory_order_relaxed);
    s.peak_requested_bytes = peak_requested_.load(std::memory_order_relaxed);
    s.cached_bytes = cache_.cached();
    return s;
  }
  void reset_peaks() {
    peak_in_use_.store(in_use_.load(std::memory_order_relaxed), std::memory_order_relaxed);
    peak_requested_.store(requested_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  void empty_cache() { cache_.release(); }
  void copy_from_host(int, void* dst, const void* src, size_t nbytes) override { std::memcpy(dst, src, nbytes); }
  void copy_to_host(int, void* dst, const void* src, size_t nbytes) override { std::memcpy(dst, src, nbytes); }
  void copy_between_devices(int, void* dst, int, const void* src, size_t nbytes) override {
    std::memcpy(dst, src, nbytes);
  }
  void synchronize(int) override {}

 private:
  /// The bytes a request of `nbytes` takes: its size class when large, else rounded to the alignment.
  static size_t block_size(size_t nbytes) {
    if (nbytes >= kLargeBlock) return size_class(nbytes);
    return (std::max<size_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  }
  static void count(std::atomic<size_t>& now, std::atomic<size_t>& peak, size_t add) {
    const size_t v = now.fetch_add(add, std::memory_order_relaxed) + add;
    size_t p = peak.load(std::memory_order_relaxed);
    while (v > p && !peak.compare_exchange_weak(p, v, std::memory_order_relaxed)) {
    }
  }

  LargeBlockCache cache_;
  std::atomic<size_t> in_use_{0}, peak_in_use_{0}, requested_{0}, peak_requested_{0};
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace kusari::cpu

namespace kusari {

HostMemoryStats cpu_memory_stats() { return static_cast<cpu::CpuBackend&>(cpu::cpu_backend()).stats(); }
void reset_cpu_peak_memory_stats() { static_cast<cpu::CpuBackend&>(cpu::cpu_backend()).reset_peaks(); }
void cpu_empty_cache() { static_cast<cpu::CpuBackend&>(cpu::cpu_backend()).empty_cache(); }

}  // namespace kusari
