#include "kusari/datasets/dataset.h"

#include "kusari/iterators/iterator.h"

namespace kusari {

std::vector<Example> Dataset::get_examples(const std::vector<int64_t>& indices) const {
  std::vector<Example> out;
  out.reserve(indices.size());
  for (int64_t i : indices) out.push_back(get_example(i));
  return out;
}

void Iterator::reseed(uint64_t) {
  KUSARI_THROW(NotImplementedError, "this iterator cannot be reseeded");
}

}  // namespace kusari
