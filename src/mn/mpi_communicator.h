// The MPI communicator base shared by every communicator kind, and the CPU (MPI) kinds.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

#include "kusari/mn/communicator.h"
#include "mn/gradient_buffer.h"

namespace kusari::mn::detail {

/// Owns an MPI communicator (a duplicate of the one given) and its intra-host and inter-host
/// sub-communicators, and derives the topology. See Note [Topology].
class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, const CommunicatorOptions& options);
  ~MpiCommunicator() override;

  intptr_t mpi_comm_handle() const override;
  void finalize() override;
  MPI_Comm comm() const { return comm_; }
  MPI_Comm intra_comm() const { return intra_comm_; }
  MPI_Comm inter_comm() const { return inter_comm_; }

 protected:
  /// The parameters to reduce in sorted path order, with zero_fill applied; checks them across
  /// ranks in debug mode. See Note [Gradient sets].
  std::vector<std::pair<std::string, Parameter>> gradients_to_reduce(Link& model, bool zero_fill);
  /// In debug mode, raises "parameters diverged" when a reduced gradient is not finite.
  void check_finite_after_reduce(const std::vector<std::pair<std::string, Parameter>>& params);
  bool debug() const { return debug_; }
  /// "flat" and "dummy": when options().gradients_in_buffer and the gradients allow it (one
  /// floating dtype, on the CPU, not cast), makes the gradients of `params` views of
  /// gradient_buffer() and, with `communicate`, replaces them by their mean with one in-place MPI
  /// allreduce; returns false (releasing the buffer) when the packed path must run instead. See
  /// Note [Gradients in the reduction buffer] in gradient_buffer.cc.
  bool host_mean_grad_in_buffer(const NamedParams& params, bool communicate);
  /// The flat buffer the gradients live in (Note [Gradients in the reduction buffer]).
  GradientBuffer& gradient_buffer() { return gradient_buffer_; }

 private:
  GradientBuffer gradient_buffer_;
  /// gradients_to_reduce's sorted order of the model's parameter list, and the list it is for
  /// (each parameter's state and path; the state pointer alone could be reused by a new one).
  std::vector<size_t> order_;
  std::vector<std::pair<const void*, std::string>> order_key_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm intra_comm_ = MPI_COMM_NULL;
  MPI_Comm inter_comm_ = MPI_COMM_NULL;
  bool debug_ = false;
};

/// "naive": one MPI allreduce per parameter.
class NaiveCommunicator : public MpiCommunicator {
 public:
  using MpiCommunicator::MpiCommunicator;
  const char* name() const override { return "naive"; }
  void multi_node_mean_grad(Link& model, bool zero_fill) override;
  std::shared_ptr<Communicator> split(int color, int key) override;
};

/// "flat": all gradients in one buffer (kept there, or packed into it and unpacked: Note [Gradients
/// in the reduction buffer]), one MPI allreduce, scaled by 1/size.
class FlatCommunicator : public MpiCommunicator {
 public:
  using MpiCommunicator::MpiCommunicator;
  const char* name() const override { return "flat"; }
  void multi_node_mean_grad(Link& model, bool zero_fill) override;
  std::shared_ptr<Communicator> split(int color, int key) override;
};

/// "dummy": moves the gradients like "flat" (packs and unpacks, or keeps them in its buffer) but
/// does not communicate (measures that cost).
class DummyCommunicator : public MpiCommunicator {
 public:
  using MpiCommunicator::MpiCommunicator;
  const char* name() const override { return "dummy"; }
  void multi_node_mean_grad(Link& model, bool zero_fill) override;
  std::shared_ptr<Communicator> split(int color, int key) override;
};

/// Packs the gradients of `params` into one contiguous buffer of `dtype` on `device`
/// (casting while packing) and unpacks it back, scaled.
Array pack_gradients(const std::vector<std::pair<std::string, Parameter>>& params, Dtype dtype, Device device);
void unpack_gradients(const Array& buffer, const std::vector<std::pair<std::string, Parameter>>& params, double scale);

}  // namespace kusari::mn::detail
