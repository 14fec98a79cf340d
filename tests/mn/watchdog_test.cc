// The watchdog of mpi_test_main.cc, tested by the CTest mn_test_watchdog: this test (disabled in
// the normal runs) hangs on purpose, rank 1 asleep and the others waiting for it in a barrier,
// and the watchdog must end the job naming the test and printing where each rank was.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <thread>

namespace {

TEST(WatchdogTest, DISABLED_HangsUntilTheWatchdogEndsTheJob) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 1) std::this_thread::sleep_for(std::chrono::hours(1));
  MPI_Barrier(MPI_COMM_WORLD);
  ADD_FAILURE() << "the watchdog did not end the job";
}

}  // namespace
