// The CUDA backend's internal interface, shared by the backend's files and by the NCCL
// communicators (src/mn/). Only compiled when KUSARI_HAVE_CUDA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/cuda_runtime.h"
#include "kusari/core/device.h"

namespace kusari::cuda {

/// The CUDA backend (created and its kernel table filled on first use).
Backend& cuda_backend();
/// Usable GPUs (0 when there is no driver or no device; never throws).
int cuda_device_count();

/// The stream every kernel of GPU `device` runs on (work on it is ordered; see
/// Note [One compute stream per device]).
cudaStream_t compute_stream(int device);
/// The cuBLAS / cuDNN handles of GPU `device`, bound to its compute stream.
cublasHandle_t cublas_handle(int device);
cudnnHandle_t cudnn_handle(int device);
/// Makes `device` current on this thread (cudaSetDevice), cheaply.
void set_device(int device);

/// Throws DeviceError naming the call and the CUDA error.
void check_cuda(cudaError_t status, const char* call, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line);

/// True while GPU `device` records a CUDA graph (kusari::cuda::Graph::capture).
bool capturing(int device);
/// Throws DeviceError when GPU `device` is recording a CUDA graph: `what` cannot be recorded, for
/// the reason `why` (see Note [What a captured graph may not do] in graph.cc).
void check_not_capturing(int device, const char* what, const char* why);

/// Throws DeviceError unless 0 <= device < cuda_device_count(); `what` names the caller.
void check_device_index(int device, const char* what);
/// Streaming multiprocessors of GPU `device` (sizes the grids of the kernels).
int sm_count(int device);

/// Returns a workspace block to the memory pool (in stream order).
struct WorkspaceFree {
  int device = 0;
  void operator()(void* p) const;
};
/// Device scratch memory for one cuDNN call, held (with the device's cuDNN lock, which also
/// guards the handle) until the lease is destroyed. See Note [cuDNN workspace].
struct WorkspaceLease {
  std::unique_lock<std::mutex> lock;
  void* ptr = nullptr;
  size_t bytes = 0;
  std::unique_ptr<void, WorkspaceFree> block;  // (freed before the lock is released)
};
/// `bytes` of scratch for one cuDNN call on GPU `device`, from the memory pool (null for 0; at
/// most kMaxCudnnWorkspaceBytes are ever asked for), with the device's cuDNN lock.
WorkspaceLease cudnn_workspace(int device, size_t bytes);
/// The largest cuDNN workspace an algorithm may use.
inline constexpr size_t kMaxCudnnWorkspaceBytes = size_t{1} << 30;

/// The two error words of GPU `device` (a flag and a value), cleared, held with a lock until the
/// lease is destroyed. A kernel that meets a bad argument (an index out of range) sets the flag
/// with atomicCAS and stores the value. See Note [Device-side argument errors].
struct ErrorWords {
  std::unique_lock<std::mutex> lock;
  int device = 0;
  /// Device address of {flag, value}.
  int64_t* words = nullptr;
  /// Waits for the compute stream; true (and the value) when a kernel set the flag.
  bool fetch(int64_t* value);
};
ErrorWords error_words(int device);

/// The implementations behind kusari/core/cuda.h, handed to the core by the library's entry
/// point (plugin.cc; Note [The CUDA library is loaded]). Their names differ from the public
/// functions they implement: both live in kusari::cuda, and a function of the public one's name
/// and signature here would be resolved to libkusari's definition (the dynamic linker's
/// interposition), which calls back into this library, forever.
std::unique_ptr<Graph::Impl> make_graph();
std::unique_ptr<ScalarReader::Impl> make_scalar_reader();
MemoryStats pool_memory_stats(int device);
void pool_reset_peaks(int device);
void pool_empty_cache();
// Pinned host memory, events and upload streams (upload.cc; Note [Upload stream]).
void* allocate_pinned(int device, size_t nbytes);
void free_pinned(int device, void* ptr) noexcept;
bool is_pinned(const void* ptr);
PinnedMemoryStats pinned_stats();
std::unique_ptr<Event::Impl> make_event();
std::unique_ptr<UploadStream::Impl> make_upload_stream(int device);

}  // namespace kusari::cuda

#define KUSARI_CUDA_CHECK(call) ::kusari::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define KUSARI_CUBLAS_CHECK(call) ::kusari::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#define KUSARI_CUDNN_CHECK(call) ::kusari::cuda::check_cudnn((call), #call, __FILE__, __LINE__)
