// Hyperparameter schedules (ExponentialShift, LinearShift) with a resume in the middle,
// observe_value / observe_lr, and FailOnNonNumber.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kusari/training/extensions.h"
#include "test_util.h"
#include "training_test_util.h"

namespace kusari::training::extensions {
namespace {

using testing::make_setup;
using testing::MapSerializer;

// Runs `iterations` iterations with `shift` and returns lr after each one (read by a reader
// registered after the shift, so it sees the value the shift just set).
std::vector<double> lr_trace(std::shared_ptr<Extension> shift, int64_t iterations,
                             double initial_lr = 1.0,
                             std::shared_ptr<Trigger> shift_trigger = nullptr) {
  auto s = make_setup(testing::fresh_out_dir("lr_trace"), interval(iterations, "iteration"), 6, 2,
                      initial_lr);
  s.trainer->extend(shift, "", shift_trigger);
  std::vector<double> lrs;
  s.trainer->extend(
      make_extension([&](Trainer& t) { lrs.push_back(t.updater().optimizer().hyperparam("lr")); },
                     "trace", interval(1, "iteration")));
  s.trainer->run();
  return lrs;
}

void expect_values(const std::vector<double>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], 1e-12) << "at call " << i + 1;
}

TEST(ExponentialShiftTest, ValuesAtEachIteration) {
  expect_values(lr_trace(std::make_shared<ExponentialShift>("lr", 0.5), 4),
                {0.5, 0.25, 0.125, 0.0625});
  expect_values(lr_trace(std::make_shared<ExponentialShift>("lr", 0.5, 2.0), 3), {1.0, 0.5, 0.25});
  // Stops at the target, from above and from below.
  expect_values(lr_trace(std::make_shared<ExponentialShift>("lr", 0.5, std::nullopt, 0.2), 4),
                {0.5, 0.25, 0.2, 0.2});
  expect_values(lr_trace(std::make_shared<ExponentialShift>("lr", 2.0, 1.0, 5.0), 4), {2, 4, 5, 5});
  // Per epoch (3 iterations each): the value changes at iterations 3 and 6.
  expect_values(
      lr_trace(std::make_shared<ExponentialShift>("lr", 0.1), 7, 1.0, interval(1, "epoch")),
      {1, 1, 0.1, 0.1, 0.1, 0.01, 0.01});
}

TEST(ExponentialShiftTest, InitializeSetsTheInitialValue) {
  auto s =
      make_setup(testing::fresh_out_dir("exp_init"), interval(1, "iteration"), 6, 2, /*lr=*/1.0);
  s.trainer->extend(ExponentialShift("lr", 0.5, 4.0), "", interval(10, "iteration"));
  s.trainer->run();
  EXPECT_DOUBLE_EQ(s.optimizer->hyperparam("lr"), 4.0) << "set by initialize() before training";
  EXPECT_THROW(ExponentialShift("lr", -1.0), ValueError);
  auto bad = make_setup(testing::fresh_out_dir("exp_bad"), interval(1, "iteration"));
  bad.trainer->extend(ExponentialShift("momentum", 0.5));
  EXPECT_THROW(bad.trainer->run(), ValueError);  // TinySGD has no "momentum"
}

TEST(ExponentialShiftTest, ResumeContinuesTheSchedule) {
  auto store = std::make_shared<MapSerializer::Store>();
  {
    auto shift = std::make_shared<ExponentialShift>("lr", 0.5);
    expect_values(lr_trace(shift, 3), {0.5, 0.25, 0.125});
    MapSerializer saver(store, false);
    shift->serialize(saver);
  }
  EXPECT_EQ(store->at("_t").item<int64_t>(), 3);
  EXPECT_DOUBLE_EQ(store->at("_last_value").item<double>(), 0.125);
  auto resumed = std::make_shared<ExponentialShift>("lr", 0.5);
  MapSerializer loader(store, true);
  resumed->serialize(loader);
  // A fresh optimizer starts at lr = 1; initialize() restores 0.125 and the shift continues.
  expect_values(lr_trace(resumed, 2), {0.0625, 0.03125});
  EXPECT_EQ(resumed->t(), 5);
}

TEST(LinearShiftTest, ValuesAtEachIteration) {
  // t <= 2: 1; 2 < t < 6: linear; t >= 6: 0.
  expect_values(
      lr_trace(std::make_shared<LinearShift>("lr", std::make_pair(1.0, 0.0), std::make_pair(2, 6)),
               8),
      {1, 1, 0.75, 0.5, 0.25, 0, 0, 0});
  // Warm-up from 0.
  expect_values(
      lr_trace(std::make_shared<LinearShift>("lr", std::make_pair(0.0, 0.1), std::make_pair(0, 4)),
               5),
      {0.025, 0.05, 0.075, 0.1, 0.1});
  EXPECT_THROW(LinearShift("lr", {1.0, 0.0}, {5, 2}), ValueError);
}

TEST(LinearShiftTest, InitializeAndResume) {
  auto store = std::make_shared<MapSerializer::Store>();
  {
    auto s = make_setup(testing::fresh_out_dir("linear_init"), interval(1, "iteration"), 6, 2,
                        /*lr=*/5.0);
    auto shift =
        std::make_shared<LinearShift>("lr", std::make_pair(1.0, 0.0), std::make_pair(2, 6));
    s.trainer->extend(shift, "", interval(100, "iteration"));
    s.trainer->run();
    EXPECT_DOUBLE_EQ(s.optimizer->hyperparam("lr"), 1.0) << "initialize() sets the value for t = 0";
  }
  auto shift = std::make_shared<LinearShift>("lr", std::make_pair(1.0, 0.0), std::make_pair(2, 6));
  expect_values(lr_trace(shift, 4), {1, 1, 0.75, 0.5});
  MapSerializer saver(store, false);
  shift->serialize(saver);
  auto resumed =
      std::make_shared<LinearShift>("lr", std::make_pair(1.0, 0.0), std::make_pair(2, 6));
  MapSerializer loader(store, true);
  resumed->serialize(loader);
  expect_values(lr_trace(resumed, 3), {0.25, 0, 0});
  EXPECT_EQ(resumed->t(), 7);
}

TEST(ObserveTest, ObserveLrRecordsTheValueBeforeTheEpochsShift) {
  auto s = make_setup(testing::fresh_out_dir("observe_lr"), interval(3, "epoch"), 6, 2, /*lr=*/1.0);
  s.trainer->extend(ExponentialShift("lr", 0.5), "", interval(1, "epoch"));
  s.trainer->extend(observe_lr());
  s.trainer->extend(observe_value("answer", [](Trainer&) { return 42.0; }));
  auto log = std::make_shared<LogReport>();
  s.trainer->extend(log);
  s.trainer->run();
  ASSERT_EQ(log->log().size(), 3u);
  // observe_lr is a writer: it runs before the shift (a reader) in the epoch's last iteration.
  const double expected[] = {1.0, 0.5, 0.25};
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(log->log()[i].at("lr"), expected[i]);
    EXPECT_DOUBLE_EQ(log->log()[i].at("answer"), 42.0);
  }
  EXPECT_NO_THROW(s.trainer->get_extension("observe_lr"));
  EXPECT_NO_THROW(s.trainer->get_extension("observe_answer"));
}

TEST(FailOnNonNumberTest, PassesWhileFinite) {
  auto s = make_setup(testing::fresh_out_dir("fail_ok"), interval(2, "epoch"));
  s.trainer->extend(FailOnNonNumber());
  EXPECT_NO_THROW(s.trainer->run());
}

// Poisons the weight (or its gradient) at iteration 2, before FailOnNonNumber checks it.
void expect_divergence_error(bool poison_grad, double value, const std::string& expected_what) {
  auto s = make_setup(testing::fresh_out_dir("fail"), interval(5, "iteration"));
  auto model = s.model;
  s.trainer->extend(make_extension(
      [model, poison_grad, value](Trainer&) {
        if (poison_grad) {
          model->l->W.set_grad(Array::full({1, 1}, value, float64, Device::cpu()));
        } else {
          Array w = model->l->W.data();
          w.fill(value);
        }
      },
      "poison", manual_schedule({2}, "iteration"), kPriorityWriter));
  s.trainer->extend(FailOnNonNumber());
  try {
    s.trainer->run();
    ADD_FAILURE() << "FailOnNonNumber did not raise";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(expected_what), std::string::npos) << what;
    EXPECT_NE(what.find("iteration 2"), std::string::npos) << what;
  }
  EXPECT_EQ(s.updater->iteration(), 2);
}

TEST(FailOnNonNumberTest, NamesTheParameterThatDiverged) {
  expect_divergence_error(false, std::nan(""), "parameter '/l/W'");
  expect_divergence_error(false, std::numeric_limits<double>::infinity(), "parameter '/l/W'");
  expect_divergence_error(true, std::numeric_limits<double>::infinity(),
                          "the gradient of parameter '/l/W'");
}

}  // namespace
}  // namespace kusari::training::extensions

namespace kusari::training::extensions {
namespace {

// IterationShift sets schedule(i) with i the iterations done; a WarmupSchedule counts in them.
TEST(IterationShiftTest, WarmupAndCosineInIterations) {
  WarmupSchedule s;
  s.peak = 1.0;
  s.warmup_start = 0.0;
  s.warmup_epochs = 2;  // iterations, here
  s.decay = WarmupSchedule::Decay::kCosine;
  s.total_epochs = 6;
  s.final_value = 0.0;
  auto shift = std::make_shared<IterationShift>("lr", s);
  EXPECT_EQ(shift->default_name(), "IterationShift");
  // After iteration k the value set is schedule(k): 0.5, 1, then the cosine from 2 to 6.
  std::vector<double> expected;
  for (int k = 1; k <= 6; ++k) expected.push_back(s(k));
  expect_values(lr_trace(shift, 6), expected);
  EXPECT_DOUBLE_EQ(expected[0], 0.5);
  EXPECT_DOUBLE_EQ(expected[5], 0.0);
}

// Two micro-batches of 2 per update take the step of one batch of 4, and count one iteration.
TEST(GradientAccumulationTest, TheUpdaterStepsOnceOnTheMeanOfTheMicroBatches) {
  auto big = make_setup(testing::fresh_out_dir("accumulate_big"), interval(1, "iteration"), 8, 4, 0.1);
  auto small = make_setup(testing::fresh_out_dir("accumulate_small"), interval(1, "iteration"), 8, 2, 0.1);
  small.updater->set_accumulation_steps(2);
  EXPECT_EQ(small.updater->accumulation_steps(), 2);
  big.updater->update();
  small.updater->update();
  EXPECT_EQ(small.updater->iteration(), 1);
  EXPECT_DOUBLE_EQ(small.updater->epoch_detail(), 0.5);
  EXPECT_NEAR(small.model->l->W.data().item<double>(), big.model->l->W.data().item<double>(), 1e-12);
  EXPECT_NE(small.model->l->W.data().item<double>(), 0.5);  // (it moved)
  EXPECT_THROW(small.updater->set_accumulation_steps(0), ValueError);
}

}  // namespace
}  // namespace kusari::training::extensions
