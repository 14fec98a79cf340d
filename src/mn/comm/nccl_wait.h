// Waiting for an asynchronous operation with a deadline: the polling loop behind the deadline of
// every communicator (Note [Deadline on every collective], Note [NCCL timeout]). Plain C++ (no CUDA), so that it is built and
// tested on every machine.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace kusari::mn::detail {

/// How a wait ended.
enum class WaitOutcome {
  /// The operation finished.
  kDone,
  /// The operation reported an error (its message is in WaitResult::error).
  kFailed,
  /// The deadline passed first.
  kTimedOut,
};

/// What poll_until saw.
struct WaitResult {
  WaitOutcome outcome = WaitOutcome::kDone;
  /// The error reported by `failed` (kFailed only).
  std::string error;
  /// Seconds between the start of the deadline clock and the end of the wait.
  double waited_seconds = 0;
  /// How often the wait gave the core back between polls: yields and sleeps.
  int64_t yields = 0;
  int64_t sleeps = 0;
};

/// The questions poll_until asks, each cheap and non-blocking.
struct WaitProbes {
  /// True once the operation finished.
  std::function<bool()> done;
  /// A non-empty message once the operation failed (optional).
  std::function<std::string()> failed;
  /// True once the operation has begun running (optional; unset means at once). The deadline
  /// clock starts at the first poll that sees it begun, so time spent queued behind earlier work
  /// is not counted.
  std::function<bool()> started;
  /// True when the operation advances only while it is polled, as MPI's non-blocking calls do
  /// (Note [Waits that move the operation]): poll_until then gives the core back between polls
  /// (a yield) instead of sleeping, for the first second of the wait.
  bool moved_by_polls = false;
};

/// Polls `probes` until the operation is done, fails, or runs `timeout_seconds` past its start
/// (<= 0: no deadline). Spins briefly, then sleeps between polls (20 us, then 200 us, and 1 ms once
/// it has waited a second), so a collective that takes milliseconds is noticed promptly without
/// burning a core, and a long wait for a stopped peer costs about 1% of one. With
/// probes.moved_by_polls it yields between polls instead of sleeping until the wait is a second
/// old, then sleeps 1 ms (Note [Waits that move the operation]).
WaitResult poll_until(const WaitProbes& probes, double timeout_seconds);

}  // namespace kusari::mn::detail
