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
  /// The optimizer `name` ("main" by default).
  virtual Optimizer& optimizer(const std::string& name = "main") = 0;
  /// The iterator `name` ("main" by default).
  virtual Iterator& iterator(const std::string& name = "main") = 0;
  virtual void connect_trainer(Trainer&) {}
  virtual void finalize() {}
};

/// Draws a batch from the "main" iterator, converts it, computes the loss and lets the "main"
/// optimizer take a step.
class StandardUpdater : public Updater {
 public:
  StandardUpdater(std::shared_ptr<Iterator> iterator, std::shared_ptr<Optimizer> optimizer,
                  Device device = Device::cpu(), Converter converter = nullptr, LossFunction loss_func = nullptr);

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
};

}  // namespace kusari::training
