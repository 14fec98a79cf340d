// The bookkeeping shared by SerialIterator and MultithreadIterator: where an iterator stands and
// the step that moves it (Chainer's IteratorState and iterator_statemachine).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kusari/core/random.h"
#include "kusari/serializers/serializer.h"

namespace kusari {

// Note [Iterator state machine]
// Chainer's rule, kept exactly so that epoch counts, epoch_detail and batch contents match:
// with n examples per epoch, position i and batch size b, a step covers order[i : i + b].
//  - repeat: when i + b reaches n, the batch takes order[i : n], a new order is drawn (when
//    shuffling), and the batch is filled from the start of the new order. Each wrap adds one epoch
//    and sets is_new_epoch. (Chainer repeats the wrap while the batch still reaches past an
//    epoch, b > n; kusari's iterators refuse b > n when repeating, see Note [Batch larger than
//    the dataset].)
//  - no repeat: the batch stops at n (the last batch may be short), the epoch count becomes 1, and
//    every later step yields nothing.
// is_new_epoch is true exactly after a step that wrapped; epoch_detail = epoch + i / n. With
// n = 10, b = 3, repeat: epoch_detail goes 0.3, 0.6, 0.9, 1.2 and the 4th batch is the first
// with is_new_epoch. A new order is drawn at every wrap -- also at the end of a non-repeating
// epoch, as Chainer does -- so two iterators with the same generator draw the same orders.
//
// The generator is part of the state (it is two integers), not of the iterator: a
// MultithreadIterator computes the next state ahead of time to prefetch, and carrying the
// generator in the state keeps the committed state -- what serialize() saves -- consistent with
// what a SerialIterator would hold at the same point.

// Note [Batch larger than the dataset]
// Chainer accepts a repeating iterator whose batch is larger than the dataset: one batch then
// wraps several times, and `epoch` jumps by several at one step (a 7-example set with b = 100
// goes from epoch 0 to 14 at the first batch). No stop trigger can then stop at the epoch asked
// for -- the count has already passed it -- and the log reports epochs that were never trained
// one at a time (`-e 1` with 2,000 examples and b = 100000 logs epoch 50). Such a batch is almost
// always a mistake (a per-process batch after scatter_dataset shrank the shards, a typo), so
// SerialIterator and MultithreadIterator refuse batch_size > dataset size when repeating, naming
// both. With b <= n a step wraps at most once, epoch_detail grows by at most 1 per step, and
// IntervalTrigger(p, "epoch") with a whole p fires exactly when epoch reaches p. Without repeat
// a large batch is fine (one short batch holds the whole set, as for evaluation).

/// Where an iterator stands (see Note [Iterator state machine]).
struct IteratorState {
  /// Position of the next example in the current epoch's order.
  int64_t current_position = 0;
  /// Completed epochs.
  int64_t epoch = 0;
  /// True when the last step finished an epoch.
  bool is_new_epoch = false;
  /// The current epoch's order of dataset indices; null for the identity order (no shuffling).
  std::shared_ptr<const std::vector<int64_t>> order;
  /// Draws the order of the next epoch.
  Generator generator;

  /// Examples per epoch: the order's length, or `dataset_size` without an order.
  int64_t epoch_size(int64_t dataset_size) const {
    return order ? static_cast<int64_t>(order->size()) : dataset_size;
  }
  /// epoch + current_position / epoch_size (just epoch for an empty dataset).
  double epoch_detail(int64_t dataset_size) const;
};

/// The state of a fresh iterator: position 0, epoch 0, and (when shuffling) an order drawn from
/// `generator`.
IteratorState initial_iterator_state(Generator generator, bool shuffle, int64_t dataset_size);

/// One step of Note [Iterator state machine]: advances `state` and returns the dataset indices of
/// the batch, or nullopt when a non-repeating iterator has already finished its epoch. `fn` names
/// the iterator in errors.
std::optional<std::vector<int64_t>> advance_iterator_state(IteratorState& state, int64_t batch_size,
                                                           bool repeat, int64_t dataset_size,
                                                           const char* fn);

// Note [Iterator snapshots]
// serialize() writes Chainer's keys: "current_position", "epoch", "is_new_epoch",
// "previous_epoch_detail" (-1 before the first batch) and, when shuffling, the order as an int64
// array under "order" (SerialIterator) or "_order" (MultithreadIterator); loading accepts either
// key. Chainer does not save its random state, so after loading its next epoch is shuffled
// differently; kusari also saves "generator_seed" and "generator_offset" (uint64 bit patterns in
// int64 arrays) so that a resumed iterator yields the same batches in every later epoch too. A
// snapshot without them (e.g. from Chainer) keeps the loading iterator's own generator, and one
// without "previous_epoch_detail" gets Chainer's estimate of it.

/// Saves or loads an iterator's state under the keys of Note [Iterator snapshots]. `order_key` is
/// the key to save the order under; `fn` names the iterator in errors.
void serialize_iterator_state(Serializer& serializer, IteratorState& state,
                              double& previous_epoch_detail, int64_t batch_size, bool shuffle,
                              int64_t dataset_size, const char* order_key, const char* fn);

}  // namespace kusari
