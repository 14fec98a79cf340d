// The large-minibatch learning-rate schedule (linear scaling, gradual warm-up, step and cosine
// decay) against hand-computed values, and EpochShift setting it in a trainer, also after a
// resume.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "kusari/training/extensions.h"
#include "test_util.h"
#include "training_test_util.h"

namespace kusari::training::extensions {
namespace {

using testing::make_setup;
using testing::MapSerializer;

TEST(LinearScaledLrTest, ScalesWithTheGlobalBatch) {
  EXPECT_DOUBLE_EQ(linear_scaled_lr(0.1, 256), 0.1);
  EXPECT_DOUBLE_EQ(linear_scaled_lr(0.1, 8192), 3.2);   // Goyal et al.'s 8k batch
  EXPECT_DOUBLE_EQ(linear_scaled_lr(0.1, 32768), 12.8);  // the 15-minute run's 32k
  EXPECT_DOUBLE_EQ(linear_scaled_lr(0.05, 64, 32), 0.1);
  EXPECT_THROW(linear_scaled_lr(0.1, 0), ValueError);
  EXPECT_THROW(linear_scaled_lr(0.1, 64, -1), ValueError);
}

TEST(WarmupScheduleTest, WarmupThenSteps) {
  WarmupSchedule s;
  s.peak = 0.8;
  s.warmup_start = 0.1;
  s.warmup_epochs = 2;
  s.decay = WarmupSchedule::Decay::kStep;
  s.decay_epochs = {3, 4};
  s.decay_factor = 0.5;
  EXPECT_DOUBLE_EQ(s(0.0), 0.1);
  EXPECT_DOUBLE_EQ(s(0.5), 0.1 + 0.7 * 0.25);
  EXPECT_DOUBLE_EQ(s(1.0), 0.45);
  EXPECT_DOUBLE_EQ(s(2.0), 0.8);
  EXPECT_DOUBLE_EQ(s(2.999), 0.8);
  EXPECT_DOUBLE_EQ(s(3.0), 0.4);
  EXPECT_DOUBLE_EQ(s(4.0), 0.2);
  EXPECT_DOUBLE_EQ(s(90.0), 0.2);
  // Without a warm-up the peak applies from the start.
  s.warmup_epochs = 0;
  EXPECT_DOUBLE_EQ(s(0.0), 0.8);
}

TEST(WarmupScheduleTest, WarmupThenCosine) {
  WarmupSchedule s;
  s.peak = 1.0;
  s.warmup_start = 0.0;
  s.warmup_epochs = 1;
  s.decay = WarmupSchedule::Decay::kCosine;
  s.total_epochs = 3;
  s.final_value = 0.0;
  EXPECT_DOUBLE_EQ(s(0.5), 0.5);
  EXPECT_DOUBLE_EQ(s(1.0), 1.0);  // the cosine starts where the warm-up ends
  EXPECT_NEAR(s(1.5), 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_NEAR(s(2.0), 0.5, 1e-15);
  EXPECT_NEAR(s(2.5), 0.5 * (1 + std::cos(3 * std::numbers::pi / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(s(3.0), 0.0);
  EXPECT_DOUBLE_EQ(s(10.0), 0.0);
  s.final_value = 0.1;
  EXPECT_NEAR(s(2.0), 0.55, 1e-15);
  EXPECT_DOUBLE_EQ(s(3.0), 0.1);
}

TEST(WarmupScheduleTest, InconsistentSchedulesAreRefused) {
  WarmupSchedule s;
  s.warmup_epochs = -1;
  EXPECT_THROW(s.validate(), ValueError);
  s.warmup_epochs = 5;
  s.decay = WarmupSchedule::Decay::kStep;
  s.decay_epochs = {3};
  try {
    s.validate();
    FAIL() << "a step inside the warm-up was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("step decay at epoch 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(EpochShift("lr", s), ValueError);
  s.decay = WarmupSchedule::Decay::kCosine;
  s.total_epochs = 5;
  EXPECT_THROW(s.validate(), ValueError);
  s.total_epochs = 6;
  EXPECT_NO_THROW(s.validate());
}

// 6 examples in batches of 2: 3 iterations per epoch, so after iteration i the epoch is i / 3.
WarmupSchedule one_epoch_warmup() {
  WarmupSchedule s;
  s.peak = 1.0;
  s.warmup_start = 0.1;
  s.warmup_epochs = 1;
  s.decay = WarmupSchedule::Decay::kStep;
  s.decay_epochs = {2};
  return s;
}

TEST(EpochShiftTest, SetsTheValueForTheNextIteration) {
  auto s = make_setup(testing::fresh_out_dir("epoch_shift"), interval(7, "iteration"), 6, 2,
                      /*lr=*/42.0);
  auto shift = std::make_shared<EpochShift>("lr", one_epoch_warmup());
  s.trainer->extend(shift);
  std::vector<double> used;  // the rate set after each iteration (for the next one)
  s.trainer->extend(make_extension(
      [&](Trainer& t) { used.push_back(t.updater().optimizer().hyperparam("lr")); }, "after",
      interval(1, "iteration")));
  s.trainer->run();
  // initialize() set 0.1 for iteration 1; after iteration i the value for epoch i / 3.
  const std::vector<double> expected = {0.4, 0.7, 1.0, 1.0, 1.0, 0.1, 0.1};
  ASSERT_EQ(used.size(), expected.size());
  for (size_t i = 0; i < used.size(); ++i) EXPECT_NEAR(used[i], expected[i], 1e-12) << i;
  EXPECT_NEAR(*shift->last_value(), 0.1, 1e-12);
}

TEST(EpochShiftTest, InitializeSetsTheStartAndAResumeContinues) {
  {
    auto s = make_setup(testing::fresh_out_dir("epoch_shift_init"), interval(1, "iteration"), 6,
                        2, /*lr=*/42.0);
    s.trainer->extend(std::make_shared<EpochShift>("lr", one_epoch_warmup()), "",
                      interval(100, "iteration"));
    s.trainer->run();
    EXPECT_DOUBLE_EQ(s.optimizer->hyperparam("lr"), 0.1) << "initialize() sets schedule(0)";
  }
  // Four iterations, a snapshot of the trainer, and a new trainer loaded from it: the schedule
  // has no state, it follows the loaded position (epoch 4 / 3 -> 1.0, then 5 / 3, 2 -> 0.1).
  auto store = std::make_shared<MapSerializer::Store>();
  {
    auto s = make_setup(testing::fresh_out_dir("epoch_shift_a"), interval(4, "iteration"), 6, 2);
    s.trainer->extend(std::make_shared<EpochShift>("lr", one_epoch_warmup()));
    s.trainer->run();
    MapSerializer saver(store, false);
    s.trainer->serialize(saver);
  }
  auto s = make_setup(testing::fresh_out_dir("epoch_shift_b"), interval(6, "iteration"), 6, 2,
                      /*lr=*/42.0);
  s.trainer->extend(std::make_shared<EpochShift>("lr", one_epoch_warmup()));
  MapSerializer loader(store, true);
  s.trainer->serialize(loader);
  double at_start = -1;
  std::vector<double> used;
  s.trainer->extend(make_extension(
      [&](Trainer& t) { used.push_back(t.updater().optimizer().hyperparam("lr")); }, "after",
      interval(1, "iteration")));
  s.trainer->extend(make_extension([&](Trainer& t) {
    if (at_start < 0) at_start = t.updater().optimizer().hyperparam("lr");
  }, "first", interval(1, "iteration"), kPriorityWriter));
  s.trainer->run();
  EXPECT_DOUBLE_EQ(at_start, 1.0) << "the rate of iteration 5 (epoch 4 / 3)";
  ASSERT_EQ(used.size(), 2u);
  EXPECT_NEAR(used[0], 1.0, 1e-12);
  EXPECT_NEAR(used[1], 0.1, 1e-12);
}

TEST(EpochShiftTest, AnyFunctionOfTheEpoch) {
  auto s = make_setup(testing::fresh_out_dir("epoch_shift_fn"), interval(3, "iteration"), 6, 2);
  s.trainer->extend(
      std::make_shared<EpochShift>("lr", [](double epoch) { return 10.0 + epoch * 3; }));
  s.trainer->run();
  EXPECT_NEAR(s.optimizer->hyperparam("lr"), 13.0, 1e-12);
  EXPECT_THROW(EpochShift("lr", std::function<double(double)>()), ValueError);
}

}  // namespace
}  // namespace kusari::training::extensions
