// The gradient reducer of the MPI communicators (naive, flat, dummy): gradients on the host,
// reduced by MPI. See Note [Gradient reducer] in reducer.h.
#pragma once

#include "kusari/mn/communicator.h"
#include "mn/reduce/gradient_buffer.h"
#include "mn/reduce/gradient_set.h"

namespace kusari::mn::detail {

class MpiCommunicator;

/// How a HostReducer moves the gradients.
enum class HostStrategy {
  /// One MPI allreduce per parameter ("naive").
  kPerParameter,
  /// All gradients in one buffer (kept there, or packed into it and unpacked: Note [Gradients in
  /// the reduction buffer]), one MPI allreduce, scaled by 1/size ("flat").
  kOneBuffer,
  /// Like kOneBuffer but without the allreduce: measures the cost of moving them ("dummy").
  kMoveOnly,
};

class HostReducer {
 public:
  HostReducer(MpiCommunicator& comm, HostStrategy strategy);

  /// Replaces the gradients of `model` by their mean over the ranks (multi_node_mean_grad).
  void mean_grad(Link& model, bool zero_fill);
  /// Forgets the gradients and releases the buffer (finalize).
  void release();

 private:
  /// kOneBuffer and kMoveOnly: when options().gradients_in_buffer and the gradients allow it (one
  /// floating dtype, on the CPU, not cast), makes the gradients of `params` views of buffer_
  /// and, with `communicate`, replaces them by their mean with one in-place MPI allreduce;
  /// returns false (releasing the buffer) when the packed path must run instead.
  bool mean_grad_in_buffer(const NamedParams& params, bool communicate);

  MpiCommunicator& comm_;
  HostStrategy strategy_;
  GradientBuffer buffer_;
  GradientSet set_;
};

/// Packs the gradients of `params` into one contiguous buffer of `dtype` on `device`
/// (casting while packing) and unpacks it back, scaled.
Array pack_gradients(const NamedParams& params, Dtype dtype, Device device);
void unpack_gradients(const Array& buffer, const NamedParams& params, double scale);

}  // namespace kusari::mn::detail
