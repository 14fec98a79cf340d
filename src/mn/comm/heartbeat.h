// Heartbeat files for a launcher that restarts jobs (kusari-run): each rank tells, once a second,
// that it is alive, how far it got and, at the end, how it ended.
#pragma once

#include <cstdint>
#include <string>

namespace kusari::mn::detail {

// Note [Heartbeat files]
// When the environment has KUSARI_HEARTBEAT_DIR (kusari-run sets it for each attempt of a job),
// every rank of MPI_COMM_WORLD keeps the file <dir>/rank.<r>.json up to date from a thread of its
// own: one JSON object, replaced atomically (written under a name starting with '.', then renamed)
// every KUSARI_HEARTBEAT_INTERVAL seconds (default 1):
//   {"rank":0,"size":3,"host":"node1","pid":1234,"time":1765000000.250,"iteration":120,
//    "resumed_from":-1,"state":"running","message":""}
// `time` is the Unix time of the write; `iteration` the number of updates of the multi-node
// optimizer (-1 before the first); `resumed_from` the iteration a restarted job loaded (-1 none).
// The state ends as "done" (MPI finished normally), "failed" (this rank's own error, in
// `message`), "peer_failed" (this rank stopped because another one failed: Note [Failure of one
// rank ends the job]) or "terminated" (SIGTERM, which mpiexec sends to end a job; the record is
// written from the signal handler with async-signal-safe calls only, then the signal's default
// action ends the process). The thread is what tells a hung rank from a live one: a process
// stopped (SIGSTOP, a node frozen in the kernel) stops beating, one busy in a long computation or
// waiting in a collective does not. A rank that dies (SIGKILL, a lost node) leaves "running"
// behind, with no final record: the launcher counts it as lost. The file is written by the
// process itself, so a launcher on another host needs a shared folder (docs/elastic.md).

/// Starts this process's heartbeat thread when KUSARI_HEARTBEAT_DIR is set (the first call does;
/// later calls do nothing). `world_rank` and `world_size` are MPI_COMM_WORLD's.
void start_heartbeat(int world_rank, int world_size) noexcept;
/// True when a heartbeat is running and its iteration was last set more than a quarter of the
/// interval ago (callers then read the count and pass it to heartbeat_iteration).
bool heartbeat_wants_iteration() noexcept;
/// The number of updates done so far (the next record carries it).
void heartbeat_iteration(int64_t iteration) noexcept;
/// One more update than the count last set (between two heartbeat_iteration calls).
void heartbeat_step() noexcept;
/// The iteration the job resumed from.
void heartbeat_resumed_from(int64_t iteration) noexcept;
/// Writes the final record ("done", "failed", "peer_failed") and stops beating. Later calls do
/// nothing: the first end is the one reported.
void heartbeat_final(const char* state, const std::string& message) noexcept;

}  // namespace kusari::mn::detail
