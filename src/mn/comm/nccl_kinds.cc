#include "kusari/config.h"

#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL

#include "mn/comm/nccl_kinds.h"

#include <cstdlib>

#include "backends/cuda/runtime/cuda_backend.h"
#include "mn/comm/mpi_util.h"

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
// float32 (float64 for float64) while unpacking (Note [Gradient pipeline] in mn/reduce/nccl_reducer.cc).
// Each kind is a configuration of the transport (nccl_communicator.cc): which NCCL
// communicators init_nccl makes, and which collectives reduce_buffer and bcast_buffer queue; the
// gradients are the reducer's (Note [Gradient reducer] in mn/reduce/reducer.h).

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
    : PureNcclCommunicator(comm, options, "single_node") {
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
    : NcclCommunicator(comm, options, "hierarchical") {
  OpScope scope(tracker(), OpKind::kCollective, "create_communicator (host sizes)");
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
    : NcclCommunicator(comm, options, "two_dimensional") {
  OpScope scope(tracker(), OpKind::kCollective, "create_communicator (host sizes)");
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
  OpTracker* t = self.tracker();
  KUSARI_CHECK(t != nullptr, CommunicatorError, self.name(), ": split: the communicator was finalized");
  OpScope scope(t, OpKind::kCollective, "split");
  MPI_Comm sub;
  {
    // MPI_Comm_split has no non-blocking form (Note [Blocking calls]).
    BlockingCallWatch watch(self.options().timeout_seconds, t->blocking_call_message("MPI_Comm_split"));
    KUSARI_MPI_CHECK(MPI_Comm_split(self.comm(), color, key, &sub));
  }
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
