#include "mn/reduce/gradient_buffer.h"

#include <algorithm>

namespace kusari::mn::detail {

// Note [Gradients in the reduction buffer]
// Why. "flat" and the NCCL kinds reduce all gradients in one flat buffer, so every step used to
// pack the gradients into it and unpack the mean back. On the GPU each of the two moves the whole
// buffer through memory: on 2 x H200 over NVLink, pack + ncclAllReduce + unpack of ResNet-50-sized
// float32 gradients reached only 0.67-0.72 of a bare ncclAllReduce of the same buffer, and cutting
// it into pipelined chunks did not help (Note [Gradient pipeline]). So, like PyTorch DDP's
// gradient_as_bucket_view, the gradients live in the buffer: GradientBuffer lays the gradients to
// reduce out in one buffer, one segment each, and binds every parameter's gradient buffer to its
// segment (Parameter::set_grad_buffer). Each reduction copies the gradients that are not in their
// segments yet into them with one batched kernel, makes the segments the gradients, and reduces
// the whole buffer in place (plus a scale where the collective cannot average): no unpack, and
// no pack when the gradients are already there (gradient accumulation: after zerograds or a
// reduction without cleargrads, backward adds into the segments in place,
// Note [Gradients in a persistent buffer] in src/autograd/backward.cc).
//
// Where the cost went. After cleargrads, backward's gradients are new arrays (the engine adopts
// them, as without a buffer), so a step makes one pass over the gradient bytes (the batched copy)
// where the packed path made two (pack and unpack). Copying each gradient into its segment inside
// backward instead was built and measured: the same bytes, but one kernel launch per parameter,
// which for ResNet-50's 161 parameters cost 1.1 ms of host time per step on an H200 against one
// launch for the batched copy.
//
// Layout. The segments follow GradientSet::select's list, the order every rank agreed on
// (Note [Gradient sets]), so all ranks lay the buffer out alike. Each segment starts at a
// multiple of 256 bytes on a GPU (64 on the CPU), as a separately allocated array would, so that
// vectorised kernels (the batched copy, the optimizer updates) keep their aligned paths; the
// gaps and the padding to the kind's multiple are zeros, which stay zeros through the reduction.
// Only the gradients to reduce have segments: a parameter skipped for lack of a gradient
// (zero_fill false) has none, keeps no gradient and is unbound; zero_fill's zeros are written
// into the segment (zerograd fills a bound buffer). A change of the list (a parameter added or
// lazily initialised, or without a gradient this step), of a shape, the dtype or the device
// makes a new buffer: the gradients are copied over from the old one and the parameters that
// left are unbound. So a model whose set of gradients changes from step to step pays a copy per
// change (still less than a pack and an unpack), and one communicator reducing two models in turn
// rebuilds on every call.
//
// Every step. With a cold cache (backward ran in between) each array of a parameter that the
// host reads costs a few cache misses, and the arrays of 161 parameters, their gradients and
// their segments cost tens of microseconds, which the GPU waits for before the allreduce. So when
// every gradient is still the segment Variable the last reduction installed (in_place(): one
// pointer per parameter; the segments carry the agreed shapes, dtype and device), nothing else
// is looked at: GradientSet::select reuses the sizes and hash it checked last time (it still
// makes the check's allreduce with the other ranks, which may have changed), and the reduction
// skips the dtype, layout and binding checks. Anything else (a new gradient from backward,
// set_grad, a parameter added) takes the full path.
//
// Fallback. The packed path runs unchanged when the option is off (gradients_in_buffer, or
// KUSARI_MN_GRADIENTS_IN_BUFFER=0); when the gradients do not share one floating dtype (mixed
// dtypes travel in one buffer of the widest); when allreduce_grad_dtype casts them to another wire
// dtype; when they are not all on the communicator's device (the CPU for "flat"); and, for the
// NCCL kinds, when the chunk plan cuts the buffer into several chunks (KUSARI_MN_CHUNK_BYTES asked
// for the pipeline; with the gradients in place there is no pack or unpack for it to overlap).
// Falling back releases the buffer (unbinds its parameters), so that nothing accumulates into a
// buffer nobody reduces. Double buffering (start_mean_grad / finish_mean_grad) keeps its own
// packed slots: the gradients of step t must survive, reduced in the background, while step
// t+1's backward writes new ones, which a gradient living in the reduction buffer cannot do.
//
// Aliasing, for users. After multi_node_mean_grad every gradient is a view into one shared
// buffer, and the next reduction overwrites it. Optimizers, hooks and update kernels write
// each gradient in place, and segments never overlap each other or any parameter's data, so that
// is safe. What is not: keeping a gradient array across steps and expecting it to stay (copy it),
// or binding a parameter to a buffer of one's own while a communicator reduces it (the
// communicator binds it back on its next call). set_grad still works: the array becomes the
// gradient, and the next reduction copies it into the segment.

namespace {

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace

std::optional<Dtype> common_gradient_dtype(const NamedParams& params, Device device) {
  if (params.empty()) return std::nullopt;
  const Dtype dtype = params.front().second.dtype();
  if (!is_floating(dtype)) return std::nullopt;
  for (const auto& [path, p] : params) {
    // (Through the impl: this runs every step, and Variable::grad() copies the array handle.)
    const kusari::detail::VariableImpl& im = p.impl();
    if (im.data.dtype() != dtype || im.data.device() != device || !im.grad) return std::nullopt;
    const Array& g = im.grad->data;
    if (!g.defined() || g.dtype() != dtype || g.device() != device) return std::nullopt;
  }
  return dtype;
}

int64_t GradientBuffer::plan(const std::vector<int64_t>& sizes, int64_t align, int64_t multiple,
                             std::vector<int64_t>* offsets) {
  KUSARI_ASSERT(align > 0 && multiple > 0, "GradientBuffer::plan: align ", align, ", multiple ",
                multiple);
  offsets->clear();
  offsets->reserve(sizes.size());
  int64_t at = 0;
  for (int64_t n : sizes) {
    at = round_up(at, align);
    offsets->push_back(at);
    at += n;
  }
  return round_up(std::max<int64_t>(at, 1), multiple);
}

bool GradientBuffer::matches(const NamedParams& params, Dtype dtype, Device device,
                             int64_t align_bytes, int64_t multiple) const {
  bool same = flat_.defined() && dtype == dtype_ && device == device_ &&
              align_bytes == align_bytes_ && multiple == multiple_ && params.size() == ids_.size();
  for (size_t i = 0; same && i < params.size(); ++i) {
    // The same parameter: the same control block (which our weak_ptr keeps from being reused).
    const auto& impl = params[i].second.impl_ptr();
    same = !ids_[i].owner_before(impl) && !impl.owner_before(ids_[i]) &&
           shapes_[i] == impl->data.shape();
  }
  return same;
}

bool GradientBuffer::in_place(const NamedParams& params) const {
  if (!flat_.defined() || params.size() != view_vars_.size()) return false;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& impl = params[i].second.impl_ptr();
    if (impl->grad != view_vars_[i] || ids_[i].owner_before(impl) || impl.owner_before(ids_[i])) {
      return false;
    }
  }
  return true;
}

std::vector<size_t> GradientBuffer::bind(const NamedParams& params, Dtype dtype, Device device,
                                         int64_t align_bytes, int64_t multiple) {
  if (!matches(params, dtype, device, align_bytes, multiple)) {
    std::vector<int64_t> sizes;
    std::vector<const kusari::detail::VariableImpl*> keep;
    sizes.reserve(params.size());
    keep.reserve(params.size());
    for (const auto& [path, p] : params) {
      sizes.push_back(p.size());
      keep.push_back(p.impl_ptr().get());
    }
    const int64_t align = std::max<int64_t>(1, align_bytes / static_cast<int64_t>(itemsize(dtype)));
    std::vector<int64_t> offsets;
    const int64_t total = plan(sizes, align, multiple, &offsets);
    Array flat = Array::zeros({total}, dtype, device);
    unbind_all_but(keep);
    flat_ = std::move(flat);
    offsets_ = std::move(offsets);
    views_.clear();
    view_vars_.clear();
    ids_.clear();
    shapes_.clear();
    for (size_t i = 0; i < params.size(); ++i) {
      const Parameter& p = params[i].second;
      views_.push_back(flat_.at({Slice(offsets_[i], offsets_[i] + sizes[i])}).reshape(p.shape()));
      view_vars_.push_back(Variable(views_.back()).impl_ptr());
      ids_.push_back(p.impl_ptr());
      shapes_.push_back(p.shape());
    }
    dtype_ = dtype;
    device_ = device;
    align_bytes_ = align_bytes;
    multiple_ = multiple;
    ++layout_builds_;
  }
  std::vector<size_t> to_copy;
  for (size_t i = 0; i < params.size(); ++i) {
    // (No handle is copied unless a binding changes: this runs for every parameter each step.)
    const kusari::detail::VariableImpl& im = params[i].second.impl();
    if (!im.grad_buffer.same_view(views_[i])) Parameter(params[i].second).set_grad_buffer(views_[i]);
    if (!im.grad_in_buffer()) to_copy.push_back(i);
  }
  return to_copy;
}

void GradientBuffer::adopt(const NamedParams& params, size_t i) const {
  Array view = views_[i];
  view.assign(params[i].second.impl().grad->data);
  use_segment(params, i);
}

void GradientBuffer::use_segment(const NamedParams& params, size_t i) const {
  kusari::detail::VariableImpl& im = params[i].second.impl();
  // Made in bind() and handed out every step: whoever holds the gradient Variable holds the
  // segment (the aliasing of Note [Gradients in the reduction buffer]).
  im.grad = view_vars_[i];
}

void GradientBuffer::unbind_all_but(
    const std::vector<const kusari::detail::VariableImpl*>& keep) noexcept {
  for (const auto& id : ids_) {
    std::shared_ptr<kusari::detail::VariableImpl> impl = id.lock();
    if (!impl || std::find(keep.begin(), keep.end(), impl.get()) != keep.end()) continue;
    // Only a binding into this buffer is ours to drop (the user may have bound another since).
    if (impl->grad_buffer.defined() && impl->grad_buffer.storage() == flat_.storage()) {
      impl->grad_buffer = Array();
    }
  }
}

void GradientBuffer::release() noexcept {
  unbind_all_but({});
  flat_ = Array();
  views_.clear();
  view_vars_.clear();
  offsets_.clear();
  ids_.clear();
  shapes_.clear();
}

}  // namespace kusari::mn::detail
