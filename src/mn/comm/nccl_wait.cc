#include "mn/comm/nccl_wait.h"

#include <thread>

namespace kusari::mn::detail {

WaitResult poll_until(const WaitProbes& probes, double timeout_seconds) {
  using Clock = std::chrono::steady_clock;
  WaitResult result;
  bool started = !probes.started;
  Clock::time_point start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  for (int polls = 0;; ++polls) {
    if (probes.done()) {
      result.outcome = WaitOutcome::kDone;
      break;
    }
    if (probes.failed) {
      std::string error = probes.failed();
      if (!error.empty()) {
        result.outcome = WaitOutcome::kFailed;
        result.error = std::move(error);
        break;
      }
    }
    if (!started && probes.started()) {
      started = true;
      start = Clock::now();
    }
    if (started && timeout_seconds > 0 && elapsed() >= timeout_seconds) {
      // A last look: the operation may have finished while we measured.
      result.outcome = probes.done() ? WaitOutcome::kDone : WaitOutcome::kTimedOut;
      break;
    }
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 20 : 200));
    }
  }
  result.waited_seconds = started ? elapsed() : 0.0;
  return result;
}

}  // namespace kusari::mn::detail
