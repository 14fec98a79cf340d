#include "mn/comm/deadline.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "kusari/core/error.h"

namespace kusari::mn::detail {

using ::kusari::detail::concat;

std::string measured_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

namespace {

/// "2", "0.5", "600": a setting as the user wrote it.
std::string setting_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

/// "rank 2", "ranks 0, 1 and 3", "ranks 0, 1, ..., 15 and 240 more".
std::string ranks_phrase(const std::vector<int>& ranks) {
  constexpr size_t kShown = 16;
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  if (ranks.size() > kShown) {
    for (size_t i = 0; i < kShown; ++i) out << ranks[i] << ", ";
    out << "... and " << ranks.size() - kShown << " more";
    return out.str();
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out << (i + 1 == ranks.size() ? " and " : ", ");
    out << ranks[i];
  }
  return out.str();
}

std::string after_phrase(const OpPosition& p) {
  if (p.collective <= 0) return "before any collective";
  return concat("after collective #", p.collective, p.name.empty() ? "" : ", ", p.name);
}

}  // namespace

bool finished_rank_blocks(const OpPosition& mine, int finished, const FinishedNotice& notice) {
  switch (mine.kind) {
    case OpKind::kCollective:
      return notice.position.collective < mine.collective;
    case OpKind::kRecv:
      return mine.peer == finished && notice.sent_to_you < mine.count;
    case OpKind::kSend:
      return mine.peer == finished && notice.received_from_you < mine.count;
    case OpKind::kNone:
    case OpKind::kFinished:
      return false;
  }
  return false;
}

std::string describe_position(const OpPosition& p) {
  switch (p.kind) {
    case OpKind::kCollective:
      return concat("collective #", p.collective, " (", p.name, ")");
    case OpKind::kSend:
      return concat(p.name, " to rank ", p.peer, " (send #", p.count, " to it)");
    case OpKind::kRecv:
      return concat(p.name, " from rank ", p.peer, " (receive #", p.count, " from it)");
    case OpKind::kFinished:
      return concat("finished (", after_phrase(p), ")");
    case OpKind::kNone:
      return concat("between operations (", after_phrase(p), ")");
  }
  return "an unknown operation";
}

std::string finished_rank_message(const char* kind, int rank, int size, const OpPosition& mine,
                                  int finished, const FinishedNotice& notice) {
  std::ostringstream out;
  out << kind << ": rank " << finished << " " << describe_position(notice.position)
      << " while rank " << rank << " of " << size << " waits in " << describe_position(mine);
  switch (mine.kind) {
    case OpKind::kCollective:
      out << ", which rank " << finished << " will never join; every rank must run the same "
          << "collectives in the same order (did a loop or a stop trigger end early on rank "
          << finished << "?)";
      break;
    case OpKind::kRecv:
      out << ", but rank " << finished << " sent only " << notice.sent_to_you
          << " message(s) to rank " << rank << " before it finished";
      break;
    case OpKind::kSend:
      out << ", but rank " << finished << " received only " << notice.received_from_you
          << " message(s) from rank " << rank << " before it finished";
      break;
    case OpKind::kNone:
    case OpKind::kFinished:
      break;
  }
  return out.str();
}

Diagnosis diagnose(const char* kind, int rank, int size, const OpPosition& mine,
                   double timeout_seconds, int first, const PeerReports& reports) {
  Diagnosis d;
  std::vector<int> silent, same;
  std::vector<std::string> differing;  // ranks in the same collective by number, but another one
  std::vector<std::string> waited_notes, other_notes;
  auto position_of_rank = [&](int r) -> const std::optional<OpPosition>& {
    static const std::optional<OpPosition> none;
    return static_cast<size_t>(r) < reports.positions.size() ? reports.positions[static_cast<size_t>(r)]
                                                            : none;
  };
  auto note = [](int r, const char* verb, const OpPosition& p) {
    std::string s = concat("rank ", r, " ", verb, " ", describe_position(p));
    if (p.kind != OpKind::kFinished && p.kind != OpKind::kNone && p.waited > 0)
      s += concat(", waiting ", measured_seconds(p.waited), " s");
    return s;
  };
  const bool point_to_point = mine.kind == OpKind::kSend || mine.kind == OpKind::kRecv;
  for (int r = 0; r < size; ++r) {
    if (r == rank || (point_to_point && r != mine.peer)) continue;
    const std::optional<OpPosition>& p = position_of_rank(r);
    if (!p) {
      silent.push_back(r);
      d.waited_for.push_back(r);
      continue;
    }
    if (point_to_point) {
      d.waited_for.push_back(r);
      waited_notes.push_back(note(r, "is in", *p));
      continue;
    }
    const bool in_same = p->kind == OpKind::kCollective && p->collective == mine.collective;
    // Past it: in a later collective, or finished after having begun this one.
    const bool past = (p->kind == OpKind::kCollective && p->collective > mine.collective) ||
                      (p->kind != OpKind::kCollective && p->collective >= mine.collective);
    // The same number, another collective (being in it, or having left the job after it): the
    // ranks' sequences of collectives diverged.
    const bool left_after_same = p->kind == OpKind::kFinished && p->collective == mine.collective;
    if ((in_same || left_after_same) && p->name != mine.name) {
      d.waited_for.push_back(r);
      differing.push_back(concat("rank ", r, in_same ? " is in " : " has ", describe_position(*p)));
    } else if (in_same) {
      same.push_back(r);
    } else if (past) {
      other_notes.push_back(
          note(r, p->kind == OpKind::kFinished ? "has" : "is ahead, in", *p));
    } else {
      d.waited_for.push_back(r);
      const char* verb = p->kind == OpKind::kFinished     ? "has"
                         : p->kind == OpKind::kCollective ? "is behind, in"
                                                          : "is in";
      waited_notes.push_back(note(r, verb, *p));
    }
  }

  std::ostringstream out;
  out << kind << ": " << describe_position(mine) << " did not finish on rank " << rank << " of "
      << size << ": it waited " << measured_seconds(mine.waited) << " s";
  if (first == rank) {
    out << " (the deadline is " << setting_seconds(timeout_seconds) << " s)";
  } else {
    out << " (rank " << first << " reached the deadline of " << setting_seconds(timeout_seconds)
        << " s first)";
  }
  if (!differing.empty()) {
    out << "; the ranks called different collectives as #" << mine.collective << " (desynchronised: a "
        << "branch, a skipped step or another size taken on some ranks only): this rank " << mine.name;
    for (const std::string& note_text : differing) out << "; " << note_text;
    out << " (KUSARI_MN_CHECK_COLLECTIVES=1 stops at the first differing call, with each rank's sizes)";
  }
  if (d.waited_for.empty() && first != rank) {
    out << "; every other rank has reached this collective, so this rank came to it late "
           "(was it stopped, or slow?)";
  } else if (d.waited_for.empty()) {
    out << "; every rank answered from the same collective (a slow network or a very long "
           "collective? raise the deadline)";
  } else if (d.waited_for.size() > differing.size()) {
    out << "; it waits for ";
    std::vector<std::string> parts;
    if (!silent.empty()) {
      parts.push_back(concat(ranks_phrase(silent), ", which did not answer within ", measured_seconds(reports.grace_seconds),
                             " s (stopped, dead, or busy outside this communicator)"));
    }
    constexpr size_t kNotes = 8;
    for (size_t i = 0; i < waited_notes.size() && i < kNotes; ++i) parts.push_back(waited_notes[i]);
    if (waited_notes.size() > kNotes)
      parts.push_back(concat(waited_notes.size() - kNotes, " more ranks elsewhere"));
    for (size_t i = 0; i < parts.size(); ++i) out << (i ? "; " : "") << parts[i];
  }
  if (!same.empty()) {
    out << "; " << ranks_phrase(same) << (same.size() == 1 ? " waits" : " wait")
        << " in the same collective";
  }
  constexpr size_t kOthers = 8;
  for (size_t i = 0; i < other_notes.size() && i < kOthers; ++i) out << "; " << other_notes[i];
  if (other_notes.size() > kOthers) out << "; " << other_notes.size() - kOthers << " more ranks are ahead";
  out << " (KUSARI_MN_TIMEOUT or CommunicatorOptions::timeout_seconds sets the deadline)";
  d.text = out.str();
  return d;
}

ControlMessage make_control_message(ControlMessage::Type type, const OpPosition& p,
                                    int64_t sent_to_you, int64_t received_from_you,
                                    double grace_left) {
  ControlMessage m;
  m.type = type;
  m.kind = static_cast<int32_t>(p.kind);
  m.collective = p.collective;
  m.count = p.count;
  m.peer = p.peer;
  m.sent_to_you = sent_to_you;
  m.received_from_you = received_from_you;
  m.waited = p.waited;
  m.grace_left = grace_left;
  const size_t n = std::min(p.name.size(), sizeof(m.name) - 1);
  std::memcpy(m.name, p.name.data(), n);
  m.name[n] = '\0';
  return m;
}

OpPosition position_of(const ControlMessage& m) {
  OpPosition p;
  p.kind = m.kind >= 0 && m.kind <= static_cast<int32_t>(OpKind::kFinished)
               ? static_cast<OpKind>(m.kind)
               : OpKind::kNone;
  p.collective = m.collective;
  p.count = m.count;
  p.peer = m.peer;
  p.waited = std::isfinite(m.waited) ? m.waited : 0.0;
  p.name.assign(m.name, strnlen(m.name, sizeof(m.name)));
  return p;
}

ControlMessage make_failure_message(const FailureNotice& failure) {
  ControlMessage m;
  m.type = ControlMessage::kFailed;
  m.world_rank = failure.world_rank;
  const size_t h = std::min(failure.host.size(), sizeof(m.host) - 1);
  std::memcpy(m.host, failure.host.data(), h);
  m.host[h] = '\0';
  const size_t t = std::min(failure.text.size(), sizeof(m.text) - 1);
  std::memcpy(m.text, failure.text.data(), t);
  m.text[t] = '\0';
  return m;
}

FailureNotice failure_of(const ControlMessage& m) {
  FailureNotice f;
  f.world_rank = m.world_rank;
  f.host.assign(m.host, strnlen(m.host, sizeof(m.host)));
  f.text.assign(m.text, strnlen(m.text, sizeof(m.text)));
  return f;
}

double parse_timeout_seconds(const std::string& text, const char* source) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const bool whole = end && end != text.c_str() && *end == '\0';
  KUSARI_CHECK(whole && errno == 0 && std::isfinite(v) && v >= 0, ValueError, source,
               " must be a number of seconds, 0 or more (0: no deadline), got '", text, "'");
  return v;
}

double grace_seconds(double timeout_seconds) {
  return std::clamp(0.5 * timeout_seconds, 0.5, 5.0);
}

}  // namespace kusari::mn::detail
