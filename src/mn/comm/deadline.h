// The pure logic of the communicators' deadline (Note [Deadline on every collective] in
// op_tracker.cc): where a rank stands in a communicator's operations, the control message the
// ranks exchange, the decision whether a rank that finished makes a wait hopeless, and the report
// naming the ranks waited for. Plain C++ (no MPI), so that it is unit-tested on its own.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kusari::mn::detail {

/// What a rank is doing on a communicator.
enum class OpKind : int32_t {
  /// Between operations (computing, or in code that does not use this communicator).
  kNone = 0,
  /// In a collective (every rank of the communicator takes part).
  kCollective = 1,
  /// In a point-to-point send to `peer`.
  kSend = 2,
  /// In a point-to-point receive from `peer`.
  kRecv = 3,
  /// It finalized the communicator (or its process ends).
  kFinished = 4,
};

/// One rank's position in the operations of a communicator.
struct OpPosition {
  OpKind kind = OpKind::kNone;
  /// kCollective: the collective's sequence number on the communicator (1 = the first one).
  /// Otherwise: the number of collectives begun so far.
  int64_t collective = 0;
  /// The operation's name ("multi_node_mean_grad", "send_obj", ...); for kNone and kFinished,
  /// the name of the last collective (empty when there was none).
  std::string name;
  /// kSend / kRecv: the other rank, and this operation's number among this rank's sends to it
  /// (receives from it), 1 = the first.
  int peer = -1;
  int64_t count = 0;
  /// Seconds this rank has waited in the operation so far.
  double waited = 0;
};

/// What a rank that finished told this rank: its position at the end, and how many
/// point-to-point operations it had with this rank.
struct FinishedNotice {
  /// kind == kFinished; collective = the collectives it began, name = the last one's name.
  OpPosition position;
  /// Sends it made to this rank, and receives it made from this rank.
  int64_t sent_to_you = 0;
  int64_t received_from_you = 0;
};

/// True when rank `finished`, having finished as `notice` says, can never take part in the
/// operation this rank waits in (`mine`): a collective it had not begun, or a receive from it (a
/// send to it) beyond the sends it made (the receives it made). See Note [A rank that finishes
/// early].
bool finished_rank_blocks(const OpPosition& mine, int finished, const FinishedNotice& notice);

/// "collective #813 (multi_node_mean_grad)", "send_obj to rank 2 (send #3 to it)",
/// "finished (after collective #812, multi_node_mean_grad)".
std::string describe_position(const OpPosition& p);

/// The error raised on a rank whose wait (in `mine`) cannot end because rank `finished` finished,
/// on communicator `kind`.
std::string finished_rank_message(const char* kind, int rank, int size, const OpPosition& mine,
                                  int finished, const FinishedNotice& notice);

/// What the ranks answered when one rank's deadline passed.
struct PeerReports {
  /// Indexed by rank: the position each rank reported (its own entry is ignored); nullopt for a
  /// rank that did not answer within the grace period.
  std::vector<std::optional<OpPosition>> positions;
  /// Seconds the ranks were given to answer.
  double grace_seconds = 0;
};

/// "2.0", "613.4": a measured time in seconds, as messages show it.
std::string measured_seconds(double s);

/// The verdict on a wait that reached its deadline.
struct Diagnosis {
  /// The ranks this rank waits for, in rank order: for a collective, every rank that did not
  /// answer, or is not in the same collective and has not passed it; for a point-to-point
  /// operation, its peer.
  std::vector<int> waited_for;
  /// One paragraph: the operation, the deadline, how long this rank waited, each rank waited for
  /// and why, and where the other ranks are.
  std::string text;
};

/// Judges the reports of the other ranks for `mine`, the operation this rank (`rank` of `size`,
/// on communicator `kind`) waited in for `mine.waited` seconds against a deadline of
/// `timeout_seconds`. `first` is the rank whose deadline passed first (this rank, or the one whose
/// question started the exchange).
Diagnosis diagnose(const char* kind, int rank, int size, const OpPosition& mine,
                   double timeout_seconds, int first, const PeerReports& reports);

/// The message the ranks exchange over a communicator's control communicator: a fixed-size
/// record of plain fields, sent as bytes.
struct ControlMessage {
  /// What the message is.
  enum Type : int32_t {
    /// The sender finished: its position, and its point-to-point counts with the receiver.
    kFinished = 1,
    /// The sender's deadline passed: where do you stand? (Carries the sender's position.)
    kQuestion = 2,
    /// The answer to a kQuestion: the sender's position.
    kAnswer = 3,
    /// The sender failed (an error it did not catch, Note [One report of a failure]): its rank in
    /// MPI_COMM_WORLD, its host and its error message.
    kFailed = 4,
  };
  /// A Type.
  int32_t type = 0;
  /// The sender's position (OpPosition's fields; `kind` is an OpKind).
  int32_t kind = 0;
  /// OpPosition::collective.
  int64_t collective = 0;
  /// OpPosition::count.
  int64_t count = 0;
  /// OpPosition::peer.
  int32_t peer = -1;
  /// kFailed: the sender's rank in MPI_COMM_WORLD (else zero; keeps the next field aligned the
  /// same way everywhere).
  int32_t world_rank = 0;
  /// kFinished: FinishedNotice's counts.
  int64_t sent_to_you = 0;
  /// kFinished: FinishedNotice's counts.
  int64_t received_from_you = 0;
  /// OpPosition::waited.
  double waited = 0;
  /// kQuestion: seconds the sender still waits for answers.
  double grace_left = 0;
  /// OpPosition::name, cut to 63 bytes and terminated.
  char name[64] = {};
  /// kFailed: the sender's host name, cut to 63 bytes and terminated.
  char host[64] = {};
  /// kFailed: the sender's error message, cut to 1023 bytes and terminated.
  char text[1024] = {};
};

/// What a rank that failed told the others (a kFailed control message).
struct FailureNotice {
  /// Its rank in MPI_COMM_WORLD.
  int world_rank = -1;
  /// Its host name.
  std::string host;
  /// Its error message (cut to 1023 bytes).
  std::string text;
};

/// Packs a failure into a kFailed control message.
ControlMessage make_failure_message(const FailureNotice& failure);
/// The failure a kFailed control message carries (strings repaired as position_of does).
FailureNotice failure_of(const ControlMessage& m);

/// Packs a position (and, for kFinished, the counts) into a control message of `type`.
ControlMessage make_control_message(ControlMessage::Type type, const OpPosition& p,
                                    int64_t sent_to_you = 0, int64_t received_from_you = 0,
                                    double grace_left = 0);
/// The position a control message carries (a name of the wrong length or an unknown kind is
/// repaired, so a damaged message cannot make the report read out of bounds).
OpPosition position_of(const ControlMessage& m);

/// Parses a deadline setting (KUSARI_MN_TIMEOUT): a number of seconds, 0 or more; throws
/// ValueError naming `source` and the text otherwise.
double parse_timeout_seconds(const std::string& text, const char* source);

/// Seconds the ranks are given to answer when a deadline of `timeout_seconds` passes: half of it,
/// at least 0.5 s and at most 5 s.
double grace_seconds(double timeout_seconds);

}  // namespace kusari::mn::detail
