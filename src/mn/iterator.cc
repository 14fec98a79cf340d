#include "kusari/mn/iterator.h"

#include <cstring>

#include "kusari/core/error.h"

namespace kusari::mn {
namespace {

constexpr const char* kName = "DistributedIterator";

/// Rank 0's seed (its given one, or a draw of its default generator) on every rank.
uint64_t agreed_seed(const DistributedIteratorOptions& options, Communicator& comm) {
  const uint64_t mine = options.seed ? *options.seed : default_generator().next_uint64();
  Bytes bytes(sizeof(uint64_t));
  std::memcpy(bytes.data(), &mine, sizeof(mine));
  bytes = comm.bcast_obj(bytes, 0);
  uint64_t seed = 0;
  KUSARI_ASSERT(bytes.size() == sizeof(seed));
  std::memcpy(&seed, bytes.data(), sizeof(seed));
  return seed;
}

}  // namespace

DistributedIterator::DistributedIterator(std::shared_ptr<Dataset> dataset, int64_t batch_size,
                                         const std::shared_ptr<Communicator>& comm,
                                         DistributedIteratorOptions options)
    : dataset_(std::move(dataset)),
      per_process_batch_(batch_size),
      rank_(detail::communicator_of(comm, kName).rank()),
      size_(comm->size()),
      options_(options) {
  init(agreed_seed(options_, *comm));
}

DistributedIterator::DistributedIterator(std::shared_ptr<Dataset> dataset, int64_t batch_size, int rank,
                                         int size, DistributedIteratorOptions options)
    : dataset_(std::move(dataset)), per_process_batch_(batch_size), rank_(rank), size_(size), options_(options) {
  KUSARI_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, ValueError, kName, ": rank ", rank_, " of ", size_,
               " processes; expected 0 <= rank < size");
  KUSARI_CHECK(options_.seed || !options_.shuffle, ValueError, kName,
               ": without a communicator the processes agree on the order only through a seed; give "
               "DistributedIteratorOptions::seed (the same on every process)");
  init(options_.seed.value_or(0));
}

void DistributedIterator::init(uint64_t seed) {
  KUSARI_CHECK(dataset_, ValueError, kName, ": the dataset is null");
  KUSARI_CHECK(per_process_batch_ > 0, ValueError, kName, ": batch_size must be positive, got ",
               per_process_batch_);
  global_batch_ = per_process_batch_ * size_;
  initial_global_batch_ = global_batch_;
  loaded_size_ = size_;
  // Note [Batch larger than the dataset]
  KUSARI_CHECK(global_batch_ <= dataset_->size(), ValueError, kName, ": the global batch of ", size_,
               " processes x ", per_process_batch_, " = ", global_batch_, " examples is larger than the dataset (",
               dataset_->size(), " examples); give every process the whole dataset, or a smaller batch_size");
  state_.generator = Generator(seed);
  reset();
}

int64_t DistributedIterator::batch_size() const {
  return global_batch_ * (rank_ + 1) / size_ - global_batch_ * rank_ / size_;
}

double DistributedIterator::learning_rate_factor() const {
  return static_cast<double>(global_batch_) / static_cast<double>(initial_global_batch_);
}

std::vector<int64_t> DistributedIterator::next_indices() {
  const double before = epoch_detail();
  std::optional<std::vector<int64_t>> global =
      advance_iterator_state(state_, global_batch_, true, dataset_->size(), kName);
  previous_epoch_detail_ = before;
  KUSARI_ASSERT(global && static_cast<int64_t>(global->size()) == global_batch_);
  const int64_t begin = global_batch_ * rank_ / size_;
  const int64_t end = global_batch_ * (rank_ + 1) / size_;
  return std::vector<int64_t>(global->begin() + begin, global->begin() + end);
}

std::vector<Example> DistributedIterator::next() { return dataset_->get_examples(next_indices()); }

void DistributedIterator::reset() {
  state_ = initial_iterator_state(state_.generator, options_.shuffle, dataset_->size());
  previous_epoch_detail_ = -1.0;
}

void DistributedIterator::reseed(uint64_t seed) {
  state_.generator = Generator(seed);
  reset();
}

void DistributedIterator::serialize(Serializer& serializer) {
  if (!serializer.is_loading()) {
    int64_t global = global_batch_, initial = initial_global_batch_, size = size_;
    serializer("global_batch_size", global);
    serializer("initial_global_batch_size", initial);
    serializer("size", size);
    serialize_iterator_state(serializer, state_, previous_epoch_detail_, global_batch_, options_.shuffle,
                             dataset_->size(), "order", kName);
    return;
  }
  for (const char* key : {"global_batch_size", "initial_global_batch_size", "size"}) {
    KUSARI_CHECK(serializer.contains(key), ValueError, kName, "::serialize: the snapshot at '", serializer.path(),
                 "' has no '", key, "'; was it saved by another kind of iterator (a SerialIterator over a "
                 "scatter_dataset shard)? A DistributedIterator resumes only from its own state");
  }
  int64_t saved_global = 0, initial = 0, saved_size = 0;
  serializer("global_batch_size", saved_global);
  serializer("initial_global_batch_size", initial);
  serializer("size", saved_size);
  KUSARI_CHECK(saved_global > 0 && initial > 0 && saved_size > 0, ValueError, kName, "::serialize: the snapshot at '",
               serializer.path(), "' has global_batch_size ", saved_global, ", initial_global_batch_size ", initial,
               " and size ", saved_size, "; expected positive numbers");
  const int64_t global =
      options_.resize == ElasticBatch::kKeepGlobal ? saved_global : per_process_batch_ * size_;
  KUSARI_CHECK(global >= size_ && global <= dataset_->size(), ValueError, kName, "::serialize: the snapshot at '",
               serializer.path(), "' was written by ", saved_size, " processes with a global batch of ", saved_global,
               "; on ", size_, " processes the global batch would be ", global, ", and it must be at least the number "
               "of processes and at most the dataset's ", dataset_->size(), " examples");
  serialize_iterator_state(serializer, state_, previous_epoch_detail_, saved_global, options_.shuffle,
                           dataset_->size(), "order", kName);
  global_batch_ = global;
  initial_global_batch_ = initial;
  loaded_size_ = static_cast<int>(saved_size);
}

}  // namespace kusari::mn
