// The deadline of the communicators (Note [Deadline on every collective], Note [A rank that
// finishes early]): the pure logic of deadline.h (which rank blocks a wait, the report), and,
// across the ranks of the job, a rank that finalizes early or sleeps outside a collective while
// the others wait, with the error caught.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "kusari/core/error.h"
#include "kusari/mn/communicator.h"
#include "mn/comm/deadline.h"
#include "mn/comm/op_tracker.h"
#include "mn_test_util.h"

namespace kusari::mn {
namespace {

using detail::ControlMessage;
using detail::Diagnosis;
using detail::FinishedNotice;
using detail::OpKind;
using detail::OpPosition;
using detail::PeerReports;

OpPosition collective(int64_t seq, const char* name, double waited = 0) {
  OpPosition p;
  p.kind = OpKind::kCollective;
  p.collective = seq;
  p.name = name;
  p.waited = waited;
  return p;
}

OpPosition point_to_point(OpKind kind, const char* name, int peer, int64_t count) {
  OpPosition p;
  p.kind = kind;
  p.name = name;
  p.peer = peer;
  p.count = count;
  p.collective = 3;
  return p;
}

FinishedNotice finished(int64_t collectives, const char* last, int64_t sent = 0, int64_t received = 0) {
  FinishedNotice n;
  n.position.kind = OpKind::kFinished;
  n.position.collective = collectives;
  n.position.name = last;
  n.sent_to_you = sent;
  n.received_from_you = received;
  return n;
}

// --- pure logic ------------------------------------------------------------------------------------

TEST(DeadlineLogicTest, AFinishedRankBlocksOnlyCollectivesItNeverBegan) {
  // Rank 1 finished after collective #812.
  const FinishedNotice n = finished(812, "multi_node_mean_grad");
  EXPECT_TRUE(detail::finished_rank_blocks(collective(813, "multi_node_mean_grad"), 1, n));
  EXPECT_TRUE(detail::finished_rank_blocks(collective(900, "barrier"), 1, n));
  // A clean end: it finished after the collective this rank still waits in, so it took part.
  EXPECT_FALSE(detail::finished_rank_blocks(collective(812, "multi_node_mean_grad"), 1, n));
  EXPECT_FALSE(detail::finished_rank_blocks(collective(5, "bcast_obj"), 1, n));
  EXPECT_FALSE(detail::finished_rank_blocks(OpPosition{}, 1, n));
}

TEST(DeadlineLogicTest, AFinishedRankBlocksReceivesBeyondItsSends) {
  // Rank 2 sent 3 messages to this rank and received 5 from it before it finished.
  const FinishedNotice n = finished(1, "create_communicator", 3, 5);
  EXPECT_FALSE(detail::finished_rank_blocks(point_to_point(OpKind::kRecv, "recv_obj", 2, 3), 2, n));
  EXPECT_TRUE(detail::finished_rank_blocks(point_to_point(OpKind::kRecv, "recv_obj", 2, 4), 2, n));
  EXPECT_FALSE(detail::finished_rank_blocks(point_to_point(OpKind::kSend, "send_obj", 2, 5), 2, n));
  EXPECT_TRUE(detail::finished_rank_blocks(point_to_point(OpKind::kSend, "send_obj", 2, 6), 2, n));
  // An exchange with another rank is not its business.
  EXPECT_FALSE(detail::finished_rank_blocks(point_to_point(OpKind::kRecv, "recv_obj", 0, 99), 2, n));
}

TEST(DeadlineLogicTest, FinishedRankMessageNamesBothOperations) {
  const std::string m = detail::finished_rank_message(
      "naive", 0, 3, collective(813, "multi_node_mean_grad"), 1, finished(812, "multi_node_mean_grad"));
  EXPECT_EQ(m,
            "naive: rank 1 finished (after collective #812, multi_node_mean_grad) while rank 0 of 3 "
            "waits in collective #813 (multi_node_mean_grad), which rank 1 will never join; every "
            "rank must run the same collectives in the same order (did a loop or a stop trigger "
            "end early on rank 1?)");
  const std::string p = detail::finished_rank_message(
      "flat", 2, 3, point_to_point(OpKind::kRecv, "recv_obj", 1, 4), 1, finished(1, "create_communicator", 3));
  EXPECT_NE(p.find("while rank 2 of 3 waits in recv_obj from rank 1 (receive #4 from it), but rank 1 "
                   "sent only 3 message(s) to rank 2"),
            std::string::npos)
      << p;
}

TEST(DeadlineLogicTest, DescribesEveryKindOfPosition) {
  EXPECT_EQ(detail::describe_position(collective(7, "barrier")), "collective #7 (barrier)");
  EXPECT_EQ(detail::describe_position(point_to_point(OpKind::kSend, "send", 3, 2)),
            "send to rank 3 (send #2 to it)");
  EXPECT_EQ(detail::describe_position(point_to_point(OpKind::kRecv, "recv_obj", 0, 1)),
            "recv_obj from rank 0 (receive #1 from it)");
  EXPECT_EQ(detail::describe_position(finished(4, "bcast_data").position),
            "finished (after collective #4, bcast_data)");
  EXPECT_EQ(detail::describe_position(finished(0, "").position), "finished (before any collective)");
  OpPosition idle;
  idle.collective = 2;
  idle.name = "allreduce_obj";
  EXPECT_EQ(detail::describe_position(idle), "between operations (after collective #2, allreduce_obj)");
}

TEST(DeadlineLogicTest, TheSilentRankIsTheOneWaitedFor) {
  // -n 3, rank 1 stopped in the middle: rank 0's view.
  PeerReports reports;
  reports.grace_seconds = 1;
  reports.positions = {std::nullopt, std::nullopt, collective(813, "multi_node_mean_grad", 2.1)};
  const Diagnosis d =
      detail::diagnose("naive", 0, 3, collective(813, "multi_node_mean_grad", 2.0), 2, 0, reports);
  EXPECT_EQ(d.waited_for, std::vector<int>{1});
  EXPECT_EQ(d.text,
            "naive: collective #813 (multi_node_mean_grad) did not finish on rank 0 of 3: it waited "
            "2.0 s (the deadline is 2 s); it waits for rank 1, which did not answer within 1.0 s "
            "(stopped, dead, or busy outside this communicator); rank 2 waits in the same "
            "collective (KUSARI_MN_TIMEOUT or CommunicatorOptions::timeout_seconds sets the deadline)");
}

TEST(DeadlineLogicTest, BehindAheadAndFinishedRanksAreSortedOut) {
  // Rank 2 of 6 waits in collective #10. Rank 0 is behind (#9), rank 1 ahead (#11: it passed
  // a broadcast it roots), rank 3 finished after #10 (took part), rank 4 finished after #8 (never
  // came), rank 5 is in a send.
  PeerReports reports;
  reports.grace_seconds = 5;
  reports.positions = {collective(9, "bcast_obj", 600.5), collective(11, "barrier", 1),
                       std::nullopt,                      finished(10, "gather_obj").position,
                       finished(8, "barrier").position,   point_to_point(OpKind::kSend, "send_obj", 0, 1)};
  const Diagnosis d = detail::diagnose("flat", 2, 6, collective(10, "gather_obj", 600), 600, 2, reports);
  EXPECT_EQ(d.waited_for, (std::vector<int>{0, 4, 5}));
  for (const char* part :
       {"it waits for rank 0 is behind, in collective #9 (bcast_obj), waiting 600.5 s",
        "rank 4 has finished (after collective #8, barrier)",
        "rank 5 is in send_obj to rank 0 (send #1 to it)",
        "rank 1 is ahead, in collective #11 (barrier)",
        "rank 3 has finished (after collective #10, gather_obj)"}) {
    EXPECT_NE(d.text.find(part), std::string::npos) << part << "\n" << d.text;
  }
}

TEST(DeadlineLogicTest, PointToPointWaitsOnlyForItsPeer) {
  PeerReports reports;
  reports.grace_seconds = 1;
  reports.positions = {std::nullopt, std::nullopt, collective(4, "barrier")};
  const Diagnosis d = detail::diagnose("naive", 0, 3, point_to_point(OpKind::kRecv, "recv", 2, 1), 2, 0,
                                       reports);
  EXPECT_EQ(d.waited_for, std::vector<int>{2});
  EXPECT_NE(d.text.find("recv from rank 2 (receive #1 from it) did not finish on rank 0 of 3"),
            std::string::npos)
      << d.text;
  EXPECT_NE(d.text.find("it waits for rank 2 is in collective #4 (barrier)"), std::string::npos) << d.text;
  EXPECT_EQ(d.text.find("rank 1"), std::string::npos) << d.text;  // not part of this exchange
}

TEST(DeadlineLogicTest, ARankAskedByAnotherSaysWhoReachedTheDeadline) {
  PeerReports reports;
  reports.grace_seconds = 1;
  reports.positions = {collective(5, "barrier"), std::nullopt, collective(5, "barrier")};
  // Rank 2 was asked by rank 0 and waits for rank 1 too.
  const Diagnosis asked = detail::diagnose("naive", 2, 3, collective(5, "barrier", 1.9), 2, 0, reports);
  EXPECT_NE(asked.text.find("it waited 1.9 s (rank 0 reached the deadline of 2 s first); it waits for rank 1"),
            std::string::npos)
      << asked.text;
  // The stopped rank itself, resumed: everybody else already waits in its collective.
  reports.positions = {collective(5, "barrier"), std::nullopt, collective(5, "barrier")};
  const Diagnosis late = detail::diagnose("naive", 1, 3, collective(5, "barrier", 0.0), 2, 0, reports);
  EXPECT_TRUE(late.waited_for.empty());
  EXPECT_NE(late.text.find("so this rank came to it late"), std::string::npos) << late.text;
}

TEST(DeadlineLogicTest, ADifferentCollectiveOfTheSameNumberIsADesync) {
  PeerReports reports;
  reports.grace_seconds = 1;
  reports.positions = {std::nullopt, collective(7, "bcast_obj", 2.0), collective(7, "allreduce", 2.0)};
  const Diagnosis d = detail::diagnose("naive", 0, 3, collective(7, "allreduce", 2.0), 2, 0, reports);
  EXPECT_EQ(d.waited_for, std::vector<int>{1});
  for (const char* part : {"the ranks called different collectives as #7 (desynchronised", "this rank allreduce",
                           "rank 1 is in collective #7 (bcast_obj)", "rank 2 waits in the same collective"}) {
    EXPECT_NE(d.text.find(part), std::string::npos) << part << "\n" << d.text;
  }
  EXPECT_EQ(d.text.find("it waits for"), std::string::npos) << d.text;
}

TEST(DeadlineLogicTest, ManySilentRanksAreListedShortly) {
  PeerReports reports;
  reports.grace_seconds = 5;
  reports.positions.resize(1024);
  const Diagnosis d = detail::diagnose("flat", 0, 1024, collective(2, "barrier"), 600, 0, reports);
  EXPECT_EQ(d.waited_for.size(), 1023u);
  EXPECT_NE(d.text.find("ranks 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, ... and 1007 more, "
                        "which did not answer"),
            std::string::npos)
      << d.text;
  EXPECT_LT(d.text.size(), 600u);
}

TEST(DeadlineLogicTest, ControlMessagesCarryPositionsAndSurviveDamage) {
  OpPosition p = point_to_point(OpKind::kRecv, "recv_obj", 4, 17);
  p.waited = 3.5;
  const ControlMessage m = detail::make_control_message(ControlMessage::kFinished, p, 11, 12, 0.75);
  EXPECT_EQ(m.type, ControlMessage::kFinished);
  EXPECT_EQ(m.sent_to_you, 11);
  EXPECT_EQ(m.received_from_you, 12);
  EXPECT_EQ(m.grace_left, 0.75);
  const OpPosition back = detail::position_of(m);
  EXPECT_EQ(back.kind, OpKind::kRecv);
  EXPECT_EQ(back.peer, 4);
  EXPECT_EQ(back.count, 17);
  EXPECT_EQ(back.collective, 3);
  EXPECT_EQ(back.name, "recv_obj");
  EXPECT_EQ(back.waited, 3.5);
  // A long name is cut to the field; a damaged message reads as an unterminated name and an
  // unknown kind, and still gives a bounded, valid position.
  OpPosition longer = collective(1, "");
  longer.name = std::string(200, 'x');
  EXPECT_EQ(detail::position_of(detail::make_control_message(ControlMessage::kAnswer, longer)).name,
            std::string(63, 'x'));
  ControlMessage bad;
  bad.kind = 99;
  std::fill(std::begin(bad.name), std::end(bad.name), 'y');
  const OpPosition repaired = detail::position_of(bad);
  EXPECT_EQ(repaired.kind, OpKind::kNone);
  EXPECT_EQ(repaired.name.size(), sizeof(bad.name));
}

TEST(DeadlineLogicTest, TimeoutSettingIsANonNegativeNumber) {
  EXPECT_EQ(detail::parse_timeout_seconds("2", "KUSARI_MN_TIMEOUT"), 2.0);
  EXPECT_EQ(detail::parse_timeout_seconds("0", "KUSARI_MN_TIMEOUT"), 0.0);
  EXPECT_EQ(detail::parse_timeout_seconds("0.5", "KUSARI_MN_TIMEOUT"), 0.5);
  for (const char* bad : {"-1", "abc", "2s", "", "inf", "nan"}) {
    try {
      detail::parse_timeout_seconds(bad, "KUSARI_MN_TIMEOUT");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("KUSARI_MN_TIMEOUT must be a number of seconds, 0 "
                                                       "or more (0: no deadline), got '") + bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(detail::grace_seconds(2), 1.0);
  EXPECT_EQ(detail::grace_seconds(600), 5.0);
  EXPECT_EQ(detail::grace_seconds(0.1), 0.5);
}

// --- across the ranks ------------------------------------------------------------------------------

TEST(DeadlineTest, DefaultIsTenMinutesAndTheEnvironmentOverridesIt) {
  EXPECT_EQ(CommunicatorOptions{}.timeout_seconds, 600);
  const char* saved = std::getenv("KUSARI_MN_TIMEOUT");
  const std::string keep = saved ? saved : "";
  unsetenv("KUSARI_MN_TIMEOUT");
  EXPECT_EQ(create_communicator("naive")->options().timeout_seconds, 600);
  setenv("KUSARI_MN_TIMEOUT", "7.5", 1);
  EXPECT_EQ(create_communicator("flat")->options().timeout_seconds, 7.5);
  setenv("KUSARI_MN_TIMEOUT", "ten", 1);
  EXPECT_THROW(create_communicator("naive"), ValueError);  // on every rank, before any MPI call
  if (saved) {
    setenv("KUSARI_MN_TIMEOUT", keep.c_str(), 1);
  } else {
    unsetenv("KUSARI_MN_TIMEOUT");
  }
}

TEST(DeadlineTest, ARankThatFinalizesEarlyIsNamedAtOnce) {
  CommunicatorOptions o;
  o.timeout_seconds = 60;  // the notice, not the deadline, must end the wait
  auto comm = create_communicator("naive", o);
  comm->barrier();
  if (comm->rank() == 1) {
    comm->finalize();
  } else {
    const auto start = std::chrono::steady_clock::now();
    try {
      comm->barrier();
      ADD_FAILURE() << "the barrier finished without rank 1";
    } catch (const CommunicatorError& e) {
      EXPECT_NE(std::string(e.what()).find("naive: rank 1 finished (after collective #2, barrier) while rank " +
                                           std::to_string(comm->rank()) + " of " +
                                           std::to_string(comm->size()) +
                                           " waits in collective #3 (barrier), which rank 1 will never join"),
                std::string::npos)
          << e.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
    // The communicator is unusable now, and says why.
    try {
      comm->allreduce_obj(1.0);
      ADD_FAILURE() << "a failed communicator was used again";
    } catch (const CommunicatorError& e) {
      EXPECT_NE(std::string(e.what()).find("unusable after an earlier failure: naive: rank 1 finished"),
                std::string::npos)
          << e.what();
    }
  }
  comm.reset();
  // The next communicator works.
  auto next = create_communicator("flat");
  EXPECT_EQ(next->allreduce_obj(int64_t{1}), next->size());
}

TEST(DeadlineTest, ARankThatSleepsOutsideTheCollectiveIsNamedAfterTheDeadline) {
  CommunicatorOptions o;
  o.timeout_seconds = 1;
  auto comm = create_communicator("flat", o);
  comm->barrier();
  const int rank = comm->rank();
  if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(3));
  try {
    comm->allreduce_obj(1.0);
    // (Rank 1, late, fails before it posts its part: the others' abandoned collective must never
    // complete and write into buffers they no longer hold.)
    ADD_FAILURE() << "rank " << rank << ": the allreduce finished although rank 1 slept through the deadline";
  } catch (const CommunicatorError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("flat: collective #3 (allreduce_obj) did not finish on rank " + std::to_string(rank)),
              std::string::npos)
        << what;
    if (rank != 1) {
      EXPECT_NE(what.find("it waits for rank 1, which did not answer"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("came to it late"), std::string::npos) << what;
    }
    // This rank's last collectives, newest first, with when each began.
    EXPECT_NE(what.find("Rank " + std::to_string(rank) + "'s last collectives: #3 allreduce_obj"), std::string::npos)
        << what;
    EXPECT_NE(what.find(" s ago, #2 barrier"), std::string::npos) << what;
  }
  comm.reset();
  auto next = create_communicator("naive");
  next->barrier();
}

TEST(DeadlineTest, RanksInDifferentCollectivesAreNamedAsDesynchronised) {
  CommunicatorOptions o;
  o.timeout_seconds = 1;
  auto comm = create_communicator("flat", o);
  comm->barrier();
  const int rank = comm->rank();
  try {
    // Rank 0 broadcasts a large object while the others reduce one. Rank 0 cannot finish (nobody
    // receives its broadcast); the others may (MPI matches collectives by order alone) and leave.
    if (rank == 0) {
      comm->bcast_obj(Bytes(1 << 20, 7), 0);
      ADD_FAILURE() << "a broadcast that nobody received completed";
    } else {
      comm->allreduce_obj(1.0);
    }
  } catch (const CommunicatorError& e) {
    // Every rank that waits is told that the ranks are out of step, and what the others called;
    // a rank whose reduction received the broadcast's message (MPI's error) is told the likely cause.
    const std::string what = e.what();
    if (rank == 0 || what.find("MPI call failed") == std::string::npos) {
      EXPECT_NE(what.find("the ranks called different collectives as #3 (desynchronised"), std::string::npos) << what;
      EXPECT_NE(what.find(rank == 0 ? "allreduce_obj" : "bcast_obj"), std::string::npos) << what;
    } else {
      EXPECT_NE(what.find("in collective #3 (allreduce_obj) on rank " + std::to_string(rank)), std::string::npos)
          << what;
      EXPECT_NE(what.find("different collectives or sizes"), std::string::npos) << what;
    }
    EXPECT_NE(what.find("KUSARI_MN_CHECK_COLLECTIVES=1"), std::string::npos) << what;
  }
  comm.reset();
  auto next = create_communicator("naive");
  next->barrier();
}

TEST(DeadlineTest, NcclInitialisationKeepsItsFloor) {
  for (const double timeout : {2.0, 0.0, 100.0}) {
    CommunicatorOptions o;
    o.timeout_seconds = timeout;
    auto comm = create_communicator("naive", o);
    detail::OpTracker* t = detail::tracker_of(*comm);
    ASSERT_NE(t, nullptr);
    {
      detail::DeadlineFloor floor(t, 60);
      EXPECT_EQ(t->timeout_seconds(), timeout == 0 ? 0.0 : std::max(timeout, 60.0)) << timeout;
    }
    EXPECT_EQ(t->timeout_seconds(), timeout);
  }
  detail::DeadlineFloor none(nullptr, 60);  // outside any operation: nothing to raise
}

TEST(DeadlineTest, PointToPointCountsFollowEachPeer) {
  auto comm = create_communicator("naive");
  const int rank = comm->rank(), size = comm->size();
  // Every rank sends to rank 0 twice; rank 0 receives in rank order.
  if (rank == 0) {
    for (int round = 0; round < 2; ++round)
      for (int r = 1; r < size; ++r) EXPECT_EQ(comm->recv_obj(r, 3).size(), static_cast<size_t>(r + round));
  } else {
    comm->send_obj(Bytes(static_cast<size_t>(rank), 1), 0, 3);
    comm->send_obj(Bytes(static_cast<size_t>(rank + 1), 1), 0, 3);
  }
  comm->barrier();
  EXPECT_THROW(comm->send_obj(Bytes(1), size + 3, 0), ValueError);  // a rank out of range
}

}  // namespace
}  // namespace kusari::mn
