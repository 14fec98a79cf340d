// The CUDA backend: per-device state (compute stream, cuBLAS and cuDNN handles, workspaces),
// memory through the caching pool, host/device transfers, the kernel table, and the public
// utilities of kusari/core/cuda.h.
//
// Note [One compute stream per device]
// Every GPU gets one non-blocking stream, created with its state on first use. All kernels,
// copies and library calls (cuBLAS, cuDNN) for arrays on that GPU are queued on it, so work on a
// device runs in the order the host issued it and no kernel ever waits for an event. Two things
// follow:
//   - memory released by an array can be handed to the next array at once, even while kernels
//     that read it are still queued: anything that touches the new array is queued after them
//     (Note [Caching memory pool]);
//   - the host only waits where it must: copies to the host, reading an error flag, and
//     synchronize(). Launchers return as soon as their work is queued.
// The stream does not synchronise with the legacy default stream (cudaStreamNonBlocking), so code
// that runs its own CUDA work on a device (the NCCL communicators) must order it against the
// compute stream with events (cudaEventRecord / cudaStreamWaitEvent).
//
// Note [Backend lifetime]
// The backend, the per-device states and the memory pool are created on first use and never
// destroyed. Arrays may outlive any static object (a global model, a test fixture), and by the
// time static destructors run the CUDA runtime may already be shut down; releasing an array then
// only touches the pool's free lists. The driver reclaims everything when the process exits.
#include "backends/cuda/runtime/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/runtime/memory_pool.h"
#include "core/cuda_runtime.h"
#include "kusari/core/cuda.h"
#include "kusari/core/error.h"

namespace kusari::cuda {
namespace {

/// The path of a source file from "src/" on (error messages stay short).
const char* short_path(const char* file) {
  const char* at = std::strstr(file, "src/");
  return at ? at : file;
}

int current_device_or_minus_one() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

std::string error_location(const char* call, const char* file, int line) {
  const int device = current_device_or_minus_one();
  std::string on = device >= 0 ? detail::concat(" on cuda:", device) : std::string();
  return detail::concat(" in ", call, " (", short_path(file), ":", line, ")", on);
}

/// What device detection found: the number of GPUs, or why there are none.
struct Detection {
  int count = 0;
  std::string reason;
};

const Detection& detection() {
  static const Detection d = [] {
    Detection r;
    int n = 0;
    const cudaError_t status = cudaGetDeviceCount(&n);
    if (status != cudaSuccess) {
      cudaGetLastError();
      r.reason = detail::concat("cudaGetDeviceCount: ", cudaGetErrorName(status), ": ",
                                cudaGetErrorString(status));
      return r;
    }
    r.count = n;
    if (n == 0) r.reason = "cudaGetDeviceCount found no device";
    return r;
  }();
  return d;
}

// --- per-device state ----------------------------------------------------------------------------

/// Bytes of the cuBLAS workspace (NVIDIA's recommendation for Hopper).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
/// Host-device copies of at least this many bytes go through the pinned staging buffers.
constexpr size_t kStagingThreshold = size_t{1} << 20;
/// Bytes of each of the two pinned staging buffers of a device.
constexpr size_t kStagingChunk = size_t{8} << 20;

struct DeviceState {
  int device = 0;
  cudaStream_t stream = nullptr;
  int sm_count = 1;

  std::once_flag cublas_once;
  cublasHandle_t cublas = nullptr;
  std::once_flag cudnn_once;
  cudnnHandle_t cudnn = nullptr;

  // Note [cuDNN workspace]
  // Each cuDNN call takes its scratch from the memory pool and gives it back once the call is
  // queued (cudnn_workspace's lease): the pool is stream-ordered, so the next call on the
  // compute stream may get the same block, and a cached block of the size costs no cudaMalloc.
  // So the workspace counts in the pool's statistics only while a call needs it, as PyTorch's
  // caching allocator counts cuDNN's. (A growing buffer kept for the process's life, as before,
  // held the largest size any call ever asked for, up to the 1 GiB limit, through every peak
  // of activations: ResNet-50 peaked about a gigabyte above PyTorch with it.) The lease also
  // holds the device's mutex until its call is queued, which serialises every use of the
  // device's cuDNN handle (cuDNN does not allow two threads to use one at once). Algorithms are
  // only chosen when their workspace fits kMaxCudnnWorkspaceBytes.
  std::mutex workspace_mutex;

  std::mutex error_mutex;
  int64_t* error_device = nullptr;  // {flag, value} on the GPU
  int64_t* error_host = nullptr;    // pinned copy

  std::mutex staging_mutex;
  void* staging[2] = {nullptr, nullptr};
  cudaEvent_t staging_done[2] = {nullptr, nullptr};
};

struct Slot {
  std::once_flag once;
  std::unique_ptr<DeviceState> state;
};

Slot* slots() {
  static Slot* s = new Slot[static_cast<size_t>(std::max(detection().count, 1))];
  return s;
}

std::unique_ptr<DeviceState> create_state(int device) {
  auto s = std::make_unique<DeviceState>();
  s->device = device;
  set_device(device);
  KUSARI_CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  KUSARI_CUDA_CHECK(cudaDeviceGetAttribute(&s->sm_count, cudaDevAttrMultiProcessorCount, device));
  return s;
}

DeviceState& state(int device) {
  check_device_index(device, "CUDA backend");
  Slot& slot = slots()[device];
  std::call_once(slot.once, [&] { slot.state = create_state(device); });
  return *slot.state;
}

void ensure_staging(DeviceState& s) {
  for (int i = 0; i < 2; ++i) {
    if (!s.staging[i]) {
      KUSARI_CUDA_CHECK(cudaHostAlloc(&s.staging[i], kStagingChunk, cudaHostAllocDefault));
    }
    if (!s.staging_done[i]) {
      KUSARI_CUDA_CHECK(cudaEventCreateWithFlags(&s.staging_done[i], cudaEventDisableTiming));
    }
  }
}

// --- transfers -----------------------------------------------------------------------------------

// Note [Pinned staging]
// A copy from pageable host memory is staged by the driver through its own pinned buffers; for
// large arrays we do the same explicitly with two pinned chunks per device, so that copying one
// chunk on the host overlaps the DMA of the other:
//   to the device: wait until chunk buffer i is free (its event), memcpy into it, queue the DMA,
//     record the event; return when the last chunk is queued (the host data has been read).
//   to the host: queue the DMA of chunk c + 1 before waiting for chunk c and copying it out;
//     return when the last chunk has been copied.
// Small copies (< kStagingThreshold) go straight to cudaMemcpyAsync.

void copy_host_to_device(int device, void* dst, const void* src, size_t nbytes) {
  check_not_capturing(device, "copying host data to the GPU",
                      "a replay would copy whatever the host memory holds then, or freed memory; "
                      "create the array (e.g. a static input) before the capture and assign() into "
                      "it between replays");
  DeviceState& s = state(device);
  set_device(device);
  if (nbytes < kStagingThreshold) {
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s.stream));
    return;
  }
  std::lock_guard<std::mutex> lock(s.staging_mutex);
  ensure_staging(s);
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  int i = 0;
  for (size_t off = 0; off < nbytes; off += kStagingChunk, i ^= 1) {
    const size_t n = std::min(kStagingChunk, nbytes - off);
    KUSARI_CUDA_CHECK(cudaEventSynchronize(s.staging_done[i]));
    std::memcpy(s.staging[i], from + off, n);
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(to + off, s.staging[i], n, cudaMemcpyHostToDevice, s.stream));
    KUSARI_CUDA_CHECK(cudaEventRecord(s.staging_done[i], s.stream));
  }
}

void copy_device_to_host(int device, void* dst, const void* src, size_t nbytes) {
  check_not_capturing(device, "reading GPU data on the host (item(), to_vector(), printing)",
                      "nothing runs during a capture, so there is no value to read yet; read the "
                      "outputs after replay()");
  DeviceState& s = state(device);
  set_device(device);
  if (nbytes < kStagingThreshold) {
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, s.stream));
    KUSARI_CUDA_CHECK(cudaStreamSynchronize(s.stream));
    return;
  }
  std::lock_guard<std::mutex> lock(s.staging_mutex);
  ensure_staging(s);
  const char* from = static_cast<const char*>(src);
  char* to = static_cast<char*>(dst);
  const size_t chunks = (nbytes + kStagingChunk - 1) / kStagingChunk;
  auto chunk_bytes = [&](size_t c) { return std::min(kStagingChunk, nbytes - c * kStagingChunk); };
  auto enqueue = [&](size_t c) {
    const int b = static_cast<int>(c & 1);
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(s.staging[b], from + c * kStagingChunk, chunk_bytes(c),
                                      cudaMemcpyDeviceToHost, s.stream));
    KUSARI_CUDA_CHECK(cudaEventRecord(s.staging_done[b], s.stream));
  };
  enqueue(0);
  for (size_t c = 0; c < chunks; ++c) {
    if (c + 1 < chunks) enqueue(c + 1);
    const int b = static_cast<int>(c & 1);
    KUSARI_CUDA_CHECK(cudaEventSynchronize(s.staging_done[b]));
    std::memcpy(to + c * kStagingChunk, s.staging[b], chunk_bytes(c));
  }
}

void enable_peer_access(int device, int peer) {
  static std::mutex mutex;
  static std::vector<std::pair<int, int>> enabled;
  std::lock_guard<std::mutex> lock(mutex);
  if (std::find(enabled.begin(), enabled.end(), std::make_pair(device, peer)) != enabled.end())
    return;
  set_device(device);
  const cudaError_t status = cudaDeviceEnablePeerAccess(peer, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
  } else {
    KUSARI_CUDA_CHECK(status);
  }
  enabled.emplace_back(device, peer);
}

void copy_device_to_device(int dst_device, void* dst, int src_device, const void* src,
                           size_t nbytes) {
  DeviceState& d = state(dst_device);
  if (dst_device == src_device) {
    set_device(dst_device);
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, d.stream));
    return;
  }
  for (int device : {dst_device, src_device}) {
    check_not_capturing(device, "copying between GPUs",
                        "a graph records the work of one device's stream");
  }
  DeviceState& s = state(src_device);
  int can_access = 0;
  KUSARI_CUDA_CHECK(cudaDeviceCanAccessPeer(&can_access, dst_device, src_device));
  if (!can_access) {
    // Through the host: the source's copy synchronises, the destination's is queued.
    std::unique_ptr<char[]> bounce(new char[nbytes]);
    copy_device_to_host(src_device, bounce.get(), src, nbytes);
    copy_host_to_device(dst_device, dst, bounce.get(), nbytes);
    KUSARI_CUDA_CHECK(cudaStreamSynchronize(d.stream));  // `bounce` is read until then
    return;
  }
  enable_peer_access(dst_device, src_device);
  enable_peer_access(src_device, dst_device);
  // The copy runs on the source's stream, after the work that wrote `src` and after the work
  // that last used the recycled `dst` block on its own device; the destination's stream waits
  // for it before anything later touches `dst`.
  cudaEvent_t dst_ready = nullptr, copied = nullptr;
  set_device(dst_device);
  KUSARI_CUDA_CHECK(cudaEventCreateWithFlags(&dst_ready, cudaEventDisableTiming));
  KUSARI_CUDA_CHECK(cudaEventRecord(dst_ready, d.stream));
  set_device(src_device);
  KUSARI_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  KUSARI_CUDA_CHECK(cudaStreamWaitEvent(s.stream, dst_ready, 0));
  KUSARI_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, s.stream));
  KUSARI_CUDA_CHECK(cudaEventRecord(copied, s.stream));
  set_device(dst_device);
  KUSARI_CUDA_CHECK(cudaStreamWaitEvent(d.stream, copied, 0));
  // Destroying a recorded event is allowed; its resources go once it completes.
  KUSARI_CUDA_CHECK(cudaEventDestroy(dst_ready));
  KUSARI_CUDA_CHECK(cudaEventDestroy(copied));
}

// --- the backend ---------------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    register_cuda_creation_kernels();
    register_cuda_elementwise_kernels();
    register_cuda_reduction_kernels();
    register_cuda_linalg_kernels();
    register_cuda_indexing_kernels();
    register_cuda_nn_kernels();
    register_cuda_update_kernels();
    register_cuda_normalization_kernels();
    register_cuda_image_kernels();
    register_cuda_attention_kernels();
  }

  DeviceType type() const override { return DeviceType::kCUDA; }
  const char* name() const override { return "cuda"; }
  int device_count() const override { return cuda_device_count(); }

  void* allocate(int index, size_t nbytes) override {
    state(index);
    return memory_pool().allocate(index, nbytes);
  }
  void deallocate(int index, void* ptr, size_t) override { memory_pool().deallocate(index, ptr); }
  void copy_from_host(int index, void* dst, const void* src, size_t nbytes) override {
    copy_host_to_device(index, dst, src, nbytes);
  }
  void copy_to_host(int index, void* dst, const void* src, size_t nbytes) override {
    copy_device_to_host(index, dst, src, nbytes);
  }
  void copy_between_devices(int dst_index, void* dst, int src_index, const void* src,
                            size_t nbytes) override {
    copy_device_to_device(dst_index, dst, src_index, src, nbytes);
  }
  void synchronize(int index) override {
    check_not_capturing(index, "synchronize()", "nothing runs during a capture");
    DeviceState& s = state(index);
    set_device(index);
    KUSARI_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  }
};

}  // namespace

// --- errors --------------------------------------------------------------------------------------

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) [[likely]]
    return;
  cudaGetLastError();  // clear a non-sticky error so that later calls can succeed
  KUSARI_THROW(DeviceError, "CUDA error ", cudaGetErrorName(status), " (",
               cudaGetErrorString(status), ")", error_location(call, file, line));
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  KUSARI_THROW(DeviceError, "cuBLAS error ", cublasGetStatusName(status), " (",
               cublasGetStatusString(status), ")", error_location(call, file, line));
}

void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) [[likely]]
    return;
  char detail_message[512] = {0};
  cudnnGetLastErrorString(detail_message, sizeof(detail_message));
  KUSARI_THROW(DeviceError, "cuDNN error ", cudnnGetErrorString(status),
               error_location(call, file, line), detail_message[0] ? ": " : "", detail_message);
}

// --- devices -------------------------------------------------------------------------------------

int cuda_device_count() {
  return detection().count;
}

void check_device_index(int device, const char* what) {
  const Detection& d = detection();
  if (device >= 0 && device < d.count) [[likely]]
    return;
  if (d.count == 0) {
    KUSARI_THROW(DeviceError, what, ": cuda:", device,
                 " is not available: no CUDA device can be used on this machine (", d.reason, ")");
  }
  KUSARI_THROW(DeviceError, what, ": cuda:", device, " does not exist; this machine has ", d.count,
               " CUDA device", d.count == 1 ? "" : "s", " (cuda:0",
               d.count > 1 ? detail::concat(" to cuda:", d.count - 1) : std::string(), ")");
}

bool capturing(int device) {
  return memory_pool().capturing(device);
}

void check_not_capturing(int device, const char* what, const char* why) {
  if (!capturing(device)) [[likely]]
    return;
  KUSARI_THROW(DeviceError, "cuda:", device, ": ", what,
               " is not possible while a CUDA graph is being captured on this device: ", why);
}

void set_device(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) cudaGetLastError();
  if (current != device) KUSARI_CUDA_CHECK(cudaSetDevice(device));
}

cudaStream_t compute_stream(int device) {
  return state(device).stream;
}

// --- ScalarReader
// ----------------------------------------------------------------------------------

namespace {

// A pending read of one int64 (the implementation behind cuda::ScalarReader).
class CudaScalarReader final : public ScalarReader::Impl {
 public:
  ~CudaScalarReader() override { release(); }

  void start(const Array& value) override {
    const int d = value.device().index();
    check_not_capturing(d, "cuda::ScalarReader::start (a read on the host)",
                        "nothing runs during a capture; read after replay()");
    if (device_ != d) {  // (events and streams belong to one device)
      release();
      set_device(d);
      KUSARI_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_), sizeof(int64_t), cudaHostAllocDefault));
      KUSARI_CUDA_CHECK(cudaEventCreateWithFlags(&arrived_, cudaEventDisableTiming));
      device_ = d;
    } else if (pending_) {
      KUSARI_CUDA_CHECK(cudaEventSynchronize(arrived_));  // (the host buffer is reused)
    }
    set_device(d);
    cudaStream_t stream = compute_stream(d);
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(host_, value.raw_data(), sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    KUSARI_CUDA_CHECK(cudaEventRecord(arrived_, stream));
    pending_ = true;
  }

  bool pending() const override { return pending_; }

  int64_t get() override {
    KUSARI_CUDA_CHECK(cudaEventSynchronize(arrived_));
    pending_ = false;
    return *host_;
  }

 private:
  void release() noexcept {
    if (device_ < 0) return;
    if (arrived_) {
      if (cudaEventSynchronize(arrived_) != cudaSuccess) cudaGetLastError();
      cudaEventDestroy(arrived_);
    }
    if (host_) cudaFreeHost(host_);
    host_ = nullptr;
    arrived_ = nullptr;
    pending_ = false;
    device_ = -1;
  }

  int device_ = -1;
  int64_t* host_ = nullptr;  // pinned, so that the copy is asynchronous
  cudaEvent_t arrived_ = nullptr;
  bool pending_ = false;
};

}  // namespace

std::unique_ptr<ScalarReader::Impl> make_scalar_reader() { return std::make_unique<CudaScalarReader>(); }

int sm_count(int device) {
  return state(device).sm_count;
}

cublasHandle_t cublas_handle(int device) {
  DeviceState& s = state(device);
  std::call_once(s.cublas_once, [&] {
    set_device(device);
    cublasHandle_t handle = nullptr;
    KUSARI_CUBLAS_CHECK(cublasCreate(&handle));
    KUSARI_CUBLAS_CHECK(cublasSetStream(handle, s.stream));
    // Float32 products use TF32 only through the compute type (CUBLAS_COMPUTE_32F_FAST_TF32,
    // when allow_tf32_matmul()); 16-bit products accumulate and reduce in float32.
    KUSARI_CUBLAS_CHECK(cublasSetMathMode(
        handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    void* workspace = memory_pool().allocate(device, kCublasWorkspaceBytes);
    KUSARI_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, kCublasWorkspaceBytes));
    s.cublas = handle;
  });
  return s.cublas;
}

cudnnHandle_t cudnn_handle(int device) {
  DeviceState& s = state(device);
  std::call_once(s.cudnn_once, [&] {
    set_device(device);
    cudnnHandle_t handle = nullptr;
    KUSARI_CUDNN_CHECK(cudnnCreate(&handle));
    KUSARI_CUDNN_CHECK(cudnnSetStream(handle, s.stream));
    s.cudnn = handle;
  });
  return s.cudnn;
}

void WorkspaceFree::operator()(void* p) const { memory_pool().deallocate(device, p); }

WorkspaceLease cudnn_workspace(int device, size_t bytes) {
  DeviceState& s = state(device);
  WorkspaceLease lease{std::unique_lock<std::mutex>(s.workspace_mutex), nullptr, 0, {nullptr, WorkspaceFree{device}}};
  if (bytes == 0) return lease;
  lease.block.reset(memory_pool().allocate(device, bytes));
  lease.ptr = lease.block.get();
  lease.bytes = bytes;
  return lease;
}

// Note [Device-side argument errors]
// A kernel cannot throw, and checking indices on the host would mean copying them there first.
// Kernels that read indices (take, add_at) check them as they go: a bad one sets a flag in two
// device words ({flag, value}) with atomicCAS, so the first writer's value is kept, and the
// element is skipped. The launcher then reads the words back (one small copy and a stream
// synchronisation) and throws the same IndexError as the CPU. The words are held with a lock
// from clearing to reading, so concurrent launches on one device cannot see each other's flag.
ErrorWords error_words(int device) {
  DeviceState& s = state(device);
  ErrorWords lease{std::unique_lock<std::mutex>(s.error_mutex), device, nullptr};
  set_device(device);
  if (!s.error_device) {
    s.error_device = static_cast<int64_t*>(memory_pool().allocate(device, 2 * sizeof(int64_t)));
  }
  if (!s.error_host) {
    void* host = nullptr;
    KUSARI_CUDA_CHECK(cudaHostAlloc(&host, 2 * sizeof(int64_t), cudaHostAllocDefault));
    s.error_host = static_cast<int64_t*>(host);
  }
  KUSARI_CUDA_CHECK(cudaMemsetAsync(s.error_device, 0, 2 * sizeof(int64_t), s.stream));
  lease.words = s.error_device;
  return lease;
}

bool ErrorWords::fetch(int64_t* value) {
  // A captured graph cannot stop to read the flag: its kernels still skip bad indices, but the
  // error is not raised (Note [What a captured graph may not do]).
  if (capturing(device)) return false;
  DeviceState& s = state(device);
  set_device(device);
  KUSARI_CUDA_CHECK(
      cudaMemcpyAsync(s.error_host, words, 2 * sizeof(int64_t), cudaMemcpyDeviceToHost, s.stream));
  KUSARI_CUDA_CHECK(cudaStreamSynchronize(s.stream));
  if (s.error_host[0] == 0) return false;
  *value = s.error_host[1];
  return true;
}

MemoryPool& memory_pool() {
  static MemoryPool* pool = new MemoryPool(cuda_device_count());
  return *pool;
}

Backend& cuda_backend() {
  static CudaBackend* backend = new CudaBackend();
  return *backend;
}

MemoryStats pool_memory_stats(int device) {
  check_device_index(device, "cuda::memory_stats");
  return memory_pool().stats(device);
}

void pool_reset_peaks(int device) {
  check_device_index(device, "cuda::reset_peak_memory_stats");
  memory_pool().reset_peaks(device);
}

void pool_empty_cache() {
  for (int d = 0; d < cuda_device_count(); ++d) memory_pool().release_cached(d);
}

}  // namespace kusari::cuda
