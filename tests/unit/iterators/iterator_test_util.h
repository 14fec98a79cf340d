// Helpers shared by the iterator tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kusari/datasets/tuple_dataset.h"
#include "kusari/iterators/iterator.h"

namespace kusari::testing {

/// A dataset whose example i is {int64 scalar i}.
inline std::shared_ptr<TupleDataset> ids_dataset(int64_t n) {
  return std::make_shared<TupleDataset>(std::vector<Array>{Array::arange(n, int64, Device::cpu())});
}

/// The ids of a batch drawn from ids_dataset.
inline std::vector<int64_t> ids(const std::vector<Example>& batch) {
  std::vector<int64_t> out;
  for (const Example& e : batch) out.push_back(e.at(0).item<int64_t>());
  return out;
}

/// Draws `steps` batches from both iterators and expects the same ids and epoch bookkeeping.
inline void expect_same_batches(Iterator& a, Iterator& b, int steps) {
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s);
    ASSERT_EQ(ids(a.next()), ids(b.next()));
    ASSERT_EQ(a.epoch(), b.epoch());
    ASSERT_DOUBLE_EQ(a.epoch_detail(), b.epoch_detail());
    ASSERT_DOUBLE_EQ(a.previous_epoch_detail(), b.previous_epoch_detail());
    ASSERT_EQ(a.is_new_epoch(), b.is_new_epoch());
  }
}

}  // namespace kusari::testing
