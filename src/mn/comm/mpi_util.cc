#include "mn/comm/mpi_util.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "kusari/core/half.h"
#include "mn/comm/heartbeat.h"
#include "mn/comm/op_tracker.h"

namespace kusari::mn::detail {

int64_t max_chunk_elements() {
  if (const char* env = std::getenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS")) {
    const long long v = std::atoll(env);
    if (v > 0) return std::min<int64_t>(v, int64_t{1} << 30);
  }
  return int64_t{1} << 30;
}

int64_t allreduce_piece_elements(int64_t n) {
  if (n <= 0) return 1;
  const int64_t pieces = (n + max_chunk_elements() - 1) / max_chunk_elements();
  return (n + pieces - 1) / pieces;
}

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  KUSARI_THROW(CommunicatorError, "MPI call failed: ", call, ": ", std::string(msg, static_cast<size_t>(len)));
}

MPI_Datatype mpi_datatype(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBool:
    case Dtype::kUInt8:
      return MPI_UINT8_T;
    case Dtype::kInt32:
      return MPI_INT32_T;
    case Dtype::kInt64:
      return MPI_INT64_T;
    case Dtype::kFloat16:
    case Dtype::kBFloat16:
      return MPI_UINT16_T;
    case Dtype::kFloat32:
      return MPI_FLOAT;
    case Dtype::kFloat64:
      return MPI_DOUBLE;
  }
  KUSARI_THROW(DtypeError, "communicator: no MPI datatype for ", dtype_name(dtype));
}

namespace {

template <typename H, typename F>
void half_op(void* in, void* inout, int* len, F f) {
  H* a = static_cast<H*>(in);
  H* b = static_cast<H*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = H(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

void half_sum(void* in, void* inout, int* len, MPI_Datatype*) { half_op<Half>(in, inout, len, [](float a, float b) { return a + b; }); }
void half_max(void* in, void* inout, int* len, MPI_Datatype*) { half_op<Half>(in, inout, len, [](float a, float b) { return a > b ? a : b; }); }
void half_min(void* in, void* inout, int* len, MPI_Datatype*) { half_op<Half>(in, inout, len, [](float a, float b) { return a < b ? a : b; }); }
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) { half_op<BFloat16>(in, inout, len, [](float a, float b) { return a + b; }); }
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) { half_op<BFloat16>(in, inout, len, [](float a, float b) { return a > b ? a : b; }); }
void bf16_min(void* in, void* inout, int* len, MPI_Datatype*) { half_op<BFloat16>(in, inout, len, [](float a, float b) { return a < b ? a : b; }); }

MPI_Op user_op(MPI_User_function* f) {
  MPI_Op op;
  KUSARI_MPI_CHECK(MPI_Op_create(f, 1, &op));
  return op;
}

}  // namespace

MPI_Op mpi_op(ReduceOp op, Dtype dtype) {
  if (is_half_precision(dtype)) {
    // Created once, after MPI_Init, and kept for the life of the job.
    static MPI_Op ops[2][3] = {};
    static std::once_flag once;
    std::call_once(once, [] {
      ops[0][0] = user_op(half_sum);
      ops[0][1] = user_op(half_max);
      ops[0][2] = user_op(half_min);
      ops[1][0] = user_op(bf16_sum);
      ops[1][1] = user_op(bf16_max);
      ops[1][2] = user_op(bf16_min);
    });
    const int k = dtype == Dtype::kFloat16 ? 0 : 1;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean:
        return ops[k][0];
      case ReduceOp::kMax:
        return ops[k][1];
      case ReduceOp::kMin:
        return ops[k][2];
    }
  }
  if (dtype == Dtype::kBool) {
    return op == ReduceOp::kMin ? MPI_BAND : MPI_BOR;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void allreduce_host(void* data, int64_t n, Dtype dtype, ReduceOp op, MPI_Comm comm) {
  const MPI_Datatype t = mpi_datatype(dtype);
  const MPI_Op o = mpi_op(op, dtype);
  char* p = static_cast<char*>(data);
  const int64_t item = static_cast<int64_t>(itemsize(dtype));
  const int64_t piece = allreduce_piece_elements(n);
  for (int64_t done = 0; done < n;) {
    const int count = static_cast<int>(std::min(n - done, piece));
    MPI_Request request;
    KUSARI_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p + done * item, count, t, o, comm, &request));
    wait_requests(&request, 1, "MPI_Iallreduce");
    done += count;
  }
}

void bcast_bytes(void* data, int64_t n, int root, MPI_Comm comm) {
  char* p = static_cast<char*>(data);
  for (int64_t done = 0; done < n;) {
    const int count = static_cast<int>(std::min(n - done, max_chunk_elements()));
    MPI_Request request;
    KUSARI_MPI_CHECK(MPI_Ibcast(p + done, count, MPI_BYTE, root, comm, &request));
    wait_requests(&request, 1, "MPI_Ibcast");
    done += count;
  }
}

void send_bytes(const void* data, int64_t n, int dest, int tag, MPI_Comm comm) {
  const char* p = static_cast<const char*>(data);
  for (int64_t done = 0; done < n;) {
    const int count = static_cast<int>(std::min(n - done, max_chunk_elements()));
    MPI_Request request;
    KUSARI_MPI_CHECK(MPI_Isend(p + done, count, MPI_BYTE, dest, tag, comm, &request));
    wait_requests(&request, 1, "MPI_Isend");
    done += count;
  }
}

void recv_bytes(void* data, int64_t n, int source, int tag, MPI_Comm comm) {
  char* p = static_cast<char*>(data);
  for (int64_t done = 0; done < n;) {
    const int count = static_cast<int>(std::min(n - done, max_chunk_elements()));
    MPI_Request request;
    KUSARI_MPI_CHECK(MPI_Irecv(p + done, count, MPI_BYTE, source, tag, comm, &request));
    wait_requests(&request, 1, "MPI_Irecv");
    done += count;
  }
}

void barrier(MPI_Comm comm) {
  MPI_Request request;
  KUSARI_MPI_CHECK(MPI_Ibarrier(comm, &request));
  wait_requests(&request, 1, "MPI_Ibarrier");
}

// Note [Reduce-scatter and all-gather in pieces]
// MPI counts are ints, and a message of more than max_chunk_elements() is cut as allreduce_host
// cuts it. With segments of several ranks in one call, piece p carries elements [p*c, (p+1)*c) of
// every rank's segment (c = max_chunk_elements() / ranks, so that a piece's total fits too): when
// one piece holds everything (the usual case) the buffers go to MPI as they are; otherwise each
// piece's parts are packed into (reduce-scatter) or unpacked from (all-gather) a staging buffer.
namespace {

struct Pieces {
  int64_t per_rank = 0;  // c
  int64_t count = 0;     // pieces
};

Pieces pieces_of(const std::vector<int64_t>& counts) {
  const int64_t ranks = static_cast<int64_t>(counts.size());
  int64_t largest = 0, total = 0;
  for (int64_t n : counts) {
    KUSARI_CHECK(n >= 0, ValueError, "communicator: a segment of ", n, " elements");
    largest = std::max(largest, n);
    total += n;
  }
  Pieces p;
  if (total <= max_chunk_elements()) {
    p.per_rank = std::max<int64_t>(largest, 1);
  } else {
    p.per_rank = std::max<int64_t>(max_chunk_elements() / std::max<int64_t>(ranks, 1), 1);
  }
  p.count = largest == 0 ? 0 : (largest + p.per_rank - 1) / p.per_rank;
  return p;
}

// The elements of piece `p` of a segment of n elements.
int64_t piece_count(int64_t n, int64_t p, int64_t c) { return std::clamp<int64_t>(n - p * c, 0, c); }

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) at[r + 1] = at[r] + counts[r];
  return at;
}

}  // namespace

void reduce_scatter_host(const void* send, void* recv, const std::vector<int64_t>& counts, Dtype dtype,
                         ReduceOp op, MPI_Comm comm) {
  int rank = 0;
  KUSARI_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const MPI_Datatype t = mpi_datatype(dtype);
  const MPI_Op o = mpi_op(op, dtype);
  const int64_t item = static_cast<int64_t>(itemsize(dtype));
  const Pieces pieces = pieces_of(counts);
  const std::vector<int64_t> at = offsets_of(counts);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  std::vector<int> piece_counts(counts.size());
  std::vector<char> staging;
  for (int64_t p = 0; p < pieces.count; ++p) {
    int64_t total = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      piece_counts[r] = static_cast<int>(piece_count(counts[r], p, pieces.per_rank));
      total += piece_counts[r];
    }
    const char* piece_in = in;
    if (pieces.count > 1) {
      staging.resize(static_cast<size_t>(total * item));
      char* dst = staging.data();
      for (size_t r = 0; r < counts.size(); ++r) {
        std::memcpy(dst, in + (at[r] + p * pieces.per_rank) * item, static_cast<size_t>(piece_counts[r] * item));
        dst += piece_counts[r] * item;
      }
      piece_in = staging.data();
    }
    MPI_Request request;
    KUSARI_MPI_CHECK(MPI_Ireduce_scatter(piece_in, out + p * pieces.per_rank * item, piece_counts.data(), t, o, comm,
                                         &request));
    wait_requests(&request, 1, "MPI_Ireduce_scatter");
  }
  (void)rank;
}

void allgather_host(const void* send, void* recv, const std::vector<int64_t>& counts, Dtype dtype, MPI_Comm comm) {
  int rank = 0;
  KUSARI_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  const MPI_Datatype t = mpi_datatype(dtype);
  const int64_t item = static_cast<int64_t>(itemsize(dtype));
  const Pieces pieces = pieces_of(counts);
  const std::vector<int64_t> at = offsets_of(counts);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const size_t ranks = counts.size();
  std::vector<int> piece_counts(ranks), displs(ranks);
  std::vector<char> staging;
  for (int64_t p = 0; p < pieces.count; ++p) {
    int64_t total = 0;
    for (size_t r = 0; r < ranks; ++r) {
      piece_counts[r] = static_cast<int>(piece_count(counts[r], p, pieces.per_rank));
      displs[r] = static_cast<int>(pieces.count > 1 ? total : at[r]);
      total += piece_counts[r];
    }
    const int mine = piece_counts[static_cast<size_t>(rank)];
    const char* piece_in = in + p * pieces.per_rank * item;
    char* piece_out = out;
    if (pieces.count > 1) {
      staging.resize(static_cast<size_t>(total * item));
      piece_out = staging.data();
    }
    // MPI_IN_PLACE when this rank's part already sits where the result puts it.
    const bool in_place = piece_in == piece_out + static_cast<int64_t>(displs[static_cast<size_t>(rank)]) * item;
    MPI_Request request;
    KUSARI_MPI_CHECK(MPI_Iallgatherv(in_place ? MPI_IN_PLACE : piece_in, mine, t, piece_out, piece_counts.data(),
                                     displs.data(), t, comm, &request));
    wait_requests(&request, 1, "MPI_Iallgatherv");
    if (pieces.count > 1) {
      for (size_t r = 0; r < ranks; ++r) {
        std::memcpy(out + (at[r] + p * pieces.per_rank) * item, staging.data() + static_cast<int64_t>(displs[r]) * item,
                    static_cast<size_t>(piece_counts[r] * item));
      }
    }
  }
}

namespace {

// Note [Failure of one rank ends the job]
// An exception that escapes main() on one rank would leave the others blocked in their next
// collective forever. Once a communicator exists, std::terminate reports which rank failed and
// why, once for all the ranks that failed alike (Note [One report of a failure] in
// op_tracker.cc), and ends the process with status 1: Open MPI's mpiexec then ends every other
// process of the job; under another launcher (srun, which may leave the others running),
// MPI_Abort ends it. A rank that failed only because another one did (it waited in a collective
// when the other's notice came) ends quietly. Set KUSARI_MN_ABORT_ON_ERROR=0 to keep the default
// std::terminate behaviour. The end of MPI uses the same path when a rank never finishes a
// communicator (Note [A rank that finishes early]); with KUSARI_MN_ABORT_ON_ERROR=0 it only
// prints, and MPI_Finalize may then wait for that rank.

/// The least time the failure path listens for the other ranks' failures (delay_abort).
std::atomic<double> g_abort_delay{0.0};

/// How long a failed rank listens for the failures of the others before it reports: ranks that
/// fail alike (a setting checked on every rank) fail within milliseconds of each other, and the
/// deadline's reports of the live ranks within the grace period's end. One second: with more
/// processes than cores (a test machine under load) ranks that failed alike were once heard more
/// than half a second apart, and reported twice.
constexpr double kFailureWindowSeconds = 1.0;

bool abort_on_error() {
  const char* env = std::getenv("KUSARI_MN_ABORT_ON_ERROR");
  return !(env && std::string(env) == "0");
}

/// True under Open MPI's mpiexec/mpirun, which ends the whole job when a process exits with a
/// non-zero status.
bool launcher_ends_job_on_failure() {
  return std::getenv("OMPI_MCA_orte_hnp_uri") != nullptr;
}

/// "0", "0 and 2", "0, 1 and 2".
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

/// Reports the failure of this rank (once for the ranks that failed alike) and, with `end_job`,
/// ends the process and so the job (Note [Failure of one rank ends the job]).
void print_failure(const std::string& what, bool end_job) noexcept {
  int rank = -1, size = 0, initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool live = initialized && !finalized;
  if (live) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  char host[MPI_MAX_PROCESSOR_NAME] = "?";
  int len = 0;
  if (live) MPI_Get_processor_name(host, &len);
  std::fflush(stdout);
  const bool by_peer = live && size > 1 && caused_by_peer_failure(what);
  heartbeat_final(by_peer ? "peer_failed" : "failed", what);  // Note [Heartbeat files]
  if (!end_job) {
    std::fprintf(stderr, "\n[kusari.mn] rank %d of %d on host %s failed: %s\n", rank, size, host, what.c_str());
    std::fflush(stderr);
    return;
  }
  if (by_peer) {
    // The rank that failed reports it; this one only waited for it. It stays until the reporter
    // has printed and ended (mpiexec then ends this process too): an exit now would make mpiexec
    // end the job before the report is out.
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(1);
  }
  FailureNotice mine;
  mine.world_rank = rank;
  mine.host = host;
  mine.text = what;
  std::vector<FailureNotice> others;
  if (live && size > 1) {
    others = announce_failure(mine, std::max(kFailureWindowSeconds, g_abort_delay.load()));
  }
  // The ranks whose message is this one's (as far as a notice carries it), and the lowest rank
  // that failed at all.
  const FailureNotice sent = failure_of(make_failure_message(mine));
  std::vector<int> alike{rank};
  std::vector<std::string> hosts{host};
  int lowest = rank;
  for (const FailureNotice& f : others) {
    lowest = std::min(lowest, f.world_rank);
    if (f.text != sent.text) continue;
    alike.push_back(f.world_rank);
    if (std::find(hosts.begin(), hosts.end(), f.host) == hosts.end()) hosts.push_back(f.host);
  }
  std::sort(alike.begin(), alike.end());
  if (alike.front() == rank) {
    if (alike.size() == 1) {
      std::fprintf(stderr, "\n[kusari.mn] rank %d of %d on host %s failed: %s\n", rank, size, host, what.c_str());
    } else {
      std::string on = hosts.size() == 1 ? "host " + hosts[0] : "hosts ";
      if (hosts.size() > 1) {
        for (size_t i = 0; i < hosts.size(); ++i) on += (i ? ", " : "") + hosts[i];
      }
      std::fprintf(stderr, "\n[kusari.mn] ranks %s of %d on %s failed: %s\n", rank_list(alike).c_str(), size,
                   on.c_str(), what.c_str());
    }
  }
  std::fflush(stderr);
  // The ranks that failed a little later than this one print their reports within their own
  // windows: stay as long, so that an end of this process (which ends the job) cuts none off.
  if (live && size > 1) std::this_thread::sleep_for(std::chrono::duration<double>(kFailureWindowSeconds));
  if (lowest == rank) {
    std::fprintf(stderr, "[kusari.mn] the job ends: exit status 1\n");
    std::fflush(stderr);
  }
  if (live && size > 1 && !launcher_ends_job_on_failure()) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

[[noreturn]] void terminate_with_abort() {
  std::string what = "unknown exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
  } else {
    what = "std::terminate called without an active exception";
  }
  print_failure(what, true);
  std::abort();
}

// MPI_Finalize deletes MPI_COMM_SELF's attributes first, whoever calls it: the moment to finish
// the communicators still alive and wait for the other ranks (Note [A rank that finishes early]).
int at_mpi_finalize(MPI_Comm, int, void*, void*) {
  finish_all_trackers();
  heartbeat_final("done", "");
  return MPI_SUCCESS;
}

// Note [Allreduce algorithm]
// Every allreduce of the CPU communicators is an in-place MPI_Iallreduce (non-blocking, for the
// deadline: Note [Deadline on every collective]). For an in-place call, or fewer than 4 ranks,
// Open MPI's non-blocking collectives (libnbc) choose a binomial tree by default: the whole
// buffer goes up to rank 0, which does every sum, and is broadcast back, log2(p) full copies each
// way. Reduce-scatter then allgather (Rabenseifner's algorithm, libnbc's algorithm 3) moves about
// two buffers per rank whatever p is and spreads the sums over the ranks: for 11.7 M floats (a
// ResNet-18's gradients) between 2 processes on a 2-core machine, 24 ms of CPU instead of 48.
// So unless the user chose an algorithm (OMPI_MCA_coll_libnbc_iallreduce_algorithm in the
// environment), the first communicator sets libnbc's choice to 3 through the MPI tools
// interface, on every rank at the same point (the communicator's creation is collective), before
// any allreduce of kusari's. Another MPI has no such variable and is left as it is.
// The sums stay independent of how a buffer is cut: recursive halving pairs ranks by rank, not
// by an element's position, so a gradient reduced in buckets (Note [Overlapped gradient
// reduction]) has the same bits as reduced whole, as with the binomial tree. Only a message of
// fewer elements than the largest power of two not above p goes round a ring instead, whose sums
// may be ordered differently from the same elements' inside a longer message; so a buffer larger
// than one message is cut into pieces of nearly equal size (allreduce_piece_elements), never
// leaving a last piece of a few elements. (A whole bucket that small still goes round the ring.)
void choose_allreduce_algorithm() {
  if (std::getenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm") != nullptr) return;
  // At the program's own thread level: Open MPI takes the level asked of MPI_T_init_thread as
  // MPI's, so asking for less would turn its locks off under a program's threads.
  int level = MPI_THREAD_SINGLE, provided = 0;
  if (MPI_Query_thread(&level) != MPI_SUCCESS) return;
  if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return;
  int index = -1;
  if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      int value = -1;
      if (count == 1 && MPI_T_cvar_read(handle, &value) == MPI_SUCCESS && value == 0) {
        int reduce_scatter_allgather = 3;
        MPI_T_cvar_write(handle, &reduce_scatter_allgather);
      }
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
}

// Note [Thread level]
// kusari initialises MPI (when the program has not) with MPI_THREAD_MULTIPLE, as mpi4py does for
// ChainerMN programs, falling back to whatever the library provides: at that level the overlap's
// progress thread may move the CPU communicators' buckets on while backward computes (Note
// [Progress thread] in host_bucket_transport.cc), while the program's own thread runs a model's
// collectives. KUSARI_MPI_THREAD_LEVEL=serialized asks for MPI_THREAD_SERIALIZED instead (for an
// MPI whose locks cost more than the thread saves); the hooks then move the buckets on. A
// program that initialises MPI itself keeps its level.
int requested_thread_level() {
  const char* env = std::getenv("KUSARI_MPI_THREAD_LEVEL");
  if (env == nullptr || *env == '\0') return MPI_THREAD_MULTIPLE;
  const std::string v = env;
  if (v == "multiple") return MPI_THREAD_MULTIPLE;
  if (v == "serialized") return MPI_THREAD_SERIALIZED;
  KUSARI_THROW(ValueError, "KUSARI_MPI_THREAD_LEVEL is '", v, "'; expected 'multiple' or 'serialized'");
}

struct MpiLifetime {
  bool we_initialized = false;
  ~MpiLifetime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (we_initialized && !finalized) MPI_Finalize();
  }
};

}  // namespace

void ensure_mpi_initialized() {
  static MpiLifetime lifetime;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    KUSARI_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, requested_thread_level(), &provided));
    lifetime.we_initialized = true;
  }
  static std::once_flag handler_once;
  std::call_once(handler_once, [] {
    if (abort_on_error()) std::set_terminate(terminate_with_abort);
    // Errors come back as codes (turned into CommunicatorError) instead of aborting silently.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int key = MPI_KEYVAL_INVALID;
    if (MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, at_mpi_finalize, &key, nullptr) == MPI_SUCCESS)
      MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr);
    choose_allreduce_algorithm();
    int world_rank = 0, world_size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    start_heartbeat(world_rank, world_size);  // Note [Heartbeat files]
  });
}

void report_failure_and_abort(const std::string& what) noexcept { print_failure(what, abort_on_error()); }

void delay_abort(double seconds) noexcept { g_abort_delay.store(seconds); }

}  // namespace kusari::mn::detail
