// The multi-node optimizer (ChainerMN's create_multi_node_optimizer).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kusari/mn/communicator.h"
#include "kusari/optimizers/optimizer.h"

namespace kusari::mn {

namespace detail {
class BucketReducer;
class PowerSgdReducer;
class ShardedUpdate;
}  // namespace detail

class Join;

/// Options of create_multi_node_optimizer.
struct MultiNodeOptimizerOptions {
  /// Each update applies the previous step's averaged gradients while this step's are reduced
  /// in the background (ChainerMN's double buffering; NCCL communicators only).
  bool double_buffering = false;
  /// Parameters without a gradient are reduced as zeros (ChainerMN's zero_fill); false skips
  /// them (every rank must then agree on which have one).
  bool zero_fill = true;
  /// Reduce the gradients in buckets while backward runs, each bucket sent as soon as its
  /// gradients are final (PyTorch DDP's overlap; see docs/data_parallel.md).
  bool overlap = false;
  /// With overlap: bytes of a bucket on the wire (a bucket closes once it holds this many).
  int64_t bucket_bytes = int64_t{25} << 20;
  /// With overlap: bytes of the first bucket (the last layers' gradients, sent first).
  int64_t first_bucket_bytes = int64_t{1} << 20;
  /// Sharded data parallelism (ZeRO; see docs/sharding.md): 0 replicates the optimizer's state
  /// on every process; 1 keeps on each process the state (moments, float32 master copies) of its
  /// 1/N of the parameters only, the shard; 2 also reduces the gradients into the shards
  /// (reduce-scatter instead of allreduce) and drops the model's gradients after each step.
  /// Every process still holds all parameters. Results equal the unsharded optimizer's (Note
  /// [Sharded optimizer]). Every communicator kind. With `overlap`, stage 2 reduce-scatters the
  /// gradients in chunks of bucket_bytes while backward runs and drops each gradient once sent,
  /// so that they never live whole (ZeRO-2's memory); stage 1 refuses overlap, both refuse
  /// double_buffering. 3 also keeps the parameters' values in the shards only (ZeRO-3, FSDP's
  /// full sharding): a group of parameters (bucket_bytes or more, consecutive) is gathered whole
  /// when one of them is read and released again once forward moves on or backward is done with
  /// it; the gradients are reduce-scattered while backward runs (stage 2 with overlap, implied).
  /// Reads are collective: see summon_full_parameters() and Note [Sharded parameters].
  int zero_stage = 0;
  /// PowerSGD (Vogels et al., 2019): the averaged gradient of each matrix (a gradient of n x m,
  /// its first axis by the rest) is approximated by P Q^T of this rank, with error feedback and
  /// Q warm-started from the previous step; 2 small allreduces replace the large one. 0: off.
  /// Matrices whose approximation saves less than powersgd_min_ratio (n m < ratio r (n + m)),
  /// and vectors, are averaged exactly; so are all gradients in the first powersgd_start_step
  /// steps. See docs/sharding.md ("Gradient compression"). Not combined with zero_stage, overlap
  /// or double_buffering.
  int powersgd_rank = 0;
  double powersgd_min_ratio = 2.0;
  int64_t powersgd_start_step = 0;
  /// The seed of PowerSGD's first Q (the same on every process).
  uint64_t powersgd_seed = 0;
};

/// What the gradient compression sent in the last update (MultiNodeOptimizer::compression_stats).
struct CompressionStats {
  /// Bytes this process put into allreduces, and the bytes of the gradients averaged uncompressed
  /// (in their own dtype).
  int64_t bytes_sent = 0;
  int64_t bytes_uncompressed = 0;
  /// Gradients approximated, and averaged exactly.
  int64_t compressed = 0;
  int64_t exact = 0;
};

/// The layout of a sharded multi-node optimizer (MultiNodeOptimizer::shard_stats).
struct ShardStats {
  /// 0 (not sharded), 1, 2 or 3.
  int stage = 0;
  /// Parameter elements whose optimizer state this process holds, and in all shards.
  int64_t shard_elements = 0;
  int64_t total_elements = 0;
  /// Parameters cut between two shards.
  int64_t split_parameters = 0;
  /// Stage 3: elements of the model's parameters held whole on this process now (other stages:
  /// all of them); the parameter groups gathered so far, and of them those gathered in the
  /// background (prefetched, as the last step's order predicted); the number of groups.
  int64_t whole_elements = 0;
  int64_t gathers = 0;
  int64_t prefetched = 0;
  int64_t units = 0;
};

/// What the last update of an overlapping multi-node optimizer did.
struct OverlapStats {
  /// Buckets of the plan.
  int buckets = 0;
  /// Buckets sent while backward was still running (the rest were sent by the update).
  int launched_in_backward = 0;
  /// Seconds backward spent in the hooks starting and moving on the collectives (on the CPU
  /// communicators this is where MPI copies and sums), and the update spent finishing them.
  double seconds_in_backward = 0;
  double seconds_waiting = 0;
  /// True when a thread moved the CPU collectives on (MPI at MPI_THREAD_MULTIPLE, kusari's own
  /// level, and a core to spare, or KUSARI_MN_PROGRESS=yield|sleep); false when the hooks did.
  bool progress_thread = false;
  /// True when that thread yields its core between tests of the collectives instead of
  /// sleeping (a core to spare, or KUSARI_MN_PROGRESS=yield; see docs/data_parallel.md).
  bool progress_yields = false;
};

/// Wraps an optimizer so that every update first averages the gradients over the ranks.
///
/// Note [First update and changed parameter sets]
/// Each update compares the sorted list of (parameter path, initialised?) with the previous
/// one. When it changed - always on the first update, and again when a lazily sized parameter
/// appears - rank 0's parameters are broadcast to every rank and the optimizer step of that
/// iteration is skipped, so all ranks start from identical weights. Otherwise the gradients are
/// mean-allreduced, then the wrapped optimizer takes its step (its "pre" hooks therefore see
/// averaged gradients). Everything else (hyperparameters, hooks, state, serialisation) is the
/// wrapped optimizer's.
class MultiNodeOptimizer : public Optimizer {
 public:
  /// With `double_buffering` each update applies the previous step's averaged gradients while
  /// this step's are reduced in the background (NCCL communicators only; see
  /// create_multi_node_optimizer).
  MultiNodeOptimizer(std::shared_ptr<Optimizer> actual, std::shared_ptr<Communicator> comm, bool zero_fill,
                     bool double_buffering = false);
  /// With the options of create_multi_node_optimizer.
  MultiNodeOptimizer(std::shared_ptr<Optimizer> actual, std::shared_ptr<Communicator> comm,
                     const MultiNodeOptimizerOptions& options);
  ~MultiNodeOptimizer() override;

  void setup(std::shared_ptr<Link> target) override;
  void update() override;
  void update(const std::function<Variable()>& lossfun) override;
  /// Accumulates the micro-batches' gradients locally (with overlap, the backward calls but the
  /// last send nothing, as under no_sync()), then averages them over the processes once.
  void update_accumulated(int64_t n, const std::function<Variable(int64_t)>& lossfun) override;
  void add_hook(std::shared_ptr<OptimizerHook> hook, const std::string& name = "") override;
  void remove_hook(const std::string& name) override;
  void new_epoch() override;
  int64_t t() const override { return actual_->t(); }
  int64_t epoch() const override { return actual_->epoch(); }
  void set_loss_scale(double scale) override { actual_->set_loss_scale(scale); }
  double loss_scale() const override { return actual_->loss_scale(); }
  void loss_scaling(int64_t interval = 1000, std::optional<double> scale = std::nullopt) override {
    actual_->loss_scaling(interval, scale);
  }
  void use_fp32_update(bool flag = true) override { actual_->use_fp32_update(flag); }
  void use_multi_tensor_update(bool flag = true) override {
    actual_->use_multi_tensor_update(flag);
  }
  bool multi_tensor_update() const override { return actual_->multi_tensor_update(); }
  int64_t last_update_calls() const override { return actual_->last_update_calls(); }
  double& hyperparam(const std::string& name) override;
  bool has_hyperparam(const std::string& name) const override;
  void set_hyperparam_where(const std::string& name, double value,
                            std::function<bool(const std::string&, const Parameter&)> select) override {
    actual_->set_hyperparam_where(name, value, std::move(select));
  }
  std::vector<std::string> per_parameter_hyperparams() const override { return actual_->per_parameter_hyperparams(); }
  double hyperparam_for(const ParamState& state, const std::string& name) const override {
    return actual_->hyperparam_for(state, name);
  }
  double lr() const override;
  std::vector<ParamState>& param_states() override;
  void serialize(Serializer& serializer) override;
  const char* type_name() const override { return "MultiNodeOptimizer"; }

  /// Records the current parameters as already identical on every rank (every rank loaded the
  /// same checkpoint), so that the next update takes a step instead of broadcasting rank 0's
  /// parameters (ChainerMN's `needs_broadcast = False`; used by MultiNodeCheckpointer::maybe_load).
  void mark_parameters_synchronized();

  Optimizer& actual_optimizer() { return *actual_; }
  /// True when updates apply the previous step's averaged gradients (double buffering).
  bool double_buffering() const { return double_buffering_; }
  /// True when gradients are reduced in buckets during backward (MultiNodeOptimizerOptions).
  bool overlap() const { return static_cast<bool>(reducer_); }
  /// With overlap: the buckets of the plan and how many the last update found already sent.
  OverlapStats overlap_stats() const;
  Communicator& communicator() { return *comm_; }
  /// The sharding of the optimizer's state (zero_stage; the layout is made by the first update).
  ShardStats shard_stats() const;
  /// zero_stage 3: gathers every parameter whole on every process (collective) and keeps them
  /// whole until the next update, or until backward is done with them, so that one process
  /// alone may then read them (save the model to a file, generate text, evaluate). Other stages,
  /// or before the first update: nothing to do.
  void summon_full_parameters();
  /// With powersgd_rank: what the last update sent.
  CompressionStats compression_stats() const;

  /// While alive, the backward calls of an overlapping optimizer send nothing (PyTorch's
  /// no_sync): hold one around every backward of a gradient accumulation but the last, which
  /// then sends the summed gradients. Does nothing without overlap. Movable, not copyable.
  class NoSync {
   public:
    explicit NoSync(detail::BucketReducer* reducer);
    NoSync(NoSync&& other) noexcept : reducer_(other.reducer_) { other.reducer_ = nullptr; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;
    ~NoSync();

   private:
    detail::BucketReducer* reducer_;
  };
  /// A NoSync guard for this optimizer.
  [[nodiscard]] NoSync no_sync();

 protected:
  void update_one(ParamState&) override {}

 private:
  friend class Join;
  /// Under a Join: whether this process still trains, and the number of processes that do (set
  /// by each step's agreement).
  bool joining_ = false;
  bool joined_ = false;
  int64_t active_ = 0;
  /// Under a Join: agrees with the other processes on how many still train; false when none does.
  bool agree_on_active();
  /// True (and remembers the new set) when the parameter set changed since the last update.
  bool parameters_changed();
  /// The same settings on every process (sharding, overlap, double buffering, the optimizer's
  /// kind), else ValueError naming the first process that differs from rank 0. Collective.
  void check_same_settings();
  /// The step after backward; false when, under a Join, no process trained any more (no step).
  bool step_after_backward();

  std::shared_ptr<Optimizer> actual_;
  std::shared_ptr<Communicator> comm_;
  void step_double_buffered();

  bool zero_fill_;
  bool double_buffering_ = false;
  std::unique_ptr<detail::BucketReducer> reducer_;
  std::unique_ptr<detail::ShardedUpdate> sharded_;
  std::unique_ptr<detail::PowerSgdReducer> powersgd_;
  std::vector<std::pair<std::string, bool>> last_params_;
  bool first_ = true;
};

/// Uneven inputs (PyTorch's Join): processes whose data runs out before the others' keep taking
/// part in the multi-node optimizer's steps, with zeros for gradients, until every process is
/// done, so that nobody waits forever in a collective that a finished process will never join.
///
///   {
///     mn::Join join(optimizer);             // every process, at the same point
///     for (auto& batch : my_batches) optimizer->update(lossfun);   // any number of steps
///   }                                       // or join.finish(): the others' steps, until all are done
///
/// Note [Uneven inputs]
/// Under a Join each update first agrees (one allreduce of a number) on how many processes still
/// train; the gradients are then averaged over those only (the sum over every process, where the
/// finished ones add zeros, divided by their number), so each step weighs the processes that took
/// it as a step of that many processes would. Every process, finished or not, applies the same
/// step: the parameters stay identical. finish() (also run by the destructor unless an exception
/// is leaving the scope) repeats that step with no gradient of its own until the agreement finds
/// no process training. It covers the optimizer's collectives only (as PyTorch's Join covers
/// DDP's): evaluators, multi-node batch normalization and other collectives inside the loop must
/// be kept even by the program. Not with overlap or double buffering (NotImplementedError).
class Join {
 public:
  /// `optimizer` must be a MultiNodeOptimizer (create_multi_node_optimizer's result).
  explicit Join(std::shared_ptr<Optimizer> optimizer);
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;
  /// This process has no more data: takes part in the other processes' steps until every process
  /// is done. Collective; once only (later calls do nothing).
  void finish();
  /// The scope is left by an error: the destructor takes no steps (the job is ending). For front
  /// ends whose scopes are not C++ ones (Python's with).
  void abandon() { finished_ = true; }
  /// The steps finish() took part in.
  int64_t shadow_steps() const { return shadow_steps_; }

 private:
  std::shared_ptr<MultiNodeOptimizer> optimizer_;
  int uncaught_ = 0;
  bool finished_ = false;
  int64_t shadow_steps_ = 0;
};

/// Wraps `actual` for data-parallel training over `comm`. double_buffering (ChainerMN's:
/// overlapping the allreduce of step t with step t+1, so that each update applies the previous
/// step's averaged gradients, one step stale; the first update after a broadcast only starts
/// the pipeline) needs an NCCL communicator; other communicators are refused with
/// NotImplementedError.
std::shared_ptr<Optimizer> create_multi_node_optimizer(std::shared_ptr<Optimizer> actual,
                                                       std::shared_ptr<Communicator> comm,
                                                       bool double_buffering = false, bool zero_fill = true);

/// Wraps `actual` for data-parallel training over `comm` with `options`, e.g.
/// `create_multi_node_optimizer(opt, comm, {.overlap = true})` to reduce the gradients in
/// buckets while backward runs (every communicator kind; the buckets are planned in the first
/// update, which broadcasts rank 0's parameters, and checked across ranks). overlap and
/// double_buffering cannot be combined (NotImplementedError). With overlap on a CPU
/// communicator, making the optimizer is collective (it duplicates the MPI communicator for the
/// buckets): every rank makes it, in the same order as its other collectives.
std::shared_ptr<Optimizer> create_multi_node_optimizer(std::shared_ptr<Optimizer> actual,
                                                       std::shared_ptr<Communicator> comm,
                                                       const MultiNodeOptimizerOptions& options);

}  // namespace kusari::mn
