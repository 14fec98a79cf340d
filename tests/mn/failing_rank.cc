// A data-parallel training loop in which rank 1 throws at its third step while the other ranks
// go on into the gradient allreduce (or, with --all, every rank throws the same error there). The
// job must end promptly with one report naming the rank(s) and the error.
#include <cstdio>
#include <cstring>
#include <chrono>
#include <stdexcept>
#include <thread>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"

namespace F = kusari::functions;

int main(int argc, char** argv) {
  const bool all = argc > 1 && std::strcmp(argv[1], "--all") == 0;
  auto comm = kusari::mn::create_communicator("naive");
  auto model = std::make_shared<kusari::links::Linear>(4, 2);
  kusari::Array x = kusari::Array::uniform({8, 4});
  for (int step = 0; step < 1000; ++step) {
    if (all && step == 3) {
      // (Every rank finishes its waits of step 2 first: a rank still waiting when another fails
      // ends quietly, as it should, and would be missing from the report's list.)
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      throw std::runtime_error("injected failure at step 3 on every rank");
    }
    if (comm->rank() == 1 && step == 3) throw std::runtime_error("injected failure at step 3");
    model->cleargrads();
    kusari::Variable loss = F::sum(F::square((*model)(x)));
    loss.backward();
    comm->multi_node_mean_grad(*model, true);
  }
  std::printf("rank %d finished without noticing the failure\n", comm->rank());
  return 0;
}
