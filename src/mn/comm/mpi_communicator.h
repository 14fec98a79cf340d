// The MPI communicator base shared by every communicator kind (the topology, the MPI
// communicators), and the CPU (MPI) kinds: naive, flat, dummy. Transport only: the gradients
// are the reducer's (Note [Gradient reducer] in mn/reduce/reducer.h).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "kusari/mn/communicator.h"
#include "mn/comm/op_tracker.h"
#include "mn/reduce/host_reducer.h"

namespace kusari::mn::detail {

/// Owns an MPI communicator (a duplicate of the one given) and its intra-host and inter-host
/// sub-communicators, derives the topology (Note [Topology]), and keeps the deadline's tracker of
/// its operations (Note [Deadline on every collective]).
class MpiCommunicator : public Communicator {
 public:
  /// `kind` ("naive", "pure_nccl", ...: a string that outlives the communicator) names it in the
  /// deadline's messages, which may come while it is being constructed, before name() can be
  /// called.
  MpiCommunicator(MPI_Comm comm, const CommunicatorOptions& options, const char* kind);
  ~MpiCommunicator() override;

  intptr_t mpi_comm_handle() const override;
  void finalize() override;
  MPI_Comm comm() const { return comm_; }
  MPI_Comm intra_comm() const { return intra_comm_; }
  MPI_Comm inter_comm() const { return inter_comm_; }
  /// Debug mode (options().debug or KUSARI_MN_DEBUG=1): the reducers compare every gradient's
  /// path, shape and dtype across ranks and check the results for NaN and infinity.
  bool debug() const { return debug_; }
  /// The tracker of this communicator's operations (null after finalize).
  OpTracker* tracker() const { return tracker_.get(); }

 private:
  /// Frees the MPI communicators, or (after a failure, when an operation may still be under way
  /// in them) forgets them without freeing.
  void release_mpi() noexcept;

  std::shared_ptr<OpTracker> tracker_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm intra_comm_ = MPI_COMM_NULL;
  MPI_Comm inter_comm_ = MPI_COMM_NULL;
  bool debug_ = false;
};

/// "naive" (one MPI allreduce per parameter), "flat" (all gradients in one buffer, one MPI
/// allreduce) and "dummy" (moves the gradients like "flat" but does not communicate): the MPI
/// transport with a HostReducer of the matching strategy.
class HostCommunicator : public MpiCommunicator {
 public:
  /// `name`: "naive", "flat" or "dummy".
  HostCommunicator(MPI_Comm comm, const CommunicatorOptions& options, const char* name);
  ~HostCommunicator() override;
  const char* name() const override { return name_; }
  void multi_node_mean_grad(Link& model, bool zero_fill) override;
  std::shared_ptr<Communicator> split(int color, int key) override;
  void finalize() override;

 private:
  const char* name_;
  HostReducer reducer_;
};

/// Copies rank 0's `params` to every rank through MPI, one parameter after another.
void bcast_parameters_over_mpi(Communicator& comm, const NamedParams& params);

}  // namespace kusari::mn::detail
