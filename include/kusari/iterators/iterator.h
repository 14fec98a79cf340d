// Iterators: draw minibatches from a dataset, epoch after epoch (Chainer's Iterator protocol).
#pragma once

#include <vector>

#include "kusari/datasets/dataset.h"
#include "kusari/serializers/serializer.h"

namespace kusari {

/// Yields batches of examples and tracks epochs. The position is serializable, so a resumed
/// training run continues with the same batches.
class Iterator : public Serializable {
 public:
  ~Iterator() override = default;
  /// The next batch; empty once a non-repeating iterator has gone through its dataset.
  virtual std::vector<Example> next() = 0;
  /// Completed epochs.
  virtual int64_t epoch() const = 0;
  /// Epochs as a real number (epoch + fraction of the current one).
  virtual double epoch_detail() const = 0;
  /// epoch_detail() before the last next() (negative before the first).
  virtual double previous_epoch_detail() const = 0;
  /// True when the last next() finished an epoch.
  virtual bool is_new_epoch() const = 0;
  virtual int64_t batch_size() const = 0;
  virtual bool repeat() const = 0;
  /// Starts over from the beginning (first epoch, fresh order).
  virtual void reset() = 0;
  /// Reseeds the shuffle and starts over (used to give several processes the same order).
  virtual void reseed(uint64_t seed);
  /// Releases resources (threads); called by the updater at the end of training.
  virtual void finalize() {}
};

}  // namespace kusari
