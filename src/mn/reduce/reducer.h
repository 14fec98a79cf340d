// The gradient reducer: what multi_node_mean_grad does between "these are the model's
// gradients" and "these are collectives on buffers". See Note [Gradient reducer]. Plain C++ (no
// CUDA or NCCL): the host reducer (host_reducer.h) and the helpers every reducer shares; the NCCL
// reducer (nccl_reducer.h) lives in the NCCL library.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kusari/mn/communicator.h"
#include "mn/reduce/gradient_buffer.h"

namespace kusari::mn::detail {

// Note [Gradient reducer]
// multi_node_mean_grad is three layers, read top-down, each in one place:
//   Communicator::multi_node_mean_grad       (src/mn/comm/: the kind; one line)
//     -> HostReducer / NcclReducer::mean_grad  (src/mn/reduce/: the gradients)
//       -> the transport's collectives on buffers, streams and events (src/mn/comm/)
// The transport (comm/) knows buffers, not gradients: MPI allreduce of host memory; for NCCL, a
// kind's reduce_buffer / bcast_buffer of a device buffer on the communication stream, the
// hand-off events (mark_packed, begin_chunk, end_chunk), the timed waits (wait_chunks), the
// lifecycle, timeout and abort, and the host staging of non_cuda_aware. Besides the kind's
// name, a reducer asks it only averages_on_wire (can the collective take the mean itself),
// reduce_waits_on_host (does it block the host mid-collective), buffer_multiple (the padding)
// and size.
// The reducer (reduce/) knows gradients:
//   which         GradientSet (gradient_set.h): sorted paths, zero_fill, the agreement check
//                 across ranks (Note [Gradient sets]) and its failure protocol;
//   layout        GradientBuffer (gradient_buffer.h): the gradients living in the reduction
//                 buffer (Note [Gradients in the reduction buffer]); BatchedPacker
//                 (batched_pack.h): packing them into a wire buffer with one kernel;
//   wire dtype    wire_dtype() below (allreduce_grad_dtype, else the widest);
//   chunking      ChunkPlan (chunk_plan.h; Note [Gradient pipeline]);
//   strategies    host: one allreduce per parameter (naive), one buffer (flat; dummy without
//                 the allreduce); NCCL: gradients in the buffer, the packed pipeline, and
//                 double buffering (Note [Double buffering]), whose state (slots, events, the
//                 reductions in flight and the loss scales their gradients carry) is all in
//                 NcclReducer.
// Each communicator owns its reducer; the reducer holds a reference to its communicator's
// transport and never the other way round, except that the NCCL transport tells its reducer to
// drop the reductions in flight when it aborts, and releases it with itself.
// Overlap with backward (PyTorch DDP's buckets, CHAINERMN_NOTES "better") is the
// BucketReducer (bucket_reducer.h, Note [Overlapped gradient reduction]), which the multi-node
// optimizer owns when asked for overlap: a bucket plan beside ChunkPlan (parameters in the order
// backward finished them, about 25 MiB per bucket, the first and last small), agreed across
// ranks as GradientSet's check does, fed by the gradient-ready hooks of backward and launched
// strictly in bucket order on every rank through a BucketTransport (MPI non-blocking
// collectives, or per bucket the same mark_packed / begin_chunk / reduce_buffer / end_chunk
// sequence the pipeline queues per chunk); mean_grad then only waits for the last bucket.
// Nothing in comm/ changed for it.

/// The settings of `options` that decide how gradients are laid out and sent, in words
/// ("gradients_in_buffer on, allreduce_grad_dtype unset"); reducers with more such settings
/// append theirs. Part of the check across ranks (Note [Gradient sets]).
std::string gradient_settings(const CommunicatorOptions& options);

/// The widest floating dtype of a set (one float64 makes float64; mixed 16/32-bit make float32).
Dtype widest_dtype(const std::vector<Dtype>& dtypes);

/// The wire dtype for the gradients of `params`: allreduce_grad_dtype when set, else the widest
/// of their dtypes.
Dtype wire_dtype(const NamedParams& params, const CommunicatorOptions& options);

/// The dtype of the gradient buffer for `params` on `device` when their gradients can live in
/// one (options.gradients_in_buffer, one floating dtype there, not cast on the wire); else
/// nullopt, with `buffer` released (its parameters unbound), so that the packed path runs.
std::optional<Dtype> buffer_dtype(GradientBuffer& buffer, const NamedParams& params,
                                  Device device, const CommunicatorOptions& options);

}  // namespace kusari::mn::detail
