// The deadline of every communicator: each communicator's operations counted and named, every
// wait on MPI requests polled against a deadline, ranks that finish telling the others, and a
// watchdog for the MPI calls that have no non-blocking form. See Note [Deadline on every
// collective], Note [A rank that finishes early] and Note [Blocking calls] in op_tracker.cc.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mn/comm/deadline.h"

namespace kusari {
namespace mn {
class Communicator;
}  // namespace mn
}  // namespace kusari

namespace kusari::mn::detail {

/// One communicator's operations as its deadline sees them: the sequence number of each
/// collective, the point-to-point operations with each peer, the operation in progress, and a
/// control communicator (a duplicate of the communicator's own) over which the ranks tell each
/// other that they finished, or ask where the others stand when a deadline passes. All MPI calls
/// are made by the thread that uses the communicator (MPI_THREAD_SERIALIZED suffices).
class OpTracker {
 public:
  /// Creates the tracker of `comm` (an MPI communicator the caller owns; its control
  /// communicator is duplicated from it) and registers it, so that the end of MPI waits for the
  /// other ranks to finish it too. `kind` (a string that outlives the tracker, e.g. "naive")
  /// names the communicator in messages; no virtual function of the communicator is called.
  static std::shared_ptr<OpTracker> create(MPI_Comm comm, const char* kind, double timeout_seconds,
                                           bool check_collectives = false);
  ~OpTracker();
  OpTracker(const OpTracker&) = delete;
  OpTracker& operator=(const OpTracker&) = delete;

  /// The communicator's kind ("naive", ...).
  const char* kind() const { return kind_; }
  /// The deadline of each wait, in seconds (0: none).
  double timeout_seconds() const { return timeout_; }
  /// Sets it (DeadlineFloor).
  void set_timeout_seconds(double seconds) { timeout_ = seconds; }
  /// This rank and the number of ranks of the communicator.
  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Waits until the `n` requests have completed, against the deadline; the body of wait_requests.
  /// Throws CommunicatorError, and makes the communicator unusable, when a rank that finished
  /// can never take part in the operation in progress, or when the deadline passes (after asking
  /// every rank where it stands: the message names the ranks waited for).
  void wait(MPI_Request* requests, int n, const char* what);

  /// For waits that are not on MPI requests (NCCL's): reads the control messages that came and
  /// returns the error message when a rank that finished can never take part in the operation in
  /// progress, else an empty string. Never blocks.
  std::string blocked_by_finished_rank();
  /// For waits that are not on MPI requests: asks every rank where it stands and returns the
  /// report naming the ranks waited for (Diagnosis::text) after `waited` seconds; marks the
  /// communicator unusable.
  std::string report_deadline(double waited);

  /// "rank 0 of 3 on host h: MPI_Comm_split (split, collective #5 of communicator 'naive') did
  /// not return within ..." for BlockingCallWatch.
  std::string blocking_call_message(const char* call) const;

  /// This rank is done with the communicator: tells every other rank (a notice with its
  /// position), without waiting. The control communicator is released once every rank's notice
  /// has come, at the latest when MPI is finalized (finish_all_trackers). Never throws.
  void finish() noexcept;
  /// True once the communicator failed (a deadline, a rank that finished early): it is unusable.
  bool broken() const { return !broken_.empty(); }
  /// When broken(), replaces the reason later operations quote by `message` (the NCCL kinds' own,
  /// which adds that their NCCL communicators were aborted).
  void amend_failure(const std::string& message) {
    if (broken()) broken_ = message;
  }

  // --- for OpScope ---------------------------------------------------------------------------
  /// Enters an operation (counted when it is the outermost): reads the control messages first
  /// and throws, before anything is posted, when a rank that finished or a rank whose deadline
  /// passed means it can never complete.
  void begin(OpKind kind, const char* name, int peer, int64_t count = -1, int dtype = -1);
  /// Leaves it.
  void end() noexcept;

  // --- for the registry (op_tracker.cc) -----------------------------------------------------
  /// Reads the control messages that came (answering questions); never blocks or throws.
  void poll_control() noexcept;
  /// True once finish() ran, every other rank's notice came and this rank's sends completed.
  bool done() noexcept;
  /// Releases the control communicator (kept, not freed, when the communicator failed: a late
  /// message could otherwise reach a new communicator that reuses its context).
  void release() noexcept;
  /// The ranks whose notice has not come.
  std::vector<int> missing_ranks() const;
  /// Asks the ranks in `ranks` where they stand and waits up to `grace` seconds for answers;
  /// returns what each answered ("rank 2 is in collective #7 (barrier)", "rank 1 did not answer").
  std::string ask(const std::vector<int>& ranks, double grace);
  /// This rank's position now.
  OpPosition position() const;
  /// Tells every other rank of the communicator that this rank failed (Note [One report of a
  /// failure]), without waiting. Never throws.
  void send_failure(const FailureNotice& failure) noexcept;
  /// The failures other ranks told this one of, by communicator rank (nullopt: none).
  const std::vector<std::optional<FailureNotice>>& failures() const { return failed_; }

 private:
  OpTracker(const char* kind, double timeout_seconds);
  void post_receive();
  void handle(const ControlMessage& m, int source);
  void send_control(int dest, const ControlMessage& m);
  /// The rank whose notice makes the operation in progress hopeless, or -1.
  int finished_blocker() const;
  /// The first rank that told this one it failed, or -1.
  int failed_peer() const;
  /// The message of the error raised because rank `peer` failed; recorded, so that the failure
  /// handler ends this rank quietly (the failed rank reports).
  std::string peer_failure_message(int peer);
  /// Asks every rank, waits for the answers (at most `grace` seconds), and returns the diagnosis.
  Diagnosis exchange(double waited, int first, double grace);
  [[noreturn]] void fail(const std::string& message);
  /// Note [Collective signatures]: every rank's (number, name, count, dtype) of the collective
  /// being entered, compared; throws CommunicatorError when they differ.
  void check_signature(const char* name, int64_t count, int dtype);
  /// This rank's last collectives, newest first ("#7 allreduce (12 float32), #6 barrier"), with
  /// `ages` how long ago each began ("#7 allreduce (12 float32) 0.51 s ago").
  std::string recent_collectives(size_t n, bool ages = false) const;

  using Clock = std::chrono::steady_clock;
  const char* kind_;
  double timeout_;
  int rank_ = 0, size_ = 1;
  std::string host_;
  MPI_Comm control_ = MPI_COMM_NULL;

  // The operations. Names are string literals (no allocation per operation).
  int depth_ = 0;
  OpKind kind_now_ = OpKind::kNone;
  const char* name_now_ = "";
  int peer_now_ = -1;
  int64_t count_now_ = 0;
  int64_t collectives_ = 0;
  const char* last_collective_ = "";
  std::vector<int64_t> sends_, recvs_;
  Clock::time_point op_start_;
  // The last collectives (a ring), and whether each collective's signature is checked.
  struct Recent {
    int64_t number = 0;
    const char* name = "";
    int64_t count = -1;
    int dtype = -1;
    Clock::time_point start{};
  };
  static constexpr size_t kRecent = 8;
  Recent recent_[kRecent];
  bool check_collectives_ = false;

  // The control messages.
  MPI_Request incoming_ = MPI_REQUEST_NULL;
  ControlMessage in_;
  struct Outgoing {
    ControlMessage message;
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::list<Outgoing> outgoing_;
  std::vector<std::optional<FinishedNotice>> finished_;
  std::vector<std::optional<OpPosition>> heard_;
  std::vector<std::optional<FailureNotice>> failed_;
  int asked_by_ = -1;
  double asked_grace_ = 0;
  bool finished_self_ = false;
  bool released_ = false;
  std::string broken_;
};

/// Marks an operation of a communicator for its deadline (Note [Deadline on every collective]):
/// the outermost scope of a tracker counts one collective, or one send to / receive from `peer`;
/// scopes within it are part of it. While it lives, wait_requests on this thread uses its tracker. A
/// null tracker makes it do nothing. Throws CommunicatorError when the communicator is unusable.
class OpScope {
 public:
  OpScope(OpTracker* tracker, OpKind kind, const char* name, int peer = -1);
  /// A collective of `count` elements of dtype `dtype` (a kusari Dtype as int), which the
  /// signature check (CommunicatorOptions::check_collectives) compares across ranks too.
  OpScope(OpTracker* tracker, const char* name, int64_t count, int dtype);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpTracker* tracker_;
  OpTracker* previous_;
};

/// While it lives, the waits of `tracker` (which may be null) have a deadline of at least
/// `floor_seconds` when they have one: NCCL's initialisation, including the MPI broadcast of its
/// id, keeps the floor of Note [NCCL timeout] while ranks create their GPU contexts.
class DeadlineFloor {
 public:
  DeadlineFloor(OpTracker* tracker, double floor_seconds) : tracker_(tracker) {
    if (!tracker_) return;
    saved_ = tracker_->timeout_seconds();
    if (saved_ > 0 && saved_ < floor_seconds) tracker_->set_timeout_seconds(floor_seconds);
  }
  ~DeadlineFloor() {
    if (tracker_) tracker_->set_timeout_seconds(saved_);
  }
  DeadlineFloor(const DeadlineFloor&) = delete;
  DeadlineFloor& operator=(const DeadlineFloor&) = delete;

 private:
  OpTracker* tracker_;
  double saved_ = 0;
};

/// The tracker of the operation in progress on this thread (null when none).
OpTracker* active_tracker();
/// The tracker of `comm` (null for a communicator without one).
OpTracker* tracker_of(const Communicator& comm);

/// Waits for `n` requests against `timeout_seconds` without a tracker (a communicator being
/// created); throws CommunicatorError naming `what` and this rank of MPI_COMM_WORLD on expiry.
void wait_untracked(MPI_Request* requests, int n, const char* what, double timeout_seconds);

/// The deadline of KUSARI_MN_TIMEOUT, else CommunicatorOptions' default.
double default_timeout_seconds();

/// Watches a blocking MPI call that has no non-blocking form (MPI_Comm_split): if it has not
/// returned within `timeout_seconds` (<= 0: never), a watchdog thread prints `message` and ends
/// this process, which ends the job (Note [Blocking calls]).
class BlockingCallWatch {
 public:
  BlockingCallWatch(double timeout_seconds, std::string message);
  ~BlockingCallWatch();
  BlockingCallWatch(const BlockingCallWatch&) = delete;
  BlockingCallWatch& operator=(const BlockingCallWatch&) = delete;

 private:
  uint64_t id_ = 0;
};

/// At the end of MPI: finishes every tracker still alive, then waits (bounded by the longest
/// deadline) until every rank's notices have come, and releases the control communicators. If
/// some rank does not finish in time, reports it and aborts the job. Never throws.
void finish_all_trackers() noexcept;

/// Tells every rank of every communicator still alive that this rank failed with `failure`, then
/// listens for up to `window_seconds` (less once every other rank of the job has failed too)
/// for the failures of other ranks, which it returns (one per world rank). Never throws.
std::vector<FailureNotice> announce_failure(const FailureNotice& failure, double window_seconds) noexcept;

/// True when `what` (the message of an error that escaped main) is one that this rank raised
/// because another rank failed (the other rank reports it: Note [One report of a failure]).
bool caused_by_peer_failure(const std::string& what) noexcept;

}  // namespace kusari::mn::detail
