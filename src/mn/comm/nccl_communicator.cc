#include "kusari/config.h"

#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL

#include "mn/comm/nccl_communicator.h"

#include <algorithm>
#include <cstdlib>

#include "backends/cuda/runtime/cuda_backend.h"
#include "kusari/core/routines.h"
#include "mn/comm/mpi_util.h"
#include "mn/comm/nccl_wait.h"
#include "mn/comm/op_tracker.h"
#include "mn/reduce/nccl_reducer.h"
#include "mn/reduce/reducer.h"

namespace kusari::mn::detail {

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
// Note [NCCL timeout]
// A dead or stuck peer makes an NCCL collective spin forever, and in blocking mode the host
// thread could hang inside an NCCL call. So every NCCL communicator is created non-blocking
// (ncclConfig_t::blocking = 0): each call returns at once, possibly with ncclInProgress, and the
// communicator's state is polled with ncclCommGetAsyncError until it is settled. With a timeout
// (options.timeout_seconds, or KUSARI_MN_TIMEOUT in seconds; 600 by default, the deadline of
// every communicator: Note [Deadline on every collective]) each operation (each chunk of a
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
// the same deadline; the NCCL id's broadcast over MPI has the initialisation's floor too
// (DeadlineFloor), since ranks may still be creating their GPU contexts. The waits also read the MPI
// tracker's control messages: a rank that finished without joining the operation fails it at once
// (Note [A rank that finishes early]), and on a deadline the message names the ranks waited for.
// With timeout_seconds = 0 nothing waits on the host: NCCL's asynchronous errors are still
// checked at the start of each operation. The cost of a timeout is one host wait per operation
// (double buffering waits only when it needs the result).

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

/// The MPI side of a wait on NCCL (Note [Deadline on every collective]): a non-empty message when
/// a rank that finished can never take part in the operation in progress.
std::string finished_rank_error() {
  OpTracker* t = active_tracker();
  return t ? t->blocked_by_finished_rank() : std::string();
}

/// What the other ranks answer when an NCCL wait reaches its deadline after `waited` seconds:
/// "; <the diagnosis naming the ranks waited for>", or nothing outside an operation.
std::string peers_report(double waited) {
  OpTracker* t = active_tracker();
  return t ? concat("; ", t->report_deadline(waited)) : std::string();
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

NcclCommunicator::NcclCommunicator(MPI_Comm comm, const CommunicatorOptions& options,
                                   const char* kind)
    : MpiCommunicator(comm, options, kind) {
  if (options_.allreduce_grad_dtype) {
    KUSARI_CHECK(is_floating(*options_.allreduce_grad_dtype), DtypeError,
                 "create_communicator: allreduce_grad_dtype must be float16, bfloat16, float32 or ",
                 "float64, got ", dtype_name(*options_.allreduce_grad_dtype));
  }
  reducer_ = std::make_unique<NcclReducer>(*this);
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
  reducer_->release();  // (also when no NCCL operation ran: the gradient lists)
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
  {
    // With the deadline (Note [Deadline on every collective]), and its floor for initialisation:
    // the ranks may still be creating their GPU contexts.
    DeadlineFloor floor(active_tracker(), kMinInitTimeoutSeconds);
    bcast_bytes(&msg, sizeof(msg), 0, mpi);
  }
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
                             "); a peer process may have died or not joined",
                             peers_report(w.waited_seconds)));
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
  reducer_->drop_in_flight();
  aborted_ = message + "; its NCCL communicators were aborted";
  // After a deadline or a finished rank the tracker refuses every operation: it quotes this.
  if (OpTracker* t = tracker()) t->amend_failure(aborted_);
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

void NcclCommunicator::destroy_events(ChunkEvents& ev) noexcept {
  for (std::vector<cudaEvent_t>* list : {&ev.packed, &ev.started, &ev.done}) {
    for (cudaEvent_t e : *list) cudaEventDestroy(e);
    list->clear();
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
    probes.failed = [&] {
      std::string e = async_error();
      return e.empty() ? finished_rank_error() : e;
    };
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
                             "); a peer process may have died or not called it",
                             peers_report(w.waited_seconds)));
    }
    warmed_up_ = true;
  }
}

void NcclCommunicator::wait_stream(const char* what) {
  KUSARI_CUDA_CHECK(cudaEventRecord(staged_, stream_));
  WaitProbes probes;
  probes.done = [&] { return event_done(staged_); };
  probes.failed = [&] {
    std::string e = async_error();
    return e.empty() ? finished_rank_error() : e;
  };
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
                           "); a peer process may have died or not called it",
                           peers_report(w.waited_seconds)));
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
  WaitProbes probes;
  probes.done = [&] {
    int flag = 0;
    KUSARI_MPI_CHECK(MPI_Test(request, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  };
  probes.failed = [] { return finished_rank_error(); };
  const WaitResult w = poll_until(probes, timeout_seconds);
  if (w.outcome == WaitOutcome::kFailed) KUSARI_THROW(CommunicatorError, w.error);
  return w.outcome == WaitOutcome::kDone;
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
  reducer_->drop_in_flight();
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
  destroy_events(op_events_);
  // The reducer's events, and its buffers (the gradient buffer with its parameters unbound, the
  // wire buffers) back to the pool: the compute stream already waits for their last use.
  reducer_->release();
  current_started_ = nullptr;
  if (host_buffer_) cudaFreeHost(host_buffer_);
  host_buffer_ = nullptr;
  host_buffer_bytes_ = 0;
  cudaGetLastError();
  device_ = -1;
}


// --- gradients: the reducer's (Note [Gradient reducer]) ------------------------------------------

void NcclCommunicator::multi_node_mean_grad(Link& model, bool zero_fill) {
  OpScope scope(tracker(), OpKind::kCollective, "multi_node_mean_grad");
  reducer_->mean_grad(model, zero_fill);
}
void NcclCommunicator::start_mean_grad(Link& model, bool zero_fill) {
  OpScope scope(tracker(), OpKind::kCollective, "multi_node_mean_grad (start)");
  reducer_->start_mean_grad(model, zero_fill);
}
bool NcclCommunicator::finish_mean_grad(Link& model) { return reducer_->finish_mean_grad(model); }
int NcclCommunicator::mean_grads_in_flight() const { return reducer_->mean_grads_in_flight(); }
void NcclCommunicator::cancel_mean_grads() { reducer_->cancel_mean_grads(); }

// --- parameters and arrays -----------------------------------------------------------------------

void NcclCommunicator::bcast_data(Link& model) {
  OpScope scope(tracker(), OpKind::kCollective, "bcast_data");
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
  const Dtype wire = widest_dtype(dtypes);
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
  OpScope scope(tracker(), OpKind::kCollective, "allreduce");
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
  OpScope scope(tracker(), OpKind::kCollective, what);
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

}  // namespace kusari::mn::detail

#endif  // KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
