// The hook that create_multi_node_optimizer's double buffering drives. Communicators that can
// reduce gradients in the background (the NCCL ones) implement it; the multi-node optimizer
// finds it with dynamic_cast, so the public Communicator interface does not grow. No CUDA or
// NCCL types appear here (optimizer.cc includes it in every build).
#pragma once

#include "kusari/links/link.h"

namespace kusari::mn::detail {

/// Background gradient reduction with one step of staleness (ChainerMN's double buffering).
/// See Note [Double buffering] in nccl_reducer.cc.
class MeanGradPipeline {
 public:
  virtual ~MeanGradPipeline() = default;

  /// Packs the model's gradients (parameters without one skipped, or zero-filled with
  /// `zero_fill`) into a buffer of their own and starts summing it over the ranks in the
  /// background. The model's gradients are not changed and may be cleared right away. At most
  /// two reductions may be in flight.
  virtual void start_mean_grad(Link& model, bool zero_fill) = 0;
  /// Waits for the oldest started reduction and writes its mean into the gradients of the
  /// parameters it was started with; the model's other parameters lose their gradient (so the
  /// update skips them), and gives every parameter the loss scale its gradient was computed with
  /// when the reduction started (1 for one that had none). Returns false, changing nothing, when
  /// nothing is in flight.
  virtual bool finish_mean_grad(Link& model) = 0;
  /// Reductions started and not yet finished.
  virtual int mean_grads_in_flight() const = 0;
  /// Waits for every reduction in flight and discards it (the parameter set changed).
  virtual void cancel_mean_grads() = 0;
};

}  // namespace kusari::mn::detail
