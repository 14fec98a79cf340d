// CUDA device utilities that user code may need: memory-pool statistics, releasing the cache,
// the TF32 switch, graphs, pinned host memory and an upload stream. In a build without CUDA they report no devices and do nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "kusari/core/array.h"
#include "kusari/core/device.h"

namespace kusari::cuda {

/// Statistics of one device's caching memory pool.
struct MemoryStats {
  /// Bytes handed out to arrays right now.
  size_t in_use_bytes = 0;
  /// Bytes held by the pool (in use + cached free blocks).
  size_t reserved_bytes = 0;
  /// The largest in_use_bytes seen.
  size_t peak_in_use_bytes = 0;
  /// Bytes the arrays in use asked for (in_use_bytes counts the pool's blocks, which round a
  /// request up by at most 1/8 and may be a cached block up to 1/4 larger; this is the
  /// counterpart of PyTorch's memory_allocated), and the largest value seen.
  size_t requested_bytes = 0;
  size_t peak_requested_bytes = 0;
  /// Calls to cudaMalloc / cudaFree made by the pool.
  int64_t device_allocations = 0;
  int64_t device_frees = 0;
};

/// The pool statistics of GPU `device`.
MemoryStats memory_stats(int device = 0);
/// Makes the peaks of GPU `device` (peak_in_use_bytes, peak_requested_bytes) the current values,
/// so that later peaks are those of what runs next (PyTorch's reset_peak_memory_stats): a
/// benchmark resets after its warm-up steps.
void reset_peak_memory_stats(int device = 0);
/// Returns every cached free block of every device to the driver (never done in the hot loop).
void empty_cache();
/// Starts and stops the collection of a profiler that was told to wait for it (Nsight's
/// `--profile-from-start off`), so that a profile holds only the steps between the two calls
/// (cudaProfilerStart / cudaProfilerStop; PyTorch's torch.cuda.profiler.start / stop).
void profiler_start();
void profiler_stop();
/// TF32 tensor cores for float32 work on GPUs: the products keep ~10 bits of mantissa (sums and
/// range stay float32), and run several times faster. As in PyTorch, convolutions may use them by
/// default and matrix products may not. The switches are read at each call. Environment:
/// KUSARI_ALLOW_TF32=0|1 sets both defaults; KUSARI_ALLOW_TF32_CONV and KUSARI_ALLOW_TF32_MATMUL
/// set one each (and win over KUSARI_ALLOW_TF32).
void set_allow_tf32(bool allow);  ///< Both switches at once.
void set_allow_tf32_convolution(bool allow);
bool allow_tf32_convolution();
void set_allow_tf32_matmul(bool allow);
bool allow_tf32_matmul();

/// A recorded sequence of GPU work, replayed with one launch (a CUDA graph).
///
/// capture() runs `fn` once on the host while the device's compute stream records, instead of
/// running, the work `fn` queues; replay() then runs all of it with a single launch, at the same
/// memory addresses. For a training step of a small model, whose time is mostly the host's
/// kernel launches, that removes nearly all of the host's cost:
///
///     model->cleargrads();
///     // one eager step first: lazy parameters, optimizer state, cuBLAS/cuDNN setup
///     kusari::Variable loss;
///     kusari::cuda::Graph graph;
///     graph.capture(device, [&] {
///       model->cleargrads();
///       loss = (*model)(kusari::Variable(x), t);  // x, t: arrays made before the capture
///       loss.backward();
///     });
///     for (...) {
///       x.assign(next_x);  t.assign(next_t);    // new data into the same arrays
///       graph.replay();                         // forward and backward
///       optimizer.update();                     // eager: the gradients are where backward put
///       them
///     }
///
/// Arrays made during the capture (the loss, the gradients) keep their memory for the graph's
/// life and every replay rewrites them; arrays made before it are read and written where they
/// are. What a captured function may not do, with the errors it gets: copy host data to the GPU
/// or read GPU data on the host, synchronize, draw random numbers (the generator counts on the
/// host: every replay would draw the same numbers), copy between GPUs. Index checks of take and
/// add_at do not raise inside a graph (bad indices are skipped, as in a non-debug run). Values
/// the host computes while `fn` runs (a learning rate, a batch size) are frozen into the graph.
/// See Note [CUDA graphs] and Note [Graph memory pools].
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;

  /// Records the GPU work that `fn` queues on `device` (a CUDA device). Nothing runs until
  /// replay(). A graph captured before is discarded first. If `fn` throws, or does something a
  /// capture cannot record, nothing is kept and the error is rethrown (DeviceError naming what
  /// was not possible).
  void capture(Device device, const std::function<void()>& fn);
  /// Queues the recorded work on the device's compute stream (returns at once, like a kernel).
  void replay();
  /// True once capture() succeeded.
  bool captured() const;
  /// The device of the captured work.
  Device device() const;
  /// Kernels and other operations recorded (0 before a capture).
  int64_t num_nodes() const;
  /// Discards the recorded work and returns its memory to the device's pool (waits for replays
  /// in flight).
  void reset();

  /// The implementation, provided by the CUDA library (Note [The CUDA library is loaded]).
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// True while `device` (a CUDA device) is recording a Graph.
bool is_capturing(Device device);

/// Reads an int64 that GPU work computes without waiting for the work queued after it. start()
/// queues the copy of `value` into pinned host memory on the compute stream, right behind the
/// work that computes it, and records an event; get() waits for that event only, so kernels
/// queued after start() keep the GPU busy meanwhile (item() would wait for all of them). The
/// optimizer reads its float16 overflow count this way (Note [Dynamic loss scaling]).
class ScalarReader {
 public:
  ScalarReader();
  ~ScalarReader();
  ScalarReader(const ScalarReader&) = delete;
  ScalarReader& operator=(const ScalarReader&) = delete;

  /// Queues the read of `value`: one int64 on a CUDA device (DeviceError during a capture).
  void start(const Array& value);
  /// True between start() and get().
  bool pending() const;
  /// The value start() queued the read of, once it has arrived (waits for it).
  int64_t get();

  /// The implementation, provided by the CUDA library.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// --- pinned host memory and the upload stream ---------------------------------------------------

/// Page-locked host memory handed out by pinned_empty: bytes held now, and the allocations and
/// frees made (each a cudaHostAlloc / cudaFreeHost: slow, so an input pipeline keeps its
/// buffers).
struct PinnedMemoryStats {
  /// Bytes held now.
  size_t in_use_bytes = 0;
  /// cudaHostAlloc calls made so far.
  int64_t allocations = 0;
  /// cudaFreeHost calls made so far.
  int64_t frees = 0;
};

/// A CPU array of `shape` and `dtype` in page-locked (pinned) host memory, which a GPU reads and
/// writes by DMA: copies from it run asynchronously (UploadStream), where copies from ordinary
/// memory are staged through the driver's buffers. It is an ordinary CPU array otherwise; the
/// memory is freed when its last view goes. Uninitialised. `gpu` is the CUDA device whose
/// context pins (and later frees) it, from whatever thread: every GPU can use the memory, and
/// naming the process's own GPU keeps the others' contexts untouched (under mpiexec, one GPU per
/// process). DeviceError where CUDA is unavailable.
Array pinned_empty(const Shape& shape, Dtype dtype, Device gpu);
/// True when `array` is a CPU array in memory from pinned_empty.
bool is_pinned(const Array& array);
/// The statistics of pinned_empty's memory.
PinnedMemoryStats pinned_memory_stats();

/// A point in the work queued on one GPU stream (a CUDA event), for handing buffers between the
/// compute stream and an UploadStream; see Note [Upload stream]. An Event that was never
/// recorded counts as done.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  /// Marks the end of the work queued so far on `device`'s compute stream.
  void record_compute(Device device);
  /// True once the marked work has finished (or nothing was marked); never waits.
  bool done() const;
  /// Waits on the host until the marked work has finished.
  void synchronize() const;
  /// Makes the compute stream of the event's device wait, on the GPU, for the marked work: work
  /// queued there afterwards starts after it. The host does not wait. Nothing when unrecorded.
  void block_compute() const;
  /// True once recorded.
  bool recorded() const;

  /// The implementation, provided by the CUDA library (null until first recorded).
  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  friend class UploadStream;
  std::unique_ptr<Impl> impl_;
};

/// A stream of host-to-device copies beside a GPU's compute stream, so that an input pipeline's
/// next batch crosses the bus while the model computes on the current one (Note [Upload stream]).
/// Copies run in the order they were queued; Events hand the buffers over.
class UploadStream {
 public:
  /// A new stream on `device` (a CUDA device).
  explicit UploadStream(Device device);
  ~UploadStream();
  UploadStream(const UploadStream&) = delete;
  UploadStream& operator=(const UploadStream&) = delete;

  /// The GPU the copies go to.
  Device device() const { return device_; }
  /// Copies queued after this call start after `event`'s work (on the GPU; the host goes on).
  void wait(const Event& event);
  /// Queues the copy of `src` (a contiguous CPU array, pinned for the copy to be asynchronous)
  /// into `dst` (a contiguous array of the same dtype and size on this stream's device). `src`
  /// must stay unchanged, and `dst` unused, until an event recorded after the copy is done.
  void copy(const Array& src, const Array& dst);
  /// Marks the copies queued so far in `event`.
  void record(Event& event);
  /// Waits on the host until every queued copy has finished.
  void synchronize();

  /// The implementation, provided by the CUDA library.
  struct Impl;

 private:
  Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kusari::cuda
