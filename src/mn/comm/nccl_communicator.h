// The NCCL transport: the NCCL communicators, the communication stream and its events, the
// timeout and abort, the host staging, and the collectives on buffers that the five kinds
// (nccl_kinds.h) configure. The gradients are the NcclReducer's (Note [Gradient reducer] in
// mn/reduce/reducer.h). Only compiled with CUDA and NCCL.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mn/comm/mpi_communicator.h"
#include "mn/reduce/batched_pack.h"
#include "mn/reduce/mean_grad_pipeline.h"

namespace kusari::mn::detail {

class NcclReducer;

/// The NCCL datatype of a kusari dtype (bool travels as uint8).
ncclDataType_t nccl_datatype(Dtype dtype);
/// The NCCL reduction for `op` on `dtype` (kMean is a sum; the caller scales).
ncclRedOp_t nccl_op(ReduceOp op, Dtype dtype);
/// True when this NCCL has ncclAvg (2.10 and later).
bool nccl_has_avg();

/// The base of the NCCL communicators. MPI (inherited) still carries the object collectives
/// and the topology; bcast_data, GPU allreduces and (through the NcclReducer it owns) the
/// gradients go through NCCL on a communication stream of their own. See Note [NCCL
/// communicators] in nccl_kinds.cc, Note [Communication stream] and Note [NCCL timeout] in
/// nccl_communicator.cc.
class NcclCommunicator : public MpiCommunicator, public MeanGradPipeline {
 public:
  /// `kind`: the kind's name (see MpiCommunicator).
  NcclCommunicator(MPI_Comm comm, const CommunicatorOptions& options, const char* kind);
  ~NcclCommunicator() override;

  void bcast_data(Link& model) override;
  /// NcclReducer::mean_grad.
  void multi_node_mean_grad(Link& model, bool zero_fill) override;
  /// GPU arrays (contiguous, on this communicator's GPU) are reduced through NCCL; others go
  /// through MPI as in every communicator.
  void allreduce_inplace(Array& x, ReduceOp op) override;
  void finalize() override;

  /// Double buffering (Note [Double buffering]): the NcclReducer's.
  void start_mean_grad(Link& model, bool zero_fill) override;
  bool finish_mean_grad(Link& model) override;
  int mean_grads_in_flight() const override;
  void cancel_mean_grads() override;
  /// The reducer of this communicator's gradients.
  NcclReducer& reducer() { return *reducer_; }
  const NcclReducer& reducer() const { return *reducer_; }

  /// The in-place sum of `x` (contiguous, on this communicator's GPU, a multiple of the kind's
  /// padding) in `pieces` equal back-to-back reductions queued at once on the NCCL stream, as the
  /// gradient pipeline queues its chunks but without packing: a benchmark of what cutting a
  /// buffer costs NCCL by itself.
  void allreduce_in_pieces(Array& x, int pieces);

  // --- the transport's interface to the reducer ---------------------------------------------
  /// The GPU this communicator drives (-1 until its first NCCL operation picks it).
  int device() const { return device_; }
  /// The communication stream (null until the first NCCL operation).
  cudaStream_t stream() const { return stream_; }
  /// Picks the GPU and creates the stream, events and NCCL communicators on the first call;
  /// checks that later calls use the same GPU. Throws when the communicator was aborted.
  void ensure_nccl(Device device, const char* what);

  /// Queues on stream() the in-place reduction (`op`: kSum, kMax, kMin or kMean) of `n` elements
  /// of `dtype` at `buffer` over every rank, so that every rank ends with the result. kMean gives
  /// the mean when averages_on_wire(dtype), else the sum (the caller scales by 1/size). `what`
  /// names the operation in errors.
  virtual void reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op,
                             const char* what) = 0;
  /// True when reduce_buffer's kMean of `dtype` is the mean itself (ncclAvg in the collectives).
  /// The base: floating dtypes, when NCCL has ncclAvg.
  virtual bool averages_on_wire(Dtype dtype) const;
  /// True when reduce_buffer waits on the host for the GPU (non_cuda_aware's MPI step): the
  /// gradient pipeline then queues every pack before the first collective.
  virtual bool reduce_waits_on_host() const { return false; }
  /// Queues on stream() the broadcast of `n` elements of `dtype` at `buffer` from rank 0.
  virtual void bcast_buffer(void* buffer, int64_t n, Dtype dtype, const char* what) = 0;
  /// The wire buffer is padded to a multiple of this many elements.
  virtual int64_t buffer_multiple() const { return 1; }

  /// The events of one (possibly pipelined) operation, per chunk k: `packed[k]` (compute stream:
  /// the chunk is ready), `started[k]` (NCCL stream: its collectives begin; recorded only with a
  /// timeout, for the deadline clock) and `done[k]` (NCCL stream: its collectives ended). Created
  /// on demand; reused by the next operation of the same kind. The owner destroys them with
  /// destroy_events.
  struct ChunkEvents {
    std::vector<cudaEvent_t> packed, started, done;
  };
  /// Makes `ev` hold events for at least `count` chunks.
  void ensure_events(ChunkEvents& ev, int count);
  /// Destroys the events of `ev` (never throws).
  static void destroy_events(ChunkEvents& ev) noexcept;
  /// Records `ev.packed[k]` on the compute stream (after the work queued there so far).
  void mark_packed(ChunkEvents& ev, int k);
  /// Makes stream() wait for `ev.packed[k]`, and (with a timeout) records `ev.started[k]` there.
  void begin_chunk(ChunkEvents& ev, int k);
  /// Records `ev.done[k]` on stream() and, with `compute_waits`, makes the compute stream wait
  /// for it.
  void end_chunk(ChunkEvents& ev, int k, bool compute_waits);
  /// One operation of one chunk: mark_packed + begin_chunk, and end_chunk.
  void begin_op(ChunkEvents& ev) {
    mark_packed(ev, 0);
    begin_chunk(ev, 0);
  }
  void end_op(ChunkEvents& ev, bool compute_waits = true) { end_chunk(ev, 0, compute_waits); }
  /// With a timeout: waits on the host until `ev.done[k]` has passed, for each chunk k < count in
  /// turn, each with its own deadline counted from its `started` event, watching NCCL's
  /// asynchronous errors; aborts and throws on a failure or when a deadline passes.
  void wait_chunks(const ChunkEvents& ev, int count, const char* what);
  void wait_op(const ChunkEvents& ev, const char* what) { wait_chunks(ev, 1, what); }

 protected:
  /// Creates the NCCL communicators this kind needs; called once on every rank, with the GPU
  /// already current, by the first NCCL operation.
  virtual void init_nccl() = 0;

  // --- for the kinds -------------------------------------------------------------------------
  /// Creates an NCCL communicator over the ranks of `mpi` into `*out` (one of world_, intra_,
  /// inter_; the unique id made by rank 0 of `mpi` and broadcast over it), or leaves it null
  /// when `mpi` has one rank. `what` names it in errors.
  void create_nccl_comm(MPI_Comm mpi, ncclComm_t* out, const char* what);
  /// The NCCL reduction reduce_buffer uses for `op` on `dtype`: ncclAvg for kMean when
  /// averages_on_wire(dtype), else nccl_op.
  ncclRedOp_t wire_op(ReduceOp op, Dtype dtype) const;
  /// Checks the result of an NCCL call on `comm`; in non-blocking mode waits (with the deadline)
  /// until the call has been enqueued. On failure aborts and throws CommunicatorError naming
  /// `call` and the operation `what`.
  void nccl_check(ncclResult_t result, ncclComm_t comm, const char* call, const char* what);
  /// MPI allreduce / broadcast of host memory among `mpi`'s ranks, bounded by the deadline
  /// (non_cuda_aware's host step).
  void host_allreduce(void* data, int64_t n, Dtype dtype, ReduceOp op, MPI_Comm mpi,
                      const char* what);
  void host_bcast(void* data, int64_t bytes, MPI_Comm mpi, const char* what);
  /// Waits on the host until everything queued on stream() so far has run (non_cuda_aware
  /// before its MPI step), with the deadline.
  void wait_stream(const char* what);
  /// Pinned host memory of at least `bytes` (grown on demand, kept).
  void* host_buffer(size_t bytes);

  /// The NCCL communicators a kind may create (null when not needed or of one rank): over all
  /// ranks, within this host, and among the processes of this host's position on every host.
  ncclComm_t world_ = nullptr;
  ncclComm_t intra_ = nullptr;
  ncclComm_t inter_ = nullptr;

 private:
  /// Makes the compute stream wait for everything queued on stream() so far (never throws): the
  /// last step before memory used there may be released or reused after a failure.
  void compute_waits_for_stream() noexcept;
  /// nccl_check with an explicit deadline.
  void nccl_check_within(ncclResult_t result, ncclComm_t comm, const char* call, const char* what,
                         double timeout_seconds);
  /// The deadline of an operation: options().timeout_seconds, but at least the initialisation
  /// deadline until one operation has completed (the first one also connects the peers).
  double op_timeout() const;
  /// Aborts every NCCL communicator of this kind, drops the reducer's reductions in flight, and
  /// throws CommunicatorError with `message`.
  [[noreturn]] void abort_and_throw(const std::string& message);
  /// A non-empty message when an NCCL communicator reported an asynchronous error.
  std::string async_error();
  /// world_, intra_ and inter_ (aborted together on a failure).
  std::array<ncclComm_t*, 3> nccl_comms() { return {&world_, &intra_, &inter_}; }
  /// Releases the NCCL communicators (finalize + destroy, bounded by the deadline; abort on
  /// failure), the stream and this transport's events and buffers, then the reducer's.
  void release_nccl() noexcept;

  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t staged_ = nullptr;   // wait_stream's event
  cudaEvent_t drained_ = nullptr;  // compute_waits_for_stream's event
  ChunkEvents op_events_;          // bcast_data and allreduce (one chunk)
  std::string aborted_;     // why the communicator was aborted (empty while healthy)
  bool warmed_up_ = false;  // an operation has completed (NCCL connects lazily on the first)
  cudaEvent_t current_started_ = nullptr;  // the started event of the chunk in progress, if any

  BatchedPacker data_packer_;  // bcast_data's

  void* host_buffer_ = nullptr;
  size_t host_buffer_bytes_ = 0;

  std::unique_ptr<NcclReducer> reducer_;
};

/// Creates the NCCL communicator `name` over `comm` (called by create_communicator; nccl_kinds.cc).
std::shared_ptr<Communicator> create_nccl_communicator(const std::string& name, MPI_Comm comm,
                                                       const CommunicatorOptions& options);

}  // namespace kusari::mn::detail
