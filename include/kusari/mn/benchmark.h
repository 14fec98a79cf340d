// Helpers for the multi-node benchmarks (bench/mn_*.cc): timing GPU work with CUDA events, and
// the versions of the communication libraries. They need no CUDA header in the caller.
#pragma once

#include <memory>
#include <string>

#include "kusari/core/device.h"

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

}  // namespace kusari::mn
