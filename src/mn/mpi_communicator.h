// The MPI communicator base shared by every communicator kind, and the CPU (MPI) kinds.
#pragma once

#include <mpi.h>

#include <exception>
#include <optional>
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
  /// The parameters to reduce in sorted path order, with zero_fill applied, checked across ranks
  /// (Note [Gradient sets]). The list is the communicator's own and stays valid until the next
  /// call; copy it to keep it longer.
  NamedParams& gradients_to_reduce(Link& model, bool zero_fill);
  /// This rank's own checks of the gradients to reduce, beyond Note [Gradient sets] (NCCL: all
  /// on one GPU). gradients_to_reduce runs them before the check across ranks, so that what they
  /// raise on one rank is raised on every rank (Note [A failure on one rank]); not run while the
  /// gradients are in place, as nothing they look at has changed.
  virtual void check_gradients_here(const NamedParams& params) { (void)params; }
  /// The settings that decide how this communicator lays out and sends gradients, e.g.
  /// "gradients_in_buffer on, allreduce_grad_dtype unset"; every rank must have the same (they
  /// are part of the check of Note [Gradient sets]). Kinds with more such settings append theirs.
  virtual std::string gradient_settings() const;
  /// True when the last gradients_to_reduce found every gradient still in its segment of
  /// gradient_buffer(), as the last reduction left it (GradientBuffer::in_place): the layout,
  /// dtype and device of the buffer hold, and the reduction need not look at the arrays.
  bool gradients_in_place() const { return in_place_; }
  /// In debug mode, raises "parameters diverged" when a reduced gradient is not finite.
  void check_finite_after_reduce(const std::vector<std::pair<std::string, Parameter>>& params);
  bool debug() const { return debug_; }
  /// "flat" and "dummy": when options().gradients_in_buffer and the gradients allow it (one
  /// floating dtype, on the CPU, not cast), makes the gradients of `params` views of
  /// gradient_buffer() and, with `communicate`, replaces them by their mean with one in-place MPI
  /// allreduce; returns false (releasing the buffer) when the packed path must run instead. See
  /// Note [Gradients in the reduction buffer] in gradient_buffer.cc.
  bool host_mean_grad_in_buffer(const NamedParams& params, bool communicate);
  /// The dtype of the gradient buffer for `params` on `device` when their gradients can live in
  /// one (options().gradients_in_buffer, one floating dtype there, not cast on the wire); else
  /// nullopt, with the buffer released (its parameters unbound), so that the packed path runs.
  std::optional<Dtype> buffer_dtype(const NamedParams& params, Device device);
  /// The flat buffer the gradients live in (Note [Gradients in the reduction buffer]).
  GradientBuffer& gradient_buffer() { return gradient_buffer_; }

 private:
  GradientBuffer gradient_buffer_;
  /// gradients_to_reduce's lists, kept while the model lists the same parameters: the model's
  /// parameters (their states, in traversal order) the sorted list was made from, that list, and
  /// the list of those with a gradient it last handed out (with its mask over the sorted list).
  std::vector<const void*> walk_, walk_key_;
  NamedParams all_params_, reduce_list_;
  std::vector<char> mask_, reduce_mask_;
  /// What the check across ranks compares for reduce_list_ (Note [Gradient sets]).
  struct Checked {
    int64_t count = 0, elements = 0, hash = 0;
    bool valid = false;
  };
  /// Applies zero_fill to all_params_, makes reduce_list_ those with a gradient, and returns what
  /// the check compares for it.
  Checked check_gradients(bool zero_fill);
  Checked checked_;
  /// Every rank's part when some rank's `failure` joined the check: raises that rank's error on
  /// it and a CommunicatorError quoting it on the others (Note [A failure on one rank]).
  [[noreturn]] void raise_failure_of_a_rank(std::exception_ptr failure, const char* what);
  bool in_place_ = false;
  /// A hash of gradient_settings(), made at the first check.
  std::optional<uint64_t> settings_hash_;
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

/// The line where `other` first differs from `ref` (both one item per line): its index and the
/// two lines, "(nothing)" past an end; nullopt when they are equal.
struct LineDifference {
  int line = 0;
  std::string ref, other;
};
std::optional<LineDifference> first_line_difference(const std::string& ref,
                                                    const std::string& other);

/// Checks that every rank gives `what` the same parameters: paths, shapes and dtypes in order
/// and, with `device_kind`, whether each is on the CPU or a GPU, plus the line `extra` (how this
/// rank will send them). One small allreduce when they agree; otherwise every rank raises a
/// CommunicatorError naming the first difference and the ranks (Note [Same model]).
void check_same_parameters(Communicator& comm, const NamedParams& params, const char* what,
                           bool device_kind, const std::string& extra = "");

/// Copies rank 0's `params` to every rank through MPI, one parameter after another.
void bcast_parameters_over_mpi(Communicator& comm, const NamedParams& params);

/// Packs the gradients of `params` into one contiguous buffer of `dtype` on `device`
/// (casting while packing) and unpacks it back, scaled.
Array pack_gradients(const std::vector<std::pair<std::string, Parameter>>& params, Dtype dtype, Device device);
void unpack_gradients(const Array& buffer, const std::vector<std::pair<std::string, Parameter>>& params, double scale);

}  // namespace kusari::mn::detail
