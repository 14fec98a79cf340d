// GoogleTest main for the multi-process tests: every rank runs every test; rank 0 prints the
// usual output, other ranks print only their failures (prefixed with the rank); the exit status
// is non-zero on every rank if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

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

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
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
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any && !failed) std::fprintf(stderr, "a test failed on another rank (see its output above)\n");
  MPI_Finalize();
  return any;
}
