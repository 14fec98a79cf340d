// The five NCCL kinds, each a thin configuration of the NCCL transport (nccl_communicator.h):
// which NCCL communicators it makes and which collectives reduce and broadcast a buffer. See
// Note [NCCL communicators] in nccl_kinds.cc. Only compiled with CUDA and NCCL.
#pragma once

#include <memory>

#include "mn/comm/nccl_communicator.h"

namespace kusari::mn::detail {

/// "pure_nccl": one NCCL allreduce over all ranks.
class PureNcclCommunicator : public NcclCommunicator {
 public:
  PureNcclCommunicator(MPI_Comm comm, const CommunicatorOptions& options,
                       const char* kind = "pure_nccl")
      : NcclCommunicator(comm, options, kind) {}
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
  NonCudaAwareCommunicator(MPI_Comm comm, const CommunicatorOptions& options)
      : NcclCommunicator(comm, options, "non_cuda_aware") {}
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

}  // namespace kusari::mn::detail
