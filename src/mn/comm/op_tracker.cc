#include "mn/comm/op_tracker.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "kusari/core/error.h"
#include "kusari/mn/communicator.h"
#include "mn/comm/mpi_communicator.h"
#include "mn/comm/mpi_util.h"
#include "mn/comm/nccl_wait.h"

namespace kusari::mn::detail {

using ::kusari::detail::concat;

// Note [Deadline on every collective]
// A stopped or dead peer (a frozen node, a stuck file system, SIGSTOP) used to leave the other
// ranks waiting in their next collective forever, spinning at full CPU. Now every wait of a
// communicator has a deadline: CommunicatorOptions::timeout_seconds, or KUSARI_MN_TIMEOUT in
// seconds (0 turns it off); 600 s by default, as PyTorch's NCCL default.
//   - Every MPI operation of the communicators is non-blocking (MPI_Iallreduce, MPI_Ibcast,
//     MPI_Isend / MPI_Irecv, MPI_Ibarrier, MPI_Comm_idup) and is waited for by wait_for
//     (mpi_util.h), which tests the requests at once (most collectives of a training step are done
//     by then, and cost nothing more) and otherwise polls them with poll_until (nccl_wait.h),
//     which yields the core between polls for a second (MPI moves a transfer only inside a
//     poll: Note [Waits that move the operation]) and then sleeps between them, so a rank that
//     waits for a straggler no longer burns a core. The deadline counts from the start of each wait, so a long operation
//     made of many chunks fails only when one chunk makes no progress for the whole deadline.
//   - Each communicator has an OpTracker. Every public operation opens an OpScope: the outermost
//     one counts a collective (its sequence number on the communicator: the same on every rank,
//     since the ranks call the same collectives in the same order) or a send to / receive from a
//     peer (counted per peer and direction). The scopes take the communicator's kind as a plain
//     string given to the constructor: a scope opened while MpiCommunicator is being constructed
//     must not call the virtual name() (that crashed an earlier attempt with "pure virtual method
//     called").
//   - Beside its own MPI communicator, each communicator keeps a duplicate, the control
//     communicator, with one small receive always posted. When a deadline passes, the rank sends
//     a question to every rank over it, carrying its own position, and gives them a grace period
//     (half the deadline, 0.5 to 5 s) to answer. A rank that waits in any operation of that
//     communicator answers at once with its position and, since the job is about to end, starts
//     its own report too, with the rest of the asker's grace period, so that every live rank
//     prints its report at about the same time. Ranks that do not answer are stopped, dead, or busy
//     outside the communicator; ranks that answer from an earlier collective are behind, from a
//     later one ahead. diagnose() (deadline.h) names the ranks waited for, and the rank raises
//     CommunicatorError: "naive: collective #813 (multi_node_mean_grad) did not finish on rank 0
//     of 3: it waited 2.0 s (the deadline is 2 s); it waits for rank 1, which did not answer
//     within 1.0 s (stopped, dead, or busy outside this communicator); rank 2 waits in the same
//     collective". Uncaught, the failure handler prints it and, a second later (so that the
//     reports of the other live ranks, made at about the same moment, are printed too), aborts the
//     job (Note [Failure of one rank ends the job]). Caught, the communicator is unusable: its operation may still be
//     under way in MPI, writing into its buffers if the peer wakes up, so its MPI communicators
//     are never freed (a late message could reach a new communicator that reused their context).
//   - Nothing here needs MPI_THREAD_MULTIPLE: the waits, questions and answers happen on the
//     thread that uses the communicator, inside its waits. The only other thread is the watchdog
//     of Note [Blocking calls], which makes no MPI call.
// The NCCL kinds use the same tracker for their MPI steps (the NCCL id's broadcast, the object
// collectives, the checks) and check it while they wait for NCCL (Note [NCCL timeout]).
//
// Note [A rank that finishes early]
// A rank whose training ends early (a stop trigger that fired for a reason the start-up settings
// check cannot see, a loop that ends sooner) would leave the others waiting in a collective it
// never joins. So a rank that finalizes a communicator (finalize(), its destructor, or the end of
// MPI for one still alive) sends every other rank a notice over the control communicator: the
// number of collectives it began with the last one's name, and the sends it made to that rank and
// the receives it made from it. Every wait checks the notices that came: a collective whose
// sequence number is beyond the finished rank's count, or a receive from it (a send to it) beyond
// the sends it made (the receives it made), can never complete, and the waiting rank raises at
// once, without waiting for the deadline: "naive: rank 1 finished (after collective #812,
// multi_node_mean_grad) while rank 0 of 3 waits in collective #813 (multi_node_mean_grad), which
// rank 1 will never join ...". A rank that finished after the collective the others wait in
// took part in it, so its notice is ignored there: a clean end, where every rank finishes after
// the last collective, raises nothing. finalize() sends and does not wait. The control
// communicator is released once every other rank's notice has come, checked without blocking at
// each creation and finalize, and at the latest when MPI is finalized: a callback on
// MPI_COMM_SELF (which MPI_Finalize runs first, whoever calls it) finishes every communicator
// still alive and waits, against the deadline, for the other ranks' notices. All notices are
// sent before any is waited for, so ranks that finalize their communicators in different orders
// cannot wait for each other. At a clean end this costs one small message to each rank per
// communicator and no waiting. If some rank has not finished when the deadline passes, the
// waiting rank asks where it stands, reports it, and aborts the job, since MPI_Finalize would
// wait for it forever.
//
// Note [Blocking calls]
// MPI_Comm_split has no non-blocking form. A watchdog thread (one per process, started on first
// use, making no MPI call) bounds it: BlockingCallWatch registers the call with its deadline and
// a message made beforehand on the calling thread (rank, host, the communicator and its
// operation); if the call has not returned in time, the watchdog prints the message and ends the
// process with _Exit(1), which makes mpiexec end the whole job. The library does not otherwise end
// a process, but here no exception can be raised: the calling thread is inside MPI, and calling
// MPI_Abort from the watchdog would need MPI_THREAD_MULTIPLE.

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kControlTag = 29417;

/// How long a rank whose communicator failed waits, after printing its report, before it ends the
/// job: the other live ranks fail at about the same moment, and their reports must reach the
/// output before the job is ended.
constexpr double kAbortDelaySeconds = 0.5;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// --- the registry of trackers ------------------------------------------------------------------

std::mutex& registry_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}

/// Every tracker whose control communicator is not yet released: the live ones, and the finished
/// ones whose peers' notices have not all come.
std::vector<std::shared_ptr<OpTracker>>& registry() {
  static auto* r = new std::vector<std::shared_ptr<OpTracker>>();
  return *r;
}

/// The trackers of communicators that failed: never destroyed, since MPI may still write into
/// their posted receive and read their sends (Note [Deadline on every collective]).
std::vector<std::shared_ptr<OpTracker>>& kept() {
  static auto* k = new std::vector<std::shared_ptr<OpTracker>>();
  return *k;
}

/// Releases the finished trackers whose peers have all finished too (never blocks).
void reap() noexcept {
  std::vector<std::shared_ptr<OpTracker>> done;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto& r = registry();
    for (auto it = r.begin(); it != r.end();) {
      if ((*it)->done()) {
        done.push_back(*it);
        if ((*it)->broken()) kept().push_back(*it);
        it = r.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& t : done) t->release();
}

thread_local OpTracker* t_active = nullptr;

// The messages of the errors this rank raised because another rank failed (Note [One report of
// a failure]): the failure handler ends the rank quietly when the error that escaped is one.
std::mutex& peer_failure_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::vector<std::string>& peer_failure_errors() {
  static auto* v = new std::vector<std::string>();
  return *v;
}
void note_peer_failure_error(const std::string& message) {
  std::lock_guard<std::mutex> lock(peer_failure_mutex());
  peer_failure_errors().push_back(message);
}

}  // namespace

// --- OpTracker -----------------------------------------------------------------------------------

OpTracker::OpTracker(const char* kind, double timeout_seconds)
    : kind_(kind ? kind : "communicator"), timeout_(timeout_seconds) {}

std::shared_ptr<OpTracker> OpTracker::create(MPI_Comm comm, const char* kind,
                                             double timeout_seconds, bool check_collectives) {
  std::shared_ptr<OpTracker> t(new OpTracker(kind, timeout_seconds));
  t->check_collectives_ = check_collectives;
  if (const char* env = std::getenv("KUSARI_MN_CHECK_COLLECTIVES")) {
    const std::string v = env;
    KUSARI_CHECK(v == "0" || v == "1", ValueError, "KUSARI_MN_CHECK_COLLECTIVES must be 0 or 1, got '", v, "'");
    t->check_collectives_ = v == "1";
  }
  KUSARI_MPI_CHECK(MPI_Comm_rank(comm, &t->rank_));
  KUSARI_MPI_CHECK(MPI_Comm_size(comm, &t->size_));
  char host[MPI_MAX_PROCESSOR_NAME] = "?";
  int len = 0;
  if (MPI_Get_processor_name(host, &len) == MPI_SUCCESS) t->host_.assign(host, static_cast<size_t>(len));
  MPI_Request request = MPI_REQUEST_NULL;
  KUSARI_MPI_CHECK(MPI_Comm_idup(comm, &t->control_, &request));
  try {
    wait_untracked(&request, 1, concat(t->kind_, ": creating the communicator (MPI_Comm_idup)").c_str(),
                   timeout_seconds);
  } catch (...) {
    t->control_ = MPI_COMM_NULL;  // not made: nothing to release
    t->released_ = true;
    throw;
  }
  KUSARI_MPI_CHECK(MPI_Comm_set_errhandler(t->control_, MPI_ERRORS_RETURN));
  const size_t n = static_cast<size_t>(t->size_);
  t->sends_.assign(n, 0);
  t->recvs_.assign(n, 0);
  t->finished_.assign(n, std::nullopt);
  t->heard_.assign(n, std::nullopt);
  t->failed_.assign(n, std::nullopt);
  t->post_receive();
  reap();  // (communicators finished earlier whose peers' notices have come since)
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().push_back(t);
  return t;
}

OpTracker::~OpTracker() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) release();
}

void OpTracker::post_receive() {
  KUSARI_MPI_CHECK(
      MPI_Irecv(&in_, sizeof(in_), MPI_BYTE, MPI_ANY_SOURCE, kControlTag, control_, &incoming_));
}

void OpTracker::send_control(int dest, const ControlMessage& m) {
  // Requests of sends already done are dropped first, so the list stays short.
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    int flag = 0;
    if (MPI_Test(&it->request, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
      it = outgoing_.erase(it);
    } else {
      ++it;
    }
  }
  Outgoing& o = outgoing_.emplace_back();
  o.message = m;
  KUSARI_MPI_CHECK(
      MPI_Isend(&o.message, sizeof(o.message), MPI_BYTE, dest, kControlTag, control_, &o.request));
}

OpPosition OpTracker::position() const {
  OpPosition p;
  p.collective = collectives_;
  p.name = last_collective_;
  if (finished_self_) {
    p.kind = OpKind::kFinished;
  } else if (depth_ > 0) {
    p.kind = kind_now_;
    p.name = name_now_;
    p.peer = peer_now_;
    p.count = count_now_;
    p.waited = seconds_since(op_start_);
  }
  return p;
}

void OpTracker::handle(const ControlMessage& m, int source) {
  if (source < 0 || source >= size_ || source == rank_) return;
  const size_t s = static_cast<size_t>(source);
  switch (m.type) {
    case ControlMessage::kFinished: {
      FinishedNotice n;
      n.position = position_of(m);
      n.position.kind = OpKind::kFinished;
      n.sent_to_you = m.sent_to_you;
      n.received_from_you = m.received_from_you;
      finished_[s] = n;
      break;
    }
    case ControlMessage::kQuestion:
      heard_[s] = position_of(m);
      if (asked_by_ < 0 && !finished_self_) {
        asked_by_ = source;
        asked_grace_ = m.grace_left;
      }
      send_control(source, make_control_message(ControlMessage::kAnswer, position()));
      break;
    case ControlMessage::kAnswer:
      heard_[s] = position_of(m);
      break;
    case ControlMessage::kFailed:
      failed_[s] = failure_of(m);
      break;
    default:
      break;
  }
}

void OpTracker::poll_control() noexcept {
  if (control_ == MPI_COMM_NULL || incoming_ == MPI_REQUEST_NULL) return;
  try {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Test(&incoming_, &flag, &status) != MPI_SUCCESS || !flag) return;
      const ControlMessage m = in_;
      post_receive();
      handle(m, status.MPI_SOURCE);
    }
  } catch (...) {
    // A control message that cannot be sent or received leaves only the report poorer.
  }
}

int OpTracker::failed_peer() const {
  for (int r = 0; r < size_; ++r) {
    if (failed_[static_cast<size_t>(r)]) return r;
  }
  return -1;
}

std::string OpTracker::peer_failure_message(int peer) {
  const FailureNotice& f = *failed_[static_cast<size_t>(peer)];
  const std::string message =
      concat(kind_, ": rank ", peer, " failed (rank ", f.world_rank, " of the job, on host ", f.host,
             ") while rank ", rank_, " of ", size_, " waited in ", describe_position(position()), ": ", f.text);
  note_peer_failure_error(message);
  return message;
}

int OpTracker::finished_blocker() const {
  if (depth_ == 0) return -1;
  OpPosition mine;
  mine.kind = kind_now_;
  mine.collective = collectives_;
  mine.peer = peer_now_;
  mine.count = count_now_;
  for (int r = 0; r < size_; ++r) {
    const auto& n = finished_[static_cast<size_t>(r)];
    if (n && finished_rank_blocks(mine, r, *n)) return r;
  }
  return -1;
}

void OpTracker::begin(OpKind kind, const char* name, int peer, int64_t count, int dtype) {
  if (depth_ > 0) {
    ++depth_;
    return;
  }
  KUSARI_CHECK(broken_.empty(), CommunicatorError, kind_, ": ", name,
               ": this communicator is unusable after an earlier failure: ", broken_,
               "; create a new communicator");
  KUSARI_CHECK(!finished_self_, CommunicatorError, kind_, ": ", name,
               ": the communicator was finalized");
  if (kind == OpKind::kSend || kind == OpKind::kRecv) {
    KUSARI_CHECK(peer >= 0 && peer < size_, ValueError, name, ": rank ", peer,
                 " is outside 0..", size_ - 1);
    KUSARI_CHECK(peer != rank_, ValueError, name, ": rank ", rank_, " cannot ",
                 kind == OpKind::kSend ? "send to" : "receive from", " itself");
  }
  depth_ = 1;
  kind_now_ = kind;
  name_now_ = name;
  peer_now_ = peer;
  count_now_ = 0;
  op_start_ = Clock::now();
  switch (kind) {
    case OpKind::kCollective:
      ++collectives_;
      last_collective_ = name;
      recent_[static_cast<size_t>(collectives_) % kRecent] = Recent{collectives_, name, count, dtype, op_start_};
      break;
    case OpKind::kSend:
      count_now_ = ++sends_[static_cast<size_t>(peer)];
      break;
    case OpKind::kRecv:
      count_now_ = ++recvs_[static_cast<size_t>(peer)];
      break;
    case OpKind::kNone:
    case OpKind::kFinished:
      break;
  }
  // Before anything is posted: a rank that comes late to a collective the others gave up on must
  // not complete it behind their backs (MPI would write into buffers they no longer hold).
  poll_control();
  const int blocker = finished_blocker();
  if (blocker < 0 && asked_by_ < 0) {
    const int failed = failed_peer();
    if (failed < 0) {
      if (check_collectives_ && kind == OpKind::kCollective && size_ > 1) check_signature(name, count, dtype);
      return;
    }
    const std::string message = peer_failure_message(failed);
    depth_ = 0;
    kind_now_ = OpKind::kNone;
    broken_ = message;
    KUSARI_THROW(CommunicatorError, message);
  }
  const std::string message =
      blocker >= 0 ? finished_rank_message(kind_, rank_, size_, position(), blocker,
                                           *finished_[static_cast<size_t>(blocker)])
                   : exchange(0.0, asked_by_,
                              std::min(std::max(asked_grace_, 0.0), grace_seconds(timeout_)))
                         .text;
  depth_ = 0;
  kind_now_ = OpKind::kNone;
  fail(message);
}

// Note [Collective signatures]
// Ranks that call different collectives (a rank skips a step, takes another branch, or passes
// another size) either wait until the deadline, or worse, complete mismatched operations: MPI
// matches collectives by order alone, so an allreduce can meet a broadcast of another size.
// With check_collectives (KUSARI_MN_CHECK_COLLECTIVES=1) every outermost collective first
// allgathers, over the control communicator, each rank's signature: the collective's number on
// this communicator, its name, and for the operations that give them the element count and
// dtype. Since the check is the same MPI operation whatever the collective, it always matches,
// and every rank compares the same table: when it differs, all of them raise the same
// CommunicatorError before posting anything, naming the first number at which they disagree
// (the current one: the ones before agreed), each rank's call, and this rank's last
// collectives. A rank busy in a point-to-point operation or stopped meets the deadline of the
// check as of any wait. It costs one allgather of a few bytes per collective (a latency, not
// bandwidth): a debug mode, off by default.
void OpTracker::check_signature(const char* name, int64_t count, int dtype) {
  struct Signature {
    int64_t number;
    int64_t count;
    int32_t dtype;
    char name[36];
  };
  Signature mine{};
  mine.number = collectives_;
  mine.count = count;
  mine.dtype = dtype;
  std::strncpy(mine.name, name, sizeof(mine.name) - 1);
  std::vector<Signature> all(static_cast<size_t>(size_));
  MPI_Request request = MPI_REQUEST_NULL;
  KUSARI_MPI_CHECK(MPI_Iallgather(&mine, sizeof(Signature), MPI_BYTE, all.data(), sizeof(Signature), MPI_BYTE,
                                  control_, &request));
  wait(&request, 1, "the check of the collectives' signatures (MPI_Iallgather)");
  auto describe = [](const Signature& s) {
    std::string d = concat("#", s.number, " ", s.name);
    if (s.count >= 0) {
      d += concat(" (", s.count, s.dtype >= 0 ? concat(" ", dtype_name(static_cast<Dtype>(s.dtype))) : "", ")");
    }
    return d;
  };
  bool same = true;
  for (const Signature& s : all) {
    same = same && s.number == mine.number && std::strcmp(s.name, mine.name) == 0 &&
           (s.count < 0 || mine.count < 0 || s.count == mine.count) &&
           (s.dtype < 0 || mine.dtype < 0 || s.dtype == mine.dtype);
  }
  if (same) return;
  std::string calls;
  for (size_t r = 0; r < all.size(); ++r) calls += concat(r == 0 ? "" : ", ", "rank ", r, " calls ", describe(all[r]));
  const std::string message =
      concat(kind_, ": the ranks call different collectives (KUSARI_MN_CHECK_COLLECTIVES): ", calls,
             "; the collectives before agreed. Rank ", rank_, "'s last collectives: ", recent_collectives(4),
             ". Every rank must call the communicator's collectives in the same order (SPMD)");
  depth_ = 0;
  kind_now_ = OpKind::kNone;
  fail(message);
}

std::string OpTracker::recent_collectives(size_t n, bool ages) const {
  std::string out;
  const Clock::time_point now = Clock::now();
  for (int64_t k = collectives_; k > 0 && k > collectives_ - static_cast<int64_t>(std::min(n, kRecent)); --k) {
    const Recent& r = recent_[static_cast<size_t>(k) % kRecent];
    if (r.number != k) break;
    out += concat(out.empty() ? "" : ", ", "#", r.number, " ", r.name);
    if (r.count >= 0) {
      out += concat(" (", r.count, r.dtype >= 0 ? concat(" ", dtype_name(static_cast<Dtype>(r.dtype))) : "", ")");
    }
    if (ages) out += concat(" ", measured_seconds(std::chrono::duration<double>(now - r.start).count()), " s ago");
  }
  return out.empty() ? "none" : out;
}

void OpTracker::end() noexcept {
  if (depth_ > 0 && --depth_ == 0) kind_now_ = OpKind::kNone;
}

void OpTracker::fail(const std::string& message) {
  broken_ = message;
  delay_abort(kAbortDelaySeconds);
  KUSARI_THROW(CommunicatorError, message);
}

void OpTracker::wait(MPI_Request* requests, int n, const char* what) {
  const Clock::time_point start = Clock::now();
  int blocker = -1;
  WaitProbes probes;
  probes.done = [&] {
    int flag = 0;
    const int code = MPI_Testall(n, requests, &flag, MPI_STATUSES_IGNORE);
    int error_class = MPI_SUCCESS;
    if (code != MPI_SUCCESS) MPI_Error_class(code, &error_class);
    if (kind_now_ == OpKind::kCollective && (error_class == MPI_ERR_TRUNCATE || error_class == MPI_ERR_IN_STATUS)) {
      // A message longer than this rank posted for: ranks out of step (Note [Collective signatures]).
      char text[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(code, text, &len);
      KUSARI_THROW(CommunicatorError, "MPI call failed: ", what, ": ", std::string(text, static_cast<size_t>(len)),
                   " in collective #", collectives_, " (", name_now_, ") on rank ", rank_, " of ", size_,
                   ": a message came that does not fit what this rank posted, which ranks that call different "
                   "collectives or sizes cause (KUSARI_MN_CHECK_COLLECTIVES=1 stops at the first differing call). "
                   "Rank ", rank_, "'s last collectives: ", recent_collectives(kRecent, true));
    }
    check_mpi(code, what);
    return flag != 0;
  };
  probes.moved_by_polls = true;  // (Note [Waits that move the operation])
  probes.failed = [&]() -> std::string {
    poll_control();
    blocker = finished_blocker();
    return blocker >= 0 || asked_by_ >= 0 || failed_peer() >= 0 ? "stop" : "";
  };
  const WaitResult w = poll_until(probes, timeout_);
  if (w.outcome == WaitOutcome::kDone) return;
  const double waited = seconds_since(start);
  // A question first: the asking rank's deadline passed, and this rank's report belongs beside
  // its own, even when a failure notice came right after the question.
  if (blocker < 0 && asked_by_ < 0 && w.outcome != WaitOutcome::kTimedOut && failed_peer() >= 0) {
    const std::string message = peer_failure_message(failed_peer());
    broken_ = message;
    KUSARI_THROW(CommunicatorError, message);
  }
  if (blocker >= 0) {
    OpPosition mine = position();
    mine.waited = waited;
    fail(finished_rank_message(kind_, rank_, size_, mine, blocker,
                               *finished_[static_cast<size_t>(blocker)]));
  }
  const bool asked = asked_by_ >= 0;
  const double grace = asked ? std::min(std::max(asked_grace_, 0.0), grace_seconds(timeout_))
                             : grace_seconds(timeout_);
  const Diagnosis d = exchange(waited, asked ? asked_by_ : rank_, grace);
  fail(d.text);
}

Diagnosis OpTracker::exchange(double waited, int first, double grace) {
  OpPosition mine = position();
  mine.waited = waited;
  broken_ = "a deadline passed";
  const Clock::time_point start = Clock::now();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    try {
      send_control(r, make_control_message(ControlMessage::kQuestion, mine, 0, 0, grace));
    } catch (...) {
    }
  }
  auto all_heard = [&] {
    for (int r = 0; r < size_; ++r) {
      const size_t s = static_cast<size_t>(r);
      if (r != rank_ && !heard_[s] && !finished_[s]) return false;
    }
    return true;
  };
  for (;;) {
    poll_control();
    if (all_heard() || seconds_since(start) >= grace) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  PeerReports reports;
  reports.grace_seconds = grace;
  reports.positions.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const size_t s = static_cast<size_t>(r);
    if (finished_[s]) {
      reports.positions[s] = finished_[s]->position;
    } else {
      reports.positions[s] = heard_[s];
    }
  }
  Diagnosis d = diagnose(kind_, rank_, size_, mine, timeout_, first, reports);
  // This rank's last collectives, when they began (the ring of Note [Collective signatures]).
  d.text += concat(". Rank ", rank_, "'s last collectives: ", recent_collectives(kRecent, true));
  return d;
}

std::string OpTracker::blocked_by_finished_rank() {
  poll_control();
  const int blocker = finished_blocker();
  if (blocker < 0 && asked_by_ < 0 && failed_peer() >= 0) {
    broken_ = peer_failure_message(failed_peer());
    return broken_;
  }
  if (blocker < 0) return {};
  const std::string message = finished_rank_message(kind_, rank_, size_, position(), blocker,
                                                    *finished_[static_cast<size_t>(blocker)]);
  broken_ = message;
  return message;
}

std::string OpTracker::report_deadline(double waited) {
  const Diagnosis d = exchange(waited, asked_by_ >= 0 ? asked_by_ : rank_, grace_seconds(timeout_));
  broken_ = d.text;
  return d.text;
}

std::string OpTracker::blocking_call_message(const char* call) const {
  return concat("rank ", rank_, " of ", size_, " on host ", host_, ": ", call, ", in ",
                depth_ > 0 ? describe_position(position()) : std::string("the creation"),
                " of communicator '", kind_, "', did not return within ", timeout_,
                " s; a peer process may have died, be stopped, or not have called it "
                "(KUSARI_MN_TIMEOUT or CommunicatorOptions::timeout_seconds sets the deadline)");
}

void OpTracker::send_failure(const FailureNotice& failure) noexcept {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || released_ || control_ == MPI_COMM_NULL) return;
  const ControlMessage m = make_failure_message(failure);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    try {
      send_control(r, m);
    } catch (...) {
    }
  }
}

void OpTracker::finish() noexcept {
  if (finished_self_) return;
  finished_self_ = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || control_ == MPI_COMM_NULL) return;
  const OpPosition p = position();
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const size_t s = static_cast<size_t>(r);
    try {
      send_control(r, make_control_message(ControlMessage::kFinished, p, sends_[s], recvs_[s]));
    } catch (...) {
    }
  }
  poll_control();
  reap();
}

bool OpTracker::done() noexcept {
  if (!finished_self_) return false;
  if (released_ || control_ == MPI_COMM_NULL) return true;
  if (!broken_.empty()) return true;  // released (kept) at once: see release()
  poll_control();
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && !finished_[static_cast<size_t>(r)]) return false;
  }
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    int flag = 0;
    if (MPI_Test(&it->request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) return false;
    it = outgoing_.erase(it);
  }
  return true;
}

std::vector<int> OpTracker::missing_ranks() const {
  std::vector<int> out;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_ && !finished_[static_cast<size_t>(r)]) out.push_back(r);
  }
  return out;
}

std::string OpTracker::ask(const std::vector<int>& ranks, double grace) {
  const OpPosition mine = position();
  for (int r : ranks) {
    heard_[static_cast<size_t>(r)].reset();
    try {
      send_control(r, make_control_message(ControlMessage::kQuestion, mine, 0, 0, grace));
    } catch (...) {
    }
  }
  const Clock::time_point start = Clock::now();
  auto answered = [&] {
    for (int r : ranks) {
      const size_t s = static_cast<size_t>(r);
      if (!heard_[s] && !finished_[s]) return false;
    }
    return true;
  };
  while (!answered() && seconds_since(start) < grace) {
    poll_control();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::string out;
  for (int r : ranks) {
    const size_t s = static_cast<size_t>(r);
    out += out.empty() ? "" : "; ";
    if (finished_[s]) {
      out += concat("rank ", r, " has ", describe_position(finished_[s]->position));
    } else if (heard_[s]) {
      out += concat("rank ", r, " is in ", describe_position(*heard_[s]));
    } else {
      char g[32];
      std::snprintf(g, sizeof(g), "%.1f", grace);
      out += concat("rank ", r, " did not answer within ", g,
                    " s (stopped, dead, or busy outside this communicator)");
    }
  }
  return out;
}

void OpTracker::release() noexcept {
  if (released_) return;
  released_ = true;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || control_ == MPI_COMM_NULL) return;
  if (!broken_.empty()) {
    // Kept: a late message could otherwise reach a new communicator that reuses its context.
    for (Outgoing& o : outgoing_) {
      if (o.request != MPI_REQUEST_NULL) MPI_Request_free(&o.request);
    }
    return;
  }
  if (incoming_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&incoming_);
    MPI_Wait(&incoming_, MPI_STATUS_IGNORE);
  }
  for (Outgoing& o : outgoing_) {
    if (o.request != MPI_REQUEST_NULL) MPI_Request_free(&o.request);
  }
  outgoing_.clear();
  MPI_Comm_free(&control_);
}

// --- scopes and waits ----------------------------------------------------------------------------

OpScope::OpScope(OpTracker* tracker, OpKind kind, const char* name, int peer)
    : tracker_(tracker), previous_(t_active) {
  if (!tracker_) return;
  tracker_->begin(kind, name, peer);
  t_active = tracker_;
}

OpScope::OpScope(OpTracker* tracker, const char* name, int64_t count, int dtype)
    : tracker_(tracker), previous_(t_active) {
  if (!tracker_) return;
  tracker_->begin(OpKind::kCollective, name, -1, count, dtype);
  t_active = tracker_;
}

OpScope::~OpScope() {
  if (!tracker_) return;
  tracker_->end();
  t_active = previous_;
}

OpTracker* active_tracker() { return t_active; }

OpTracker* tracker_of(const Communicator& comm) {
  const auto* m = dynamic_cast<const MpiCommunicator*>(&comm);
  return m ? m->tracker() : nullptr;
}

double default_timeout_seconds() {
  if (const char* t = std::getenv("KUSARI_MN_TIMEOUT")) return parse_timeout_seconds(t, "KUSARI_MN_TIMEOUT");
  return CommunicatorOptions{}.timeout_seconds;
}

void wait_untracked(MPI_Request* requests, int n, const char* what, double timeout_seconds) {
  WaitProbes probes;
  probes.done = [&] {
    int flag = 0;
    check_mpi(MPI_Testall(n, requests, &flag, MPI_STATUSES_IGNORE), what);
    return flag != 0;
  };
  probes.moved_by_polls = true;
  const WaitResult w = poll_until(probes, timeout_seconds);
  if (w.outcome == WaitOutcome::kDone) return;
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  KUSARI_THROW(CommunicatorError, what, " did not finish within the deadline of ", timeout_seconds,
               " s on rank ", rank, " of ", size,
               " (of MPI_COMM_WORLD); a peer process may have died, be stopped, or not have "
               "called it (KUSARI_MN_TIMEOUT or CommunicatorOptions::timeout_seconds sets the "
               "deadline)");
}

void wait_requests(MPI_Request* requests, int count, const char* what) {
  if (count <= 0) return;
  int flag = 0;
  check_mpi(MPI_Testall(count, requests, &flag, MPI_STATUSES_IGNORE), what);
  if (flag) return;
  if (OpTracker* t = t_active) {
    t->wait(requests, count, what);
  } else {
    wait_untracked(requests, count, what, default_timeout_seconds());
  }
}

// --- the watchdog of blocking calls --------------------------------------------------------------

namespace {

class Watchdog {
 public:
  Watchdog() { std::thread([this] { run(); }).detach(); }

  uint64_t add(Clock::time_point deadline, std::string message) {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t id = next_++;
    calls_[id] = Call{deadline, std::move(message)};
    wake_.notify_all();
    return id;
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.erase(id);
  }

 private:
  struct Call {
    Clock::time_point deadline;
    std::string message;
  };
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (calls_.empty()) {
        wake_.wait(lock);
        continue;
      }
      auto first = std::min_element(calls_.begin(), calls_.end(), [](const auto& a, const auto& b) {
        return a.second.deadline < b.second.deadline;
      });
      // A copy: wait_until reads its time point again after waking, and while it waits (the
      // lock released) the call may be removed and its map node freed.
      const Clock::time_point deadline = first->second.deadline;
      if (Clock::now() < deadline) {
        wake_.wait_until(lock, deadline);
        continue;
      }
      std::fprintf(stderr, "\n[kusari.mn] %s\n[kusari.mn] ending this process, which ends the whole job\n",
                   first->second.message.c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Call> calls_;
  uint64_t next_ = 1;
};

Watchdog& watchdog() {
  static Watchdog* w = new Watchdog();  // never destroyed: its thread may outlive static destructors
  return *w;
}

}  // namespace

BlockingCallWatch::BlockingCallWatch(double timeout_seconds, std::string message) {
  if (timeout_seconds <= 0) return;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  id_ = watchdog().add(deadline, std::move(message));
}

BlockingCallWatch::~BlockingCallWatch() {
  if (id_) watchdog().remove(id_);
}

// --- one report of a failure --------------------------------------------------------------------

// Note [One report of a failure]
// An error that escapes main on one rank used to end the job with MPI_Abort: Open MPI's 7-line
// banner, and an ORTE_ERROR_LOG line where several ranks aborted at once, made every failure look
// like a crash of MPI; and an error that every rank hit (a bad setting checked on every rank) was
// printed once per rank. Now the failure handler (Note [Failure of one rank ends the job]):
//   - tells every rank of every live communicator, over the control communicators, that this rank
//     failed, with its world rank, host and message (a kFailed control message);
//   - listens for a second for the other ranks' failures (less once every rank has failed;
//     another second after each new one, up to four seconds);
//   - prints each distinct message once, from the lowest rank that hit it, with the list of
//     ranks: "[kusari.mn] ranks 0, 1 and 2 of 3 failed: ...", and the lowest failed rank ends with
//     "[kusari.mn] the job ends: exit status 1";
//   - ends the process with status 1 (Open MPI's mpiexec then ends the rest of the job; under
//     another launcher, which may not, MPI_Abort still ends it).
// A rank that waits in a collective or a receive sees the notice in its wait and raises a
// CommunicatorError quoting the failure ("naive: rank 1 failed (rank 1 of the job, on host h)
// while rank 0 of 2 waited in collective #5 (multi_node_mean_grad): ..."); uncaught, it ends that
// rank quietly with status 1, since the failed rank reports. A question of a deadline is answered
// before a failure notice that came after it, so the ranks' deadline reports are all printed.

std::vector<FailureNotice> announce_failure(const FailureNotice& failure, double window_seconds) noexcept {
  std::vector<FailureNotice> others;
  try {
    std::vector<std::shared_ptr<OpTracker>> all;
    {
      std::lock_guard<std::mutex> lock(registry_mutex());
      all = registry();
      all.insert(all.end(), kept().begin(), kept().end());
    }
    if (all.empty()) return others;
    for (auto& t : all) t->send_failure(failure);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    std::map<int, FailureNotice> heard;
    // Failures that trickle in (ranks that fail alike, one descheduled a little longer than the
    // others) extend the window: each new one gives the rest another window, up to 4 in all.
    const Clock::time_point start = Clock::now();
    double until = window_seconds;
    for (;;) {
      const size_t before = heard.size();
      for (auto& t : all) {
        t->poll_control();
        for (const auto& f : t->failures()) {
          if (f && f->world_rank != failure.world_rank) heard.emplace(f->world_rank, *f);
        }
      }
      const double now = seconds_since(start);
      if (heard.size() > before) until = std::min(std::max(until, now + window_seconds), 4 * window_seconds);
      if (static_cast<int>(heard.size()) + 1 >= world || now >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (auto& [rank, f] : heard) others.push_back(f);
  } catch (...) {
  }
  return others;
}

bool caused_by_peer_failure(const std::string& what) noexcept {
  try {
    std::lock_guard<std::mutex> lock(peer_failure_mutex());
    for (const std::string& m : peer_failure_errors()) {
      if (what.find(m) != std::string::npos) return true;
    }
  } catch (...) {
  }
  return false;
}

// --- the end of MPI ------------------------------------------------------------------------------

void finish_all_trackers() noexcept {
  std::vector<std::shared_ptr<OpTracker>> all;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    all = registry();
  }
  // Every notice first, then the waiting (Note [A rank that finishes early]).
  double timeout = 0;
  bool forever = false;
  for (auto& t : all) {
    t->finish();
    if (t->timeout_seconds() <= 0) forever = true;
    timeout = std::max(timeout, t->timeout_seconds());
  }
  WaitProbes probes;
  probes.done = [&] {
    reap();
    std::lock_guard<std::mutex> lock(registry_mutex());
    return registry().empty();
  };
  const WaitResult w = poll_until(probes, forever ? 0.0 : timeout);
  if (w.outcome == WaitOutcome::kDone) return;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    all = registry();
  }
  for (auto& t : all) {
    const std::vector<int> missing = t->missing_ranks();
    if (missing.empty()) continue;
    const OpPosition p = t->position();
    char waited[32];
    std::snprintf(waited, sizeof(waited), "%.1f", w.waited_seconds);
    message += concat(message.empty() ? "" : "; ", t->kind(), ": rank ", t->rank(), " of ",
                      t->size(), " finished the communicator after ",
                      p.collective > 0 ? concat("collective #", p.collective, " (", p.name, ")")
                                       : std::string("no collective"),
                      " and waited ", waited, " s for the other ranks to finish it too: ",
                      t->ask(missing, grace_seconds(t->timeout_seconds())));
  }
  if (message.empty()) return;
  message += " (KUSARI_MN_TIMEOUT or CommunicatorOptions::timeout_seconds sets the deadline)";
  report_failure_and_abort(message);
}

}  // namespace kusari::mn::detail
