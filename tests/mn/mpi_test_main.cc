// GoogleTest main for the multi-process tests: every rank runs every test; rank 0 prints the
// usual output, other ranks print only their failures (prefixed with the rank); the exit status
// is non-zero on every rank if any rank failed.
//
// A watchdog ends a test that hangs (a collective one rank never joins, a deadlock in a driver):
// when one test has run for KUSARI_MN_TEST_TIMEOUT seconds (default 120; 0 turns it off), every
// rank prints the test's name and the stack of its test thread, and exits with status 124, which
// makes mpiexec end the job. So a hang fails in two minutes, saying where each rank was, instead
// of waiting for CTest's timeout with nothing to show. (The test thread's stack is printed from a
// signal handler with backtrace_symbols_fd; the executable exports its symbols, so frames of
// kusari, MPI, NCCL and the CUDA driver have names, and those of functions in anonymous
// namespaces an offset for addr2line.)
#include <execinfo.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
    }
  }

 private:
  int rank_;
};

std::atomic<bool> g_stack_printed{false};

void print_stack(int) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  g_stack_printed = true;
}

/// Watches the running test from a thread of its own; see the note at the top.
class Watchdog : public ::testing::EmptyTestEventListener {
 public:
  Watchdog(int rank, double limit_seconds) : rank_(rank), limit_(limit_seconds), test_thread_(pthread_self()) {
    void* warm[1];
    backtrace(warm, 1);  // loads what backtrace needs now, not inside the signal handler
    struct sigaction sa {};
    sa.sa_handler = print_stack;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, nullptr);
    thread_ = std::thread([this] { watch(); });
  }
  ~Watchdog() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lock(mutex_);
    test_ = std::string(info.test_suite_name()) + "." + info.name();
    started_ = std::chrono::steady_clock::now();
    running_ = true;
  }
  void OnTestEnd(const ::testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::seconds(1));
      if (stop_ || !running_) continue;
      const double ran = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      if (ran < limit_) continue;
      std::fprintf(stderr,
                   "[rank %d] watchdog: %s has run for %.0f s (KUSARI_MN_TEST_TIMEOUT=%g); ending the job. "
                   "The test thread's stack on rank %d:\n",
                   rank_, test_.c_str(), ran, limit_, rank_);
      std::fflush(stderr);
      pthread_kill(test_thread_, SIGUSR2);
      for (int i = 0; i < 50 && !g_stack_printed; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::fflush(stderr);
      std::_Exit(124);
    }
  }

  int rank_;
  double limit_;
  pthread_t test_thread_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  bool running_ = false;
  std::string test_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace

// The thread level MPI is initialised with: MPI_THREAD_SERIALIZED, as a program that initialises
// MPI itself at that level (kusari keeps it), unless a test executable asks for another (the
// overlap tests also run under MPI_THREAD_MULTIPLE, kusari's own level, where a progress thread
// works).
#ifndef KUSARI_MN_TEST_THREAD_LEVEL
#define KUSARI_MN_TEST_THREAD_LEVEL MPI_THREAD_SERIALIZED
#endif

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, KUSARI_MN_TEST_THREAD_LEVEL, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "MPI could not be initialised\n");
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) {
    std::fprintf(stderr, "the multi-node tests need at least 2 processes (run them under mpiexec -n 2)\n");
    MPI_Finalize();
    return 1;
  }
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  double limit = 120;
  if (const char* v = std::getenv("KUSARI_MN_TEST_TIMEOUT")) limit = std::atof(v);
  Watchdog* watchdog = limit > 0 ? new Watchdog(rank, limit) : nullptr;
  if (watchdog) listeners.Append(watchdog);
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  if (watchdog) delete listeners.Release(watchdog);  // stops its thread
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any && !failed) std::fprintf(stderr, "a test failed on another rank (see its output above)\n");
  MPI_Finalize();
  return any;
}
