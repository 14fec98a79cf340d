// Multi-node trainer extensions, triggers and iterators (ChainerMN's evaluator, persistent
// allreduce, observation aggregation, early stopping, synchronized / multi-node iterators).
#pragma once

#include <concepts>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kusari/iterators/iterator.h"
#include "kusari/mn/communicator.h"
#include "kusari/training/early_stopping.h"
#include "kusari/training/extensions/evaluator.h"

namespace kusari::mn {

/// Evaluates each rank's shard with `evaluator`, then combines the ranks' results.
///
/// Note [Exact multi-node evaluation]
/// ChainerMN averages the ranks' means unweighted, which is off when the shards have different
/// sizes (and with force_equal_length some samples repeat). kusari allreduces every key's
/// weighted sum and total weight (each batch weighted by its size, see the Evaluator), so the
/// result is the per-sample mean over all evaluated samples: with an unequal scatter
/// (force_equal_length = false) it equals a single-process evaluation of the whole set exactly.
class MultiNodeEvaluator : public training::Extension {
 public:
  MultiNodeEvaluator(std::shared_ptr<training::extensions::Evaluator> evaluator, std::shared_ptr<Communicator> comm);
  void operator()(training::Trainer& trainer) override;
  std::string default_name() const override { return evaluator_->default_name(); }
  std::shared_ptr<training::Trigger> default_trigger() const override { return evaluator_->default_trigger(); }
  int priority() const override { return evaluator_->priority(); }
  /// The combined means (also reported to the current reporter).
  std::map<std::string, double> evaluate();
  training::extensions::Evaluator& evaluator() { return *evaluator_; }

 private:
  std::shared_ptr<training::extensions::Evaluator> evaluator_;
  std::shared_ptr<Communicator> comm_;
};

/// ChainerMN's create_multi_node_evaluator, with the evaluator given by value as
/// Trainer::extend takes extensions (an Evaluator or a subclass of it; the multi-node
/// evaluator keeps its own copy):
///
///   trainer.extend(mn::create_multi_node_evaluator(
///       extensions::Evaluator(test_iter, model, nullptr, device), comm));
template <typename E>
  requires std::derived_from<std::remove_cvref_t<E>, training::extensions::Evaluator>
std::shared_ptr<MultiNodeEvaluator> create_multi_node_evaluator(E&& evaluator,
                                                                std::shared_ptr<Communicator> comm);

/// The same over an evaluator the caller shares (e.g. to call evaluate() on it later).
std::shared_ptr<MultiNodeEvaluator> create_multi_node_evaluator(
    std::shared_ptr<training::extensions::Evaluator> evaluator, std::shared_ptr<Communicator> comm);

template <typename E>
  requires std::derived_from<std::remove_cvref_t<E>, training::extensions::Evaluator>
std::shared_ptr<MultiNodeEvaluator> create_multi_node_evaluator(E&& evaluator,
                                                                std::shared_ptr<Communicator> comm) {
  auto owned = std::make_shared<std::remove_cvref_t<E>>(std::forward<E>(evaluator));
  return create_multi_node_evaluator(
      std::static_pointer_cast<training::extensions::Evaluator>(std::move(owned)), std::move(comm));
}

/// An evaluator for metrics that are not means (mAP, ...): every rank computes per-batch results
/// with calc_local; they are gathered on the root, which aggregates them; the aggregated values
/// are broadcast and reported on every rank as "<name>/<key>" (ChainerMN's
/// GenericMultiNodeEvaluator).
class GenericMultiNodeEvaluator : public training::Extension {
 public:
  using Results = std::map<std::string, Array>;
  GenericMultiNodeEvaluator(std::shared_ptr<Communicator> comm, std::shared_ptr<Iterator> iterator,
                            std::shared_ptr<Link> target, Device device = Device::cpu(), int root = 0);
  void operator()(training::Trainer& trainer) override;
  std::string default_name() const override { return "validation"; }
  int priority() const override { return training::kPriorityWriter; }
  /// Runs the whole iterator and returns the aggregated values (on every rank).
  std::map<std::string, double> evaluate();

 protected:
  /// One batch's results on this rank (default: the target's output as "y").
  virtual Results calc_local(const std::vector<Variable>& batch);
  /// Combines every rank's per-batch results (root only; `results` holds all batches of all
  /// ranks, rank by rank). Must be implemented.
  virtual std::map<std::string, double> aggregate(const std::vector<Results>& results) = 0;
  Link& target() { return *target_; }

 private:
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<Iterator> iterator_;
  std::shared_ptr<Link> target_;
  Device device_;
  int root_;
};

/// Every epoch (before the evaluators), replaces each floating persistent value of `model`
/// (e.g. batch normalization's running mean and variance) by its mean over the ranks.
class AllreducePersistent : public training::Extension {
 public:
  AllreducePersistent(std::shared_ptr<Link> model, std::shared_ptr<Communicator> comm);
  void operator()(training::Trainer& trainer) override;
  void allreduce();
  std::string default_name() const override { return "AllreducePersistent"; }
  int priority() const override { return training::kPriorityWriter + 1; }

 private:
  std::shared_ptr<Link> model_;
  std::shared_ptr<Communicator> comm_;
};

/// Averages `original_key` over each `comm_trigger` interval on every rank, combines the ranks'
/// values with `aggregator` (the mean by default) and reports the result as `aggregated_key`.
class ObservationAggregator : public training::Extension {
 public:
  using Aggregator = std::function<double(const std::vector<double>&)>;
  ObservationAggregator(std::shared_ptr<Communicator> comm, std::string original_key,
                        std::string aggregated_key = "", std::shared_ptr<training::Trigger> comm_trigger = nullptr,
                        Aggregator aggregator = nullptr);
  void operator()(training::Trainer& trainer) override;
  std::string default_name() const override { return "ObservationAggregator"; }
  std::shared_ptr<training::Trigger> default_trigger() const override {
    return training::interval(1, "iteration");
  }
  int priority() const override { return training::kPriorityEditor; }

 private:
  std::shared_ptr<Communicator> comm_;
  std::string original_key_, aggregated_key_;
  std::shared_ptr<training::Trigger> comm_trigger_;
  Aggregator aggregator_;
  training::DictSummary summary_;
};

/// EarlyStoppingTrigger whose monitored value is averaged over the ranks, so all ranks stop at
/// the same iteration.
class MultiNodeEarlyStoppingTrigger : public training::EarlyStoppingTrigger {
 public:
  MultiNodeEarlyStoppingTrigger(std::shared_ptr<Communicator> comm,
                                std::shared_ptr<training::Trigger> check_trigger = nullptr,
                                std::string monitor = "main/loss", int patience = 3, std::string mode = "auto",
                                bool verbose = false, std::shared_ptr<training::Trigger> max_trigger = nullptr);

 protected:
  double reduce(double local_mean) override;

 private:
  std::shared_ptr<Communicator> comm_;
};

/// Gives every rank the same shuffle: rank 0 draws a seed and broadcasts it, and the iterator is
/// reseeded and reset (model parallelism needs identical batches). Returns the same iterator.
std::shared_ptr<Iterator> create_synchronized_iterator(std::shared_ptr<Iterator> iterator, Communicator& comm);
/// create_synchronized_iterator with the communicator as create_communicator returns it.
inline std::shared_ptr<Iterator> create_synchronized_iterator(std::shared_ptr<Iterator> iterator,
                                                              const std::shared_ptr<Communicator>& comm) {
  return create_synchronized_iterator(std::move(iterator), detail::communicator_of(comm, "create_synchronized_iterator"));
}

/// An iterator whose batches are read by `rank_master` and broadcast to the other ranks (which
/// pass nullptr or any iterator); epoch bookkeeping is broadcast with them.
std::shared_ptr<Iterator> create_multi_node_iterator(std::shared_ptr<Iterator> iterator,
                                                     std::shared_ptr<Communicator> comm, int rank_master = 0);

}  // namespace kusari::mn
