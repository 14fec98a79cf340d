// MPI helpers for the communicators: error checking, dtype mapping, chunked transfers, and the
// one entry point for waiting on MPI requests (wait_requests, with the deadline).
#pragma once

#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/core/error.h"
#include "kusari/mn/communicator.h"

namespace kusari::mn::detail {

/// Throws CommunicatorError naming the MPI call when it did not succeed.
void check_mpi(int code, const char* call);

#define KUSARI_MPI_CHECK(call) ::kusari::mn::detail::check_mpi((call), #call)

/// Largest element count sent in one MPI call: 2^30 (well under INT_MAX), or the value of
/// KUSARI_MN_MAX_MESSAGE_ELEMENTS (tests use small values to exercise the chunked paths).
int64_t max_chunk_elements();
/// The element count of each piece when an allreduce of `n` elements is cut into as few pieces of
/// at most max_chunk_elements() as it takes: all of this size but the last, which is shorter by
/// less than the number of pieces, never a remainder of a few elements (Note [Allreduce
/// algorithm]).
int64_t allreduce_piece_elements(int64_t n);

/// The MPI datatype of a kusari dtype (16-bit floats travel as 16-bit integers).
MPI_Datatype mpi_datatype(Dtype dtype);
/// The MPI operation for `op` on `dtype` (user-defined for 16-bit floats).
MPI_Op mpi_op(ReduceOp op, Dtype dtype);

// MPI_Comm is a pointer in Open MPI and an int in MPICH; it travels as an intptr_t.
static_assert(sizeof(MPI_Comm) <= sizeof(intptr_t), "MPI_Comm must fit in intptr_t");
inline MPI_Comm to_comm(intptr_t handle) {
  MPI_Comm c;
  std::memcpy(&c, &handle, sizeof(c));
  return c;
}
inline intptr_t from_comm(MPI_Comm comm) {
  intptr_t h = 0;
  std::memcpy(&h, &comm, sizeof(comm));
  return h;
}

/// Initialises MPI if nobody has (finalised at exit), and installs the job-wide failure handler
/// and the end-of-MPI wait for the other ranks (Note [A rank that finishes early]).
void ensure_mpi_initialized();

/// Reports "[kusari.mn] rank R of N on host H failed: <what>" (once for the ranks that failed
/// alike) and ends the whole job, as an uncaught exception does (Note [Failure of one rank ends
/// the job]); with KUSARI_MN_ABORT_ON_ERROR=0 it only prints and returns.
void report_failure_and_abort(const std::string& what) noexcept;
/// Makes the failure path listen at least `seconds` for the failures of the other ranks before it
/// reports and ends the job, so that the reports of the other ranks, which fail at about the same
/// moment, are printed too (the deadline's failures set it: Note [Deadline on every collective]).
void delay_abort(double seconds) noexcept;

/// Waits until the `count` MPI requests at `requests` have completed (each becomes
/// MPI_REQUEST_NULL): every piece of code that waits on MPI requests calls this. Inside an
/// operation of a communicator (an OpScope, which every public operation opens) the wait has that
/// communicator's deadline and checks whether a rank that finished makes it hopeless; otherwise it
/// has the default deadline (KUSARI_MN_TIMEOUT, else 600 s). Throws CommunicatorError naming `what`, the operation and the ranks waited for.
/// See Note [Deadline on every collective] in op_tracker.cc.
void wait_requests(MPI_Request* requests, int count, const char* what);

/// In-place allreduce of `n` elements at `data` (host memory), in chunks (MPI_Iallreduce and
/// wait_requests, as every helper below).
void allreduce_host(void* data, int64_t n, Dtype dtype, ReduceOp op, MPI_Comm comm);
/// Broadcast of `n` bytes at `data` (host memory), in chunks.
void bcast_bytes(void* data, int64_t n, int root, MPI_Comm comm);
/// Point-to-point transfer of `n` bytes, in chunks.
void send_bytes(const void* data, int64_t n, int dest, int tag, MPI_Comm comm);
void recv_bytes(void* data, int64_t n, int source, int tag, MPI_Comm comm);
/// MPI_Ibarrier and wait_requests.
void barrier(MPI_Comm comm);

/// Reduce-scatter of host memory: `send` holds the sum of counts[r] elements of every rank, rank r's
/// segment after rank r-1's; this rank's segment of the reduction over the ranks is written to `recv`
/// (counts[rank] elements). Counts may differ (and be 0). kMean sums (the caller scales). In pieces
/// of at most max_chunk_elements() elements in all (packed per piece when the segments are larger).
void reduce_scatter_host(const void* send, void* recv, const std::vector<int64_t>& counts, Dtype dtype,
                         ReduceOp op, MPI_Comm comm);
/// All-gather of host memory: this rank's counts[rank] elements at `send` (which may point into
/// `recv`, at this rank's segment) go to every rank's `recv`, which holds the segments of all ranks in
/// rank order. In pieces as reduce_scatter_host.
void allgather_host(const void* send, void* recv, const std::vector<int64_t>& counts, Dtype dtype, MPI_Comm comm);


}  // namespace kusari::mn::detail
