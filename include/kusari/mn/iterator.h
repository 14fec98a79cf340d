// An iterator whose place in the data survives a restart on another number of processes
// (elastic training, docs/elastic.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kusari/iterators/iterator.h"
#include "kusari/iterators/iterator_state.h"
#include "kusari/mn/communicator.h"

namespace kusari::mn {

/// What a DistributedIterator keeps when a snapshot written by N processes is loaded by M.
enum class ElasticBatch {
  /// The global batch (every process's examples of one step together) stays; each process then
  /// takes global / M examples per step, and a run needs as many steps as an uninterrupted one.
  kKeepGlobal,
  /// Each process's batch stays; the global batch becomes M times it, with fewer steps per epoch.
  /// learning_rate_factor() then tells by how much to scale the learning rate (the linear rule).
  kKeepPerProcess,
};

/// Options of a DistributedIterator.
struct DistributedIteratorOptions {
  /// Visit each epoch in a new random order (the same on every process).
  bool shuffle = true;
  /// Seeds the order; absent: rank 0 draws one from its default generator and sends it to all.
  std::optional<uint64_t> seed;
  /// The policy on a change of the number of processes (see ElasticBatch).
  ElasticBatch resize = ElasticBatch::kKeepGlobal;
};

/// Batches of a data-parallel job drawn from one order of the whole dataset that every process
/// shares, each process taking its part of every global batch.
///
/// Note [Distributed iterator]
/// scatter_dataset gives each process a shard and its own SerialIterator; the position of such a
/// job is N positions in N shards, which mean nothing to a job of M processes. Here every process
/// holds the whole dataset (each loads it, or receives it whole) and runs the same state machine
/// as SerialIterator (Note [Iterator state machine]) over the whole dataset with the global batch
/// B: the order, the position and the epoch count are the same on every process, and so is
/// every saved state. Process r of M takes examples [floor(B r / M), floor(B (r + 1) / M)) of
/// each global batch, so together the processes see every example of an epoch exactly once (the
/// last batch of an epoch is filled from the next order, as SerialIterator's is). A snapshot
/// holds the global state plus the global batch and the number of processes that wrote it;
/// loaded by M processes the next batches are the next examples of the same order, split M ways,
/// so no example of the interrupted epoch is seen twice or skipped. ElasticBatch says whether B or
/// the per-process batch b stays (B = M b); when B is not a multiple of M the processes' parts
/// differ by one example. The iterator always repeats (it is for training: evaluate with
/// scatter_dataset and a SerialIterator).
class DistributedIterator : public Iterator {
 public:
  /// Iterates over `dataset` (the whole dataset, on every process) with `batch_size` examples
  /// per process per step. Collective when the seed is not given (rank 0 broadcasts one).
  DistributedIterator(std::shared_ptr<Dataset> dataset, int64_t batch_size,
                      const std::shared_ptr<Communicator>& comm, DistributedIteratorOptions options = {});
  /// The same for process `rank` of `size`, without a communicator (options.seed is then needed
  /// when shuffling, so that the processes agree).
  DistributedIterator(std::shared_ptr<Dataset> dataset, int64_t batch_size, int rank, int size,
                      DistributedIteratorOptions options);

  /// This process's part of the next global batch.
  std::vector<Example> next() override;
  /// This process's part of the next global batch, as dataset indices (what next() fetches).
  std::vector<int64_t> next_indices();
  int64_t epoch() const override { return state_.epoch; }
  double epoch_detail() const override { return state_.epoch_detail(dataset_->size()); }
  double previous_epoch_detail() const override { return previous_epoch_detail_; }
  bool is_new_epoch() const override { return state_.is_new_epoch; }
  /// This process's examples per step.
  int64_t batch_size() const override;
  bool repeat() const override { return true; }
  /// Every process's examples of one step together.
  int64_t global_batch_size() const { return global_batch_; }
  /// The global batch of the job's first start (kept through every resize).
  int64_t initial_global_batch_size() const { return initial_global_batch_; }
  /// global_batch_size() / initial_global_batch_size(): with ElasticBatch::kKeepPerProcess, the
  /// factor by which the linear scaling rule scales the learning rate after a resize (1 with
  /// kKeepGlobal).
  double learning_rate_factor() const;
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// The number of processes that wrote the state last loaded (size() when none was loaded).
  int loaded_size() const { return loaded_size_; }
  /// Position of the next example within the current epoch's (global) order.
  int64_t current_position() const { return state_.current_position; }
  const std::shared_ptr<Dataset>& dataset() const { return dataset_; }
  /// Back to epoch 0, position 0, with a new order.
  void reset() override;
  /// A new shuffle seed (use the same on every process), then reset().
  void reseed(uint64_t seed) override;
  /// Saves or loads the global state (Note [Iterator snapshots] keys, plus "global_batch_size",
  /// "initial_global_batch_size" and "size"); a state of another number of processes is
  /// continued as Note [Distributed iterator] says.
  void serialize(Serializer& serializer) override;

 private:
  void init(uint64_t seed);

  std::shared_ptr<Dataset> dataset_;
  int64_t per_process_batch_;
  int rank_;
  int size_;
  DistributedIteratorOptions options_;
  int64_t global_batch_;
  int64_t initial_global_batch_;
  int loaded_size_;
  IteratorState state_;
  double previous_epoch_detail_ = -1.0;
};

}  // namespace kusari::mn
