// The boundary between the core library and the CUDA library (libkusari_cuda), which the core
// loads at run time the first time a GPU is asked for. See Note [The CUDA library is loaded].
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kusari/core/cuda.h"
#include "kusari/core/device.h"

namespace kusari::cuda {

// Note [The CUDA library is loaded]
// One install of kusari serves machines with and without GPUs. The core library (libkusari)
// holds the CPU backend and everything above the kernels, and links no CUDA library: a CPU
// program needs none of them to link or to run. The CUDA backend, with everything that calls
// the CUDA runtime, cuBLAS or cuDNN, is its own shared library, libkusari_cuda, loaded with
// dlopen the first time something asks for a GPU (Device::cuda, cuda_device_count, a Graph,
// memory_stats). It is looked for
//   1. in $KUSARI_CUDA_LIBRARY (a path), if set;
//   2. beside libkusari itself (the build tree and an install keep them together);
//   3. by the dynamic linker's search (LD_LIBRARY_PATH, the cache).
// When it cannot be loaded — no such file, or a CUDA library it needs is missing on this
// machine — the core behaves as a build without CUDA: cuda_device_count() is 0, and asking for a
// CUDA device raises a DeviceError that quotes the loader's reason. The two libraries come from
// one build: the entry point's name carries the version (kusari_cuda_runtime_<version>), so a
// mismatched pair fails to load with a clear reason instead of calling through a wrong layout.
// A static build (-DBUILD_SHARED_LIBS=OFF) links the CUDA code into libkusari instead, and then
// every program links the CUDA libraries.

/// The implementation of a Graph, provided by the CUDA library.
struct Graph::Impl {
  virtual ~Impl() = default;
  virtual void capture(Device device, const std::function<void()>& fn) = 0;
  virtual void replay() = 0;
  virtual bool captured() const = 0;
  virtual Device device() const = 0;
  virtual int64_t num_nodes() const = 0;
  virtual void reset() = 0;
};

/// The implementation of a ScalarReader, provided by the CUDA library.
struct ScalarReader::Impl {
  virtual ~Impl() = default;
  virtual void start(const Array& value) = 0;
  virtual bool pending() const = 0;
  virtual int64_t get() = 0;
};

// Note [Upload stream]
// An input pipeline copies each batch to the GPU while the model computes on the one before, so
// the copy runs on a stream of its own (UploadStream: non-blocking, one per pipeline) and the
// buffers change hands through events, never through a host wait in the hot loop:
//   compute stream:  ... kernels reading staging[s] --record(consumed[s])-->   wait(copied[s]),
//                                                                              kernels reading it
//   upload stream:   wait(consumed[s]), copy pinned[s] -> staging[s], record(copied[s])
// - The device buffer a copy writes (staging) belongs to the pipeline and is never released while
//   copies may use it; the upload stream waits for the compute stream's `consumed` event before
//   overwriting it. Memory from the caching pool may be the target only under the pool's rule
//   (Note [Caching memory pool]): the compute stream must wait for the copy (block_compute)
//   before the array is used or released.
// - The pinned host buffer is rewritten by the host only after the copy from it is done
//   (copied.synchronize(), which by then has long finished in a steady pipeline).
// - Events and streams belong to one device; the CUDA library sets the device for each call, so
//   they may be used from any thread that does not share them with another at the same time.
// Graph capture refuses all of it (the copies read host memory at replay time).

/// The implementation of an Event, provided by the CUDA library.
struct Event::Impl {
  virtual ~Impl() = default;
  virtual void record_compute(int device) = 0;
  virtual bool done() = 0;
  virtual void synchronize() = 0;
  virtual void block_compute() = 0;
  virtual bool recorded() const = 0;
};

/// The implementation of an UploadStream, provided by the CUDA library.
struct UploadStream::Impl {
  virtual ~Impl() = default;
  virtual void wait(Event::Impl& event) = 0;
  virtual void copy(void* dst, const void* src, size_t nbytes) = 0;
  virtual void record(Event::Impl& event) = 0;
  virtual void synchronize() = 0;
};

/// Times GPU work with two events on a device's compute stream.
struct EventTimer {
  virtual ~EventTimer() = default;
  virtual void start() = 0;
  virtual void stop() = 0;
  /// Seconds between start() and stop() (waits for stop's event).
  virtual double seconds() = 0;
};

/// What the CUDA library gives the core: its backend and the utilities of kusari/core/cuda.h.
class Runtime {
 public:
  virtual ~Runtime() = default;
  virtual Backend& backend() = 0;
  /// Usable GPUs (0 when there is no driver or no device; never throws).
  virtual int device_count() = 0;
  virtual MemoryStats memory_stats(int device) = 0;
  virtual void reset_peak_memory_stats(int device) = 0;
  virtual void empty_cache() = 0;
  /// cudaProfilerStart (on) or cudaProfilerStop.
  virtual void profiler_collect(bool on) = 0;
  /// True while GPU `device` records a graph (device is a valid index).
  virtual bool capturing(int device) = 0;
  virtual std::unique_ptr<Graph::Impl> make_graph() = 0;
  virtual std::unique_ptr<ScalarReader::Impl> make_scalar_reader() = 0;
  virtual std::unique_ptr<EventTimer> make_event_timer(int device) = 0;
  /// Page-locked host memory (cudaHostAlloc, portable to every device) through GPU `device`'s
  /// context; freed by free_pinned with the same device.
  virtual void* allocate_pinned(int device, size_t nbytes) = 0;
  /// Frees memory from allocate_pinned (errors after the CUDA runtime has shut down are ignored).
  virtual void free_pinned(int device, void* ptr) noexcept = 0;
  virtual bool is_pinned(const void* ptr) = 0;
  virtual PinnedMemoryStats pinned_memory_stats() = 0;
  virtual std::unique_ptr<Event::Impl> make_event() = 0;
  virtual std::unique_ptr<UploadStream::Impl> make_upload_stream(int device) = 0;
};

/// The CUDA library's runtime, loaded on the first call; null when this build has no CUDA
/// backend or the library cannot be loaded here (unavailable_reason() says why).
Runtime* runtime();
/// Why runtime() is null: a sentence for error messages ("" when it is not).
const std::string& unavailable_reason();
/// runtime(), or a DeviceError naming `what` and the reason.
Runtime& require_runtime(const char* what);

}  // namespace kusari::cuda
