// Summary and DictSummary: weighted means, statistics, raw sums and serialization.
#include <gtest/gtest.h>

#include <cmath>

#include "kusari/training/summary.h"
#include "test_util.h"
#include "training_test_util.h"

namespace kusari::training {
namespace {

using testing::MapSerializer;

Array scalar64(double v) {
  return Array::full({}, v, float64, Device::cpu());
}

TEST(SummaryTest, WeightedMeanAndStatistics) {
  Summary s;
  s.add(1.0);
  s.add(3.0, 3.0);
  EXPECT_DOUBLE_EQ(s.weight(), 4.0);
  EXPECT_DOUBLE_EQ(s.sum(), 10.0);
  EXPECT_DOUBLE_EQ(s.sum_of_squares(), 28.0);
  EXPECT_DOUBLE_EQ(s.compute_mean(), 2.5);
  auto [mean, std] = s.make_statistics();
  EXPECT_DOUBLE_EQ(mean, 2.5);
  EXPECT_NEAR(std, std::sqrt(28.0 / 4 - 6.25), 1e-12);
}

TEST(SummaryTest, AcceptsScalarArraysOfAnyDtype) {
  Summary s;
  s.add(Array::full({}, 0.5, float32, Device::cpu()));
  s.add(Array::full({}, 2, int64, Device::cpu()), 2.0);
  s.add(Array::full({1}, 1.5, float64, Device::cpu()));  // a 1-element array counts as a scalar
  EXPECT_DOUBLE_EQ(s.compute_mean(), (0.5 + 4.0 + 1.5) / 4.0);
  EXPECT_THROW(s.add(Array::zeros({2}, float32, Device::cpu())), ShapeError);
  EXPECT_THROW(s.add(Array()), ValueError);
}

TEST(SummaryTest, EmptyMeanIsAnError) {
  Summary s;
  EXPECT_THROW(s.compute_mean(), ValueError);
}

TEST(SummaryTest, RawSumsCombineLikeAnAllreduce) {
  // Two "ranks" with different sample counts: summing their raw sums and weights gives the
  // global mean, which averaging their means would not.
  Summary a, b;
  for (double v : {1.0, 2.0, 3.0}) a.add(v);
  b.add(10.0);
  Summary total;
  total.set_raw(a.sum() + b.sum(), a.sum_of_squares() + b.sum_of_squares(),
                a.weight() + b.weight());
  EXPECT_DOUBLE_EQ(total.compute_mean(), 16.0 / 4.0);
}

TEST(DictSummaryTest, AddsObservationsWithWeights) {
  DictSummary d;
  d.add(Observation{{"a", scalar64(1.0)}, {"b", scalar64(4.0)}});
  d.add(Observation{{"a", scalar64(3.0)}, {"vector", Array::zeros({3}, float32, Device::cpu())}},
        3.0);
  std::map<std::string, double> means = d.compute_mean();
  ASSERT_EQ(means.size(), 2u) << "non-scalar values are skipped, as in Chainer";
  EXPECT_DOUBLE_EQ(means["a"], (1.0 + 9.0) / 4.0);
  EXPECT_DOUBLE_EQ(means["b"], 4.0);
  EXPECT_DOUBLE_EQ(d.summaries().at("a").weight(), 4.0);
  std::map<std::string, double> stats = d.make_statistics();
  EXPECT_DOUBLE_EQ(stats["a"], 2.5);
  EXPECT_NEAR(stats["a.std"], std::sqrt((1.0 + 27.0) / 4.0 - 6.25), 1e-12);
  EXPECT_DOUBLE_EQ(stats["b.std"], 0.0);
  d.clear();
  EXPECT_TRUE(d.empty());
}

TEST(DictSummaryTest, SerializeRoundTrip) {
  DictSummary d;
  d.add(Observation{{"main/loss", scalar64(2.0)}, {"main/accuracy", scalar64(0.5)}});
  d.add(Observation{{"main/loss", scalar64(4.0)}}, 2.0);
  auto store = std::make_shared<MapSerializer::Store>();
  MapSerializer saver(store, false);
  d.serialize(saver);
  EXPECT_TRUE(store->count("_names"));
  EXPECT_TRUE(store->count("_summaries/0/_x"));
  EXPECT_TRUE(store->count("_summaries/1/_n"));

  DictSummary loaded;
  loaded.add("stale", 1.0);
  MapSerializer loader(store, true);
  loaded.serialize(loader);
  EXPECT_EQ(loaded.compute_mean(), d.compute_mean());
  EXPECT_FALSE(loaded.summaries().count("stale"));
  EXPECT_DOUBLE_EQ(loaded.summaries().at("main/loss").weight(), 3.0);
  // Adding continues from the loaded sums.
  loaded.add("main/accuracy", 1.0);
  EXPECT_DOUBLE_EQ(loaded.compute_mean()["main/accuracy"], 0.75);
}

}  // namespace
}  // namespace kusari::training
