// The gradient reducer of the NCCL communicators: gradients on one GPU, reduced by the NCCL
// transport's collectives on buffers. Three strategies: the gradients in the reduction buffer,
// the packed pipeline (Note [Gradient pipeline]) and double buffering (Note [Double
// buffering]). See Note [Gradient reducer] in reducer.h. Only compiled with CUDA and NCCL.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "mn/comm/nccl_communicator.h"
#include "mn/reduce/batched_pack.h"
#include "mn/reduce/chunk_plan.h"
#include "mn/reduce/gradient_buffer.h"
#include "mn/reduce/gradient_set.h"

namespace kusari::mn::detail {

class NcclReducer {
 public:
  /// Reads KUSARI_MN_CHUNK_BYTES.
  explicit NcclReducer(NcclCommunicator& transport);
  NcclReducer(const NcclReducer&) = delete;
  NcclReducer& operator=(const NcclReducer&) = delete;
  ~NcclReducer();

  /// multi_node_mean_grad: the gradients in the buffer when they allow it, else the packed
  /// pipeline; waits (with a timeout) for the result.
  void mean_grad(Link& model, bool zero_fill);

  /// Double buffering (MeanGradPipeline, Note [Double buffering]). start_mean_grad also records
  /// the loss scale each parameter's gradient was computed with, and finish_mean_grad gives the
  /// parameters the loss scales of the gradients it writes (1 for a parameter that had none), so
  /// that the update unscales stale gradients by their own factor.
  void start_mean_grad(Link& model, bool zero_fill);
  bool finish_mean_grad(Link& model);
  int mean_grads_in_flight() const { return static_cast<int>(in_flight_.size()); }
  void cancel_mean_grads();

  /// The base settings and the gradient chunk size (KUSARI_MN_CHUNK_BYTES), which decides
  /// between the buffer and the pipeline; part of the check across ranks.
  std::string gradient_settings() const;
  /// The chunk-size setting of the gradient pipeline (KUSARI_MN_CHUNK_BYTES, read when the
  /// communicator is made): bytes, kChunkBytesAuto or kChunkBytesOff.
  int64_t chunk_bytes() const { return chunk_bytes_; }
  /// Chunks of the last gradient reduction (mean_grad or start_mean_grad; 0 before).
  int last_gradient_chunks() const { return last_gradient_chunks_; }

  /// Forgets the reductions in flight (the transport aborted: their collectives have ended).
  void drop_in_flight() noexcept { in_flight_.clear(); }
  /// Destroys the events and releases the wire buffers and the gradient buffer (its parameters
  /// unbound): the transport released its stream, and the compute stream has waited for
  /// everything queued there.
  void release() noexcept;

 private:
  using ChunkEvents = NcclCommunicator::ChunkEvents;
  /// One double-buffering reduction in flight.
  struct InFlight {
    int slot = 0;
    NamedParams params;
    ChunkPlan plan;
    double scale = 1.0;
    /// The loss scale of every parameter of the model when the reduction started.
    std::vector<std::pair<std::string, double>> loss_scales;
  };

  /// Checks that the gradients are on one GPU, before the check across ranks, and remembers it
  /// in gradients_device_.
  void check_gradients_here(const NamedParams& params);
  /// Prepares the gradient pipeline for `params`: plans the chunks of the padded wire buffer,
  /// prepares grad_packer_ for them, grows `buffer` to hold them and queues the zeroing of the
  /// pad on the compute stream.
  ChunkPlan prepare_gradients(const NamedParams& params, Array& buffer);
  /// Queues the pipelined reduction of the gradients prepared in grad_packer_: per chunk, the
  /// pack (compute stream), the collectives (kMean, NCCL stream) and, with `unpack`, the
  /// unpack times `scale` (compute stream, after the chunk's collectives). See
  /// Note [Gradient pipeline].
  void queue_gradient_pipeline(const ChunkPlan& plan, Array& buffer, ChunkEvents& ev, bool unpack,
                               double scale, const char* what);
  /// When options().gradients_in_buffer and the gradients allow it (one floating dtype, not cast,
  /// one chunk), makes the gradients of `params` views of buffer_ and queues their mean as one
  /// in-place reduction of it; returns false (releasing the buffer) when the packed path must
  /// run instead. See Note [Gradients in the reduction buffer] in gradient_buffer.cc.
  bool mean_grad_in_buffer(const NamedParams& params, const char* what);
  /// Queues the mean of the gradient buffer `flat` in place (one collective on the side stream,
  /// which the compute stream then waits for), and waits for it under the timeout.
  void reduce_gradient_buffer(Array flat, const char* what);

  NcclCommunicator& transport_;
  int64_t chunk_bytes_ = kChunkBytesAuto;
  int last_gradient_chunks_ = 0;
  /// The flat buffer the gradients live in (Note [Gradients in the reduction buffer]).
  GradientBuffer buffer_;
  GradientSet set_;
  /// The GPU of the gradients set_ last handed out (checked there, or unchanged since: in place).
  Device gradients_device_ = Device::cpu();

  ChunkEvents grad_events_;  // mean_grad
  BatchedPacker grad_packer_;
  /// Copies gradients that are not in their segments of buffer_ yet.
  BatchedPacker adopt_packer_;
  Array grad_buffer_;

  // Double buffering: two wire buffers ("slots") and their events, and the reductions in flight.
  std::array<ChunkEvents, 2> slot_events_;
  std::array<Array, 2> slot_buffers_;
  std::deque<InFlight> in_flight_;
  int next_slot_ = 0;
};

}  // namespace kusari::mn::detail
