#include "kusari/datasets/convert.h"

#include <algorithm>

#include "kusari/core/routines.h"

namespace kusari {
namespace {

// Note [Batches that are rows of one array]
// A loader that makes whole batches (ImageLoader, and a SerialIterator over a TupleDataset
// without shuffling) yields examples whose arrays are consecutive rows of one array; stacking
// them row by row would copy each through the host, which for rows on a GPU is one device-to-host
// copy per example. When the arrays in one position are contiguous views of one allocation, of
// one dtype and shape, each starting where the one before ends, the batch is copied in one piece
// instead (still a fresh array, as stacking gives).
std::optional<Array> rows_of_one_array(const std::vector<Example>& batch, size_t k) {
  const Array& first = batch[0][k];
  if (!first.is_contiguous()) return std::nullopt;
  const int64_t row = first.size();
  for (size_t i = 1; i < batch.size(); ++i) {
    const Array& a = batch[i][k];
    if (!a.shares_memory_with(first) || a.dtype() != first.dtype() || a.shape() != first.shape() ||
        !a.is_contiguous() || a.offset() != first.offset() + static_cast<int64_t>(i) * row) {
      return std::nullopt;
    }
  }
  Shape shape = first.shape();
  shape.insert(0, static_cast<int64_t>(batch.size()));
  return first.as_strided(shape, contiguous_strides(shape), first.offset());
}

}  // namespace

std::vector<Array> concat_examples(const std::vector<Example>& batch, Device device, std::optional<Scalar> padding) {
  KUSARI_CHECK(!batch.empty(), ValueError, "concat_examples: the batch is empty");
  const size_t width = batch[0].size();
  std::vector<Array> out;
  out.reserve(width);
  for (size_t k = 0; k < width; ++k) {
    const Array& first = batch[0][k];
    Shape shape = first.shape();
    for (size_t i = 0; i < batch.size(); ++i) {
      KUSARI_CHECK(batch[i].size() == width, ValueError, "concat_examples: example ", i, " has ", batch[i].size(),
                   " arrays but example 0 has ", width);
      const Array& a = batch[i][k];
      KUSARI_CHECK(a.dtype() == first.dtype(), DtypeError, "concat_examples: array ", k, " of example ", i, " is ",
                   dtype_name(a.dtype()), " but in example 0 it is ", dtype_name(first.dtype()));
      if (a.shape() != shape) {
        KUSARI_CHECK(padding && a.ndim() == shape.size(), ShapeError, "concat_examples: array ", k, " of example ", i,
                     " has shape ", a.shape(), " but in example 0 it has shape ", first.shape(),
                     " (give a padding value to pad them to one shape)");
        for (int d = 0; d < shape.size(); ++d) shape[d] = std::max(shape[d], a.shape()[d]);
      }
    }
    if (shape == first.shape()) {
      if (std::optional<Array> rows = rows_of_one_array(batch, k)) {
        out.push_back(rows->device() == device ? rows->copy() : rows->to_device(device));
        continue;
      }
    }
    Shape bshape = shape;
    bshape.insert(0, static_cast<int64_t>(batch.size()));
    // Stack on the host, then move the whole batch at once.
    Array stacked = padding ? Array::full(bshape, *padding, first.dtype(), Device::cpu())
                            : Array::empty(bshape, first.dtype(), Device::cpu());
    for (size_t i = 0; i < batch.size(); ++i) {
      Array src = batch[i][k].to_device(Device::cpu());
      std::vector<Index> idx{static_cast<int64_t>(i)};
      for (int d = 0; d < src.ndim(); ++d) idx.emplace_back(Slice(0, src.shape()[d]));
      Array dst = stacked.at(idx);
      dst.assign(src);
    }
    out.push_back(stacked.to_device(device));
  }
  return out;
}

}  // namespace kusari
