// A data-parallel training loop in which rank 1 throws at its third step while the other ranks
// go on into the gradient allreduce. The job must end promptly with a message naming rank 1.
#include <cstdio>
#include <stdexcept>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"

namespace F = kusari::functions;

int main() {
  auto comm = kusari::mn::create_communicator("naive");
  auto model = std::make_shared<kusari::links::Linear>(4, 2);
  kusari::Array x = kusari::Array::uniform({8, 4});
  for (int step = 0; step < 1000; ++step) {
    if (comm->rank() == 1 && step == 3) throw std::runtime_error("injected failure at step 3");
    model->cleargrads();
    kusari::Variable loss = F::sum(F::square((*model)(x)));
    loss.backward();
    comm->multi_node_mean_grad(*model, true);
  }
  std::printf("rank %d finished without noticing the failure\n", comm->rank());
  return 0;
}
