#include "kusari/config.h"

#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL

#include "mn/reduce/nccl_reducer.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "backends/cuda/runtime/cuda_backend.h"
#include "kusari/core/routines.h"
#include "mn/reduce/reducer.h"

namespace kusari::mn::detail {

// Note [Gradient pipeline]
// (The packed path. By default the gradients live in the reduction buffer and need neither pack
// nor unpack: Note [Gradients in the reduction buffer] in gradient_buffer.cc. This pipeline runs
// where that does not apply: mixed dtypes, a cast to another wire dtype, several chunks, double
// buffering, or gradients_in_buffer off.)
// Packing the gradients into the wire buffer and unpacking the result each move the buffer
// twice through GPU memory (about 0.05 ms each for ResNet-50's 102 MB on an H200); done before
// and after the collectives they added 40% to a 0.4 ms NVLink allreduce. So the buffer is cut
// into chunks, and the three stages are pipelined over the two streams:
//   compute: pack 0, rec(packed 0), pack 1, rec(packed 1), ..., wait(done 0), unpack 0,
//            wait(done 1), unpack 1, ...
//   NCCL:    wait(packed 0), collectives 0, rec(done 0), wait(packed 1), collectives 1, ...
// The packing of later chunks and the unpacking of earlier ones overlap the collectives; what is
// left on top of them is the pack of the first chunk, the unpack of the last, and a few
// microseconds per extra chunk (one more collective launch, its ring's fill and drain). Every
// pack is queued before the first unpack on the compute stream, since an unpack waits for its
// collectives and would hold up the packs behind it. A chunk's pack and unpack is still one
// kernel over the batched tables (Note [Batched packing]), whose blocks never straddle a chunk
// boundary. A kind's collectives for a chunk (reduce, inter-host allreduce and broadcast for
// hierarchical; reduce-scatter, allreduce, all-gather for two_dimensional; ...) run one after
// the other on the one NCCL stream, in the same order on every rank. non_cuda_aware's hosts'
// first processes wait on the host for each chunk's intra-host reduce before its MPI step, so
// they queue every pack first and then, per chunk, the collectives and the unpack (which then
// overlaps the next chunk's host step).
// Chunk size: the first pack and the last unpack cost about 0.7 us per MB of chunk each (two
// bytes moved per byte at ~3 TB/s), and every chunk a few microseconds; the sum is least for
// chunks of roughly 10-20 MB on NVLink, and NCCL keeps near its full bandwidth at those sizes.
// So the automatic setting cuts a buffer into about bytes / 16 MiB equal chunks (ResNet-50 in
// float32: 6 chunks of 16 MiB; with a float16 wire: 3), and sends a buffer under 24 MiB whole,
// where pipelining would save less than it costs. KUSARI_MN_CHUNK_BYTES overrides it ("off" for
// one chunk, or a size such as "8M"; read when the communicator is made); bench_mn_allreduce
// --chunk-bytes sweeps it. Chunk boundaries are multiples of 256 bytes and of the kind's
// padding (so two_dimensional splits every chunk evenly over a host), at most 64 chunks.
// The mean: where the collectives can average (ncclAvg on a floating wire dtype: pure_nccl,
// single_node, two_dimensional, and hierarchical when every host runs as many processes), they
// do, and the unpack is a plain copy or cast; elsewhere (non_cuda_aware's MPI step, uneven
// hierarchical hosts) they sum and the unpack scales by 1/size. ncclAvg scales each rank's
// values by 1/size before summing, so a float16 mean no longer overflows where the sum would.
// The wire buffers stay in the communicator: the compute stream has waited for every chunk's
// done event before it unpacks, so the next call's packs into the buffer, or its release to the
// pool when it grows, come after the collectives. With a timeout the host waits for the chunks
// in turn, each with its own deadline counted from its started event (Note [NCCL timeout]); the
// unpacks are already queued then, so the wait does not hold up the pipeline. After a failure
// the gradients are unspecified (some chunks may have been averaged, others not). Double
// buffering (Note [Double buffering]) pipelines the packs and collectives the same way in
// start_mean_grad, so its collectives start once the first chunk is packed; finish_mean_grad,
// which runs a step later when they are long over, unpacks the whole slot in one launch.
//

namespace {

using cuda::compute_stream;
using ::kusari::detail::concat;

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

/// Gives every parameter of `model` the loss scale `scales` recorded for it (1 when none).
void restore_loss_scales(Link& model, const std::vector<std::pair<std::string, double>>& scales) {
  for (auto& [path, p] : model.namedparams(false)) {
    auto it =
        std::find_if(scales.begin(), scales.end(), [&](const auto& e) { return e.first == path; });
    p.impl().loss_scale = it != scales.end() ? it->second : 1.0;
  }
}

}  // namespace

NcclReducer::NcclReducer(NcclCommunicator& transport)
    : transport_(transport),
      set_(
          transport, [this] { return gradient_settings(); },
          [this](const NamedParams& params) { check_gradients_here(params); }) {
  if (const char* c = std::getenv("KUSARI_MN_CHUNK_BYTES")) chunk_bytes_ = parse_chunk_bytes(c);
}

NcclReducer::~NcclReducer() {
  release();
}

void NcclReducer::release() noexcept {
  in_flight_.clear();
  set_.clear();
  for (ChunkEvents* ev : {&grad_events_, &slot_events_[0], &slot_events_[1]}) {
    NcclCommunicator::destroy_events(*ev);
  }
  // The wire buffers go back to the pool; the compute stream already waits for their last use.
  // The parameters bound to the gradient buffer are unbound (their gradients keep it alive).
  buffer_.release();
  grad_buffer_ = Array();
  slot_buffers_[0] = Array();
  slot_buffers_[1] = Array();
}

std::string NcclReducer::gradient_settings() const {
  return concat(::kusari::mn::detail::gradient_settings(transport_.options()),
                ", KUSARI_MN_CHUNK_BYTES ", chunk_bytes_name(chunk_bytes_));
}

void NcclReducer::check_gradients_here(const NamedParams& params) {
  if (params.empty()) return;
  const char* what = "multi_node_mean_grad";
  const Device d = params.front().second.impl().grad->data.device();
  for (const auto& [path, p] : params) {
    const Device here = p.impl().grad->data.device();  // (GradientSet::select gave each one)
    KUSARI_CHECK(here == d, DeviceError, transport_.name(), ": ", what, ": the gradient of ", path,
                 " is on ", here, " but that of ", params.front().first, " is on ", d,
                 " (the model must be on one GPU)");
  }
  KUSARI_CHECK(d.is_cuda(), CommunicatorError, transport_.name(), ": ", what,
               " needs the model on a GPU, but its gradients are on ", d,
               " (move the model with to_device(Device::cuda(comm->intra_rank())), or use 'flat' "
               "or 'naive' on the CPU)");
  gradients_device_ = d;
}

ChunkPlan NcclReducer::prepare_gradients(const NamedParams& params, Array& buffer) {
  std::vector<Array> grads;
  grads.reserve(params.size());
  int64_t total = 0;
  for (const auto& [path, p] : params) {
    grads.push_back(p.grad());
    total += p.grad().size();
  }
  const Dtype wire = wire_dtype(params, transport_.options());
  const int64_t padded = round_up(std::max<int64_t>(total, 1), transport_.buffer_multiple());
  const ChunkPlan plan = plan_chunks(padded, static_cast<int64_t>(itemsize(wire)),
                                     transport_.buffer_multiple(), chunk_bytes_);
  grad_packer_.prepare(grads, wire, transport_.device(), plan.count > 1 ? plan.chunk : 0);
  KUSARI_ASSERT(grad_packer_.total() == total && grad_packer_.chunks() == plan.count,
                "gradient pipeline: the packer's layout does not match the chunk plan");
  if (!buffer.defined() || buffer.dtype() != wire || buffer.size() < padded) {
    buffer = Array::empty({padded}, wire, Device::cuda(transport_.device()));
  }
  if (padded > total) {
    const size_t item = itemsize(wire);
    KUSARI_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(buffer.raw_data()) + total * item, 0,
                                      static_cast<size_t>(padded - total) * item,
                                      compute_stream(transport_.device())));
  }
  last_gradient_chunks_ = plan.count;
  return plan;
}

void NcclReducer::queue_gradient_pipeline(const ChunkPlan& plan, Array& buffer, ChunkEvents& ev,
                                          bool unpack, double scale, const char* what) {
  transport_.ensure_events(ev, plan.count);
  cudaStream_t compute = compute_stream(transport_.device());
  const Dtype wire = buffer.dtype();
  const int64_t item = static_cast<int64_t>(itemsize(wire));
  char* base = static_cast<char*>(buffer.raw_data());
  std::string chunk_what;
  auto reduce_chunk = [&](int k) {
    if (plan.count > 1) {  // (no ostringstream on the hot path)
      chunk_what = std::string(what) + " (chunk " + std::to_string(k + 1) + " of " +
                   std::to_string(plan.count) + ")";
    }
    transport_.begin_chunk(ev, k);
    transport_.reduce_buffer(base + plan.begin(k) * item, plan.size(k), wire, ReduceOp::kMean,
                             plan.count > 1 ? chunk_what.c_str() : what);
    transport_.end_chunk(ev, k, /*compute_waits=*/false);
  };
  // Every pack goes before the first unpack on the compute stream (an unpack waits for its
  // collectives). The collectives of chunk k are queued right after its pack, unless the kind
  // waits on the host inside them.
  const bool host_waits = transport_.reduce_waits_on_host();
  for (int k = 0; k < plan.count; ++k) {
    grad_packer_.pack_chunk(base, k, compute);
    transport_.mark_packed(ev, k);
    if (!host_waits) reduce_chunk(k);
  }
  for (int k = 0; k < plan.count; ++k) {
    if (host_waits) reduce_chunk(k);
    if (unpack) {
      KUSARI_CUDA_CHECK(cudaStreamWaitEvent(compute, ev.done[static_cast<size_t>(k)], 0));
      grad_packer_.unpack_chunk(base, k, scale, compute);
    }
  }
}

bool NcclReducer::mean_grad_in_buffer(const NamedParams& params, const char* what) {
  GradientBuffer& gb = buffer_;
  if (set_.in_place() && gb.device() == Device::cuda(transport_.device())) {
    // Every gradient is still its segment (Note [Gradients in the reduction buffer], "Every
    // step"): the buffer was laid out, checked and bound for them, so reduce it.
    reduce_gradient_buffer(gb.flat(), what);
    return true;
  }
  const Device gpu = Device::cuda(transport_.device());
  const std::optional<Dtype> dtype = buffer_dtype(gb, params, gpu, transport_.options());
  if (!dtype) return false;
  // Segments on 256-byte boundaries, as the memory pool aligns arrays.
  constexpr int64_t kAlignBytes = 256;
  const int64_t item = static_cast<int64_t>(itemsize(*dtype));
  int64_t elements = 0;
  if (gb.matches(params, *dtype, gpu, kAlignBytes, transport_.buffer_multiple())) {
    elements = gb.flat().size();  // (every step but the first: no planning)
  } else {
    std::vector<int64_t> sizes, offsets;
    sizes.reserve(params.size());
    for (const auto& [path, p] : params) sizes.push_back(p.size());
    const int64_t align = std::max<int64_t>(1, kAlignBytes / item);
    elements = GradientBuffer::plan(sizes, align, transport_.buffer_multiple(), &offsets);
  }
  if (plan_chunks(elements, item, transport_.buffer_multiple(), chunk_bytes_).count != 1) {
    gb.release();
    return false;
  }
  const std::vector<size_t> to_copy =
      gb.bind(params, *dtype, gpu, kAlignBytes, transport_.buffer_multiple());
  KUSARI_ASSERT(gb.flat().size() == elements,
                "gradients in the buffer: the layout does not match its plan");
  cudaStream_t compute = compute_stream(transport_.device());
  if (!to_copy.empty()) {
    // One kernel copies every gradient that is not in its segment yet (the first call, set_grad,
    // zero_fill's fresh zeros, the views of a previous buffer).
    std::vector<Array> grads;
    std::vector<int64_t> at;
    for (size_t i : to_copy) {
      grads.push_back(params[i].second.grad());
      at.push_back(gb.offset(i));
    }
    adopt_packer_.prepare(grads, *dtype, transport_.device(), 0, &at);
    adopt_packer_.pack(gb.flat().raw_data(), compute);
    for (size_t i : to_copy) gb.use_segment(params, i);
  }
  reduce_gradient_buffer(gb.flat(), what);
  return true;
}

void NcclReducer::reduce_gradient_buffer(Array flat, const char* what) {
  last_gradient_chunks_ = 1;
  transport_.ensure_events(grad_events_, 1);
  transport_.begin_op(grad_events_);
  transport_.reduce_buffer(flat.raw_data(), flat.size(), flat.dtype(), ReduceOp::kMean,
                           what);   // mean or sum
  transport_.end_op(grad_events_);  // the compute stream waits: backward and updates come after
  if (!transport_.averages_on_wire(flat.dtype())) multiply_to(flat, 1.0 / transport_.size());
  transport_.wait_chunks(grad_events_, 1, what);
}

void NcclReducer::mean_grad(Link& model, bool zero_fill) {
  NamedParams& params = set_.select(model, zero_fill, buffer_);
  if (params.empty()) return;
  const char* what = "multi_node_mean_grad";
  transport_.ensure_nccl(gradients_device_, what);
  // Note [Gradients in the reduction buffer] (gradient_buffer.cc): no pack and no unpack.
  if (mean_grad_in_buffer(params, what)) {
    set_.check_finite_after_reduce(params);
    return;
  }
  const ChunkPlan plan = prepare_gradients(params, grad_buffer_);
  const double scale =
      transport_.averages_on_wire(grad_buffer_.dtype()) ? 1.0 : 1.0 / transport_.size();
  queue_gradient_pipeline(plan, grad_buffer_, grad_events_, /*unpack=*/true, scale, what);
  transport_.wait_chunks(grad_events_, plan.count, what);
  set_.check_finite_after_reduce(params);
}

// Note [Double buffering]
// ChainerMN's double buffering hides the gradient allreduce behind the next step's computation at
// the price of one step of staleness. The multi-node optimizer drives it through
// MeanGradPipeline, which the NCCL communicators forward to their NcclReducer; it keeps all the
// state: two wire buffers ("slots") with their events, and the reductions in flight:
//   update t:  start_mean_grad: pack the gradients of step t into the free slot (compute
//              stream) and queue their reduction on the NCCL stream, chunk by chunk
//              (Note [Gradient pipeline]); the compute stream does NOT wait, so step t+1's
//              forward and backward run while the collectives do;
//              finish_mean_grad: make the compute stream wait for the reduction of step t-1 (the
//              other slot; its last chunk's done event), unpack its mean into the gradients
//              (overwriting step t's, which are already packed), and the wrapped optimizer
//              updates with them.
// The first update after a broadcast only starts the pipeline (there is no earlier sum yet). The
// slots are only repacked after the compute stream waited for their collectives, and are never
// released while a reduction is in flight, so the pool's stream-order rule holds. A parameter set
// change cancels the pipeline (waits for and drops the reductions in flight). With a timeout, the
// deadlines are checked in finish_mean_grad, when the result is needed; non_cuda_aware still
// waits on the host for its MPI step inside start_mean_grad, so only its GPU parts overlap.
// The loss scale each gradient was computed with travels with its reduction (InFlight), and
// finish_mean_grad gives it back to the parameters, so that the update unscales the stale
// gradients by their own factor.
void NcclReducer::start_mean_grad(Link& model, bool zero_fill) {
  KUSARI_CHECK(in_flight_.size() < 2, CommunicatorError, transport_.name(),
               ": start_mean_grad: two reductions are already in flight; finish one first");
  std::vector<std::pair<std::string, double>> loss_scales;
  for (auto& [path, p] : model.namedparams(false))
    loss_scales.emplace_back(path, p.impl().loss_scale);
  NamedParams params = set_.select(model, zero_fill, buffer_);
  const char* what = "multi_node_mean_grad (double buffering)";
  InFlight f;
  f.loss_scales = std::move(loss_scales);
  f.slot = next_slot_;
  if (!in_flight_.empty() && in_flight_.front().slot == f.slot) f.slot ^= 1;
  next_slot_ = f.slot ^ 1;
  if (!params.empty()) {
    transport_.ensure_nccl(gradients_device_, what);
    ChunkEvents& ev = slot_events_[static_cast<size_t>(f.slot)];
    Array& buffer = slot_buffers_[static_cast<size_t>(f.slot)];
    f.plan = prepare_gradients(params, buffer);
    f.scale = transport_.averages_on_wire(buffer.dtype()) ? 1.0 : 1.0 / transport_.size();
    queue_gradient_pipeline(f.plan, buffer, ev, /*unpack=*/false, f.scale, what);
  }
  f.params = std::move(params);
  in_flight_.push_back(std::move(f));
}

bool NcclReducer::finish_mean_grad(Link& model) {
  if (in_flight_.empty()) return false;
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  const char* what = "multi_node_mean_grad (double buffering)";
  std::set<std::string> reduced;
  for (auto& [path, p] : f.params) reduced.insert(path);
  for (auto& [path, p] : model.namedparams(false)) {
    if (!reduced.count(path)) p.cleargrad();
  }
  if (f.params.empty()) {
    restore_loss_scales(model, f.loss_scales);
    return true;
  }
  const ChunkEvents& ev = slot_events_[static_cast<size_t>(f.slot)];
  const Array& buffer = slot_buffers_[static_cast<size_t>(f.slot)];
  KUSARI_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(transport_.device()),
                                        ev.done[static_cast<size_t>(f.plan.count - 1)], 0));
  transport_.wait_chunks(ev, f.plan.count, what);
  std::vector<Array> grads;
  for (auto& [path, p] : f.params) {
    if (!p.grad().defined()) {
      p.zerograd();
    } else if (!p.grad().is_contiguous()) {
      p.set_grad(p.grad().copy());
    }
    grads.push_back(p.grad());
  }
  // The same chunk size as start_mean_grad, so that the tables are not rebuilt every step.
  grad_packer_.prepare(grads, buffer.dtype(), transport_.device(),
                       f.plan.count > 1 ? f.plan.chunk : 0);
  KUSARI_ASSERT(grad_packer_.total() <= f.plan.elements,
                "double buffering: the gradients outgrew their slot");
  grad_packer_.unpack(buffer.raw_data(), f.scale, compute_stream(transport_.device()));
  set_.check_finite_after_reduce(f.params);
  restore_loss_scales(model, f.loss_scales);
  return true;
}

void NcclReducer::cancel_mean_grads() {
  while (!in_flight_.empty()) {
    const InFlight& f = in_flight_.front();
    if (!f.params.empty()) {
      const ChunkEvents& ev = slot_events_[static_cast<size_t>(f.slot)];
      KUSARI_CUDA_CHECK(cudaStreamWaitEvent(compute_stream(transport_.device()),
                                            ev.done[static_cast<size_t>(f.plan.count - 1)], 0));
      transport_.wait_chunks(ev, f.plan.count, "multi_node_mean_grad (double buffering)");
    }
    in_flight_.pop_front();
  }
}

}  // namespace kusari::mn::detail

#endif  // KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
