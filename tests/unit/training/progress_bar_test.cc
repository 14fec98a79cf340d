// ProgressBar: plain lines when writing to a file-like stream, Chainer's redrawn bars on a
// terminal, and the training length taken from the stop trigger.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "kusari/training/extensions.h"
#include "test_util.h"
#include "training/extensions/extension_util.h"
#include "training_test_util.h"

namespace kusari::training::extensions {
namespace {

using testing::make_setup;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(ProgressBarTest, PlainLinesWhenNotATerminal) {
  // 3 epochs of 3 iterations, an update every 3 iterations.
  auto s = make_setup(testing::fresh_out_dir("progress"), interval(3, "epoch"));
  std::ostringstream out;
  s.trainer->extend(ProgressBar(std::nullopt, /*update_interval=*/3, /*bar_length=*/50, out));
  s.trainer->run();
  const std::string text = out.str();
  EXPECT_EQ(text.find('\033'), std::string::npos) << "no escapes in a log file";
  const std::vector<std::string> lines = split_lines(text);
  ASSERT_EQ(lines.size(), 3u) << text;
  EXPECT_EQ(lines[0].rfind("3 iter, 1 epoch / 3 epochs; total 33.33%, this epoch 0.00%; ", 0), 0u)
      << lines[0];
  EXPECT_EQ(lines[1].rfind("6 iter, 2 epoch / 3 epochs; total 66.67%, this epoch 0.00%; ", 0), 0u)
      << lines[1];
  EXPECT_EQ(lines[2].rfind("9 iter, 3 epoch / 3 epochs; total 100.00%, this epoch 0.00%; ", 0), 0u)
      << lines[2];
  // The first update is measured from the start of the run: a speed and an estimate, never
  // Chainer's "inf iters/sec ... 0:00:00".
  EXPECT_EQ(text.find("inf"), std::string::npos) << text;
  const std::regex speed(
      R"(.*; [0-9.e+]+ iters/sec; estimated time to finish: \d+:\d\d:\d\d(\.\d{6})?\.)");
  EXPECT_TRUE(std::regex_match(lines[0], speed)) << lines[0];
  EXPECT_TRUE(std::regex_match(lines[1], speed)) << lines[1];
  EXPECT_TRUE(std::regex_match(lines[2], speed)) << lines[2];
}

TEST(ProgressBarTest, ExplicitLengthInIterations) {
  auto s = make_setup(testing::fresh_out_dir("progress_iter"), interval(4, "iteration"));
  std::ostringstream out;
  s.trainer->extend(ProgressBar(std::make_pair(8.0, std::string("iteration")), 2, 50, out));
  s.trainer->run();
  const std::vector<std::string> lines = split_lines(out.str());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("2 iter, 0 epoch / 8 iterations; total 25.00%, this epoch 66.67%; ", 0),
            0u)
      << lines[0];
  EXPECT_EQ(lines[1].rfind("4 iter, 1 epoch / 8 iterations; total 50.00%, this epoch 33.33%; ", 0),
            0u)
      << lines[1];
}

TEST(ProgressBarTest, ChainersBarsOnATerminal) {
  auto s = make_setup(testing::fresh_out_dir("progress_tty"), interval(3, "epoch"));
  std::ostringstream out;
  ProgressBar bar(std::nullopt, 3, 50, out);
  bar.set_terminal(true);
  s.trainer->extend(std::move(bar));
  s.trainer->run();
  const std::string text = out.str();
  const std::string first = "\033[J     total [" + std::string(16, '#') + std::string(34, '.') +
                            "]  33.33%\n" + "this epoch [" + std::string(50, '.') + "]   0.00%\n" +
                            "         3 iter, 1 epoch / 3 epochs\n";
  EXPECT_EQ(text.rfind(first, 0), 0u) << text;
  const std::regex speed_line(std::string(R"(\s+[0-9.e+]+ iters/sec\. Estimated time to finish: [0-9:.]+\.\n)") +
                              "\033" + R"(\[4A)");
  EXPECT_TRUE(std::regex_search(text.substr(first.size(), 80), speed_line)) << text;
  EXPECT_EQ(text.find("inf"), std::string::npos) << text;
  EXPECT_NE(text.find("     total [" + std::string(50, '#') + "] 100.00%\n"), std::string::npos);
  EXPECT_NE(text.find("         9 iter, 3 epoch / 3 epochs\n"), std::string::npos);
  // finalize() erases the bar.
  EXPECT_EQ(text.substr(text.size() - 7), "\033[4A\033[J");
}

// An updater that sweeps no dataset (reinforcement learning): no epoch parts in the report.
class EpochlessUpdater : public Updater {
 public:
  explicit EpochlessUpdater(Updater& inner) : inner_(inner) {}
  void update() override { inner_.update(); }
  int64_t iteration() const override { return inner_.iteration(); }
  int64_t epoch() const override { return 0; }
  double epoch_detail() const override { return 0; }
  double previous_epoch_detail() const override { return 0; }
  bool is_new_epoch() const override { return false; }
  bool has_epochs() const override { return false; }
  Optimizer& optimizer(const std::string& name) override { return inner_.optimizer(name); }
  Iterator& iterator(const std::string& name) override { return inner_.iterator(name); }
  void serialize(Serializer& s) override { inner_.serialize(s); }

 private:
  Updater& inner_;
};

TEST(ProgressBarTest, NoEpochsForAnUpdaterWithout) {
  auto s = make_setup(testing::fresh_out_dir("progress_epochless"), interval(4, "iteration"));
  auto updater = std::make_shared<EpochlessUpdater>(*s.updater);
  Trainer trainer(updater, interval(4, "iteration"), testing::fresh_out_dir("progress_epochless_run"));
  std::ostringstream plain, drawn;
  trainer.extend(ProgressBar(std::nullopt, 2, 50, plain));
  ProgressBar bar(std::nullopt, 2, 50, drawn);
  bar.set_terminal(true);
  trainer.extend(std::move(bar), "drawn");
  trainer.run();
  const std::vector<std::string> lines = split_lines(plain.str());
  ASSERT_EQ(lines.size(), 2u) << plain.str();
  EXPECT_EQ(lines[0].rfind("2 iter / 4 iterations; total 50.00%; ", 0), 0u) << lines[0];
  EXPECT_EQ(plain.str().find("epoch"), std::string::npos) << plain.str();
  EXPECT_EQ(drawn.str().find("epoch"), std::string::npos) << drawn.str();
  EXPECT_NE(drawn.str().find("         4 iter / 4 iterations\n"), std::string::npos) << drawn.str();
  EXPECT_NE(drawn.str().find("\033[3A"), std::string::npos) << drawn.str();
}

TEST(ProgressBarTest, NeedsALengthWhenTheStopTriggerIsNotAnInterval) {
  auto s = make_setup(testing::fresh_out_dir("progress_manual"), manual_schedule({3}, "iteration"));
  std::ostringstream out;
  s.trainer->extend(ProgressBar(std::nullopt, 1, 50, out));
  EXPECT_THROW(s.trainer->run(), ValueError);
  EXPECT_THROW(ProgressBar(std::make_pair(1.0, std::string("hour"))), ValueError);
  EXPECT_THROW(ProgressBar(std::nullopt, 0), ValueError);
}

TEST(ProgressBarTest, TimedeltaLikePython) {
  using detail::format_timedelta;
  EXPECT_EQ(format_timedelta(0), "0:00:00");
  EXPECT_EQ(format_timedelta(122.799182), "0:02:02.799182");
  EXPECT_EQ(format_timedelta(3600 * 25 + 61), "1 day, 1:01:01");
  EXPECT_EQ(format_timedelta(2 * 86400 + 16 * 3600 + 23 * 60 + 34.613215),
            "2 days, 16:23:34.613215");
}

}  // namespace
}  // namespace kusari::training::extensions
