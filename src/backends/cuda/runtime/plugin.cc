// The entry point of the CUDA library: what the core calls once it has loaded libkusari_cuda.
// See Note [The CUDA library is loaded] in core/cuda_runtime.h.
#include <cuda_profiler_api.h>

#include "backends/cuda/runtime/cuda_backend.h"
#include "core/cuda_runtime.h"
#include "kusari/core/error.h"

namespace kusari::cuda {
namespace {

class EventTimerImpl final : public EventTimer {
 public:
  explicit EventTimerImpl(int device) : device_(device) {
    check_device_index(device, "GpuTimer");
    compute_stream(device);
    set_device(device);
    KUSARI_CUDA_CHECK(cudaEventCreate(&start_));
    KUSARI_CUDA_CHECK(cudaEventCreate(&stop_));
  }
  ~EventTimerImpl() override {
    if (start_) cudaEventDestroy(start_);
    if (stop_) cudaEventDestroy(stop_);
  }
  void start() override { record(start_); }
  void stop() override { record(stop_); }
  double seconds() override {
    KUSARI_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    KUSARI_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  void record(cudaEvent_t event) {
    set_device(device_);
    KUSARI_CUDA_CHECK(cudaEventRecord(event, compute_stream(device_)));
  }
  int device_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

class CudaRuntime final : public Runtime {
 public:
  Backend& backend() override { return cuda_backend(); }
  int device_count() override { return cuda_device_count(); }
  MemoryStats memory_stats(int device) override { return pool_memory_stats(device); }
  void reset_peak_memory_stats(int device) override { pool_reset_peaks(device); }
  void empty_cache() override { pool_empty_cache(); }
  void profiler_collect(bool on) override {
    KUSARI_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop());
  }
  bool capturing(int device) override { return cuda::capturing(device); }
  std::unique_ptr<Graph::Impl> make_graph() override { return cuda::make_graph(); }
  std::unique_ptr<ScalarReader::Impl> make_scalar_reader() override { return cuda::make_scalar_reader(); }
  std::unique_ptr<EventTimer> make_event_timer(int device) override {
    return std::make_unique<EventTimerImpl>(device);
  }
  void* allocate_pinned(int device, size_t nbytes) override {
    return cuda::allocate_pinned(device, nbytes);
  }
  void free_pinned(int device, void* ptr) noexcept override { cuda::free_pinned(device, ptr); }
  bool is_pinned(const void* ptr) override { return cuda::is_pinned(ptr); }
  PinnedMemoryStats pinned_memory_stats() override { return cuda::pinned_stats(); }
  std::unique_ptr<Event::Impl> make_event() override { return cuda::make_event(); }
  std::unique_ptr<UploadStream::Impl> make_upload_stream(int device) override {
    return cuda::make_upload_stream(device);
  }
};

}  // namespace
}  // namespace kusari::cuda

extern "C" __attribute__((visibility("default"))) kusari::cuda::Runtime* KUSARI_CUDA_ENTRY() {
  static kusari::cuda::CudaRuntime* runtime = new kusari::cuda::CudaRuntime();
  return runtime;
}
