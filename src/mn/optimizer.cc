#include "kusari/mn/optimizer.h"

#include <algorithm>

#include "kusari/autograd/variable.h"
#include "kusari/core/routines.h"
#include "kusari/functions/math.h"
#include "mn/comm/heartbeat.h"
#include "mn/nccl_library.h"
#include "mn/reduce/bucket_reducer.h"
#include "mn/reduce/mean_grad_pipeline.h"
#include "mn/reduce/powersgd.h"
#include "mn/reduce/sharded_update.h"

namespace kusari::mn {

namespace {

detail::MeanGradPipeline* pipeline_of(Communicator* comm) { return dynamic_cast<detail::MeanGradPipeline*>(comm); }

/// `options`, refused when they combine overlap with double buffering.
const MultiNodeOptimizerOptions& checked_options(const MultiNodeOptimizerOptions& options) {
  KUSARI_CHECK(!(options.overlap && options.double_buffering), NotImplementedError,
               "create_multi_node_optimizer: overlap and double_buffering cannot be combined: double buffering "
               "reduces step t's gradients during step t+1 (one step stale), overlap during step t's own "
               "backward; choose one (overlap keeps the gradients fresh)");
  KUSARI_CHECK(options.zero_stage >= 0 && options.zero_stage <= 3, ValueError,
               "create_multi_node_optimizer: zero_stage must be 0 (replicated), 1, 2 or 3, got ",
               options.zero_stage);
  KUSARI_CHECK(options.powersgd_rank >= 0, ValueError, "create_multi_node_optimizer: powersgd_rank must be 0 (off) or "
               "positive, got ", options.powersgd_rank);
  KUSARI_CHECK(options.powersgd_rank == 0 || (options.zero_stage == 0 && !options.overlap && !options.double_buffering),
               NotImplementedError, "create_multi_node_optimizer: powersgd_rank cannot be combined with ",
               options.zero_stage ? "zero_stage" : options.overlap ? "overlap" : "double_buffering", " yet");
  KUSARI_CHECK(options.powersgd_min_ratio >= 0 && options.powersgd_start_step >= 0, ValueError,
               "create_multi_node_optimizer: powersgd_min_ratio (", options.powersgd_min_ratio,
               ") and powersgd_start_step (", options.powersgd_start_step, ") must not be negative");
  KUSARI_CHECK(options.zero_stage == 0 || !options.double_buffering, NotImplementedError,
               "create_multi_node_optimizer: zero_stage ", options.zero_stage, " cannot be combined with "
               "double_buffering; zero_stage 2 with overlap reduce-scatters the gradients during backward instead");
  KUSARI_CHECK(options.zero_stage != 1 || !options.overlap, NotImplementedError,
               "create_multi_node_optimizer: zero_stage 1 cannot be combined with overlap (its gradients are averaged "
               "whole after backward); zero_stage 2 with overlap reduce-scatters them during backward");
  return options;
}

/// The transport of the overlapped buckets for `comm`'s kind.
std::unique_ptr<detail::BucketTransport> bucket_transport_of(Communicator& comm) {
  if (auto host = detail::make_host_bucket_transport(comm)) return host;
  if (const detail::NcclLibrary* nccl = detail::nccl_library()) {
    if (nccl->bucket_transport) {
      if (auto t = nccl->bucket_transport(comm)) return t;
    }
  }
  KUSARI_THROW(NotImplementedError, "create_multi_node_optimizer: overlap has no transport for the communicator '",
               comm.name(), "' (it works with naive, flat, dummy and the NCCL communicators)");
}

}  // namespace

MultiNodeOptimizer::MultiNodeOptimizer(std::shared_ptr<Optimizer> actual, std::shared_ptr<Communicator> comm,
                                       bool zero_fill, bool double_buffering)
    : actual_(std::move(actual)), comm_(std::move(comm)), zero_fill_(zero_fill), double_buffering_(double_buffering) {
  KUSARI_CHECK(actual_, ValueError, "create_multi_node_optimizer: the optimizer is null");
  KUSARI_CHECK(comm_, ValueError, "create_multi_node_optimizer: the communicator is null");
  KUSARI_CHECK(!double_buffering_ || pipeline_of(comm_.get()), NotImplementedError,
               "create_multi_node_optimizer: double_buffering needs an NCCL communicator (pure_nccl, hierarchical, ",
               "two_dimensional, non_cuda_aware or single_node); '", comm_->name(),
               "' reduces on the host and cannot overlap the next step");
  if (actual_->target()) target_ = actual_->target_ptr();
}

MultiNodeOptimizer::MultiNodeOptimizer(std::shared_ptr<Optimizer> actual, std::shared_ptr<Communicator> comm,
                                       const MultiNodeOptimizerOptions& options)
    : MultiNodeOptimizer(std::move(actual), std::move(comm), options.zero_fill,
                         checked_options(options).double_buffering) {
  if (options.zero_stage > 0) {
    // (stage 2 with overlap reduce-scatters from its own gradient-ready hooks: no bucket reducer)
    sharded_ = std::make_unique<detail::ShardedUpdate>(comm_, options.zero_stage, options.bucket_bytes,
                                                       options.overlap);
    return;
  }
  if (options.powersgd_rank > 0) {
    powersgd_ = std::make_unique<detail::PowerSgdReducer>(comm_, options.powersgd_rank, options.powersgd_min_ratio,
                                                          options.powersgd_start_step, options.powersgd_seed);
  }
  if (!options.overlap) return;
  KUSARI_CHECK(options.bucket_bytes > 0 && options.first_bucket_bytes > 0, ValueError,
               "create_multi_node_optimizer: bucket_bytes (", options.bucket_bytes, ") and first_bucket_bytes (",
               options.first_bucket_bytes, ") must be positive");
  detail::BucketSettings settings;
  settings.bucket_bytes = options.bucket_bytes;
  settings.first_bucket_bytes = options.first_bucket_bytes;
  reducer_ = std::make_unique<detail::BucketReducer>(*comm_, bucket_transport_of(*comm_), settings);
  if (target_) reducer_->attach(*target_);
}

MultiNodeOptimizer::~MultiNodeOptimizer() = default;

MultiNodeOptimizer::NoSync::NoSync(detail::BucketReducer* reducer) : reducer_(reducer) {
  if (reducer_) reducer_->hold();
}

MultiNodeOptimizer::NoSync::~NoSync() {
  if (reducer_) reducer_->release_hold();
}

MultiNodeOptimizer::NoSync MultiNodeOptimizer::no_sync() { return NoSync(reducer_.get()); }

CompressionStats MultiNodeOptimizer::compression_stats() const {
  return powersgd_ ? powersgd_->stats() : CompressionStats{};
}

ShardStats MultiNodeOptimizer::shard_stats() const {
  if (!sharded_) return {};
  ShardStats stats;
  stats.stage = sharded_->stage();
  if (!sharded_->planned()) return stats;
  stats.shard_elements = sharded_->shard_elements();
  stats.total_elements = sharded_->total_elements();
  stats.split_parameters = sharded_->split_parameters();
  stats.whole_elements = sharded_->whole_elements();
  stats.gathers = sharded_->gathers();
  stats.prefetched = sharded_->prefetched();
  stats.units = sharded_->units();
  return stats;
}

void MultiNodeOptimizer::summon_full_parameters() {
  if (sharded_) sharded_->gather_all();
}

OverlapStats MultiNodeOptimizer::overlap_stats() const {
  if (!reducer_) return {};
  return reducer_->stats();
}

void MultiNodeOptimizer::setup(std::shared_ptr<Link> target) {
  if (double_buffering_) {
    pipeline_of(comm_.get())->cancel_mean_grads();
  }
  if (sharded_) sharded_->forget();
  actual_->setup(target);
  target_ = std::move(target);
  first_ = true;
  last_params_.clear();
  if (reducer_) {
    reducer_->reset();
    reducer_->attach(*target_);
  }
}

bool MultiNodeOptimizer::parameters_changed() {
  KUSARI_CHECK(target_, ValueError, "MultiNodeOptimizer: call setup(model) before update");
  std::vector<std::pair<std::string, bool>> now;
  for (auto& [path, p] : target_->namedparams(true)) now.emplace_back(path, p.is_initialized());
  std::sort(now.begin(), now.end());
  const bool changed = first_ || now != last_params_;
  first_ = false;
  last_params_ = std::move(now);
  return changed;
}

void MultiNodeOptimizer::check_same_settings() {
  const std::string mine =
      ::kusari::detail::concat("zero_stage ", sharded_ ? sharded_->stage() : 0, ", powersgd_rank ",
                               powersgd_ ? powersgd_->rank() : 0, ", overlap ", reducer_ ? "on" : "off",
                               ", double_buffering ", double_buffering_ ? "on" : "off", ", optimizer ",
                               actual_->type_name());
  const std::vector<Bytes> all = comm_->allgather_obj(Bytes(mine.begin(), mine.end()));
  const std::string first(all[0].begin(), all[0].end());
  for (size_t r = 1; r < all.size(); ++r) {
    const std::string other(all[r].begin(), all[r].end());
    KUSARI_CHECK(other == first, ValueError, "create_multi_node_optimizer: the processes were given different "
                 "settings: rank 0 has ", first, ", rank ", r, " has ", other, "; every process must make its "
                 "multi-node optimizer alike");
  }
}

void MultiNodeOptimizer::mark_parameters_synchronized() {
  parameters_changed();  // remembers the current parameter set and clears first_
}

bool MultiNodeOptimizer::agree_on_active() {
  active_ = comm_->allreduce_obj(static_cast<int64_t>(joined_ ? 0 : 1), ReduceOp::kSum);
  return active_ > 0;
}

bool MultiNodeOptimizer::step_after_backward() {
  // However the step ends, the heartbeat tells how many updates were done (Note [Heartbeat files]).
  // Only when one beats, and not at every step: t() may wait for the GPU's loss-scale verdict.
  struct Beat {
    const MultiNodeOptimizer& optimizer;
    ~Beat() {
      if (detail::heartbeat_wants_iteration()) {
        detail::heartbeat_iteration(optimizer.t());
      } else {
        detail::heartbeat_step();  // (a step dynamic loss scaling skips is corrected at the next read)
      }
    }
  } beat{*this};
  if (joining_ && !agree_on_active()) return false;
  // Under a Join with finished processes: the mean over every process, scaled to the mean over
  // those that trained (Note [Uneven inputs]).
  const double join_scale = joining_ && active_ < comm_->size() ? static_cast<double>(comm_->size()) / active_ : 1.0;
  if (parameters_changed()) {
    check_same_settings();
    if (double_buffering_) {
      pipeline_of(comm_.get())->cancel_mean_grads();
    }
    comm_->bcast_data(*target_);
    if (reducer_) reducer_->learn(*target_);  // (the buckets' plan, from this step's backward)
    if (sharded_) {
      sharded_->forget();
      sharded_->plan(*target_, *actual_);
    }
    if (powersgd_) powersgd_->forget();
    return true;
  }
  if (sharded_) {
    if (!sharded_->planned()) sharded_->plan(*target_, *actual_);  // (parameters loaded identical)
    sharded_->step(*target_, *actual_, zero_fill_ || joining_, join_scale);
    return true;
  }
  if (reducer_) {
    reducer_->mean_grad(*target_, zero_fill_);
    actual_->update();
    return true;
  }
  if (double_buffering_) {
    step_double_buffered();
    return true;
  }
  if (powersgd_) {
    powersgd_->mean_grad(*target_);
  } else {
    comm_->multi_node_mean_grad(*target_, zero_fill_ || joining_);
  }
  if (join_scale != 1.0) {
    target_->for_each_param([&](const Parameter& p) {
      Array g = p.grad();
      if (g.defined()) multiply_to(g, join_scale);
    });
  }
  actual_->update();
  return true;
}

// See Note [Double buffering] (src/mn/reduce/nccl_reducer.cc). Each update starts the reduction
// of this step's gradients and applies the previous step's averaged ones; the very first update
// after a broadcast has nothing to apply yet. The reducer keeps everything in flight, the loss
// scale each gradient was computed with included (finish_mean_grad gives it back), so that the
// update unscales the stale gradients by their own factor.
void MultiNodeOptimizer::step_double_buffered() {
  detail::MeanGradPipeline* pipeline = pipeline_of(comm_.get());
  pipeline->start_mean_grad(*target_, zero_fill_);
  if (pipeline->mean_grads_in_flight() < 2) return;  // the pipeline's first step
  pipeline->finish_mean_grad(*target_);
  actual_->update();
}

void MultiNodeOptimizer::update() { step_after_backward(); }

void MultiNodeOptimizer::update(const std::function<Variable()>& lossfun) {
  KUSARI_CHECK(target_, ValueError, "MultiNodeOptimizer: call setup(model) before update");
  Variable loss = lossfun();
  target_->cleargrads();
  BackwardOptions options;
  if (actual_->loss_scale() != 1.0) options.loss_scale = actual_->loss_scale();
  options.retain_graph = false;  // Note [Freeing the graph during backward]
  loss.backward(options);
  loss = Variable();
  step_after_backward();
}

void MultiNodeOptimizer::update_accumulated(int64_t n, const std::function<Variable(int64_t)>& lossfun) {
  KUSARI_CHECK(target_, ValueError, "MultiNodeOptimizer: call setup(model) before update");
  KUSARI_CHECK(n >= 1, ValueError, "MultiNodeOptimizer::update_accumulated: the number of micro-batches must be "
               "positive, got ", n);
  target_->cleargrads();
  for (int64_t i = 0; i < n; ++i) {
    Variable loss = lossfun(i);
    if (n > 1) loss = functions::mul(loss, 1.0 / static_cast<double>(n));
    BackwardOptions options;
    if (actual_->loss_scale() != 1.0) options.loss_scale = actual_->loss_scale();
    options.retain_graph = false;
    if (i + 1 < n && reducer_) {
      NoSync hold = no_sync();
      loss.backward(options);
    } else if (i + 1 < n && sharded_ && sharded_->overlap()) {
      struct Hold {
        detail::ShardedUpdate& s;
        ~Hold() { s.hold(false); }
      } hold{*sharded_};
      sharded_->hold(true);
      loss.backward(options);
    } else {
      loss.backward(options);
    }
  }
  step_after_backward();
}

void MultiNodeOptimizer::add_hook(std::shared_ptr<OptimizerHook> hook, const std::string& name) {
  actual_->add_hook(std::move(hook), name);
}
void MultiNodeOptimizer::remove_hook(const std::string& name) { actual_->remove_hook(name); }
void MultiNodeOptimizer::new_epoch() { actual_->new_epoch(); }
double& MultiNodeOptimizer::hyperparam(const std::string& name) { return actual_->hyperparam(name); }
bool MultiNodeOptimizer::has_hyperparam(const std::string& name) const { return actual_->has_hyperparam(name); }
double MultiNodeOptimizer::lr() const { return actual_->lr(); }
std::vector<ParamState>& MultiNodeOptimizer::param_states() { return actual_->param_states(); }
void MultiNodeOptimizer::serialize(Serializer& s) {
  if (sharded_ && !sharded_->planned() && s.is_loading() && target_) {
    // Lay the shards out now if the layout is known (every parameter initialised), so that only
    // this process's pieces of the state are read (Note [Sharded snapshot files]); the first
    // update keeps pieces cut alike.
    bool initialised = true;
    target_->for_each_param([&](const Parameter& p) { initialised = initialised && p.is_initialized(); });
    if (initialised) sharded_->plan(*target_, *actual_);
  }
  if (sharded_ && sharded_->planned()) {
    sharded_->serialize(s, *actual_);  // (this process's pieces; local)
    return;
  }
  actual_->serialize(s);
}

Join::Join(std::shared_ptr<Optimizer> optimizer)
    : optimizer_(std::dynamic_pointer_cast<MultiNodeOptimizer>(optimizer)), uncaught_(std::uncaught_exceptions()) {
  KUSARI_CHECK(optimizer_, ValueError, "Join: the optimizer must be a multi-node optimizer (create_multi_node_optimizer), "
               "got ", optimizer ? optimizer->type_name() : "null");
  KUSARI_CHECK(!optimizer_->reducer_ && !optimizer_->double_buffering_, NotImplementedError,
               "Join: uneven inputs are not supported with ", optimizer_->reducer_ ? "overlap" : "double_buffering",
               " yet: the finished processes would have no backward to send their buckets from");
  KUSARI_CHECK(!optimizer_->sharded_ || optimizer_->sharded_->stage() != 3, NotImplementedError,
               "Join: uneven inputs are not supported with zero_stage 3: a finished process runs no forward, "
               "so it would not take part in the others' gathers of the sharded parameters");
  KUSARI_CHECK(!optimizer_->joining_, ValueError, "Join: the optimizer is already under a Join");
  KUSARI_CHECK(optimizer_->target_, ValueError, "Join: call setup(model) on the optimizer first");
  optimizer_->joining_ = true;
  optimizer_->joined_ = false;
}

Join::~Join() {
  // (An exception leaving the scope ends the job anyway; the steps of the others would wait for
  // this process in vain.)
  if (!finished_ && std::uncaught_exceptions() == uncaught_) finish();
  optimizer_->joining_ = false;
  optimizer_->joined_ = false;
}

void Join::finish() {
  if (finished_) return;
  finished_ = true;
  MultiNodeOptimizer& o = *optimizer_;
  o.joined_ = true;
  while (true) {
    o.target_->cleargrads();
    // The others' gradients carry the loss scale of their backward: so do this one's zeros, so
    // that every process undoes the same factor.
    const double scale = o.actual_->loss_scale();
    o.target_->for_each_param([scale](const Parameter& p) { p.impl().loss_scale = scale; });
    if (!o.step_after_backward()) break;
    ++shadow_steps_;
  }
}

std::shared_ptr<Optimizer> create_multi_node_optimizer(std::shared_ptr<Optimizer> actual,
                                                       std::shared_ptr<Communicator> comm, bool double_buffering,
                                                       bool zero_fill) {
  return std::make_shared<MultiNodeOptimizer>(std::move(actual), std::move(comm), zero_fill, double_buffering);
}

std::shared_ptr<Optimizer> create_multi_node_optimizer(std::shared_ptr<Optimizer> actual,
                                                       std::shared_ptr<Communicator> comm,
                                                       const MultiNodeOptimizerOptions& options) {
  return std::make_shared<MultiNodeOptimizer>(std::move(actual), std::move(comm), options);
}

}  // namespace kusari::mn
