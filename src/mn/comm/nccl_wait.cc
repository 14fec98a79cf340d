#include "mn/comm/nccl_wait.h"

#include <thread>

namespace kusari::mn::detail {

namespace {
/// How long poll_until polls without pausing before it starts to sleep between polls.
constexpr std::chrono::microseconds kSpin{200};
}  // namespace

// Note [Waits that move the operation]
// A GPU runs an NCCL kernel on its own, so a host that sleeps between polls of its event only
// notices the end a little later. MPI is different: a non-blocking collective moves only while
// some thread is inside MPI. Without single-copy shared memory (Open MPI's vader with
// single_copy_mechanism none, common in containers, where process_vm_readv is not allowed) or
// over TCP, a large message goes in fragments of 32 KiB to 128 KiB, each moved by one poll, so a
// 200 us sleep between polls caps a transfer at a fragment per sleep: on a 16-core Xeon in a
// container, a 20 MB allreduce between two processes took 55 ms polled every 200 us and 5 ms in a
// blocking MPI_Allreduce (bench: `mpiexec -n 2` of a loop of MPI_Iallreduce + MPI_Test).
// So a probe that moves its operation (moved_by_polls: the MPI waits of the communicators) is
// polled without sleeping for the first second of the wait, yielding the core between polls
// (other threads and processes that want it get it, as Open MPI's own blocking calls do when a
// machine is oversubscribed); after a second the wait is for a straggler, not a transfer, and it
// sleeps 1 ms between polls like any other.

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
    // waiting long for a peer uses about 1% of a core; an operation moved by the polls is polled
    // with yields for that second instead.
    const bool long_wait = Clock::now() - begun > std::chrono::seconds(1);
    if (Clock::now() - begun < kSpin) {
      --polls;  // the sleeps' schedule counts from the end of the spin
    } else if (probes.moved_by_polls && !long_wait) {
      std::this_thread::yield();
      ++result.yields;
    } else {
      const int us = probes.moved_by_polls ? 1000 : polls < 1024 ? 20 : long_wait ? 1000 : 200;
      std::this_thread::sleep_for(std::chrono::microseconds(us));
      ++result.sleeps;
    }
  }
  result.waited_seconds = started ? elapsed() : 0.0;
  return result;
}

}  // namespace kusari::mn::detail
