// MultithreadIterator: SerialIterator's batches, fetched by worker threads ahead of time
// (Chainer's MultithreadIterator).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kusari/iterators/iterator.h"
#include "kusari/iterators/iterator_state.h"

namespace kusari {

// Note [MultithreadIterator prefetch]
// The batch sequence is computed by the same state machine as SerialIterator's, in the calling
// thread, so both iterators give the same batches for the same seed. Only the fetching --
// dataset->get_example(i) for every index of a batch -- runs on a pool of std::threads (never
// fork). next() hands the prefetched batch over and immediately queues the following one, so the
// workers load batch k + 1 while the caller trains on batch k. Workers fill the slots of a batch
// in any order; the batch is assembled in index order. get_example must therefore be safe to call
// from several threads at once (TupleDataset's is: it only makes views).
//
// Failures: an exception thrown by get_example is caught in the worker and rethrown from the
// next() that hands over that batch, with the failing dataset index and the batch position in
// the message (the original is nested; kusari error types keep their type). As in Chainer, that
// batch counts as consumed: the following next() goes on with the batch after it.
//
// Shutdown: finalize() (and the destructor) marks queued batches as cancelled, wakes the workers
// and joins them; a worker finishes at most the example it is loading. next() after finalize()
// starts new workers and prefetches again from the current position. reset() and loading a
// snapshot discard any prefetched batch.

/// Like SerialIterator, but examples are fetched by worker threads while the previous batch is
/// in use; see Note [MultithreadIterator prefetch].
class MultithreadIterator : public Iterator {
 public:
  /// The arguments of SerialIterator, plus `n_threads` workers (0: the hardware concurrency).
  /// Threads start at the first next().
  MultithreadIterator(std::shared_ptr<Dataset> dataset, int64_t batch_size, bool repeat = true,
                      bool shuffle = true, std::optional<uint64_t> seed = std::nullopt,
                      int n_threads = 0);
  /// Joins the workers (finalize()), also in the middle of an epoch.
  ~MultithreadIterator() override;
  MultithreadIterator(const MultithreadIterator&) = delete;
  MultithreadIterator& operator=(const MultithreadIterator&) = delete;

  /// The next batch (waiting for the workers if it is not loaded yet); empty once a
  /// non-repeating iterator has finished its epoch. Rethrows a worker's error.
  std::vector<Example> next() override;
  int64_t epoch() const override { return state_.epoch; }
  double epoch_detail() const override { return state_.epoch_detail(dataset_->size()); }
  double previous_epoch_detail() const override { return previous_epoch_detail_; }
  bool is_new_epoch() const override { return state_.is_new_epoch; }
  int64_t batch_size() const override { return batch_size_; }
  bool repeat() const override { return repeat_; }
  /// True when each epoch is visited in a random order.
  bool shuffle() const { return shuffle_; }
  /// Number of worker threads.
  int n_threads() const { return n_threads_; }
  /// Position of the next example within the current epoch's order.
  int64_t current_position() const { return state_.current_position; }
  /// The current epoch's order (empty without shuffling).
  std::vector<int64_t> order() const {
    return state_.order ? *state_.order : std::vector<int64_t>{};
  }
  /// The dataset being iterated.
  const std::shared_ptr<Dataset>& dataset() const { return dataset_; }
  /// Back to epoch 0, position 0, with a new order; drops any prefetched batch.
  void reset() override;
  /// A new shuffle seed, then reset().
  void reseed(uint64_t seed) override;
  /// Stops and joins the worker threads; a later next() starts them again.
  void finalize() override;
  /// Saves or loads the position (Note [Iterator snapshots]); loading drops any prefetched batch.
  void serialize(Serializer& serializer) override;

 private:
  class WorkerPool;
  struct Job;
  /// A batch computed ahead: the state after it and its loading job (null when exhausted).
  struct Prefetch {
    IteratorState next_state;
    std::shared_ptr<Job> job;
  };

  /// Computes the batch after state_ and queues it for the workers.
  void prefetch();
  /// Cancels the prefetched batch, if any.
  void drop_prefetch();

  std::shared_ptr<Dataset> dataset_;
  int64_t batch_size_;
  bool repeat_;
  bool shuffle_;
  int n_threads_;
  IteratorState state_;
  double previous_epoch_detail_ = -1.0;
  std::optional<Prefetch> prefetch_;
  std::unique_ptr<WorkerPool> pool_;
};

}  // namespace kusari
