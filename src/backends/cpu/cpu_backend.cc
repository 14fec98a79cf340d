#include "backends/cpu/cpu_backend.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace kusari::cpu {
namespace {

// Note [CPU allocation]
// Host buffers are 64-byte aligned (a cache line; full AVX-512 vectors) so that kernels and BLAS
// see aligned rows. glibc's malloc keeps freed blocks of training-loop sizes for reuse.
constexpr size_t kAlignment = 64;

class CpuBackend final : public Backend {
 public:
  CpuBackend() {
    kernels_.fill = &cpu::fill;
    kernels_.arange = &cpu::arange;
    kernels_.copy = &cpu::copy;
    kernels_.random_uniform = &cpu::random_uniform;
    kernels_.random_normal = &cpu::random_normal;
    kernels_.unary = &cpu::unary;
    kernels_.binary = &cpu::binary;
    kernels_.where = &cpu::where;
    kernels_.reduce = &cpu::reduce;
    kernels_.arg_reduce = &cpu::arg_reduce;
    kernels_.softmax = &cpu::softmax;
    kernels_.matmul = &cpu::matmul;
    kernels_.take = &cpu::take;
    kernels_.add_at = &cpu::add_at;
    register_nn_kernels(kernels_);
    register_update_kernels(kernels_);
  }

  DeviceType type() const override { return DeviceType::kCPU; }
  const char* name() const override { return "cpu"; }
  int device_count() const override { return 1; }

  void* allocate(int, size_t nbytes) override {
    size_t rounded = (std::max<size_t>(nbytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (!p) {
      KUSARI_THROW(Error, "cpu: out of memory allocating ", nbytes, " bytes");
    }
    return p;
  }
  void deallocate(int, void* ptr, size_t) override { std::free(ptr); }
  void copy_from_host(int, void* dst, const void* src, size_t nbytes) override { std::memcpy(dst, src, nbytes); }
  void copy_to_host(int, void* dst, const void* src, size_t nbytes) override { std::memcpy(dst, src, nbytes); }
  void copy_between_devices(int, void* dst, int, const void* src, size_t nbytes) override {
    std::memcpy(dst, src, nbytes);
  }
  void synchronize(int) override {}
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace kusari::cpu
