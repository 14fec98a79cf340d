// kusari's own MPI initialisation (Note [Thread level] in src/mn/comm/mpi_util.cc): a program
// that leaves MPI to kusari gets MPI_THREAD_MULTIPLE, or MPI_THREAD_SERIALIZED with
// KUSARI_MPI_THREAD_LEVEL=serialized; any other value is an error that names the variable, the
// value and the accepted ones, raised before MPI is initialised. Run by CTest under mpiexec
// (tests/mn/CMakeLists.txt):
//
//   kusari_mn_thread_level_check --expect multiple|serialized|error
//
// Prints "thread level: ok" and returns 0 when the level (or the error) is the expected one.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "kusari/core/error.h"
#include "kusari/mn.h"

namespace mn = kusari::mn;

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--expect") {
    std::fprintf(stderr, "usage: kusari_mn_thread_level_check --expect multiple|serialized|error\n");
    return 2;
  }
  const std::string expect = argv[2];
  try {
    auto comm = mn::create_communicator("naive");
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    const int wanted = expect == "multiple" ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
    if (expect == "error" || level != wanted) {
      std::fprintf(stderr, "rank %d: MPI's thread level is %d; expected %s\n", comm->rank(), level,
                   expect.c_str());
      return 1;
    }
    // The level is in force: a collective of the communicator works.
    if (comm->allreduce_obj(1.0) != comm->size()) {
      std::fprintf(stderr, "rank %d: allreduce_obj gave a wrong sum\n", comm->rank());
      return 1;
    }
  } catch (const kusari::ValueError& e) {
    const std::string what = e.what();
    const std::string want = "KUSARI_MPI_THREAD_LEVEL is 'funneled'; expected 'multiple' or 'serialized'";
    int initialized = 1;
    MPI_Initialized(&initialized);
    if (expect != "error" || what.find(want) == std::string::npos || initialized) {
      std::fprintf(stderr, "unexpected error (MPI initialised: %d): %s\n", initialized, what.c_str());
      return 1;
    }
  }
  std::printf("thread level: ok\n");
  return 0;
}
