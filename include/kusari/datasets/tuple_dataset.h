// TupleDataset: a dataset made of arrays that share their first axis (Chainer's TupleDataset).
#pragma once

#include <cstdint>
#include <vector>

#include "kusari/datasets/dataset.h"

namespace kusari {

/// Zips arrays along their first axis: example i is {columns[0][i], columns[1][i], ...}, each a
/// view into the column (no copy). Typical use: TupleDataset({images (N, 784), labels (N,)}).
class TupleDataset : public Dataset {
 public:
  /// Takes at least one column; every column must have at least one axis, and all columns the
  /// same length along it.
  explicit TupleDataset(std::vector<Array> columns);

  /// Number of examples (the common length of the first axis).
  int64_t size() const override { return size_; }
  /// {columns[k][i] for every k}; a negative i counts from the end (as in Chainer).
  Example get_example(int64_t i) const override;
  /// The arrays this dataset zips.
  const std::vector<Array>& columns() const { return columns_; }
  /// Column k (0 <= k < width()).
  const Array& column(size_t k) const;
  /// Number of arrays in each example.
  size_t width() const { return columns_.size(); }

 private:
  std::vector<Array> columns_;
  int64_t size_ = 0;
};

}  // namespace kusari
