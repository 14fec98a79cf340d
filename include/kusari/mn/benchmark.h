// Helpers for the multi-node benchmarks (bench/mn_*.cc): timing GPU work with CUDA events, the
// versions of the communication libraries, and what a gradient reduction did. They need no CUDA
// header in the caller.
#pragma once

#include <memory>
#include <string>

#include "kusari/core/device.h"
#include "kusari/mn/communicator.h"

namespace kusari::mn {

/// Measures the GPU time between start() and stop(), as seen by the compute stream of a GPU
/// (CUDA events recorded there: everything queued on that stream between them counts, including
/// collectives the stream waits for). Needs a CUDA build; throws DeviceError otherwise.
class GpuTimer {
 public:
  explicit GpuTimer(Device device);
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  /// Records the start event on the compute stream.
  void start();
  /// Records the stop event on the compute stream.
  void stop();
  /// Waits for the stop event and returns the seconds between the two events.
  double seconds();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// "NCCL 2.28.9" (the library linked at run time), or why there is none.
std::string nccl_version();

/// The number of pipeline chunks the last gradient reduction of an NCCL communicator was cut into
/// (see KUSARI_MN_CHUNK_BYTES in docs/nccl.md); 0 for other communicators, or before the first.
int gradient_chunks(const Communicator& comm);
/// An NCCL communicator's chunk-size setting in words ("auto", "off", "8MiB"); "" for others.
std::string gradient_chunk_setting(const Communicator& comm);
/// The in-place sum of `x` (contiguous, on the communicator's GPU) over the ranks of an NCCL
/// communicator in `pieces` equal NCCL reductions queued back to back, without packing: what
/// cutting a buffer into pipeline chunks costs NCCL by itself. Throws CommunicatorError for
/// other communicators.
void allreduce_in_pieces(Communicator& comm, Array& x, int pieces);

}  // namespace kusari::mn
