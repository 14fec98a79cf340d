// SubDataset and dataset splitting (Chainer's SubDataset, split_dataset, split_dataset_random).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "kusari/datasets/dataset.h"

namespace kusari {

// Note [SubDataset order]
// As in Chainer, a SubDataset is the range [start, finish) of the base dataset *after* an optional
// reordering: example i of the subset is base[order[start + i]] (base[start + i] without order).
// The order must have exactly one entry per base example. Two SubDatasets that share one order
// and cover [0, k) and [k, n) therefore partition the base dataset, which is how split_dataset
// and split_dataset_random work. Nothing is copied: examples are fetched from the base on demand.

/// A contiguous range of a (possibly reordered) base dataset; see Note [SubDataset order].
class SubDataset : public Dataset {
 public:
  /// The examples start..finish-1 of `dataset` in `order` (identity order when empty).
  /// Requires 0 <= start <= finish <= dataset->size(), and order (when given) of length
  /// dataset->size() with entries in [0, dataset->size()).
  SubDataset(std::shared_ptr<Dataset> dataset, int64_t start, int64_t finish,
             std::vector<int64_t> order = {});

  /// finish - start.
  int64_t size() const override { return finish_ - start_; }
  /// The example at position start + i of the order; a negative i counts from the end.
  Example get_example(int64_t i) const override;
  /// Maps the indices to base indices and asks the base dataset for all of them at once.
  std::vector<Example> get_examples(const std::vector<int64_t>& indices) const override;

  /// The dataset this one is a part of.
  const std::shared_ptr<Dataset>& base() const { return dataset_; }
  int64_t start() const { return start_; }
  int64_t finish() const { return finish_; }
  /// The order over the base dataset (empty for the identity order).
  const std::vector<int64_t>& order() const { return *order_; }
  /// The index in the base dataset of example i of this one.
  int64_t base_index(int64_t i) const;

 private:
  std::shared_ptr<Dataset> dataset_;
  int64_t start_;
  int64_t finish_;
  std::shared_ptr<const std::vector<int64_t>> order_;
};

/// Two SubDatasets of the same type: the first and the rest.
using SubDatasetPair = std::pair<std::shared_ptr<SubDataset>, std::shared_ptr<SubDataset>>;

/// Splits `dataset` into its first `first_size` examples and the rest, in `order` (identity when
/// empty). Requires 0 <= first_size <= dataset->size().
SubDatasetPair split_dataset(std::shared_ptr<Dataset> dataset, int64_t first_size,
                             std::vector<int64_t> order = {});

/// Splits `dataset` into two random disjoint subsets of first_size and size - first_size examples.
/// The permutation is drawn from a Generator seeded with `seed` (with the default generator's
/// next_uint64() when absent), so a fixed seed gives the same split on every run.
SubDatasetPair split_dataset_random(std::shared_ptr<Dataset> dataset, int64_t first_size,
                                    std::optional<uint64_t> seed = std::nullopt);

}  // namespace kusari
