// The NCCL communicators: a base that owns the NCCL communicators, the communication stream,
// the wire buffers and the timeout, and the five kinds (pure_nccl, non_cuda_aware, hierarchical,
// two_dimensional, single_node). Only compiled with CUDA and NCCL.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mn/mean_grad_pipeline.h"
#include "mn/mpi_communicator.h"
#include "mn/nccl_pack.h"

namespace kusari::mn::detail {

/// The NCCL datatype of a kusari dtype (bool travels as uint8).
ncclDataType_t nccl_datatype(Dtype dtype);
/// The NCCL reduction for `op` on `dtype` (kMean is a sum; the caller scales).
ncclRedOp_t nccl_op(ReduceOp op, Dtype dtype);
/// True when this NCCL has ncclAvg (2.10 and later).
bool nccl_has_avg();

/// The base of the NCCL communicators. MPI (inherited) still carries the object collectives,
/// the topology and the gradient agreement check; gradients and bcast_data go through NCCL on a
/// communication stream of their own. See Note [NCCL communicators], Note [Communication stream],
/// Note [Gradient pipeline] and Note [NCCL timeout] in nccl_communicator.cc.
class NcclCommunicator : public MpiCommunicator, public MeanGradPipeline {
 public:
  NcclCommunicator(MPI_Comm comm, const CommunicatorOptions& options);
  ~NcclCommunicator() override;

  void bcast_data(Link& model) override;
  void multi_node_mean_grad(Link& model, bool zero_fill) override;
  /// GPU arrays (contiguous, on this communicator's GPU) are reduced through NCCL; others go
  /// through MPI as in every communicator.
  void allreduce_inplace(Array& x, ReduceOp op) override;
  void finalize() override;
  /// The base settings and the gradient chunk size (KUSARI_MN_CHUNK_BYTES), which decides
  /// between the buffer and the pipeline.
  std::string gradient_settings() const override;

  void start_mean_grad(Link& model, bool zero_fill) override;
  bool finish_mean_grad(Link& model) override;
  int mean_grads_in_flight() const override { return static_cast<int>(in_flight_.size()); }
  void cancel_mean_grads() override;

  /// The GPU this communicator drives (-1 until its first NCCL operation picks it).
  int device() const { return device_; }
  /// The communication stream (null until the first NCCL operation).
  cudaStream_t stream() const { return stream_; }
  /// The chunk-size setting of the gradient pipeline (KUSARI_MN_CHUNK_BYTES, read when the
  /// communicator is made): bytes, kChunkBytesAuto or kChunkBytesOff.
  int64_t chunk_bytes() const { return chunk_bytes_; }
  /// Chunks of the last gradient reduction (multi_node_mean_grad or start_mean_grad; 0 before).
  int last_gradient_chunks() const { return last_gradient_chunks_; }
  /// The in-place sum of `x` (contiguous, on this communicator's GPU, a multiple of the kind's
  /// padding) in `pieces` equal back-to-back reductions queued at once on the NCCL stream, as the
  /// gradient pipeline queues its chunks but without packing: a benchmark of what cutting a
  /// buffer costs NCCL by itself.
  void allreduce_in_pieces(Array& x, int pieces);

 protected:
  /// Creates the NCCL communicators this kind needs; called once on every rank, with the GPU
  /// already current, by the first NCCL operation.
  virtual void init_nccl() = 0;
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
  /// The events of one (possibly pipelined) operation, per chunk k: `packed[k]` (compute stream:
  /// the chunk is ready), `started[k]` (NCCL stream: its collectives begin; recorded only with a
  /// timeout, for the deadline clock) and `done[k]` (NCCL stream: its collectives ended). Created
  /// on demand; reused by the next operation of the same kind.
  struct ChunkEvents {
    std::vector<cudaEvent_t> packed, started, done;
  };
  /// One double-buffering reduction in flight.
  struct InFlight {
    int slot = 0;
    std::vector<std::pair<std::string, Parameter>> params;
    ChunkPlan plan;
    double scale = 1.0;
  };

  /// Picks the GPU and creates the stream, events and NCCL communicators on the first call;
  /// checks that later calls use the same GPU. Throws when the communicator was aborted.
  void ensure_nccl(Device device, const char* what);
  /// Makes `ev` hold events for at least `count` chunks.
  void ensure_events(ChunkEvents& ev, int count);
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
  /// Makes the compute stream wait for everything queued on stream() so far (never throws): the
  /// last step before memory used there may be released or reused after a failure.
  void compute_waits_for_stream() noexcept;
  /// nccl_check with an explicit deadline.
  void nccl_check_within(ncclResult_t result, ncclComm_t comm, const char* call, const char* what,
                         double timeout_seconds);
  /// With a timeout: waits on the host until `ev.done[k]` has passed, for each chunk k < count in
  /// turn, each with its own deadline counted from its `started` event, watching NCCL's
  /// asynchronous errors; aborts and throws on a failure or when a deadline passes.
  void wait_chunks(const ChunkEvents& ev, int count, const char* what);
  void wait_op(const ChunkEvents& ev, const char* what) { wait_chunks(ev, 1, what); }
  /// The deadline of an operation: options().timeout_seconds, but at least the initialisation
  /// deadline until one operation has completed (the first one also connects the peers).
  double op_timeout() const;
  /// Aborts every NCCL communicator of this kind and throws CommunicatorError with `message`.
  [[noreturn]] void abort_and_throw(const std::string& message);
  /// A non-empty message when an NCCL communicator reported an asynchronous error.
  std::string async_error();
  /// Checks that the gradients are on one GPU, before the check across ranks, and remembers it
  /// in gradients_device_.
  void check_gradients_here(const NamedParams& params) override;
  /// The GPU of the gradients gradients_to_reduce last handed out (checked there, or unchanged
  /// since: in place).
  Device gradients_device_ = Device::cpu();
  /// Prepares the gradient pipeline for `params`: plans the chunks of the padded wire buffer,
  /// prepares grad_packer_ for them, grows `buffer` to hold them and queues the zeroing of the
  /// pad on the compute stream.
  ChunkPlan prepare_gradients(const std::vector<std::pair<std::string, Parameter>>& params,
                              Array& buffer);
  /// Queues the pipelined reduction of the gradients prepared in grad_packer_: per chunk, the
  /// pack (compute stream), the collectives (kMean, NCCL stream) and, with `unpack`, the
  /// unpack times `scale` (compute stream, after the chunk's collectives). See
  /// Note [Gradient pipeline].
  void queue_gradient_pipeline(const ChunkPlan& plan, Array& buffer, ChunkEvents& ev, bool unpack,
                               double scale, const char* what);
  /// The wire dtype for gradients of these dtypes.
  Dtype wire_dtype(const std::vector<std::pair<std::string, Parameter>>& params) const;
  /// When options().gradients_in_buffer and the gradients allow it (one floating dtype, not cast,
  /// one chunk), makes the gradients of `params` views of gradient_buffer() and queues their mean
  /// as one in-place reduction of it; returns false (releasing the buffer) when the packed path
  /// must run instead. See Note [Gradients in the reduction buffer] in gradient_buffer.cc.
  bool mean_grad_in_buffer(const std::vector<std::pair<std::string, Parameter>>& params,
                           const char* what);
  /// Queues the mean of the gradient buffer `flat` in place (one collective on the side stream,
  /// which the compute stream then waits for), and waits for it under the timeout.
  void reduce_gradient_buffer(Array flat, const char* what);
  /// world_, intra_ and inter_ (aborted together on a failure).
  std::array<ncclComm_t*, 3> nccl_comms() { return {&world_, &intra_, &inter_}; }
  /// Releases the NCCL communicators (finalize + destroy, bounded by the deadline; abort on
  /// failure).
  void release_nccl() noexcept;

  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t staged_ = nullptr;   // wait_stream's event
  cudaEvent_t drained_ = nullptr;  // compute_waits_for_stream's event
  ChunkEvents op_events_;          // bcast_data and allreduce (one chunk)
  ChunkEvents grad_events_;        // multi_node_mean_grad
  std::array<ChunkEvents, 2> slot_events_;
  std::string aborted_;     // why the communicator was aborted (empty while healthy)
  bool warmed_up_ = false;  // an operation has completed (NCCL connects lazily on the first)
  cudaEvent_t current_started_ = nullptr;  // the started event of the chunk in progress, if any
  int64_t chunk_bytes_ = kChunkBytesAuto;
  int last_gradient_chunks_ = 0;

  BatchedPacker grad_packer_;
  BatchedPacker data_packer_;
  /// Copies gradients that are not in their segments of gradient_buffer() yet.
  BatchedPacker adopt_packer_;
  Array grad_buffer_;
  std::array<Array, 2> slot_buffers_;
  std::deque<InFlight> in_flight_;
  int next_slot_ = 0;

  void* host_buffer_ = nullptr;
  size_t host_buffer_bytes_ = 0;
};

/// "pure_nccl": one NCCL allreduce over all ranks.
class PureNcclCommunicator : public NcclCommunicator {
 public:
  using NcclCommunicator::NcclCommunicator;
  const char* name() const override { return "pure_nccl"; }
  std::shared_ptr<Communicator> split(int color, int key) override;

 protected:
  void init_nccl() override;
  void reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op, const char* what) override;
  void bcast_buffer(void* buffer, int64_t n, Dtype dtype, const char* what) override;
};

/// "single_node": pure_nccl that refuses a job spanning more than one host.
class SingleNodeCommunicator : public PureNcclCommunicator {
 public:
  SingleNodeCommunicator(MPI_Comm comm, const CommunicatorOptions& options);
  const char* name() const override { return "single_node"; }
  std::shared_ptr<Communicator> split(int color, int key) override;
};

/// "hierarchical": NCCL reduce within each host, NCCL allreduce among the hosts' first
/// processes, NCCL broadcast within each host.
class HierarchicalCommunicator : public NcclCommunicator {
 public:
  HierarchicalCommunicator(MPI_Comm comm, const CommunicatorOptions& options);
  const char* name() const override { return "hierarchical"; }
  std::shared_ptr<Communicator> split(int color, int key) override;

 protected:
  void init_nccl() override;
  void reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op, const char* what) override;
  void bcast_buffer(void* buffer, int64_t n, Dtype dtype, const char* what) override;
  /// The mean of the hosts' means is the mean only when every host runs as many processes.
  bool averages_on_wire(Dtype dtype) const override;

 private:
  bool even_hosts_ = false;
};

/// "two_dimensional": NCCL reduce-scatter within each host, NCCL allreduce of each chunk across
/// the hosts, NCCL all-gather within each host.
class TwoDimensionalCommunicator : public NcclCommunicator {
 public:
  TwoDimensionalCommunicator(MPI_Comm comm, const CommunicatorOptions& options);
  const char* name() const override { return "two_dimensional"; }
  std::shared_ptr<Communicator> split(int color, int key) override;

 protected:
  void init_nccl() override;
  void reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op, const char* what) override;
  void bcast_buffer(void* buffer, int64_t n, Dtype dtype, const char* what) override;
  int64_t buffer_multiple() const override;
};

/// "non_cuda_aware": NCCL reduce within each host, the hosts' first processes copy the sum to
/// pinned host memory and MPI-allreduce it, copy it back, NCCL broadcast within each host.
class NonCudaAwareCommunicator : public NcclCommunicator {
 public:
  using NcclCommunicator::NcclCommunicator;
  const char* name() const override { return "non_cuda_aware"; }
  std::shared_ptr<Communicator> split(int color, int key) override;

 protected:
  void init_nccl() override;
  void reduce_buffer(void* buffer, int64_t n, Dtype dtype, ReduceOp op, const char* what) override;
  void bcast_buffer(void* buffer, int64_t n, Dtype dtype, const char* what) override;
  /// The MPI step sums: kMean is always a sum here.
  bool averages_on_wire(Dtype dtype) const override { return false; }
  /// The hosts' first processes wait for the intra-host reduce before their MPI step.
  bool reduce_waits_on_host() const override { return intra_rank_ == 0 && inter_size_ > 1; }
};

/// Creates the NCCL communicator `name` over `comm` (called by create_communicator).
std::shared_ptr<Communicator> create_nccl_communicator(const std::string& name, MPI_Comm comm,
                                                       const CommunicatorOptions& options);

}  // namespace kusari::mn::detail
