// Pinned host memory, events and upload streams: the CUDA side of kusari/core/cuda.h's
// pinned_empty, Event and UploadStream (Note [Upload stream] in core/cuda_runtime.h).
#include <atomic>
#include <mutex>
#include <unordered_map>

#include "backends/cuda/runtime/cuda_backend.h"
#include "core/cuda_runtime.h"
#include "kusari/core/error.h"

namespace kusari::cuda {
namespace {

const char* kCaptureReason =
    "an upload reads host memory and hands buffers between streams while it runs; keep the "
    "input pipeline outside the captured step";

struct PinnedCounters {
  std::mutex mutex;
  PinnedMemoryStats stats;
  std::unordered_map<void*, size_t> sizes;
};

PinnedCounters& pinned_counters() {
  static PinnedCounters* c = new PinnedCounters();  // never destroyed (Note [Backend lifetime])
  return *c;
}

class CudaEvent final : public Event::Impl {
 public:
  ~CudaEvent() override {
    if (event_ != nullptr) cudaEventDestroy(event_);  // allowed while pending
  }

  void record_compute(int device) override {
    check_not_capturing(device, "cuda::Event::record_compute", kCaptureReason);
    record(device, compute_stream(device));
  }

  // Records on `stream` of `device` (the event is recreated when it belonged to another device).
  void record(int device, cudaStream_t stream) {
    set_device(device);
    if (event_ != nullptr && device_ != device) {
      KUSARI_CUDA_CHECK(cudaEventDestroy(event_));
      event_ = nullptr;
    }
    if (event_ == nullptr) {
      KUSARI_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
      device_ = device;
    }
    KUSARI_CUDA_CHECK(cudaEventRecord(event_, stream));
  }

  bool done() override {
    if (event_ == nullptr) return true;
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    KUSARI_CUDA_CHECK(status);
    return true;
  }

  void synchronize() override {
    if (event_ != nullptr) KUSARI_CUDA_CHECK(cudaEventSynchronize(event_));
  }

  void block_compute() override {
    if (event_ == nullptr) return;
    check_not_capturing(device_, "cuda::Event::block_compute", kCaptureReason);
    set_device(device_);
    KUSARI_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(device_), event_, 0));
  }

  bool recorded() const override { return event_ != nullptr; }

  cudaEvent_t event() const { return event_; }
  int device() const { return device_; }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

class CudaUploadStream final : public UploadStream::Impl {
 public:
  explicit CudaUploadStream(int device) : device_(device) {
    check_device_index(device, "cuda::UploadStream");
    compute_stream(device);  // the device's state first
    set_device(device);
    // The lowest priority (the largest number): kernels of the compute stream go first.
    int least = 0, greatest = 0;
    KUSARI_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    KUSARI_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, least));
  }

  ~CudaUploadStream() override {
    if (stream_ == nullptr) return;
    set_device(device_);
    if (cudaStreamSynchronize(stream_) != cudaSuccess) cudaGetLastError();
    cudaStreamDestroy(stream_);
  }

  void wait(Event::Impl& event) override {
    auto& e = static_cast<CudaEvent&>(event);
    if (e.event() == nullptr) return;
    check_not_capturing(device_, "cuda::UploadStream::wait", kCaptureReason);
    set_device(device_);
    KUSARI_CUDA_CHECK(cudaStreamWaitEvent(stream_, e.event(), 0));
  }

  void copy(void* dst, const void* src, size_t nbytes) override {
    check_not_capturing(device_, "cuda::UploadStream::copy", kCaptureReason);
    set_device(device_);
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream_));
  }

  void record(Event::Impl& event) override {
    check_not_capturing(device_, "cuda::UploadStream::record", kCaptureReason);
    static_cast<CudaEvent&>(event).record(device_, stream_);
  }

  void synchronize() override {
    set_device(device_);
    KUSARI_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

void* allocate_pinned(int device, size_t nbytes) {
  check_device_index(device, "cuda::pinned_empty");
  set_device(device);  // this thread may have no current device: never make one on GPU 0
  void* ptr = nullptr;
  const cudaError_t status = cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable);
  if (status != cudaSuccess) {
    cudaGetLastError();
    PinnedMemoryStats s = pinned_stats();
    KUSARI_THROW(DeviceError, "cuda::pinned_empty: cannot allocate ", nbytes,
                 " bytes of page-locked host memory (", cudaGetErrorName(status), ": ",
                 cudaGetErrorString(status), "); ", s.in_use_bytes,
                 " bytes are pinned through kusari now");
  }
  PinnedCounters& c = pinned_counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.sizes[ptr] = nbytes;
  c.stats.in_use_bytes += nbytes;
  ++c.stats.allocations;
  return ptr;
}

void free_pinned(int device, void* ptr) noexcept {
  {
    PinnedCounters& c = pinned_counters();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.sizes.find(ptr);
    if (it != c.sizes.end()) {
      c.stats.in_use_bytes -= it->second;
      c.sizes.erase(it);
    }
    ++c.stats.frees;
  }
  // After the CUDA runtime has shut down (static destruction) the driver reclaims it anyway.
  if (cudaSetDevice(device) != cudaSuccess || cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
}

bool is_pinned(const void* ptr) {
  // From the allocations' own record: asking the driver (cudaPointerGetAttributes) would make a
  // context on the calling thread's device.
  PinnedCounters& c = pinned_counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (const auto& [base, size] : c.sizes) {
    const auto* b = static_cast<const char*>(base);
    if (ptr >= b && ptr < b + size) return true;
  }
  return false;
}

PinnedMemoryStats pinned_stats() {
  PinnedCounters& c = pinned_counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

std::unique_ptr<Event::Impl> make_event() { return std::make_unique<CudaEvent>(); }

std::unique_ptr<UploadStream::Impl> make_upload_stream(int device) {
  return std::make_unique<CudaUploadStream>(device);
}

}  // namespace kusari::cuda
