// SerialIterator: batches drawn in the calling thread (Chainer's SerialIterator).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kusari/iterators/iterator.h"
#include "kusari/iterators/iterator_state.h"

namespace kusari {

/// Visits a dataset in order or in a shuffled order, batch after batch, with Chainer's epoch
/// bookkeeping (Note [Iterator state machine]). Examples are fetched with
/// dataset->get_examples() in the thread that calls next().
class SerialIterator : public Iterator {
 public:
  /// Iterates over `dataset` in batches of `batch_size`. With `repeat` it goes on forever (the last
  /// batch of an epoch is filled from the next epoch); without, it stops after one epoch. With
  /// `shuffle` each epoch has a new random order drawn from a Generator seeded with `seed` (with
  /// the default generator's next_uint64() when absent), so equal seeds give equal batches.
  SerialIterator(std::shared_ptr<Dataset> dataset, int64_t batch_size, bool repeat = true,
                 bool shuffle = true, std::optional<uint64_t> seed = std::nullopt);

  /// The next batch; empty once a non-repeating iterator has finished its epoch.
  std::vector<Example> next() override;
  int64_t epoch() const override { return state_.epoch; }
  double epoch_detail() const override { return state_.epoch_detail(dataset_->size()); }
  double previous_epoch_detail() const override { return previous_epoch_detail_; }
  bool is_new_epoch() const override { return state_.is_new_epoch; }
  int64_t batch_size() const override { return batch_size_; }
  bool repeat() const override { return repeat_; }
  /// True when each epoch is visited in a random order.
  bool shuffle() const { return shuffle_; }
  /// Position of the next example within the current epoch's order.
  int64_t current_position() const { return state_.current_position; }
  /// The current epoch's order (empty without shuffling).
  std::vector<int64_t> order() const {
    return state_.order ? *state_.order : std::vector<int64_t>{};
  }
  /// The dataset being iterated.
  const std::shared_ptr<Dataset>& dataset() const { return dataset_; }
  /// Back to epoch 0, position 0, with a new order drawn from the iterator's generator.
  void reset() override;
  /// A new shuffle seed, then reset().
  void reseed(uint64_t seed) override;
  /// Saves or loads the position; see Note [Iterator snapshots].
  void serialize(Serializer& serializer) override;

 private:
  std::shared_ptr<Dataset> dataset_;
  int64_t batch_size_;
  bool repeat_;
  bool shuffle_;
  IteratorState state_;
  double previous_epoch_detail_ = -1.0;
};

}  // namespace kusari
