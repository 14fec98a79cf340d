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
  // The first update has no earlier one to measure against: infinite speed, nothing left (Chainer).
  EXPECT_NE(lines[0].find("; inf iters/sec; estimated time to finish: 0:00:00."), std::string::npos)
      << lines[0];
  const std::regex speed(
      R"(.*; [0-9.e+]+ iters/sec; estimated time to finish: \d+:\d\d:\d\d(\.\d{6})?\.)");
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
                            "         3 iter, 1 epoch / 3 epochs\n" +
                            "       inf iters/sec. Estimated time to finish: 0:00:00.\n\033[4A";
  EXPECT_EQ(text.rfind(first, 0), 0u) << text;
  EXPECT_NE(text.find("     total [" + std::string(50, '#') + "] 100.00%\n"), std::string::npos);
  EXPECT_NE(text.find("         9 iter, 3 epoch / 3 epochs\n"), std::string::npos);
  // finalize() erases the bar.
  EXPECT_EQ(text.substr(text.size() - 7), "\033[4A\033[J");
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
