// Evaluator: runs a model over a whole validation set and reports the means of what it
// reports (Chainer's extensions.Evaluator).
//
//   auto test_iter = std::make_shared<SerialIterator>(test, 100, /*repeat=*/false,
//   /*shuffle=*/false); trainer.extend(extensions::Evaluator(test_iter, model));   //
//   "validation/main/loss", ...
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kusari/autograd/variable.h"
#include "kusari/iterators/iterator.h"
#include "kusari/links/link.h"
#include "kusari/training/extension.h"
#include "kusari/training/summary.h"
#include "kusari/training/updater.h"

namespace kusari::training::extensions {

/// Evaluates `target` on every batch of a non-repeating iterator, in test mode without
/// recording a graph, and reports the per-sample means of the values the target reports.
///
/// The target is registered as "main" (and its sub-links as "main/<path>") on a reporter of
/// the evaluator's own, with the extension's registered name as prefix, so a Classifier's
/// report of "loss" becomes "validation/main/loss". evaluate() returns the means and reports
/// them to the current reporter (the trainer's observation when run by the trainer).
///
/// Note [Evaluator weighting]
/// Chainer averages the per-batch means unweighted, so a short last batch (e.g. 10000
/// samples in batches of 128: 16 samples in the last one) counts as much as a full one and
/// the result is not the mean over the dataset. kusari weights each batch's observation by
/// its number of examples, so when the target reports batch means (as losses and accuracies
/// are), the result is the exact per-sample mean over the whole dataset. evaluate_summary()
/// returns the weighted sums and weights before dividing, so a multi-node evaluator can
/// allreduce them and divide once: the result then equals a single-process evaluation.
class Evaluator : public Extension {
 public:
  /// Runs on one converted batch, reporting what it computes (default: the target's
  /// forward_batch, e.g. a Classifier reporting loss and accuracy). Its result is ignored.
  using EvalFunction = std::function<void(const std::vector<Variable>& batch)>;

  /// `iterator` must not repeat (e.g. SerialIterator(..., repeat=false)). `converter`
  /// defaults to concat_examples; batches are converted onto `device`.
  Evaluator(std::shared_ptr<Iterator> iterator, std::shared_ptr<Link> target,
            Converter converter = nullptr, Device device = Device::cpu(),
            EvalFunction eval_func = nullptr);

  /// Runs evaluate().
  void operator()(Trainer& trainer) override;
  /// "validation": keys become "validation/main/...".
  std::string default_name() const override { return "validation"; }
  /// Every epoch.
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "epoch"); }
  /// Writer: runs before LogReport and PrintReport in the same iteration.
  int priority() const override { return kPriorityWriter; }

  /// Evaluates the whole iterator (reset first) and returns key -> per-sample mean; the
  /// means are also reported to the current reporter, if any.
  std::map<std::string, double> evaluate();
  /// The evaluation without the final division: every key's weighted sum and total weight
  /// (each batch weighted by its number of examples). See Note [Evaluator weighting].
  virtual DictSummary evaluate_summary();

  /// The evaluation iterator.
  Iterator& iterator() { return *iterator_; }
  /// The evaluated link (registered as "main").
  Link& target() { return *target_; }
  /// The device batches are converted onto.
  Device device() const { return device_; }

 protected:
  /// Converts one batch and runs the evaluation function on it; reports go to the
  /// evaluator's reporter, which is current while this runs.
  virtual void evaluate_batch(const std::vector<Example>& batch);

 private:
  std::shared_ptr<Iterator> iterator_;
  std::shared_ptr<Link> target_;
  Converter converter_;
  Device device_;
  EvalFunction eval_func_;
};

}  // namespace kusari::training::extensions
