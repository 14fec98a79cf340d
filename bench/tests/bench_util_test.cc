// Tests of the benchmarks' runner (bench_util.h, Note [Runs with a time limit]): results are read,
// failures are named, and a run past its time limit is stopped with everything it started.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "bench_util.h"

namespace kusari::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// True when `pid` is gone or a zombie (killed, not yet reaped by its new parent).
bool is_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'Z';
}

std::string fresh_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kusari_bench_util_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST(RunCommandTest, ReadsResultsAndOutput) {
  const RunOutcome r = run_command("echo 'RESULT ms 1.5'; echo note >&2; echo 'RESULT x 2'", 10, "t");
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_status, 0);
  EXPECT_NE(r.output.find("note"), std::string::npos) << "stderr is collected too";
  const auto results = parse_results(r.output);
  EXPECT_EQ(results, (std::map<std::string, double>{{"ms", 1.5}, {"x", 2}}));
  EXPECT_EQ(run_for_results("echo 'RESULT a 3'"), (std::map<std::string, double>{{"a", 3}}));
}

TEST(RunCommandTest, AFailedRunIsNamedWithItsStatusAndOutput) {
  try {
    run_for_results("echo first; echo 'something broke'; exit 3", "the test peer");
    FAIL() << "expected RunFailed";
  } catch (const RunFailed& e) {
    const std::string what = e.what();
    EXPECT_FALSE(e.timed_out());
    EXPECT_NE(what.find("the test peer printed no RESULT line"), std::string::npos) << what;
    EXPECT_NE(what.find("exited with status 3"), std::string::npos) << what;
    EXPECT_NE(what.find("something broke"), std::string::npos) << what;
  }
}

// The run is stopped at its limit, and so is what it started (a grandchild holding the pipe).
TEST(RunCommandTest, ARunPastItsLimitIsStoppedWithItsChildren) {
  const std::string pid_file = fresh_file("pid");
  const Clock::time_point start = Clock::now();
  const RunOutcome r =
      run_command("sleep 300 & echo $! > " + pid_file + "; echo started; wait", 1, "the sleeper");
  const double took = seconds_since(start);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_status, -1);
  EXPECT_GE(took, 1.0);
  EXPECT_LT(took, 4.0) << "a shell that obeys SIGTERM needs no grace period";
  EXPECT_NE(r.output.find("started"), std::string::npos) << "the output before the stop is kept";
  pid_t grandchild = 0;
  std::ifstream(pid_file) >> grandchild;
  std::filesystem::remove(pid_file);
  ASSERT_GT(grandchild, 0);
  const Clock::time_point wait = Clock::now();
  while (!is_gone(grandchild) && seconds_since(wait) < 5) usleep(10000);
  EXPECT_TRUE(is_gone(grandchild)) << "the sleeping grandchild " << grandchild << " survived";
}

// A run that ignores SIGTERM gets SIGKILL after the grace period.
TEST(RunCommandTest, ARunIgnoringSigtermIsKilled) {
  const Clock::time_point start = Clock::now();
  const RunOutcome r = run_command("trap '' TERM; echo stubborn; while :; do sleep 1; done", 0.5,
                                   "the stubborn one");
  const double took = seconds_since(start);
  EXPECT_TRUE(r.timed_out);
  EXPECT_GE(took, 5.0);
  EXPECT_LT(took, 9.0);
}

// While it waits, the runner says what for, so a long wait is never silent.
TEST(RunCommandTest, WaitingIsReported) {
  ::testing::internal::CaptureStderr();
  const RunOutcome r = run_command("sleep 1.3; echo 'RESULT done 1'", 10, "the slow peer", 0.5);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(parse_results(r.output).at("done"), 1);
  EXPECT_NE(err.find("[bench] waiting for the slow peer: 1 s so far (limit 10 s, --timeout)"),
            std::string::npos)
      << err;
}

// try_run prints why a run gave nothing and finish() reports it and returns status 1.
TEST(RunCommandTest, IncompleteRunsAreReportedByFinish) {
  incomplete_runs().clear();
  const double saved = run_timeout_seconds();
  run_timeout_seconds() = 1;
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const auto got = try_run("sleep 30", "the hanging peer");
  char name[] = "bench_x", flag[] = "--flag";
  char* argv[] = {name, flag};
  const int status = finish(2, argv);
  const std::string out = ::testing::internal::GetCapturedStdout();
  (void)::testing::internal::GetCapturedStderr();
  run_timeout_seconds() = saved;
  EXPECT_FALSE(got.has_value());
  EXPECT_EQ(status, 1);
  EXPECT_NE(out.find("(the hanging peer did not finish within 1 s and was stopped (--timeout 1))"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("reproduce: bench_x --flag\nincomplete: the hanging peer did not finish"),
            std::string::npos)
      << out;
  incomplete_runs().clear();
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(finish(2, argv), 0);
  (void)::testing::internal::GetCapturedStdout();
}

}  // namespace
}  // namespace kusari::bench
