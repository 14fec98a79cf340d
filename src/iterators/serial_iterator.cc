#include "kusari/iterators/serial_iterator.h"

#include "kusari/core/error.h"

namespace kusari {

SerialIterator::SerialIterator(std::shared_ptr<Dataset> dataset, int64_t batch_size, bool repeat,
                               bool shuffle, std::optional<uint64_t> seed)
    : dataset_(std::move(dataset)), batch_size_(batch_size), repeat_(repeat), shuffle_(shuffle) {
  KUSARI_CHECK(dataset_, ValueError, "SerialIterator: the dataset is null");
  KUSARI_CHECK(batch_size_ > 0, ValueError, "SerialIterator: batch_size must be positive, got ",
               batch_size_);
  KUSARI_CHECK(!repeat_ || dataset_->size() > 0, ValueError,
               "SerialIterator: the dataset is empty; a repeating iterator needs examples");
  // Note [Batch larger than the dataset]
  KUSARI_CHECK(!repeat_ || batch_size_ <= dataset_->size(), ValueError,
               "SerialIterator: batch_size ", batch_size_, " is larger than the dataset (",
               dataset_->size(),
               " examples); a repeating iterator would cover several epochs in one batch. Use a "
               "batch_size of at most ",
               dataset_->size(), ", or repeat=false");
  state_.generator = Generator(seed ? *seed : default_generator().next_uint64());
  reset();
}

std::vector<Example> SerialIterator::next() {
  const double before = epoch_detail();
  std::optional<std::vector<int64_t>> indices =
      advance_iterator_state(state_, batch_size_, repeat_, dataset_->size(), "SerialIterator");
  previous_epoch_detail_ = before;
  if (!indices || indices->empty()) return {};
  return dataset_->get_examples(*indices);
}

void SerialIterator::reset() {
  state_ = initial_iterator_state(state_.generator, shuffle_, dataset_->size());
  previous_epoch_detail_ = -1.0;
}

void SerialIterator::reseed(uint64_t seed) {
  state_.generator = Generator(seed);
  reset();
}

void SerialIterator::serialize(Serializer& serializer) {
  serialize_iterator_state(serializer, state_, previous_epoch_detail_, batch_size_, shuffle_,
                           dataset_->size(), "order", "SerialIterator");
}

}  // namespace kusari
