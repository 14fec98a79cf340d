// Evaluator: exact per-sample means with a short last batch, test mode without backprop, the
// "validation/main/..." keys, and the raw sums a multi-node evaluator reduces.
#include <gtest/gtest.h>

#include "kusari/datasets/convert.h"
#include "kusari/training/extensions.h"
#include "test_util.h"
#include "training_test_util.h"

namespace kusari::training::extensions {
namespace {

using testing::make_setup;
using testing::ProbeModel;
using testing::VectorIterator;

// 7 examples x = 0..6, t = 2x, W = 0.5: each sample's loss is (0.5x - 2x)^2 = 2.25 x^2.
constexpr double kExactLoss = 2.25 * (0 + 1 + 4 + 9 + 16 + 25 + 36) / 7.0;  // 29.25
constexpr double kExactXMean = 3.0;

std::shared_ptr<VectorIterator> eval_iterator(int64_t batch_size = 3) {
  return std::make_shared<VectorIterator>(testing::probe_data(7), batch_size, /*repeat=*/false);
}

TEST(EvaluatorTest, ExactPerSampleMeanWithAShortLastBatch) {
  auto model = std::make_shared<ProbeModel>();
  Evaluator evaluator(eval_iterator(3), model);
  std::map<std::string, double> result = evaluator.evaluate();
  EXPECT_EQ(model->batch_sizes, (std::vector<int64_t>{3, 3, 1}));
  ASSERT_EQ(result.size(), 2u);
  EXPECT_NEAR(result.at("main/loss"), kExactLoss, 1e-12);
  EXPECT_NEAR(result.at("main/x_mean"), kExactXMean, 1e-12);
  // Chainer's unweighted mean of the batch means would differ.
  const double chainer = 2.25 * ((0 + 1 + 4) / 3.0 + (9 + 16 + 25) / 3.0 + 36) / 3.0;
  EXPECT_GT(std::abs(result.at("main/loss") - chainer), 1.0);
  // The iterator is reset, so a second evaluation sees the whole set again.
  EXPECT_EQ(evaluator.evaluate(), result);
}

TEST(EvaluatorTest, RunsInTestModeWithoutBackprop) {
  auto model = std::make_shared<ProbeModel>();
  Evaluator evaluator(eval_iterator(), model);
  evaluator.evaluate();
  ASSERT_EQ(model->train_modes.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(model->train_modes[i]);
    EXPECT_FALSE(model->backprop_modes[i]);
  }
  EXPECT_TRUE(is_train_mode());
  EXPECT_TRUE(is_backprop_enabled());
}

TEST(EvaluatorTest, SummaryExposesRawSumsAndWeights) {
  auto model = std::make_shared<ProbeModel>();
  Evaluator evaluator(eval_iterator(2), model);
  training::DictSummary summary = evaluator.evaluate_summary();
  const training::Summary& loss = summary.summaries().at("main/loss");
  EXPECT_DOUBLE_EQ(loss.weight(), 7.0);
  EXPECT_NEAR(loss.sum(), kExactLoss * 7, 1e-9);
  // Two "ranks" each evaluating half: adding sums and weights reproduces the single-process mean.
  auto first = std::make_shared<VectorIterator>(testing::probe_data(3), 2, false);
  std::vector<Example> rest_data = testing::probe_data(7);
  rest_data.erase(rest_data.begin(), rest_data.begin() + 3);
  auto second = std::make_shared<VectorIterator>(rest_data, 2, false);
  training::DictSummary a = Evaluator(first, model).evaluate_summary();
  training::DictSummary b = Evaluator(second, model).evaluate_summary();
  const training::Summary& la = a.summaries().at("main/loss");
  const training::Summary& lb = b.summaries().at("main/loss");
  training::Summary total;
  total.set_raw(la.sum() + lb.sum(), la.sum_of_squares() + lb.sum_of_squares(),
                la.weight() + lb.weight());
  EXPECT_NEAR(total.compute_mean(), kExactLoss, 1e-12);
}

TEST(EvaluatorTest, ReportsValidationKeysInTheTrainer) {
  const std::string out = testing::fresh_out_dir("evaluator");
  auto s = make_setup(out, interval(2, "epoch"), 6, 2, /*lr=*/0.0);
  auto evaluator = std::make_shared<Evaluator>(eval_iterator(3), s.model);
  s.trainer->extend(evaluator);
  auto log = std::make_shared<LogReport>();
  s.trainer->extend(log);
  s.trainer->run();
  EXPECT_EQ(evaluator->name(), "validation");
  EXPECT_EQ(evaluator->priority(), kPriorityWriter);
  ASSERT_EQ(log->log().size(), 2u);
  for (const auto& entry : log->log()) {
    EXPECT_NEAR(entry.at("validation/main/loss"), kExactLoss, 1e-12);
    EXPECT_NEAR(entry.at("validation/main/x_mean"), kExactXMean, 1e-12);
    EXPECT_TRUE(entry.count("main/loss"));
  }
  // Registered under another name, the prefix follows it.
  auto s2 = make_setup(testing::fresh_out_dir("evaluator2"), interval(1, "epoch"), 6, 2, 0.0);
  s2.trainer->extend(Evaluator(eval_iterator(), s2.model), "test");
  auto log2 = std::make_shared<LogReport>();
  s2.trainer->extend(log2);
  s2.trainer->run();
  EXPECT_TRUE(log2->log().at(0).count("test/main/loss"));
}

TEST(EvaluatorTest, CustomEvalFunctionAndConverter) {
  auto model = std::make_shared<ProbeModel>();
  int converted = 0;
  training::Converter converter = [&](const std::vector<Example>& batch, Device device) {
    ++converted;
    return concat_examples(batch, device);
  };
  Evaluator evaluator(eval_iterator(4), model, converter, Device::cpu(),
                      [&](const std::vector<Variable>& batch) {
                        // Report the batch's largest x through the target, as a custom metric
                        // would.
                        report({{"max_x", amax(batch[0].data())}}, model.get());
                      });
  std::map<std::string, double> result = evaluator.evaluate();
  EXPECT_EQ(converted, 2);
  // Batches {0..3} and {4, 5, 6}: max 3 (weight 4) and 6 (weight 3).
  EXPECT_NEAR(result.at("main/max_x"), (3.0 * 4 + 6.0 * 3) / 7, 1e-12);
  EXPECT_EQ(result.count("main/loss"), 0u);
}

TEST(EvaluatorTest, RejectsARepeatingIterator) {
  auto repeating = std::make_shared<VectorIterator>(testing::probe_data(7), 3, /*repeat=*/true);
  EXPECT_THROW(Evaluator(repeating, std::make_shared<ProbeModel>()), ValueError);
  EXPECT_THROW(Evaluator(nullptr, std::make_shared<ProbeModel>()), ValueError);
  EXPECT_THROW(Evaluator(eval_iterator(), nullptr), ValueError);
}

}  // namespace
}  // namespace kusari::training::extensions
