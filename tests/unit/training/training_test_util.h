// Small stand-ins for the training tests: an iterator over a vector of examples (Chainer's
// SerialIterator without shuffling), a plain SGD step, a map-backed serializer and a tiny model
// that reports known values. The real SerialIterator, optimizers and npz serializer live in
// their own modules; these keep the trainer tests independent of them.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kusari/autograd/mode.h"
#include "kusari/core/reporter.h"
#include "kusari/core/routines.h"
#include "kusari/functions.h"
#include "kusari/iterators/iterator.h"
#include "kusari/links/initializers.h"
#include "kusari/links/linear.h"
#include "kusari/optimizers/optimizer.h"
#include "kusari/serializers/serializer.h"
#include "kusari/training/trainer.h"
#include "kusari/training/updater.h"
#include "map_serializer.h"

namespace kusari::testing {

/// Batches in order; with repeat, a batch that crosses the end of the data wraps around into
/// the next epoch (Chainer's SerialIterator with shuffle=False).
class VectorIterator : public Iterator {
 public:
  VectorIterator(std::vector<Example> data, int64_t batch_size, bool repeat)
      : data_(std::move(data)), batch_size_(batch_size), repeat_(repeat) {}

  std::vector<Example> next() override {
    const int64_t n = static_cast<int64_t>(data_.size());
    if (!repeat_ && epoch_ > 0) return {};
    previous_epoch_detail_ = epoch_detail();
    const int64_t i = position_, i_end = i + batch_size_;
    std::vector<Example> batch(data_.begin() + i, data_.begin() + std::min(i_end, n));
    if (i_end >= n) {
      if (repeat_) {
        const int64_t rest = i_end - n;
        for (int64_t k = 0; k < rest; ++k) batch.push_back(data_[k % n]);
        position_ = rest % n;
      } else {
        position_ = 0;
      }
      ++epoch_;
      is_new_epoch_ = true;
    } else {
      is_new_epoch_ = false;
      position_ = i_end;
    }
    return batch;
  }
  int64_t epoch() const override { return epoch_; }
  double epoch_detail() const override {
    return static_cast<double>(epoch_) +
           static_cast<double>(position_) / static_cast<double>(data_.size());
  }
  double previous_epoch_detail() const override { return previous_epoch_detail_; }
  bool is_new_epoch() const override { return is_new_epoch_; }
  int64_t batch_size() const override { return batch_size_; }
  bool repeat() const override { return repeat_; }
  void reset() override {
    position_ = 0;
    epoch_ = 0;
    is_new_epoch_ = false;
    previous_epoch_detail_ = -1;
  }
  void serialize(Serializer& s) override {
    s("current_position", position_);
    s("epoch", epoch_);
    s("is_new_epoch", is_new_epoch_);
    s("previous_epoch_detail", previous_epoch_detail_);
  }

 private:
  std::vector<Example> data_;
  int64_t batch_size_;
  bool repeat_;
  int64_t position_ = 0;
  int64_t epoch_ = 0;
  bool is_new_epoch_ = false;
  double previous_epoch_detail_ = -1;
};

/// p -= lr * grad.
class TinySGD : public Optimizer {
 public:
  explicit TinySGD(double lr = 0.01) { declare_hyperparam("lr", lr); }
  const char* type_name() const override { return "TinySGD"; }

 protected:
  void update_one(ParamState& s) override {
    Array data = s.param.data();
    data.assign(data - s.param.grad() * hyperparam("lr"));
  }
};


/// y = W x (W starts at 0.5, no bias); reports "loss" = mean((y - t)^2) and "x_mean" = mean(x)
/// of each batch, and remembers the modes and batch sizes it ran with.
class ProbeModel : public Chain {
 public:
  ProbeModel() {
    l = add_link(
        "l", std::make_shared<links::Linear>(
                 1, 1, /*nobias=*/true, std::make_shared<initializers::Constant>(0.5, float64)));
  }
  Variable forward_batch(const std::vector<Variable>& batch) override {
    namespace F = functions;
    Variable d = (*l)(batch[0]) - batch[1];
    Variable loss = F::mean(d * d);
    report({{"loss", loss.data()}, {"x_mean", F::mean(batch[0]).data()}}, this);
    train_modes.push_back(is_train_mode());
    backprop_modes.push_back(is_backprop_enabled());
    batch_sizes.push_back(batch[0].shape()[0]);
    return loss;
  }

  std::shared_ptr<links::Linear> l;
  std::vector<bool> train_modes;
  std::vector<bool> backprop_modes;
  std::vector<int64_t> batch_sizes;
};

/// n examples {x = (i), t = (2 i)} as float64 (1,) arrays.
inline std::vector<Example> probe_data(int64_t n) {
  std::vector<Example> data;
  for (int64_t i = 0; i < n; ++i) {
    data.push_back({Array::full({1}, static_cast<double>(i), float64, Device::cpu()),
                    Array::full({1}, 2.0 * static_cast<double>(i), float64, Device::cpu())});
  }
  return data;
}

/// The folder holding this test process's output (CTest runs tests in parallel processes).
inline std::filesystem::path process_out_root() {
  return std::filesystem::path(::testing::TempDir()) /
         ("kusari_training_" + std::to_string(::getpid()));
}

/// Removes this process's output folder when the tests end.
class RemoveOutputs : public ::testing::Environment {
 public:
  void TearDown() override { std::filesystem::remove_all(process_out_root()); }
};
inline ::testing::Environment* const kRemoveOutputs =
    ::testing::AddGlobalTestEnvironment(new RemoveOutputs);

/// A fresh, empty folder for one test's output, unique to the running test.
inline std::string fresh_out_dir(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string unique = info ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  const std::filesystem::path dir = process_out_root() / unique / name;
  std::filesystem::remove_all(dir);
  return dir.string();
}

/// A model, optimizer, iterator, updater and trainer wired together.
struct TrainingSetup {
  std::shared_ptr<ProbeModel> model;
  std::shared_ptr<TinySGD> optimizer;
  std::shared_ptr<VectorIterator> iterator;
  std::shared_ptr<training::StandardUpdater> updater;
  std::unique_ptr<training::Trainer> trainer;
};

/// n examples in batches of `batch_size` (repeating), SGD with `lr`, stopping at `stop`.
inline TrainingSetup make_setup(const std::string& out, std::shared_ptr<training::Trigger> stop,
                                int64_t n = 6, int64_t batch_size = 2, double lr = 0.01,
                                training::LossFunction loss_func = nullptr) {
  TrainingSetup s;
  s.model = std::make_shared<ProbeModel>();
  s.optimizer = std::make_shared<TinySGD>(lr);
  s.optimizer->setup(s.model);
  s.iterator = std::make_shared<VectorIterator>(probe_data(n), batch_size, /*repeat=*/true);
  s.updater = std::make_shared<training::StandardUpdater>(s.iterator, s.optimizer, Device::cpu(),
                                                          nullptr, std::move(loss_func));
  s.trainer = std::make_unique<training::Trainer>(s.updater, std::move(stop), out);
  return s;
}

}  // namespace kusari::testing
