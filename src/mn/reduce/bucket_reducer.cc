// The overlapped gradient reducer (Note [Overlapped gradient reduction] in bucket_reducer.h).
#include "mn/reduce/bucket_reducer.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>

#include "kusari/core/cuda.h"
#include "kusari/core/routines.h"
#include "mn/object_codec.h"
#include "mn/reduce/gradient_set.h"

namespace kusari::mn::detail {

namespace {

using ::kusari::detail::VariableImpl;

constexpr const char* kWhat = "multi_node_mean_grad (overlap)";

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool debug_mode(const Communicator& comm) {
  if (comm.options().debug) return true;
  const char* env = std::getenv("KUSARI_MN_DEBUG");
  return env && std::string(env) == "1";
}

/// A 62-bit hash as three 21-bit pieces (exact in a double, for allreduce_obj).
void put_hash(std::vector<double>& v, uint64_t hash) {
  for (int k = 0; k < 3; ++k) {
    const double piece = static_cast<double>((hash >> (21 * k)) & ((uint64_t{1} << 21) - 1));
    v.push_back(piece);
    v.push_back(-piece);
  }
}

}  // namespace

std::vector<BucketLayout> plan_buckets(const std::vector<size_t>& order,
                                       const std::vector<int64_t>& sizes,
                                       const std::vector<Dtype>& grad_dtypes,
                                       const std::vector<Dtype>& wire_dtypes,
                                       const BucketSettings& settings) {
  std::vector<BucketLayout> buckets;
  for (size_t index : order) {
    KUSARI_ASSERT(index < sizes.size(), "plan_buckets: index ", index, " of ", sizes.size());
    const Dtype grad = grad_dtypes[index], wire = wire_dtypes[index];
    bool open = !buckets.empty();
    if (open) {
      const BucketLayout& last = buckets.back();
      const int64_t limit =
          buckets.size() == 1 ? settings.first_bucket_bytes : settings.bucket_bytes;
      open = last.bytes < limit && last.grad_dtype == grad && last.wire_dtype == wire;
    }
    if (!open) {
      buckets.emplace_back();
      buckets.back().grad_dtype = grad;
      buckets.back().wire_dtype = wire;
    }
    BucketLayout& b = buckets.back();
    b.params.push_back(index);
    b.bytes += sizes[index] * static_cast<int64_t>(itemsize(wire));
  }
  // The last bucket goes out only when backward ends, so whatever it holds is never hidden: its
  // tail (the parameters backward finishes last) becomes a bucket of its own of about
  // first_bucket_bytes, and the rest goes out before backward reaches them.
  if (buckets.size() >= 2 && buckets.back().bytes > settings.first_bucket_bytes &&
      buckets.back().params.size() >= 2) {
    BucketLayout& last = buckets.back();
    const int64_t item = static_cast<int64_t>(itemsize(last.wire_dtype));
    BucketLayout tail;
    tail.grad_dtype = last.grad_dtype;
    tail.wire_dtype = last.wire_dtype;
    while (last.params.size() > 1 && tail.bytes < settings.first_bucket_bytes) {
      const size_t index = last.params.back();
      last.params.pop_back();
      last.bytes -= sizes[index] * item;
      tail.params.insert(tail.params.begin(), index);
      tail.bytes += sizes[index] * item;
    }
    buckets.push_back(std::move(tail));
  }
  return buckets;
}

BucketReducer::BucketReducer(Communicator& comm, std::unique_ptr<BucketTransport> transport,
                             const BucketSettings& settings)
    : comm_(comm), transport_(std::move(transport)), settings_(settings) {
  KUSARI_ASSERT(transport_, "BucketReducer: no transport");
}

BucketReducer::~BucketReducer() {
  abandon_in_flight();
  detach();
}

std::vector<const void*> BucketReducer::walk(Link& model) {
  std::vector<const void*> w;
  model.for_each_param([&](const Parameter& p) { w.push_back(p.impl_ptr().get()); }, false);
  return w;
}

void BucketReducer::attach(Link& model) {
  model.for_each_param([&](const Parameter& p) {
    const std::shared_ptr<VariableImpl>& impl = p.impl_ptr();
    auto it = hooked_.find(impl.get());
    if (it != hooked_.end() && it->second.impl.lock() == impl) return;
    Hooked h;
    h.impl = impl;
    h.id =
        Parameter(p).add_grad_ready_hook([this](const Variable& leaf) { on_ready(&leaf.impl()); });
    hooked_[impl.get()] = h;
  });
}

void BucketReducer::detach() noexcept {
  for (auto& [ptr, h] : hooked_) {
    if (std::shared_ptr<VariableImpl> impl = h.impl.lock()) impl->grad_ready_hooks.remove(h.id);
  }
  hooked_.clear();
  buckets_.clear();  // (each GradientBuffer unbinds its parameters)
  where_.clear();
  params_.clear();
  planned_ = false;
}

void BucketReducer::reset_step() {
  order_.clear();
  seen_.clear();
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
  }
  next_launch_ = 0;
  launched_in_backward_ = 0;
  seconds_in_backward_ = 0;
}

void BucketReducer::abandon_in_flight() noexcept {
  if (next_launch_ > 0) transport_->abandon();
  for (Bucket& b : buckets_) b.launched = false;
  next_launch_ = 0;
}

void BucketReducer::on_ready(VariableImpl* impl) {
  if (holds_ > 0) return;  // no_sync: a later backward sends the sum
  if (!seen_[impl]) {
    seen_[impl] = 1;
    order_.push_back(impl);
  }
  if (!planned_) return;
  // A CUDA graph records this backward: what a hook queued would not replay, so the update
  // sends everything (Note [Overlapped gradient reduction]).
  if (device_.is_cuda() && cuda::is_capturing(device_)) return;
  auto it = where_.find(impl);
  if (it == where_.end()) return;  // not in the plan (a parameter initialised since)
  const auto [b, i] = it->second;
  Bucket& bucket = buckets_[b];
  KUSARI_CHECK(!bucket.launched, CommunicatorError, transport_->name(), ": ", kWhat,
               ": the gradient of ", bucket.params[i].first,
               " became ready again after its bucket was sent, so the reduction would miss what "
               "this backward added; with overlap, run every backward of a gradient "
               "accumulation but the last inside MultiNodeOptimizer::no_sync()");
  fill_segment(bucket, i);
  char& r = ready_[first_slot_[b] + i];
  if (!r) {
    r = 1;
    --bucket.pending;
  }
  const double start = seconds_now();
  launch_ready(/*in_backward=*/true);
  transport_->progress();
  seconds_in_backward_ += seconds_now() - start;
}

void BucketReducer::fill_segment(Bucket& b, size_t i) {
  Parameter& p = b.params[i].second;
  const std::shared_ptr<VariableImpl>& grad = p.impl().grad;
  const bool has = grad && grad->data.defined();
  if (b.in_place) {
    if (has && p.impl().grad_in_buffer()) return;  // backward added into the segment itself
    Array view = b.in_place->view(i);
    if (has) {
      // (a copy left to the transport's thread: the update makes the segment the gradient)
      if (transport_->fill(view, grad->data)) b.in_place->use_segment(b.params, i);
    } else {
      view.fill(0);
    }
    return;
  }
  Array& view = b.views[i];
  if (has) {
    view.assign(grad->data.reshape({view.size()}).astype(view.dtype()));
  } else {
    view.fill(0);
  }
}

void BucketReducer::launch_ready(bool in_backward) {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(next_launch_, in_backward);
  }
}

void BucketReducer::launch(size_t b, bool in_backward) {
  KUSARI_ASSERT(b == next_launch_, "BucketReducer: bucket ", b, " launched out of order");
  Array flat = buckets_[b].flat();
  transport_->launch(static_cast<int>(b), flat);
  buckets_[b].launched = true;
  ++next_launch_;
  if (in_backward) ++launched_in_backward_;
}

void BucketReducer::check_plan_everywhere(const std::string& signature) {
  if (same_hash_everywhere(comm_, fnv1a(signature))) return;
  Writer w;
  w.put_string(signature);
  const std::vector<Bytes> all = comm_.allgather_obj(w.take());
  const std::string ref = Reader(all[0]).get_string();
  for (int r = 1; r < comm_.size(); ++r) {
    const std::string other = Reader(all[static_cast<size_t>(r)]).get_string();
    if (const auto d = first_line_difference(ref, other)) {
      KUSARI_THROW(CommunicatorError, transport_->name(), ": ", kWhat,
                   ": the ranks' bucket plans differ, so they would send different gradients "
                   "in the same collective: line ",
                   d->line, " of the plan is '", d->ref, "' on rank 0 but '", d->other,
                   "' on rank ", r,
                   " (buckets follow the order in which backward finished the gradients in the "
                   "first step; every rank's backward must reach the parameters in the same "
                   "order then, with the same model and settings)");
    }
  }
  KUSARI_THROW(CommunicatorError, transport_->name(), ": ", kWhat,
               ": the ranks' bucket plans hash differently but read the same");
}

void BucketReducer::plan(Link& model) {
  abandon_in_flight();
  attach(model);
  walk_key_ = walk(model);
  params_ = model.namedparams(false);
  std::sort(params_.begin(), params_.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::unordered_map<const VariableImpl*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].second.impl_ptr().get()] = i;
  // The order: as ready in this step, then the others in reverse path order.
  std::vector<size_t> order;
  std::vector<char> placed(params_.size(), 0);
  for (const VariableImpl* impl : order_) {
    auto it = index.find(impl);
    if (it == index.end() || placed[it->second]) continue;
    placed[it->second] = 1;
    order.push_back(it->second);
  }
  for (size_t i = params_.size(); i-- > 0;) {
    if (!placed[i]) order.push_back(i);
  }
  std::vector<int64_t> sizes;
  std::vector<Dtype> grad_dtypes, wire_dtypes;
  for (const auto& [path, p] : params_) {
    sizes.push_back(p.size());
    grad_dtypes.push_back(p.data().dtype());
    wire_dtypes.push_back(transport_->wire_dtype(p.data().dtype()));
  }
  const std::vector<BucketLayout> layouts =
      plan_buckets(order, sizes, grad_dtypes, wire_dtypes, settings_);
  // What every rank must agree on. A failure of this rank's own (a model the transport cannot
  // reduce) goes into its plan, so that every rank raises instead of one hanging.
  std::ostringstream sig;
  sig << "overlap on '" << transport_->name() << "', bucket_bytes " << settings_.bucket_bytes
      << ", first_bucket_bytes " << settings_.first_bucket_bytes << ", " << gradient_settings_line()
      << "\n";
  std::string failure;
  Device device = Device::cpu();
  try {
    if (!params_.empty()) device = transport_->device_for(params_);
  } catch (const std::exception& e) {
    failure = e.what();
    sig << "failed: " << failure << "\n";
  }
  for (size_t b = 0; b < layouts.size(); ++b) {
    sig << "bucket " << b << " of " << dtype_name(layouts[b].wire_dtype) << "\n";
    for (size_t i : layouts[b].params) {
      sig << params_[i].first << " " << params_[i].second.shape() << " "
          << dtype_name(grad_dtypes[i]) << "\n";
    }
  }
  const std::string signature = sig.str();
  buckets_.clear();
  where_.clear();
  planned_ = false;
  check_plan_everywhere(signature);
  KUSARI_CHECK(failure.empty(), CommunicatorError, failure);
  device_ = device;
  transport_->prepare(static_cast<int>(layouts.size()), device_);
  const bool buffers = comm_.options().gradients_in_buffer;
  first_slot_.clear();
  size_t slots = 0;
  buckets_.resize(layouts.size());
  for (size_t b = 0; b < layouts.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.layout = layouts[b];
    for (size_t i : layouts[b].params) bucket.params.push_back(params_[i]);
    const Dtype wire = layouts[b].wire_dtype;
    const int64_t item = static_cast<int64_t>(itemsize(wire));
    if (buffers && wire == layouts[b].grad_dtype) {
      bucket.in_place = std::make_unique<GradientBuffer>();
      bucket.in_place->bind(bucket.params, wire, device_, transport_->align_bytes(),
                            transport_->buffer_multiple());
    } else {
      std::vector<int64_t> seg_sizes, offsets;
      for (size_t i : layouts[b].params) seg_sizes.push_back(sizes[i]);
      const int64_t align = std::max<int64_t>(1, transport_->align_bytes() / item);
      const int64_t total =
          GradientBuffer::plan(seg_sizes, align, transport_->buffer_multiple(), &offsets);
      bucket.wire = Array::zeros({total}, wire, device_);
      for (size_t k = 0; k < offsets.size(); ++k) {
        bucket.views.push_back(bucket.wire.at({Slice(offsets[k], offsets[k] + seg_sizes[k])}));
      }
    }
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      where_[bucket.params[i].second.impl_ptr().get()] = {b, i};
    }
    first_slot_.push_back(slots);
    slots += bucket.params.size();
  }
  ready_.assign(slots, 0);
  plan_hash_ = fnv1a(signature);
  planned_ = true;
  reset_step();
}

std::string BucketReducer::gradient_settings_line() const {
  const CommunicatorOptions& o = comm_.options();
  return ::kusari::detail::concat(
      "gradients_in_buffer ", o.gradients_in_buffer ? "on" : "off", ", allreduce_grad_dtype ",
      o.allreduce_grad_dtype ? dtype_name(*o.allreduce_grad_dtype) : "unset");
}

void BucketReducer::learn(Link& model) {
  plan(model);
  stats_ = OverlapStats{bucket_count(), 0};
}

void BucketReducer::mean_grad(Link& model, bool zero_fill) {
  KUSARI_CHECK(!(device_.is_cuda() && cuda::is_capturing(device_)), DeviceError, transport_->name(),
               ": ", kWhat,
               " cannot be recorded in a CUDA graph (it waits for collectives and checks the "
               "ranks on the host); record forward and backward only and call the optimizer "
               "outside the capture, as the updater's graph steps do");
  // Every rank still holds the planned parameters (or all plan again together).
  const bool stale = !planned_ || walk(model) != walk_key_;
  std::vector<double> check;
  put_hash(check, planned_ ? plan_hash_ : 0);
  check.push_back(stale ? 1.0 : 0.0);
  check = comm_.allreduce_obj(check, ReduceOp::kMax);
  if (check[6] > 0) {
    plan(model);  // (waits for the buckets in flight and drops them)
  } else {
    for (int k = 0; k < 3; ++k) {
      if (check[2 * static_cast<size_t>(k)] != -check[2 * static_cast<size_t>(k) + 1]) {
        abandon_in_flight();
        reset_step();
        KUSARI_THROW(CommunicatorError, transport_->name(), ": ", kWhat,
                     ": the ranks' bucket plans differ (every rank must plan at the same "
                     "steps, with the same model)");
      }
    }
  }
  // Without zero_fill: on how many ranks each parameter has a gradient.
  std::vector<double> present;
  if (!zero_fill) {
    present.reserve(params_.size());
    for (const Bucket& b : buckets_) {
      for (const auto& [path, p] : b.params) {
        const auto& g = p.impl().grad;
        present.push_back(g && g->data.defined() ? 1.0 : 0.0);
      }
    }
    present = comm_.allreduce_obj(present, ReduceOp::kSum);
  }
  const double start = seconds_now();
  try {
    for (size_t b = next_launch_; b < buckets_.size(); ++b) {
      Bucket& bucket = buckets_[b];
      for (size_t i = 0; i < bucket.params.size(); ++i) {
        if (!ready_[first_slot_[b] + i]) fill_segment(bucket, i);
      }
      launch(b, /*in_backward=*/false);
    }
    transport_->wait(static_cast<int>(buckets_.size()));
  } catch (...) {
    abandon_in_flight();
    reset_step();
    throw;
  }
  stats_ = OverlapStats{bucket_count(), launched_in_backward_, seconds_in_backward_,
                           seconds_now() - start, transport_->progress_thread(),
                           transport_->progress_yields()};
  // The means.
  const double scale = 1.0 / comm_.size();
  std::string disagreement;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    const bool averaged = transport_->averages(bucket.layout.wire_dtype);
    if (bucket.in_place && !averaged) {
      Array flat = bucket.flat();
      transport_->divide(flat);
    }
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      Parameter& p = bucket.params[i].second;
      if (!zero_fill) {
        const double n = present[first_slot_[b] + i];
        if (n == 0) {  // no rank has it: skipped, as without overlap
          p.cleargrad();
          continue;
        }
        if (n != comm_.size() && disagreement.empty()) {
          disagreement =
              ::kusari::detail::concat(bucket.params[i].first, " has a gradient on ",
                                       static_cast<int64_t>(n), " of ", comm_.size(), " ranks");
        }
      }
      if (bucket.in_place) {
        bucket.in_place->use_segment(bucket.params, i);
        continue;
      }
      // As unpack_gradients: 16-bit values are scaled in float32.
      Array src = bucket.views[i];
      if (!averaged)
        src = (is_half_precision(src.dtype()) ? src.astype(Dtype::kFloat32) : src) * scale;
      if (!p.grad().defined()) p.zerograd();
      Array g = p.grad();
      g.assign(src.astype(g.dtype()).reshape(g.shape()));
    }
  }
  reset_step();
  KUSARI_CHECK(disagreement.empty(), CommunicatorError, transport_->name(), ": ", kWhat,
               ": the ranks disagree on the gradients to reduce: ", disagreement,
               " (parameters without a gradient on some ranks need zero_fill=true)");
  if (debug_mode(comm_)) {
    for (const auto& [path, p] : params_) {
      if (!p.grad().defined()) continue;
      KUSARI_CHECK(all(isfinite(p.grad())).item<bool>(), CommunicatorError, kWhat,
                   ": parameters diverged: the averaged gradient of ", path,
                   " contains NaN or infinity");
    }
  }
}

}  // namespace kusari::mn::detail
