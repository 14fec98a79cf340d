// Reported values keep the order they were first reported in, as Chainer's observation dicts
// do: the log reads main/loss, main/accuracy, validation/main/loss, validation/main/accuracy.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kusari/core/reporter.h"
#include "kusari/links/classifier.h"
#include "kusari/links/linear.h"
#include "kusari/serializers/serializer.h"
#include "kusari/training/summary.h"
#include "map_serializer.h"

namespace kusari {
namespace {

std::vector<std::string> keys_of(const Observation& o) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : o) keys.push_back(key);
  return keys;
}

Array scalar(double v) { return Array::full({}, v, Dtype::kFloat64, Device::cpu()); }

TEST(ObservationTest, KeepsTheOrderOfFirstReport) {
  Observation o{{"zeta", scalar(1)}, {"alpha", scalar(2)}};
  o["mid"] = scalar(3);
  o["zeta"] = scalar(4);  // a new value keeps the key's place
  EXPECT_EQ(keys_of(o), (std::vector<std::string>{"zeta", "alpha", "mid"}));
  EXPECT_EQ(o.at("zeta").item<double>(), 4.0);
  EXPECT_FALSE(o.emplace("alpha", scalar(9)).second);
  EXPECT_EQ(o.at("alpha").item<double>(), 2.0);
  EXPECT_EQ(o.erase("alpha"), 1u);
  EXPECT_EQ(o.count("alpha"), 0u);
  EXPECT_THROW(o.at("alpha"), std::out_of_range);
  EXPECT_EQ(keys_of(o), (std::vector<std::string>{"zeta", "mid"}));
}

TEST(ObservationTest, ClassifierReportsLossBeforeAccuracy) {
  auto model = std::make_shared<links::Classifier>(std::make_shared<links::Linear>(3, 2));
  Reporter reporter;
  reporter.add_observer("main", static_cast<const Link*>(model.get()));
  Observation observation;
  {
    ReporterScope scope(reporter, observation);
    (*model)(Variable(Array::ones({4, 3})), Array::zeros({4}, Dtype::kInt32));
  }
  EXPECT_EQ(keys_of(observation), (std::vector<std::string>{"main/loss", "main/accuracy"}));
}

TEST(DictSummaryOrderTest, KeysKeepTheOrderOfFirstAddThroughASnapshot) {
  training::DictSummary d;
  d.add(Observation{{"main/loss", scalar(2)}, {"main/accuracy", scalar(0.5)}});
  d.add("lr", 0.1);
  d.add(Observation{{"main/accuracy", scalar(0.7)}, {"main/loss", scalar(1)}});
  const std::vector<std::string> expected{"main/loss", "main/accuracy", "lr"};
  EXPECT_EQ(d.keys(), expected);

  auto store = std::make_shared<testing::MapSerializer::Store>();
  testing::MapSerializer saver(store, /*loading=*/false);
  d.serialize(saver);
  training::DictSummary loaded;
  loaded.add("stale", 1.0);
  testing::MapSerializer loader(store, /*loading=*/true);
  loaded.serialize(loader);
  EXPECT_EQ(loaded.keys(), expected);
  EXPECT_DOUBLE_EQ(loaded.compute_mean().at("main/loss"), 1.5);
}

}  // namespace
}  // namespace kusari
