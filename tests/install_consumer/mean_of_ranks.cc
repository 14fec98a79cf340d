// Under mpiexec: every rank contributes its rank to an allreduce through kusari::mn, and checks
// the mean; exits non-zero on a wrong value.
#include <cstdio>

#include <kusari/kusari.h>
#include <kusari/mn.h>

int main() {
  auto comm = kusari::mn::create_communicator("naive");
  kusari::Array x = kusari::Array::full({3}, static_cast<double>(comm->rank()));
  kusari::Array mean = comm->allreduce(x, kusari::mn::ReduceOp::kMean);
  const double expected = (comm->size() - 1) / 2.0;
  const double got = mean.to_vector<double>()[0];
  std::printf("rank %d of %d: mean of ranks %.2f (expected %.2f)\n", comm->rank(), comm->size(), got,
              expected);
  return got == expected ? 0 : 1;
}
