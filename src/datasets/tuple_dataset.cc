#include "kusari/datasets/tuple_dataset.h"

#include "kusari/core/error.h"

namespace kusari {

TupleDataset::TupleDataset(std::vector<Array> columns) : columns_(std::move(columns)) {
  KUSARI_CHECK(!columns_.empty(), ValueError,
               "TupleDataset: no columns were given (it needs at least one array)");
  for (size_t k = 0; k < columns_.size(); ++k) {
    const Array& c = columns_[k];
    KUSARI_CHECK(c.defined(), ValueError, "TupleDataset: column ", k, " is an undefined array");
    KUSARI_CHECK(c.ndim() >= 1, ShapeError, "TupleDataset: column ", k,
                 " is 0-d; every column needs a first axis to index examples along");
    KUSARI_CHECK(c.shape()[0] == columns_[0].shape()[0], ShapeError, "TupleDataset: column ", k,
                 " has shape ", c.shape(), " (", c.shape()[0], " examples) but column 0 has shape ",
                 columns_[0].shape(), " (", columns_[0].shape()[0],
                 " examples); all columns must have the same length");
  }
  size_ = columns_[0].shape()[0];
}

Example TupleDataset::get_example(int64_t i) const {
  KUSARI_CHECK(i >= -size_ && i < size_, IndexError, "TupleDataset::get_example: index ", i,
               " is out of range for a dataset of ", size_, " examples");
  if (i < 0) i += size_;
  Example out;
  out.reserve(columns_.size());
  for (const Array& c : columns_) out.push_back(c[i]);
  return out;
}

const Array& TupleDataset::column(size_t k) const {
  KUSARI_CHECK(k < columns_.size(), IndexError, "TupleDataset::column: index ", k,
               " is out of range (the dataset has ", columns_.size(), " columns)");
  return columns_[k];
}

}  // namespace kusari
