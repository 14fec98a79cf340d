// Datasets: indexable collections of examples (Chainer's dataset protocol).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kusari/core/array.h"

namespace kusari {

/// One example: a tuple of arrays, e.g. {image (784,), label ()}.
using Example = std::vector<Array>;

/// A random-access collection of examples.
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// Number of examples.
  virtual int64_t size() const = 0;
  /// Example i (0 <= i < size()); arrays may be views into the dataset's storage.
  virtual Example get_example(int64_t i) const = 0;
  /// Several examples; the default calls get_example for each index.
  virtual std::vector<Example> get_examples(const std::vector<int64_t>& indices) const;
};

}  // namespace kusari
