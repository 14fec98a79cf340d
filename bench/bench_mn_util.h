// Helpers of the multi-process benchmarks (bench/mn_*.cc), which run under mpiexec and start
// their PyTorch peer from rank 0 while the other ranks wait.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace kusari::bench {

/// Seconds on the steady clock.
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// The median of `v` (the upper one of an even count).
inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Waits for every rank without spinning a core (the peer runs on rank 0 meanwhile).
inline void sleepy_barrier() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  int done = 0;
  while (!done) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace kusari::bench
