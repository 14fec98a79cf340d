#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <vector>

#include "kusari/datasets/convert.h"
#include "kusari/datasets/permutation.h"
#include "kusari/datasets/sub_dataset.h"
#include "kusari/datasets/tuple_dataset.h"
#include "test_util.h"

namespace kusari {
namespace {

std::shared_ptr<TupleDataset> make_range_dataset(int64_t n) {
  Array x =
      Array::arange(0.0, static_cast<double>(2 * n), 1.0, float32, Device::cpu()).reshape({n, 2});
  Array t = Array::arange(n, int32, Device::cpu());
  return std::make_shared<TupleDataset>(std::vector<Array>{x, t});
}

int64_t label_of(const Example& e) {
  return e[1].item<int64_t>();
}

TEST(TupleDatasetTest, ExamplesAreViewsOfTheColumns) {
  auto ds = make_range_dataset(5);
  EXPECT_EQ(ds->size(), 5);
  EXPECT_EQ(ds->width(), 2u);
  Example e = ds->get_example(3);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].shape(), (Shape{2}));
  EXPECT_EQ(e[0].to_vector<float>(), (std::vector<float>{6, 7}));
  EXPECT_EQ(e[1].ndim(), 0);
  EXPECT_EQ(e[1].dtype(), int32);
  EXPECT_EQ(e[1].item<int32_t>(), 3);
  EXPECT_TRUE(e[0].shares_memory_with(ds->column(0)));
  // Negative indices count from the end, as in Chainer.
  EXPECT_EQ(label_of(ds->get_example(-1)), 4);
  EXPECT_EQ(label_of(ds->get_example(-5)), 0);
}

TEST(TupleDatasetTest, GetExamplesMatchesGetExample) {
  auto ds = make_range_dataset(6);
  std::vector<Example> batch = ds->get_examples({4, 0, 4, 2});
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(label_of(batch[0]), 4);
  EXPECT_EQ(label_of(batch[1]), 0);
  EXPECT_EQ(label_of(batch[2]), 4);
  EXPECT_EQ(label_of(batch[3]), 2);
  std::vector<Array> arrays = concat_examples(batch);
  EXPECT_EQ(arrays[0].shape(), (Shape{4, 2}));
  EXPECT_EQ(arrays[1].to_vector<int32_t>(), (std::vector<int32_t>{4, 0, 4, 2}));
}

TEST(ConcatExamplesTest, RowsOfOneArrayAreCopiedInOnePieceIntoAFreshArray) {
  auto ds = make_range_dataset(6);
  // Consecutive rows (Note [Batches that are rows of one array]) and the same rows out of order.
  for (const std::vector<int64_t>& order : {std::vector<int64_t>{1, 2, 3, 4}, {4, 0, 4, 2}}) {
    const std::vector<Example> batch = ds->get_examples(order);
    const std::vector<Array> arrays = concat_examples(batch);
    ASSERT_EQ(arrays[0].shape(), (Shape{4, 2}));
    EXPECT_TRUE(arrays[0].is_contiguous());
    for (size_t i = 0; i < order.size(); ++i) {
      EXPECT_TRUE(array_equal(arrays[0][static_cast<int64_t>(i)], batch[i][0]));
      EXPECT_FALSE(arrays[0].shares_memory_with(batch[i][0]));
    }
    std::vector<int32_t> labels(order.begin(), order.end());
    EXPECT_EQ(arrays[1].to_vector<int32_t>(), labels);
  }
}

TEST(TupleDatasetTest, RejectsBadColumnsAndIndices) {
  EXPECT_THROW(TupleDataset(std::vector<Array>{}), ValueError);
  EXPECT_THROW(TupleDataset({Array()}), ValueError);
  EXPECT_THROW(TupleDataset({Array::scalar(1.0)}), ShapeError);
  try {
    TupleDataset({Array::zeros({3, 2}), Array::zeros({4})});
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("same length"), std::string::npos) << e.what();
  }
  auto ds = make_range_dataset(3);
  EXPECT_THROW(ds->get_example(3), IndexError);
  EXPECT_THROW(ds->get_example(-4), IndexError);
  EXPECT_THROW(ds->column(2), IndexError);
}

TEST(SubDatasetTest, RangeWithoutOrder) {
  auto base = make_range_dataset(10);
  SubDataset sub(base, 2, 7);
  EXPECT_EQ(sub.size(), 5);
  EXPECT_EQ(label_of(sub.get_example(0)), 2);
  EXPECT_EQ(label_of(sub.get_example(4)), 6);
  EXPECT_EQ(label_of(sub.get_example(-1)), 6);
  EXPECT_EQ(label_of(sub.get_example(-5)), 2);
  EXPECT_THROW(sub.get_example(5), IndexError);
  EXPECT_THROW(sub.get_example(-6), IndexError);
  std::vector<Example> batch = sub.get_examples({1, -1});
  EXPECT_EQ(label_of(batch[0]), 3);
  EXPECT_EQ(label_of(batch[1]), 6);
}

TEST(SubDatasetTest, RangeOfAnOrder) {
  auto base = make_range_dataset(5);
  SubDataset sub(base, 1, 4, {4, 3, 2, 1, 0});
  EXPECT_EQ(sub.size(), 3);
  EXPECT_EQ(label_of(sub.get_example(0)), 3);
  EXPECT_EQ(label_of(sub.get_example(2)), 1);
  EXPECT_EQ(label_of(sub.get_example(-1)), 1);
  EXPECT_EQ(sub.base_index(1), 2);
  // A SubDataset of a SubDataset composes.
  auto inner = std::make_shared<SubDataset>(base, 1, 4, std::vector<int64_t>{4, 3, 2, 1, 0});
  SubDataset outer(inner, 1, 3);
  EXPECT_EQ(label_of(outer.get_example(0)), 2);
  EXPECT_EQ(label_of(outer.get_example(1)), 1);
}

TEST(SubDatasetTest, RejectsBadArguments) {
  auto base = make_range_dataset(5);
  EXPECT_THROW(SubDataset(nullptr, 0, 1), ValueError);
  EXPECT_THROW(SubDataset(base, -1, 3), ValueError);
  EXPECT_THROW(SubDataset(base, 0, 6), ValueError);
  EXPECT_THROW(SubDataset(base, 3, 2), ValueError);
  EXPECT_THROW(SubDataset(base, 0, 2, {0, 1, 2}), ValueError);        // order of the wrong length
  EXPECT_THROW(SubDataset(base, 0, 2, {0, 1, 2, 3, 5}), IndexError);  // entry out of range
  EXPECT_NO_THROW(SubDataset(base, 5, 5));
  EXPECT_EQ(SubDataset(base, 5, 5).size(), 0);
}

TEST(SplitDatasetTest, SplitsAtFirstSize) {
  auto base = make_range_dataset(10);
  auto [a, b] = split_dataset(base, 3);
  EXPECT_EQ(a->size(), 3);
  EXPECT_EQ(b->size(), 7);
  EXPECT_EQ(label_of(a->get_example(2)), 2);
  EXPECT_EQ(label_of(b->get_example(0)), 3);
  auto [c, d] = split_dataset(base, 2, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  EXPECT_EQ(label_of(c->get_example(0)), 9);
  EXPECT_EQ(label_of(d->get_example(0)), 7);
  auto [e, f] = split_dataset(base, 0);
  EXPECT_EQ(e->size(), 0);
  EXPECT_EQ(f->size(), 10);
  EXPECT_THROW(split_dataset(base, -1), ValueError);
  EXPECT_THROW(split_dataset(base, 11), ValueError);
  EXPECT_THROW(split_dataset(nullptr, 0), ValueError);
}

TEST(SplitDatasetTest, RandomSplitIsADeterministicPartition) {
  auto base = make_range_dataset(50);
  auto [a, b] = split_dataset_random(base, 20, 7);
  EXPECT_EQ(a->size(), 20);
  EXPECT_EQ(b->size(), 30);
  std::set<int64_t> seen;
  for (int64_t i = 0; i < a->size(); ++i) seen.insert(label_of(a->get_example(i)));
  for (int64_t i = 0; i < b->size(); ++i) seen.insert(label_of(b->get_example(i)));
  EXPECT_EQ(seen.size(), 50u);
  EXPECT_EQ(a->order(), b->order());
  std::vector<int64_t> identity(50);
  for (int64_t i = 0; i < 50; ++i) identity[i] = i;
  EXPECT_NE(a->order(), identity);
  // The same seed gives the same split; another seed another one.
  auto [a2, b2] = split_dataset_random(base, 20, 7);
  EXPECT_EQ(a2->order(), a->order());
  auto [a3, b3] = split_dataset_random(base, 20, 8);
  EXPECT_NE(a3->order(), a->order());
  // Without a seed the default generator decides, so manual_seed makes it reproducible.
  manual_seed(123);
  auto [a4, b4] = split_dataset_random(base, 20);
  manual_seed(123);
  auto [a5, b5] = split_dataset_random(base, 20);
  EXPECT_EQ(a4->order(), a5->order());
  EXPECT_THROW(split_dataset_random(base, 51, 1), ValueError);
}

TEST(PermutationTest, IsAUniformPermutation) {
  Generator gen(42);
  std::vector<int64_t> p = random_permutation(1000, gen);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_TRUE(random_permutation(0, gen).empty());
  EXPECT_EQ(random_permutation(1, gen), (std::vector<int64_t>{0}));
  // Position 0 takes each of 4 values about equally often.
  std::vector<int> counts(4, 0);
  for (int r = 0; r < 4000; ++r) ++counts[random_permutation(4, gen)[0]];
  for (int c : counts) EXPECT_NEAR(c, 1000, 150);
  EXPECT_THROW(random_below(gen, 0), ValueError);
}

}  // namespace
}  // namespace kusari
