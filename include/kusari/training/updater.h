// Updaters: one training step per call (Chainer's Updater and StandardUpdater).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kusari/autograd/variable.h"
#include "kusari/datasets/dataset.h"
#include "kusari/iterators/iterator.h"
#include "kusari/optimizers/optimizer.h"

namespace kusari::training {

class Trainer;

/// Turns a batch of examples into arrays on a device, e.g. concat_examples.
using Converter = std::function<std::vector<Array>(const std::vector<Example>& batch, Device device)>;
/// Computes the loss from a converted batch (default: the target's forward_batch).
using LossFunction = std::function<Variable(const std::vector<Variable>& batch)>;

class Updater : public Serializable {
 public:
  ~Updater() override = default;
  /// One training step.
  virtual void update() = 0;
  virtual int64_t iteration() const = 0;
  virtual int64_t epoch() const = 0;
  virtual double epoch_detail() const = 0;
  virtual double previous_epoch_detail() const = 0;
  virtual bool is_new_epoch() const = 0;
  /// False for an updater that does not sweep a dataset (reinforcement learning, a generator
  /// of its own batches): its epoch counts mean nothing, and the reports leave them out.
  virtual bool has_epochs() const { return true; }
  /// The optimizer `name` ("main" by default).
  virtual Optimizer& optimizer(const std::string& name = "main") = 0;
  /// The iterator `name` ("main" by default).
  virtual Iterator& iterator(const std::string& name = "main") = 0;
  /// Every optimizer by name (Chainer's get_all_optimizers): the trainer reports each one's
  /// target under its name ("main/loss", "gen/loss"). By default the "main" optimizer alone.
  virtual std::vector<std::pair<std::string, Optimizer*>> all_optimizers() { return {{"main", &optimizer("main")}}; }
  virtual void connect_trainer(Trainer&) {}
  virtual void finalize() {}
};

/// Draws a batch from the "main" iterator, converts it, computes the loss and lets the "main"
/// optimizer take a step.
class StandardUpdater : public Updater {
 public:
  StandardUpdater(std::shared_ptr<Iterator> iterator, std::shared_ptr<Optimizer> optimizer,
                  Device device = Device::cpu(), Converter converter = nullptr, LossFunction loss_func = nullptr);
  ~StandardUpdater() override;

  /// Runs forward and backward as a replayed CUDA graph (kusari::cuda::Graph) instead of
  /// launching every kernel from the host: much faster for models whose step is dominated by
  /// launch overhead. The first step with a new batch shape (or loss scale) runs eagerly and is
  /// then recorded; later steps copy the batch into the graph's inputs, replay it, report what
  /// the model reported while it was recorded (copies of the new values), and call the
  /// optimizer's update() eagerly (it may be a multi-node optimizer). Up to four recordings are
  /// kept (e.g. the full batch and a short last one). The device must be a GPU, and the step
  /// must be one a graph can record (Note [What a captured graph may not do]: no dropout, no
  /// values read on the host, no communication inside forward or backward); see
  /// Note [Graph steps in the updater].
  void set_use_cuda_graph(bool use);
  bool use_cuda_graph() const { return use_cuda_graph_; }
  /// Gradient accumulation: each update draws `steps` batches from the iterator (micro-batches)
  /// and takes one optimizer step on their mean loss (Optimizer::update_accumulated); the
  /// iteration count grows by one. The model's reports are the last micro-batch's. Not with a
  /// CUDA graph (ValueError).
  void set_accumulation_steps(int64_t steps);
  int64_t accumulation_steps() const { return accumulation_steps_; }
  /// Steps run from a recording so far (diagnostics and tests).
  int64_t graph_replays() const { return graph_replays_; }

  void update() override;
  /// The step itself (update() adds the iteration count).
  virtual void update_core();
  int64_t iteration() const override { return iteration_; }
  int64_t epoch() const override { return iterator_->epoch(); }
  double epoch_detail() const override { return iterator_->epoch_detail(); }
  double previous_epoch_detail() const override { return iterator_->previous_epoch_detail(); }
  bool is_new_epoch() const override { return iterator_->is_new_epoch(); }
  Optimizer& optimizer(const std::string& name = "main") override;
  Iterator& iterator(const std::string& name = "main") override;
  const std::shared_ptr<Optimizer>& optimizer_ptr() const { return optimizer_; }
  Device device() const { return device_; }
  void finalize() override { iterator_->finalize(); }
  /// Chainer's layout: "iterator:main/...", "optimizer:main/...", "model:main/...", "iteration".
  void serialize(Serializer& serializer) override;

 protected:
  std::shared_ptr<Iterator> iterator_;
  std::shared_ptr<Optimizer> optimizer_;
  Device device_;
  Converter converter_;
  LossFunction loss_func_;
  int64_t iteration_ = 0;

 private:
  struct RecordedStep;
  /// The eager step (forward, backward and update through the optimizer).
  void eager_step(const std::vector<Array>& arrays);
  /// A step replayed from a recording, or an eager one that records for the next steps.
  void graph_step(const std::vector<Array>& arrays);

  bool use_cuda_graph_ = false;
  int64_t accumulation_steps_ = 1;
  int64_t graph_replays_ = 0;
  std::vector<std::unique_ptr<RecordedStep>> recorded_;
};

}  // namespace kusari::training
