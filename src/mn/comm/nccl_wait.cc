#include "mn/comm/nccl_wait.h"

#include <thread>

namespace kusari::mn::detail {

namespace {
/// How long poll_until polls without pausing before it starts to sleep between polls.
constexpr std::chrono::microseconds kSpin{200};
}  // namespace

WaitResult poll_until(const WaitProbes& probes, double timeout_seconds) {
  using Clock = std::chrono::steady_clock;
  WaitResult result;
  bool started = !probes.started;
  Clock::time_point start = Clock::now();
  const Clock::time_point begun = start;
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
    // A short spin (most collectives of a step end within it, as they would in a blocking call),
    // then sleeps that grow with the wait: 20 us, 200 us, and after a second 1 ms, so that a rank
    // waiting long for a peer uses about 1% of a core.
    if (Clock::now() - begun < kSpin) {
      --polls;  // the sleeps' schedule counts from the end of the spin
    } else if (polls < 1024) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      const bool long_wait = Clock::now() - begun > std::chrono::seconds(1);
      std::this_thread::sleep_for(std::chrono::microseconds(long_wait ? 1000 : 200));
    }
  }
  result.waited_seconds = started ? elapsed() : 0.0;
  return result;
}

}  // namespace kusari::mn::detail
