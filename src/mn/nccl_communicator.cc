#include "kusari/config.h"

#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL

#include "mn/nccl_communicator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>

#include "backends/cuda/runtime/cuda_backend.h"
#include "kusari/core/routines.h"
#include "mn/mpi_util.h"
#include "mn/nccl_wait.h"

namespace kusari::mn::detail {

// Note [NCCL communicators]
// The NCCL kinds keep everything of the MPI base (topology, pretend hosts, the object
// collectives, the gradient agreement check of Note [Gradient sets]) and move the gradient
// traffic to NCCL:
//   pure_nccl        one ncclAllReduce over all ranks;
//   single_node      the same, refused when the job spans more than one host;
//   hierarchical     ncclReduce to each host's first process, ncclAllReduce among those
//                    processes, ncclBroadcast within each host;
//   two_dimensional  ncclReduceScatter within each host (process k of a host keeps chunk k),
//                    ncclAllReduce of chunk k among the processes k of all hosts,
//                    ncclAllGather within each host (the buffer is padded to a multiple of
//                    the host size; every host must have the same number of processes);
//   non_cuda_aware   ncclReduce to each host's first process, which copies the sum to pinned
//                    host memory, MPI-allreduces it with the other hosts' first processes (the
//                    16-bit wire dtypes use the user-defined MPI sums of mpi_util) and copies it
//                    back; ncclBroadcast within each host.
// The NCCL communicators follow the MPI intra-host and inter-host split (so
// KUSARI_MN_RANKS_PER_HOST also shapes them); each is made from a unique id created by rank 0 of
// the matching MPI communicator and broadcast over it, and only the ones a kind uses are made
// (hierarchical makes the inter-host one only on the hosts' first processes). A communicator of
// one rank is never made: its collectives are no-ops.
// The GPU is the one the arrays are on, picked by the first NCCL operation (bcast_data,
// multi_node_mean_grad or a GPU allreduce), which every rank calls together, so NCCL is set up
// collectively then; later operations must use the same GPU. Each process drives one GPU (by
// convention Device::cuda(comm->intra_rank())); two ranks of one NCCL communicator on the same
// GPU is an error NCCL reports.
// Gradients of mixed dtypes travel in one buffer of the widest of them unless
// allreduce_grad_dtype names the wire dtype; the reduction happens in the wire dtype (as in
// ChainerMN), as a mean where the collectives can average, else as a sum scaled by 1/size in
// float32 (float64 for float64) while unpacking (Note [Gradient pipeline]).
//
// Note [Communication stream]
// Collectives run on a stream of their own (high priority, non-blocking) so that they can overlap
// the compute stream (the gradient pipeline, double buffering). The hand-off never makes the
// host wait:
//   compute stream:  ... backward, pack ---record(packed)--->        wait(done) ---> unpack ...
//   NCCL stream:                        wait(packed), record(started), collectives, record(done)
// (once per chunk for gradients: Note [Gradient pipeline]). The pack and unpack kernels run on
// the compute stream, so they are ordered with the kernels that write and read the gradients;
// only the collectives (and non_cuda_aware's host copies) run on the NCCL stream. Buffers used
// there (the wire buffers, kept between steps) are reused, or released to the caching pool, only
// after the compute stream has waited for the collectives that used them (Note [Caching memory
// pool]); after a failure, the compute stream first waits for everything queued on the NCCL
// stream (whose kernels the abort ends). With the gradients in the reduction buffer the wire
// buffer is the gradients' own memory: the compute stream waits for the collectives before
// anything after multi_node_mean_grad (the update, the next backward) touches it.
//
// Note [Gradient pipeline]
// (The packed path. By default the gradients live in the reduction buffer and need neither pack
// nor unpack: Note [Gradients in the reduction buffer] in gradient_buffer.cc. This pipeline runs
// where that does not apply: mixed dtypes, a cast to another wire dtype, several chunks, double
// buffering, or gradients_in_buffer off.)
// Packing the gradients into the wire buffer and unpacking the result each move the buffer
// twice through GPU memory (about 0.05 ms each for ResNet-50's 102 MB on an H200); done before
// and after the collectives they added 40% to a 0.4 ms NVLink allreduce. So the buffer is cut
// into chunks, and the three stages are pipelined over the two streams:
//   compute: pack 0, rec(packed 0), pack 1, rec(packed 1), ..., wait(done 0), unpack 0,
//            wait(done 1), unpack 1, ...
//   NCCL:    wait(packed 0), collectives 0, rec(done 0), wait(packed 1), collectives 1, ...
// The packing of later chunks and the unpacking of earlier ones overlap the collectives; what is
// left on top of them is the pack of the first chunk, the unpack of the last, and a few
// microseconds per extra chunk (one more collective launch, its ring's fill and drain). Every
// pack is queued before the first unpack on the compute stream, since an unpack waits for its
// collectives and would hold up the packs behind it. A chunk's pack and unpack is still one
// kernel over the batched tables (Note [Batched packing]), whose blocks never straddle a chunk
// boundary. A kind's collectives for a chunk (reduce, inter-host allreduce and broadcast for
// hierarchical; reduce-scatter, allreduce, all-gather for two_dimensional; ...) run one after
// the other on the one NCCL stream, in the same order on every rank. non_cuda_aware's hosts'
// first processes wait on the host for each chunk's intra-host reduce before its MPI step, so
// they queue every pack first and then, per chunk, the collectives and the unpack (which then
// overlaps the next chunk's host step).
// Chunk size: the first pack and the last unpack cost about 0.7 us per MB of chunk each (two
// bytes moved per byte at ~3 TB/s), and every chunk a few microseconds; the sum is least for
// chunks of roughly 10-20 MB on NVLink, and NCCL keeps near its full bandwidth at those sizes.
// So the automatic setting cuts a buffer into about bytes / 16 MiB equal chunks (ResNet-50 in
// float32: 6 chunks of 16 MiB; with a float16 wire: 3), and sends a buffer under 24 MiB whole,
// where pipelining would save less than it costs. KUSARI_MN_CHUNK_BYTES overrides it ("off" for
// one chunk, or a size such as "8M"; read when the communicator is made); bench_mn_allreduce
// --chunk-bytes sweeps it. Chunk boundaries are multiples of 256 bytes and of the kind's
// padding (so two_dimensional splits every chunk evenly over a host), at most 64 chunks.
// The mean: where the collectives can average (ncclAvg on a floating wire dtype: pure_nccl,
// single_node, two_dimensional, and hierarchical when every host runs as many processes), they
// do, and the unpack is a plain copy or cast; elsewhere (non_cuda_aware's MPI step, uneven
// hierarchical hosts) they sum and the unpack scales by 1/size. ncclAvg scales each rank's
// values by 1/size before summing, so a float16 mean no longer overflows where the sum would.
// The wire buffers stay in the communicator: the compute stream has waited for every chunk's
// done event before it unpacks, so the next call's packs into the buffer, or its release to the
// pool when it grows, come after the collectives. With a timeout the host waits for the chunks
// in turn, each with its own deadline counted from its started event (Note [NCCL timeout]); the
// unpacks are already queued then, so the wait does not hold up the pipeline. After a failure
// the gradients are unspecified (some chunks may have been averaged, others not). Double
// buffering (Note [Double buffering]) pipelines the packs and collectives the same way in
// start_mean_grad, so its collectives start once the first chunk is packed; finish_mean_grad,
// which runs a step later when they are long over, unpacks the whole slot in one launch.
//
// Note [NCCL timeout]
// A dead or stuck peer makes an NCCL collective spin forever, and in blocking mode the host
// thread could hang inside an NCCL call. So every NCCL communicator is created non-blocking
// (ncclConfig_t::blocking = 0): each call returns at once, possibly with ncclInProgress, and the
// communicator's state is polled with ncclCommGetAsyncError until it is settled. With a timeout
// (options.timeout_seconds, or KUSARI_MN_TIMEOUT in seconds) each operation (each chunk of a
// gradient reduction: Note [Gradient pipeline]) is also waited for on the host: the done event is
// polled together with ncclCommGetAsyncError, and the deadline clock starts when the NCCL stream
// reaches the operation (its `started` event), so a long backward queued before it does not
// count. If an asynchronous error shows up, or the deadline passes,
// every NCCL communicator of this kind is aborted (ncclCommAbort, which also ends the kernels
// still spinning on the GPU, so the streams drain), and CommunicatorError names the operation,
// the rank, the GPU and the timeout. Uncaught, that error ends the whole job through the failure
// handler (Note [Failure of one rank ends the job]); caught, the communicator refuses further
// NCCL work. Creating the NCCL communicators, and the first operation (NCCL connects the peers
// lazily, on first use), are bounded by max(timeout, 60 s), since connecting many ranks can
// legitimately take long; non_cuda_aware's MPI step uses non-blocking MPI calls polled against
// the same deadline. Without a timeout (the default) nothing waits on the host:
// NCCL's asynchronous errors are still checked at the start of each operation. The cost of a
// timeout is one host wait per operation (double buffering waits only when it needs the result).

namespace {

using cuda::compute_stream;
using ::kusari::detail::concat;

/// The shortest deadline given to NCCL initialisation when a timeout is set.
constexpr double kMinInitTimeoutSeconds = 60.0;

std::string nccl_message(ncclResult_t result, ncclComm_t comm) {
  std::string msg = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last && *last) msg += concat(" (", last, ")");
  return msg;
}

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

/// The widest floating dtype of a set (one float64 makes float64; mixed 16/32-bit make float32).
Dtype widest(const std::vector<Dtype>& dtypes) {
  Dtype first = dtypes.front();
  bool same = true, any64 = false;
  for (Dtype d : dtypes) {
    same = same && d == first;
    any64 = any64 || d == Dtype::kFloat64;
  }
  if (same) return first;
  return any64 ? Dtype::kFloat64 : Dtype::kFloat32;
}

}  // namespace

bool nccl_has_avg() {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
  return true;
#else
  return false;
#endif
}

ncclDataType_t nccl_datatype(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBool:
    case Dtype::kUInt8:
      return ncclUint8;
    case Dtype::kInt32:
      return ncclInt32;
    case Dtype::kInt64:
      return ncclInt64;
    case Dtype::kFloat16:
      return ncclFloat16;
    case Dtype::kBFloat16:
      return ncclBfloat16;
    case Dtype::kFloat32:
      return ncclFloat32;
    case Dtype::kFloat64:
      return ncclFloat64;
  }
  KUSARI_THROW(DtypeError, "NCCL: no datatype for ", dtype_name(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op, Dtype dtype) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return dtype == Dtype::kBool ? ncclMax : ncclSum;  // a sum of bools is their "or"
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// --- the base -----------------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(MPI_Comm comm, const CommunicatorOptions& options)
    : MpiCommunicator(comm, options) {
  if (options_.allreduce_grad_dtype) {
    KUSARI_CHECK(is_floating(*options_.allreduce_grad_dtype), DtypeError,
                 "create_communicator: allreduce_grad_dtype must be float16, bfloat16, float32 or ",
                 "float64, got ", dtype_name(*options_.allreduce_grad_dtype));
  }
  if (const char* c = std::getenv("KUSARI_MN_CHUNK_BYTES")) chunk_bytes_ = parse_chunk_bytes(c);
}

bool NcclCommunicator::averages_on_wire(Dtype dtype) const {
  return nccl_has_avg() && is_floating(dtype);
}

ncclRedOp_t NcclCommunicator::wire_op(ReduceOp op, Dtype dtype) const {
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
  if (op == ReduceOp::kMean && averages_on_wire(dtype)) return ncclAvg;
#endif
  return nccl_op(op, dtype);
}

NcclCommunicator::~NcclCommunicator() {
  release_nccl();
}

void NcclCommunicator::finalize() {
  release_nccl();
  if (aborted_.empty()) aborted_ = "finalize() was called";
  MpiCommunicator::finalize();
}

void NcclCommunicator::create_nccl_comm(MPI_Comm mpi, ncclComm_t* out, const char* what) {
  int r = 0, n = 1;
  KUSARI_MPI_CHECK(MPI_Comm_rank(mpi, &r));
  KUSARI_MPI_CHECK(MPI_Comm_size(mpi, &n));
  *out = nullptr;
  if (n == 1) return;
  // Rank 0 makes the id and says whether that worked, so that a failure there fails every rank
  // instead of leaving the others waiting in ncclCommInitRank.
  struct {
    int ok;
    ncclUniqueId id;
  } msg{};
  ncclResult_t made = ncclSuccess;
  if (r == 0) {
    made = ncclGetUniqueId(&msg.id);
    msg.ok = made == ncclSuccess ? 1 : 0;
  }
  KUSARI_MPI_CHECK(MPI_Bcast(&msg, sizeof(msg), MPI_BYTE, 0, mpi));
  KUSARI_CHECK(msg.ok, CommunicatorError, name(), ": creating the ", what,
               " NCCL communicator failed: ncclGetUniqueId on its rank 0 failed",
               r == 0 ? concat(": ", ncclGetErrorString(made)) : std::string());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&c, n, msg.id, r, &config);
  *out = c;
  const double t =
      options_.timeout_seconds > 0 ? std::max(options_.timeout_seconds, kMinInitTimeoutSeconds) : 0;
  nccl_check_within(result, c, "ncclCommInitRankConfig",
                    concat("creating the ", what, " NCCL communicator").c_str(), t);
}

double NcclCommunicator::op_timeout() const {
  const double t = options_.timeout_seconds;
  if (t <= 0 || warmed_up_) return t;
  return std::max(t, kMinInitTimeoutSeconds);
}

void NcclCommunicator::nccl_check(ncclResult_t result, ncclComm_t comm, const char* call,
                                  const char* what) {
  nccl_check_within(result, comm, call, what, op_timeout());
}

void NcclCommunicator::nccl_check_within(ncclResult_t result, ncclComm_t comm, const char* call,
                                         const char* what, double timeout_seconds) {
  if (result == ncclInProgress && comm) {
    ncclResult_t state = ncclInProgress;
    WaitProbes probes;
    probes.done = [&] {
      const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
      return state != ncclInProgress;
    };
    const WaitResult w = poll_until(probes, timeout_seconds);
    if (w.outcome == WaitOutcome::kTimedOut) {
      abort_and_throw(concat(name(), ": ", what, ": ", call, " did not complete within ",
                             timeout_seconds, " s on rank ", rank_, " (cuda:", device_,
                             "); a peer process may have died or not joined"));
    }
    result = state;
  }
  if (result != ncclSuccess) {
    abort_and_throw(concat(name(), ": ", what, ": NCCL call ", call, " failed on rank ", rank_,
                           " (cuda:", device_, "): ", nccl_message(result, comm)));
  }
}

void NcclCommunicator::abort_and_throw(const std::string& message) {
  for (ncclComm_t* c : nccl_comms()) {
    if (*c) ncclCommAbort(*c);  // ends the kernels still waiting; nothing more to do if it fails
    *c = nullptr;
  }
  // The wire buffers (the double-buffering slots in flight among them) are reused or go back to
  // the pool only after the compute stream has passed their (now ended) collectives.
  compute_waits_for_stream();
  in_flight_.clear();
  aborted_ = message + "; its NCCL communicators were aborted";
  KUSARI_THROW(CommunicatorError, aborted_, " and it cannot be used again");
}

std::string NcclCommunicator::async_error() {
  for (ncclComm_t* c : nccl_comms()) {
    if (!*c) continue;
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(*c, &state);
    if (r != ncclSuccess) state = r;
    if (state != ncclSuccess && state != ncclInProgress) return nccl_message(state, *c);
  }
  return {};
}

void NcclCommunicator::ensure_nccl(Device device, const char* what) {
  KUSARI_CHECK(aborted_.empty(), CommunicatorError, name(), ": ", what,
               ": this communicator is unusable: ", aborted_, "; create a new communicator");
  KUSARI_CHECK(device.is_cuda(), DeviceError, name(), ": ", what, " needs arrays on a GPU, got ",
               device, " (on the CPU use the 'flat' or 'naive' communicator)");
  if (device_ < 0) {
    const int d = device.index();
    cuda::check_device_index(d, name());
    compute_stream(d);  // creates the device's state
    cuda::set_device(d);
    int least = 0, greatest = 0;
    KUSARI_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    KUSARI_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    for (cudaEvent_t* e : {&staged_, &drained_}) {
      KUSARI_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
    device_ = d;
    ensure_events(op_events_, 1);
    init_nccl();
  } else {
    KUSARI_CHECK(device.index() == device_, DeviceError, name(), ": ", what, " got arrays on ",
                 device, " but this communicator drives cuda:", device_, " (one GPU per process)");
    cuda::set_device(device_);
    const std::string error = async_error();
    if (!error.empty()) {
      abort_and_throw(concat(name(), ": ", what, ": an earlier NCCL operation failed on rank ",
                             rank_, ": ", error));
    }
  }
}

void NcclCommunicator::ensure_events(ChunkEvents& ev, int count) {
  const size_t n = static_cast<size_t>(count);
  for (std::vector<cudaEvent_t>* list : {&ev.packed, &ev.started, &ev.done}) {
    while (list->size() < n) {
      cudaEvent_t e = nullptr;
      KUSARI_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      list->push_back(e);
    }
  }
}

void NcclCommunicator::mark_packed(ChunkEvents& ev, int k) {
  KUSARI_CUDA_CHECK(cudaEventRecord(ev.packed[static_cast<size_t>(k)], compute_stream(device_)));
}

void NcclCommunicator::begin_chunk(ChunkEvents& ev, int k) {
  const size_t i = static_cast<size_t>(k);
  KUSARI_CUDA_CHECK(cudaStreamWaitEvent(stream_, ev.packed[i], 0));
  current_started_ = nullptr;
  if (op_timeout() > 0) {  // only the deadline clock reads it
    KUSARI_CUDA_CHECK(cudaEventRecord(ev.started[i], stream_));
    current_started_ = ev.started[i];
  }
}

void NcclCommunicator::end_chunk(ChunkEvents& ev, int k, bool compute_waits) {
  const size_t i = static_cast<size_t>(k);
  KUSARI_CUDA_CHECK(cudaEventRecord(ev.done[i], stream_));
  if (compute_waits) KUSARI_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(device_), ev.done[i], 0));
}

void NcclCommunicator::compute_waits_for_stream() noexcept {
  if (device_ < 0 || !stream_ || !drained_) return;
  try {
    cudaStream_t compute = compute_stream(device_);
    if (cudaEventRecord(drained_, stream_) == cudaSuccess)
      cudaStreamWaitEvent(compute, drained_, 0);
  } catch (...) {
  }
  cudaGetLastError();
}

namespace {

/// True once `event` has completed; throws on a CUDA error other than "not ready".
bool event_done(cudaEvent_t event) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaErrorNotReady) return false;
  KUSARI_CUDA_CHECK(status);
  return true;
}

}  // namespace

void NcclCommunicator::wait_chunks(const ChunkEvents& ev, int count, const char* what) {
  for (int k = 0; k < count; ++k) {
    const double timeout = op_timeout();
    if (timeout <= 0) return;
    const size_t i = static_cast<size_t>(k);
    WaitProbes probes;
    probes.done = [&] { return event_done(ev.done[i]); };
    probes.failed = [&] { return async_error(); };
    probes.started = [&] { return event_done(ev.started[i]); };
    const WaitResult w = poll_until(probes, timeout);
    if (w.outcome != WaitOutcome::kDone) {
      const std::string op =
          count > 1 ? concat(what, " (chunk ", k + 1, " of ", count, ")") : std::string(what);
      if (w.outcome == WaitOutcome::kFailed) {
        abort_and_throw(concat(name(), ": ", op, " failed on rank ", rank_, " (cuda:", device_,
                               "): ", w.error));
      }
      abort_and_throw(concat(name(), ": ", op, " did not finish within the timeout of ", timeout,
                             " s on rank ", rank_, " (cuda:", device_,
                             "); a peer process may have died or not called it"));
    }
    warmed_up_ = true;
  }
}

void NcclCommunicator::wait_stream(const char* what) {
  KUSARI_CUDA_CHECK(cudaEventRecord(staged_, stream_));
  WaitProbes probes;
  probes.done = [&] { return event_done(staged_); };
  probes.failed = [&] { return async_error(); };
  cudaEvent_t started = current_started_;
  if (started) probes.started = [&] { return event_done(started); };
  const double timeout = op_timeout();
  const WaitResult w = poll_until(probes, timeout);
  if (w.outcome == WaitOutcome::kFailed) {
    abort_and_throw(
        concat(name(), ": ", what, " failed on rank ", rank_, " (cuda:", device_, "): ", w.error));
  }
  if (w.outcome == WaitOutcome::kTimedOut) {
    abort_and_throw(concat(name(), ": ", what, " did not finish within the timeout of ", timeout,
                           " s on rank ", rank_, " (cuda:", device_,
                           "); a peer process may have died or not called it"));
  }
}

void* NcclCommunicator::host_buffer(size_t bytes) {
  if (bytes > host_buffer_bytes_) {
    if (host_buffer_) {
      // Copies queued on the stream may still read the old buffer.
      KUSARI_CUDA_CHECK(cudaStreamSynchronize(stream_));
      KUSARI_CUDA_CHECK(cudaFreeHost(host_buffer_));
      host_buffer_ = nullptr;
      host_buffer_bytes_ = 0;
    }
    KUSARI_CUDA_CHECK(cudaHostAlloc(&host_buffer_, bytes, cudaHostAllocDefault));
    host_buffer_bytes_ = bytes;
  }
  return host_buffer_;
}

namespace {

/// Waits for an MPI request against the deadline; false when it timed out.
bool wait_request(MPI_Request* request, double timeout_seconds) {
  if (timeout_seconds <= 0) {
    KUSARI_MPI_CHECK(MPI_Wait(request, MPI_STATUS_IGNORE));
    return true;
  }
  WaitProbes probes;
  probes.done = [&] {
    int flag = 0;
    KUSARI_MPI_CHECK(MPI_Test(request, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  };
  return poll_until(probes, timeout_seconds).outcome == WaitOutcome::kDone;
}

}  // namespace

void NcclCommunicator::host_allreduce(void* data, int64_t n, Dtype dtype, ReduceOp op, MPI_Comm mpi,
                                      const char* what) {
  const MPI_Datatype type = mpi_datatype(dtype);
  const MPI_Op mop = mpi_op(op, dtype);
  char* p = static_cast<char*>(data);
  const int64_t item = static_cast<int64_t>(itemsize(dtype));
  for (int64_t done = 0; done < n;) {
    const int count = static_cast<int>(std::min(n - done, max_chunk_elements()));
    MPI_Request request;
    KUSARI_MPI_CHECK(
        MPI_Iallreduce(MPI_IN_PLACE, p + done * item, count, type, mop, mpi, &request));
    if (!wait_request(&request, op_timeout())) {
      abort_and_throw(concat(
          name(), ": ", what, ": the MPI allreduce among the hosts did not finish within ",
          op_timeout(), " s on rank ", rank_, "; a peer process may have died or not called it"));
    }
    done += count;
  }
}

void NcclCommunicator::host_bcast(void* data, int64_t bytes, MPI_Comm mpi, const char* what) {
  char* p = static_cast<char*>(data);
  for (int64_t done = 0; done < bytes;) {
    const int count = static_cast<int>(std::min(bytes - done, max_chunk_elements()));
    MPI_Request request;
    KUSARI_MPI_CHECK(MPI_Ibcast(p + done, count, MPI_BYTE, 0, mpi, &request));
    if (!wait_request(&request, op_timeout())) {
      abort_and_throw(concat(
          name(), ": ", what, ": the MPI broadcast among the hosts did not finish within ",
          op_timeout(), " s on rank ", rank_, "; a peer process may have died or not called it"));
    }
    done += count;
  }
}

void NcclCommunicator::release_nccl() noexcept {
  if (device_ < 0) return;
  // Nothing here may throw: this runs in destructors, possibly while the CUDA runtime shuts down.
  if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  cudaStream_t compute = nullptr;
  try {
    compute = compute_stream(device_);
  } catch (...) {
  }
  if (compute) compute_waits_for_stream();
  in_flight_.clear();
  for (ncclComm_t* c : nccl_comms()) {
    if (!*c) continue;
    ncclResult_t result = ncclCommFinalize(*c);
    if (result == ncclInProgress) {
      ncclResult_t state = ncclInProgress;
      WaitProbes probes;
      probes.done = [&] {
        const ncclResult_t r = ncclCommGetAsyncError(*c, &state);
        if (r != ncclSuccess) state = r;
        return state != ncclInProgress;
      };
      const WaitResult w = poll_until(probes, options_.timeout_seconds);
      result = w.outcome == WaitOutcome::kDone ? state : ncclInProgress;
    }
    if (result == ncclSuccess) {
      ncclCommDestroy(*c);
    } else {
      ncclCommAbort(*c);
    }
    *c = nullptr;
  }
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  for (cudaEvent_t* e : {&staged_, &drained_}) {
    if (*e) cudaEventDestroy(*e);
    *e = nullptr;
  }
  for (ChunkEvents* ev : {&op_events_, &grad_events_, &slot_events_[0], &slot_events_[1]}) {
    for (std::vector<cudaEvent_t>* list : {&ev->packed, &ev->started, &ev->done}) {
      for (cudaEvent_t e : *list) cudaEventDestroy(e);
      list->clear();
    }
  }
  current_started_ = nullptr;
  if (host_buffer_) cudaFreeHost(host_buffer_);
  host_buffer_ = nullptr;
  host_buffer_bytes_ = 0;
  cudaGetLastError();
  // The wire buffers go back to the pool; the compute stream already waits for their last use.
  // The parameters bound to the gradient buffer are unbound (their gradients keep it alive).
  gradient_buffer().release();
  grad_buffer_ = Array();
  slot_buffers_[0] = Array();
  slot_buffers_[1] = Array();
  device_ = -1;
}

// --- gradients -----------------------------------------------------------------------------------

std::string NcclCommunicator::gradient_settings() const {
  return concat(MpiCommunicator::gradient_settings(), ", KUSARI_MN_CHUNK_BYTES ",
                chunk_bytes_name(chunk_bytes_));
}

void NcclCommunicator::check_gradients_here(const NamedParams& params) {
  if (params.empty()) return;
  const char* what = "multi_node_mean_grad";
  const Device d = params.front().second.impl().grad->data.device();
  for (const auto& [path, p] : params) {
    const Device here = p.impl().grad->data.device();  // (gradients_to_reduce gave each one)
    KUSARI_CHECK(here == d, DeviceError, name(), ": ", what, ": the gradient of ", path, " is on ",
                 here, " but that of ", params.front().first, " is on ", d,
                 " (the model must be on one GPU)");
  }
  KUSARI_CHECK(d.is_cuda(), CommunicatorError, name(), ": ", what,
               " needs the model on a GPU, but its gradients are on ", d,
               " (move the model with to_device(Device::cuda(comm->intra_rank())), or use 'flat' "
               "or 'naive' on the CPU)");
  gradients_device_ = d;
}

Dtype NcclCommunicator::wire_dtype(
    const std::vector<std::pair<std::string, Parameter>>& params) const {
  if (options_.allreduce_grad_dtype) return *options_.allreduce_grad_dtype;
  std::vector<Dtype> dtypes;
  for (const auto& [path, p] : params) dtypes.push_back(p.grad().dtype());
  return widest(dtypes);
}

ChunkPlan NcclCommunicator::prepare_gradients(
    const std::vector<std::pair<std::string, Parameter>>& params, Array& buffer) {
  std::vector<Array> grads;
  grads.reserve(params.size());
  int64_t total = 0;
  for (const auto& [path, p] : params) {
    grads.push_back(p.grad());
    total += p.grad().size();
  }
  const Dtype wire = wire_dtype(params);
  const int64_t padded = round_up(std::max<int64_t>(total, 1), buffer_multiple());
  const ChunkPlan plan =
      plan_chunks(padded, static_cast<int64_t>(itemsize(wire)), buffer_multiple(), chunk_bytes_);
  grad_packer_.prepare(grads, wire, device_, plan.count > 1 ? plan.chunk : 0);
  KUSARI_ASSERT(grad_packer_.total() == total && grad_packer_.chunks() == plan.count,
                "gradient pipeline: the packer's layout does not match the chunk plan");
  if (!buffer.defined() || buffer.dtype() != wire || buffer.size() < padded) {
    buffer = Array::empty({padded}, wire, Device::cuda(device_));
  }
  if (padded > total) {
    const size_t item = itemsize(wire);
    KUSARI_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(buffer.raw_data()) + total * item, 0,
                                      static_cast<size_t>(padded - total) * item,
                                      compute_stream(device_)));
  }
  last_gradient_chunks_ = plan.count;
  return plan;
}

void NcclCommunicator::queue_gradient_pipeline(const ChunkPlan& plan, Array& buffer,
                                               ChunkEvents& ev, bool unpack, double scale,
                                               const char* what) {
  ensure_events(ev, plan.count);
  cudaStream_t compute = compute_stream(device_);
  const Dtype wire = buffer.dtype();
  const int64_t item = static_cast<int64_t>(itemsize(wire));
  char* base = static_cast<char*>(buffer.raw_data());
  std::string chunk_what;
  auto reduce_chunk = [&](int k) {
    if (plan.count > 1) {  // (no ostringstream on the hot path)
      chunk_what = std::string(what) + " (chunk " + std::to_string(k + 1) + " of " +
                   std::to_string(plan.count) + ")";
    }
    begin_chunk(ev, k);
    reduce_buffer(base + plan.begin(k) * item, plan.size(k), wire, ReduceOp::kMean,
                  plan.count > 1 ? chunk_what.c_str() : what);
    end_chunk(ev, k, /*compute_waits=*/false);
  };
  // Every pack goes before the first unpack on the compute stream (an unpack waits for its
  // collectives). The collectives of chunk k are queued right after its pack, unless the kind
  // waits on the host inside them.
  const bool host_waits = reduce_waits_on_host();
  for (int k = 0; k < plan.count; ++k) {
    grad_packer_.pack_chunk(base, k, compute);
    mark_packed(ev, k);
    if (!host_waits) reduce_chunk(k);
  }
  for (int k = 0; k < plan.count; ++k) {
    if (host_waits) reduce_chunk(k);
    if (unpack) {
      KUSARI_CUDA_CHECK(cudaStreamWaitEvent(compute, ev.done[static_cast<size_t>(k)], 0));
      grad_packer_.unpack_chunk(base, k, scale, compute);
    }
  }
}

bool NcclCommunicator::mean_grad_in_buffer(
    const std::vector<std::pair<std::string, Parameter>>& params, const char* what) {
  GradientBuffer& gb = gradient_buffer();
  if (gradients_in_place() && gb.device() == Device::cuda(device_)) {
    // Every gradient is still its segment (Note [Gradients in the reduction buffer], "Every
    // step"): the buffer was laid out, checked and bound for them, so reduce it.
    reduce_gradient_buffer(gb.flat(), what);
    return true;
  }
  const Device gpu = Device::cuda(device_);
  const std::optional<Dtype> dtype = buffer_dtype(params, gpu);
  if (!dtype) return false;
  // Segments on 256-byte boundaries, as the memory pool aligns arrays.
  constexpr int64_t kAlignBytes = 256;
  const int64_t item = static_cast<int64_t>(itemsize(*dtype));
  int64_t elements = 0;
  if (gb.matches(params, *dtype, gpu, kAlignBytes, buffer_multiple())) {
    elements = gb.flat().size();  // (every step but the first: no planning)
  } else {
    std::vector<int64_t> sizes, offsets;
    sizes.reserve(params.size());
    for (const auto& [path, p] : params) sizes.push_back(p.size());
    const int64_t align = std::max<int64_t>(1, kAlignBytes / item);
    elements = GradientBuffer::plan(sizes, align, buffer_multiple(), &offsets);
  }
  if (plan_chunks(elements, item, buffer_multiple(), chunk_bytes_).count != 1) {
    gb.release();
    return false;
  }
  const std::vector<size_t> to_copy =
      gb.bind(params, *dtype, gpu, kAlignBytes, buffer_multiple());
  KUSARI_ASSERT(gb.flat().size() == elements,
                "gradients in the buffer: the layout does not match its plan");
  cudaStream_t compute = compute_stream(device_);
  if (!to_copy.empty()) {
    // One kernel copies every gradient that is not in its segment yet (the first call, set_grad,
    // zero_fill's fresh zeros, the views of a previous buffer).
    std::vector<Array> grads;
    std::vector<int64_t> at;
    for (size_t i : to_copy) {
      grads.push_back(params[i].second.grad());
      at.push_back(gb.offset(i));
    }
    adopt_packer_.prepare(grads, *dtype, device_, 0, &at);
    adopt_packer_.pack(gb.flat().raw_data(), compute);
    for (size_t i : to_copy) gb.use_segment(params, i);
  }
  reduce_gradient_buffer(gb.flat(), what);
  return true;
}

void NcclCommunicator::reduce_gradient_buffer(Array flat, const char* what) {
  last_gradient_chunks_ = 1;
  ensure_events(grad_events_, 1);
  begin_op(grad_events_);
  reduce_buffer(flat.raw_data(), flat.size(), flat.dtype(), ReduceOp::kMean, what);  // mean or sum
  end_op(grad_events_);  // the compute stream waits: backward and updates come after
  if (!averages_on_wire(flat.dtype())) multiply_to(flat, 1.0 / size_);
  wait_chunks(grad_events_, 1, what);
}

void NcclCommunicator::multi_node_mean_grad(Link& model, bool zero_fill) {
  NamedParams& params = gradients_to_reduce(model, zero_fill);
  if (params.empty()) return;
  const char* what = "multi_node_mean_grad";
  ensure_nccl(gradients_device_, what);
  // Note [Gradients in the reduction buffer] (gradient_buffer.cc): no pack and no unpack.
  if (mean_grad_in_buffer(params, what)) {
    check_finite_after_reduce(params);
    return;
  }
  const ChunkPlan plan = prepare_gradients(params, grad_buffer_);
  const double scale = averages_on_wire(grad_buffer_.dtype()) ? 1.0 : 1.0 / size_;
  queue_gradient_pipeline(plan, grad_buffer_, grad_events_, /*unpack=*/true, scale, what);
  wait_chunks(grad_events_, plan.count, what);
  check_finite_after_reduce(params);
}

// Note [Double buffering]
// ChainerMN's double buffering hides the gradient allreduce behind the next step's computation at
// the price of one step of staleness. The multi-node optimizer drives it through
// MeanGradPipeline, which this base implements with two wire buffers ("slots") of its own:
//   update t:  start_mean_grad: pack the gradients of step t into the free slot (compute
//              stream) and queue their reduction on the NCCL stream, chunk by chunk
//              (Note [Gradient pipeline]); the compute stream does NOT wait, so step t+1's
//              forward and backward run while the collectives do;
//              finish_mean_grad: make the compute stream wait for the reduction of step t-1 (the
//              other slot; its last chunk's done event), unpack its mean into the gradients
//              (overwriting step t's, which are already packed), and the wrapped optimizer
//              updates with them.
// The first update after a broadcast only starts the pipeline (there is no earlier sum yet). The
// slots are only repacked after the compute stream waited for their collectives, and are never
// released while a reduction is in flight, so the pool's stream-order rule holds. A parameter set
// change cancels the pipeline (waits for and drops the reductions in flight). With a timeout, the
// deadlines are checked in finish_mean_grad, when the result is needed; non_cuda_aware still
// waits on the host for its MPI step inside start_mean_grad, so only its GPU parts overlap.
void NcclCommunicator::start_mean_grad(Link& model, bool zero_fill) {
  KUSARI_CHECK(in_flight_.size() < 2, CommunicatorError, name(),
               ": start_mean_grad: two reductions are already in flight; finish one first");
  NamedParams params = gradients_to_reduce(model, zero_fill);
  const char* what = "multi_node_mean_grad (double buffering)";
  InFlight f;
  f.slot = next_slot_;
  if (!in_flight_.empty() && in_flight_.front().slot == f.slot) f.slot ^= 1;
  next_slot_ = f.slot ^ 1;
  if (!params.empty()) {
    ensure_nccl(gradients_device_, what);
    ChunkEvents& ev = slot_events_[static_cast<size_t>(f.slot)];
    Array& buffer = slot_buffers_[static_cast<size_t>(f.slot)];
    f.plan = prepare_gradients(params, buffer);
    f.scale = averages_on_wire(buffer.dtype()) ? 1.0 : 1.0 / size_;
    queue_gradient_pipeline(f.plan, buffer, ev, /*unpack=*/false, f.scale, what);
  }
  f.params = std::move(params);
  in_flight_.push_back(std::move(f));
}

bool NcclCommunicator::finish_mean_grad(Link& model) {
  if (in_flight_.empty()) return false;
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  const char* what = "multi_node_mean_grad (double buffering)";
  std::set<std::string> reduced;
  for (auto& [path, p] : f.params) reduced.insert(path);
  for (auto& [path, p] : model.namedparams(false)) {
    if (!reduced.count(path)) p.cleargrad();
  }
  if (f.params.empty()) return true;
  const ChunkEvents& ev = slot_events_[static_cast<size_t>(f.slot)];
  const Array& buffer = slot_buffers_[static_cast<size_t>(f.slot)];
  KUSARI_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(device_),
                                        ev.done[static_cast<size_t>(f.plan.count - 1)], 0));
  wait_chunks(ev, f.plan.count, what);
  std::vector<Array> grads;
  for (auto& [path, p] : f.params) {
    if (!p.grad().defined()) {
      p.zerograd();
    } else if (!p.grad().is_contiguous()) {
      p.set_grad(p.grad().copy());
    }
    grads.push_back(p.grad());
  }
  // The same chunk size as start_mean_grad, so that the tables are not rebuilt every step.
  grad_packer_.prepare(grads, buffer.dtype(), device_, f.plan.count > 1 ? f.plan.chunk : 0);
  KUSARI_ASSERT(grad_packer_.total() <= f.plan.elements,
                "double buffering: the gradients outgrew their slot");
  grad_packer_.unpack(buffer.raw_data(), f.scale, compute_stream(device_));
  check_finite_after_reduce(f.params);
  return true;
}

void NcclCommunicator::cancel_mean_grads() {
  while (!in_flight_.empty()) {
    const InFlight& f = in_flight_.front();
    if (!f.params.empty()) {
      const ChunkEvents& ev = slot_events_[static_cast<size_t>(f.slot)];
      KUSARI_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(device_),
                                            ev.done[static_cast<size_t>(f.plan.count - 1)], 0));
      wait_chunks(ev, f.plan.count, "multi_node_mean_grad (double buffering)");
    }
    in_flight_.pop_front();
  }
}

// --- parameters and arrays -----------------------------------------------------------------------

void NcclCommunicator::bcast_data(Link& model) {
  auto params = model.namedparams(false);
  std::sort(params.begin(), params.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Array> datas;
  std::vector<Dtype> dtypes;
  bool gpu = true;
  for (auto& [path, p] : params) {
    if (!p.is_initialized()) continue;
    const Array& data = p.data();
    gpu = gpu && data.device().is_cuda() && is_floating(data.dtype()) &&
          (datas.empty() || data.device() == datas.front().device());
    datas.push_back(data.is_contiguous() ? data : data.contiguous());
    dtypes.push_back(data.dtype());
  }
  // A model on the CPU (or of integer parameters) is broadcast through MPI like every
  // communicator does. The ranks check that they hold the same model, on the same kind of
  // device, so that every rank takes the same path (Note [Same model]).
  const char* what = "bcast_data";
  check_same_parameters(*this, params, what, /*device_kind=*/true,
                        gpu ? "sent over NCCL (every parameter floating, on one GPU)"
                            : "sent over MPI (not every parameter floating, on one GPU)");
  if (!gpu || datas.empty()) {
    bcast_parameters_over_mpi(*this, params);
    return;
  }
  ensure_nccl(datas.front().device(), what);
  const Dtype wire = widest(dtypes);
  data_packer_.prepare(datas, wire, device_);
  const int64_t total = data_packer_.total();
  Array buffer = Array::empty({total}, wire, Device::cuda(device_));
  cudaStream_t compute = compute_stream(device_);
  if (rank_ == 0) data_packer_.pack(buffer.raw_data(), compute);
  begin_op(op_events_);
  bcast_buffer(buffer.raw_data(), total, wire, what);
  end_op(op_events_);
  wait_op(op_events_, what);
  if (rank_ != 0) {
    data_packer_.unpack(buffer.raw_data(), 1.0, compute);
    // A parameter that was not contiguous was packed from a copy: write the copy back.
    size_t i = 0;
    for (auto& [path, p] : params) {
      if (!p.is_initialized()) continue;
      if (!p.data().shares_memory_with(datas[i]) || p.data().raw_data() != datas[i].raw_data()) {
        Array data = p.data();
        data.assign(datas[i]);
      }
      ++i;
    }
  }
}

void NcclCommunicator::allreduce_inplace(Array& x, ReduceOp op) {
  if (!x.device().is_cuda() || !x.is_contiguous() || x.size() == 0) {
    Communicator::allreduce_inplace(x, op);
    return;
  }
  if (op == ReduceOp::kMean) {
    KUSARI_CHECK(is_floating(x.dtype()), DtypeError, "allreduce: mean needs a floating dtype, got ",
                 dtype_name(x.dtype()));
  }
  const char* what = "allreduce";
  ensure_nccl(x.device(), what);
  const int64_t n = x.size();
  const int64_t padded = round_up(n, buffer_multiple());
  Array work = x;
  if (padded != n) {
    work = Array::zeros({padded}, x.dtype(), x.device());
    Array head = work.at({Slice(0, n)});
    head.assign(x.reshape({n}));
  }
  begin_op(op_events_);
  reduce_buffer(work.raw_data(), padded, x.dtype(), op, what);  // kMean: mean or sum
  end_op(op_events_);
  wait_op(op_events_, what);
  if (padded != n) x.assign(work.at({Slice(0, n)}).reshape(x.shape()));
  if (op == ReduceOp::kMean && !averages_on_wire(x.dtype())) x.assign(x * (1.0 / size_));
}

void NcclCommunicator::allreduce_in_pieces(Array& x, int pieces) {
  const char* what = "allreduce (in pieces)";
  KUSARI_CHECK(x.device().is_cuda() && x.is_contiguous() && x.size() > 0, ValueError, name(), ": ",
               what, " needs a non-empty contiguous GPU array");
  ensure_nccl(x.device(), what);
  const int64_t n = x.size();
  KUSARI_CHECK(n % buffer_multiple() == 0, ValueError, name(), ": ", what, ": ", n,
               " elements are not a multiple of ", buffer_multiple());
  const int64_t count = std::clamp<int64_t>(pieces, 1, n / buffer_multiple());
  const int64_t piece = round_up((n + count - 1) / count, buffer_multiple());
  const int64_t item = static_cast<int64_t>(itemsize(x.dtype()));
  char* base = static_cast<char*>(x.raw_data());
  begin_op(op_events_);
  for (int64_t at = 0; at < n; at += piece) {
    reduce_buffer(base + at * item, std::min(piece, n - at), x.dtype(), ReduceOp::kSum, what);
  }
  end_op(op_events_);
  wait_op(op_events_, what);
}

// --- the kinds -----------------------------------------------------------------------------------

#define KUSARI_NCCL(call, comm, what) nccl_check((call), (comm), #call, (what))

void PureNcclCommunicator::init_nccl() {
  create_nccl_comm(comm(), &world_, "world");
}

void PureNcclCommunicator::reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op,
                                         const char* what) {
  if (!world_) return;
  KUSARI_NCCL(ncclAllReduce(buffer, buffer, static_cast<size_t>(n), nccl_datatype(dtype),
                            wire_op(op, dtype), world_, stream()),
              world_, what);
}

void PureNcclCommunicator::bcast_buffer(void* buffer, int64_t n, Dtype dtype, const char* what) {
  if (!world_) return;
  KUSARI_NCCL(ncclBroadcast(buffer, buffer, static_cast<size_t>(n), nccl_datatype(dtype), 0, world_,
                            stream()),
              world_, what);
}

SingleNodeCommunicator::SingleNodeCommunicator(MPI_Comm comm, const CommunicatorOptions& options)
    : PureNcclCommunicator(comm, options) {
  KUSARI_CHECK(inter_size_ == 1, CommunicatorError, "single_node: the job spans ", inter_size_,
               " hosts, but single_node works within one host only (use pure_nccl or hierarchical "
               "across hosts",
               std::getenv("KUSARI_MN_RANKS_PER_HOST")
                   ? "; KUSARI_MN_RANKS_PER_HOST makes pretend hosts"
                   : "",
               ")");
}

HierarchicalCommunicator::HierarchicalCommunicator(MPI_Comm comm,
                                                   const CommunicatorOptions& options)
    : NcclCommunicator(comm, options) {
  int64_t sizes[2] = {intra_size_, -intra_size_};
  allreduce_host(sizes, 2, Dtype::kInt64, ReduceOp::kMax, this->comm());
  even_hosts_ = sizes[0] == -sizes[1];
}

bool HierarchicalCommunicator::averages_on_wire(Dtype dtype) const {
  return even_hosts_ && NcclCommunicator::averages_on_wire(dtype);
}

void HierarchicalCommunicator::init_nccl() {
  create_nccl_comm(intra_comm(), &intra_, "intra-host");
  if (intra_rank_ == 0) create_nccl_comm(inter_comm(), &inter_, "inter-host");
}

void HierarchicalCommunicator::reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op,
                                             const char* what) {
  const size_t count = static_cast<size_t>(n);
  const ncclDataType_t type = nccl_datatype(dtype);
  // With even hosts, the mean of the hosts' means (ncclAvg in both steps) is the mean.
  const ncclRedOp_t rop = wire_op(op, dtype);
  if (intra_)
    KUSARI_NCCL(ncclReduce(buffer, buffer, count, type, rop, 0, intra_, stream()), intra_, what);
  if (inter_)
    KUSARI_NCCL(ncclAllReduce(buffer, buffer, count, type, rop, inter_, stream()), inter_, what);
  if (intra_)
    KUSARI_NCCL(ncclBroadcast(buffer, buffer, count, type, 0, intra_, stream()), intra_, what);
}

void HierarchicalCommunicator::bcast_buffer(void* buffer, int64_t n, Dtype dtype,
                                            const char* what) {
  const size_t count = static_cast<size_t>(n);
  const ncclDataType_t type = nccl_datatype(dtype);
  if (inter_)
    KUSARI_NCCL(ncclBroadcast(buffer, buffer, count, type, 0, inter_, stream()), inter_, what);
  if (intra_)
    KUSARI_NCCL(ncclBroadcast(buffer, buffer, count, type, 0, intra_, stream()), intra_, what);
}

TwoDimensionalCommunicator::TwoDimensionalCommunicator(MPI_Comm comm,
                                                       const CommunicatorOptions& options)
    : NcclCommunicator(comm, options) {
  int64_t sizes[2] = {intra_size_, -intra_size_};
  allreduce_host(sizes, 2, Dtype::kInt64, ReduceOp::kMax, this->comm());
  KUSARI_CHECK(
      sizes[0] == -sizes[1], CommunicatorError,
      "two_dimensional: every host must run the same number of processes, but hosts run between ",
      -sizes[1], " and ", sizes[0], " (use hierarchical for uneven hosts)");
}

int64_t TwoDimensionalCommunicator::buffer_multiple() const {
  // Chunks of a multiple of 64 elements keep every chunk 128-byte aligned.
  return static_cast<int64_t>(intra_size_) * 64;
}

void TwoDimensionalCommunicator::init_nccl() {
  create_nccl_comm(intra_comm(), &intra_, "intra-host");
  create_nccl_comm(inter_comm(), &inter_, "inter-host");
}

void TwoDimensionalCommunicator::reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op,
                                               const char* what) {
  KUSARI_ASSERT(n % intra_size_ == 0, "two_dimensional: the buffer is not padded");
  const size_t chunk = static_cast<size_t>(n / intra_size_);
  const ncclDataType_t type = nccl_datatype(dtype);
  // Every host runs as many processes: the mean of the hosts' means (ncclAvg) is the mean.
  const ncclRedOp_t rop = wire_op(op, dtype);
  void* mine =
      static_cast<char*>(buffer) + chunk * static_cast<size_t>(intra_rank_) * itemsize(dtype);
  if (intra_)
    KUSARI_NCCL(ncclReduceScatter(buffer, mine, chunk, type, rop, intra_, stream()), intra_, what);
  if (inter_)
    KUSARI_NCCL(ncclAllReduce(mine, mine, chunk, type, rop, inter_, stream()), inter_, what);
  if (intra_) KUSARI_NCCL(ncclAllGather(mine, buffer, chunk, type, intra_, stream()), intra_, what);
}

void TwoDimensionalCommunicator::bcast_buffer(void* buffer, int64_t n, Dtype dtype,
                                              const char* what) {
  const size_t count = static_cast<size_t>(n);
  const ncclDataType_t type = nccl_datatype(dtype);
  if (intra_rank_ == 0 && inter_) {
    KUSARI_NCCL(ncclBroadcast(buffer, buffer, count, type, 0, inter_, stream()), inter_, what);
  }
  if (intra_)
    KUSARI_NCCL(ncclBroadcast(buffer, buffer, count, type, 0, intra_, stream()), intra_, what);
}

void NonCudaAwareCommunicator::init_nccl() {
  create_nccl_comm(intra_comm(), &intra_, "intra-host");
}

void NonCudaAwareCommunicator::reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op,
                                             const char* what) {
  const size_t count = static_cast<size_t>(n);
  const ncclDataType_t type = nccl_datatype(dtype);
  const ReduceOp sum_op = op == ReduceOp::kMean ? ReduceOp::kSum : op;  // the caller scales
  const ncclRedOp_t rop = nccl_op(sum_op, dtype);
  if (intra_)
    KUSARI_NCCL(ncclReduce(buffer, buffer, count, type, rop, 0, intra_, stream()), intra_, what);
  if (intra_rank_ == 0 && inter_size_ > 1) {
    const size_t bytes = count * itemsize(dtype);
    void* host = host_buffer(bytes);
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(host, buffer, bytes, cudaMemcpyDeviceToHost, stream()));
    wait_stream(what);
    host_allreduce(host, n, dtype, sum_op, inter_comm(), what);
    KUSARI_CUDA_CHECK(cudaMemcpyAsync(buffer, host, bytes, cudaMemcpyHostToDevice, stream()));
  }
  if (intra_)
    KUSARI_NCCL(ncclBroadcast(buffer, buffer, count, type, 0, intra_, stream()), intra_, what);
}

void NonCudaAwareCommunicator::bcast_buffer(void* buffer, int64_t n, Dtype dtype,
                                            const char* what) {
  const size_t count = static_cast<size_t>(n);
  if (intra_rank_ == 0 && inter_size_ > 1) {
    const size_t bytes = count * itemsize(dtype);
    void* host = host_buffer(bytes);
    if (inter_rank_ == 0) {
      KUSARI_CUDA_CHECK(cudaMemcpyAsync(host, buffer, bytes, cudaMemcpyDeviceToHost, stream()));
      wait_stream(what);
    }
    host_bcast(host, static_cast<int64_t>(bytes), inter_comm(), what);
    if (inter_rank_ != 0) {
      KUSARI_CUDA_CHECK(cudaMemcpyAsync(buffer, host, bytes, cudaMemcpyHostToDevice, stream()));
    }
  }
  if (intra_) {
    KUSARI_NCCL(ncclBroadcast(buffer, buffer, count, nccl_datatype(dtype), 0, intra_, stream()),
                intra_, what);
  }
}

#undef KUSARI_NCCL

// --- split and creation --------------------------------------------------------------------------

namespace {

template <typename C>
std::shared_ptr<Communicator> split_as(const MpiCommunicator& self, int color, int key) {
  MPI_Comm sub;
  KUSARI_MPI_CHECK(MPI_Comm_split(self.comm(), color, key, &sub));
  std::shared_ptr<Communicator> c;
  try {
    c = std::make_shared<C>(sub, self.options());
  } catch (...) {
    MPI_Comm_free(&sub);
    throw;
  }
  MPI_Comm_free(&sub);  // the new communicator holds its own duplicate
  return c;
}

}  // namespace

std::shared_ptr<Communicator> PureNcclCommunicator::split(int color, int key) {
  return split_as<PureNcclCommunicator>(*this, color, key);
}
std::shared_ptr<Communicator> SingleNodeCommunicator::split(int color, int key) {
  return split_as<SingleNodeCommunicator>(*this, color, key);
}
std::shared_ptr<Communicator> HierarchicalCommunicator::split(int color, int key) {
  return split_as<HierarchicalCommunicator>(*this, color, key);
}
std::shared_ptr<Communicator> TwoDimensionalCommunicator::split(int color, int key) {
  return split_as<TwoDimensionalCommunicator>(*this, color, key);
}
std::shared_ptr<Communicator> NonCudaAwareCommunicator::split(int color, int key) {
  return split_as<NonCudaAwareCommunicator>(*this, color, key);
}

std::shared_ptr<Communicator> create_nccl_communicator(const std::string& name, MPI_Comm comm,
                                                       const CommunicatorOptions& options) {
  if (name == "pure_nccl") return std::make_shared<PureNcclCommunicator>(comm, options);
  if (name == "single_node") return std::make_shared<SingleNodeCommunicator>(comm, options);
  if (name == "hierarchical") return std::make_shared<HierarchicalCommunicator>(comm, options);
  if (name == "two_dimensional") return std::make_shared<TwoDimensionalCommunicator>(comm, options);
  if (name == "non_cuda_aware") return std::make_shared<NonCudaAwareCommunicator>(comm, options);
  KUSARI_THROW(ValueError, "create_nccl_communicator: unknown NCCL communicator '", name, "'");
}

}  // namespace kusari::mn::detail

#endif  // KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
