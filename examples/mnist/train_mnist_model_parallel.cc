// Model parallelism in its smallest form: the 784-1000-1000-10 MLP of train_mnist, cut in two
// and run by two processes (ChainerMN's train_mnist_model_parallel).
//
//   mpiexec -n 2 ./train_mnist_model_parallel [-b 100] [-e 20] [-u 1000] [-o result]
//
//   rank 0:  x -> Linear(784, 1000) -> ReLU ----send---->
//   rank 1:  ----recv----> Linear(1000, 1000) -> ReLU -> Linear(1000, 10) -> loss(y, t)
//
// In backward the gradient travels the other way: rank 1's loss.backward() sends the gradient of
// the activation back, and rank 0's backward, started from the "delegate variable" that its half
// returns in place of an output, receives it and finishes. Each rank trains only its own half,
// with its own optimizer. Both ranks draw the same batches (the same data, the same iterator
// seed): rank 0 uses the images, rank 1 the labels. Fashion-MNIST is read from
// /usr/share/datasets/fashion-mnist or $KUSARI_DATASET_ROOT/fashion-mnist.
#include <cstdio>
#include <exception>

#include "model_parallel_common.h"

int main(int argc, char** argv) {
  auto comm = kusari::mn::create_communicator("naive");
  example::Args args;
  constexpr char kDescription[] =
      "kusari example: MNIST with the MLP split over 2 processes"
      " (model parallelism)";
  if (auto code = example::parse_args(argc, argv, kDescription, comm->rank() == 0, args)) {
    return *code;
  }
  if (kusari::only_check_arguments("train_mnist_model_parallel")) return 0;
  if (comm->size() != 2) {
    if (comm->rank() == 0)
      std::fprintf(stderr, "error: this example needs exactly 2 processes (mpiexec -n 2)\n");
    return 2;
  }
  example::check_same_args(*comm, args, "train_mnist_model_parallel");
  const bool has_loss = comm->rank() == 1;
  if (has_loss) {
    std::printf("model parallel MNIST: 2 processes, %lld units, minibatch %lld, %lld epochs\n",
                static_cast<long long>(args.unit), static_cast<long long>(args.batchsize),
                static_cast<long long>(args.epoch));
  }

  // Each rank builds a MultiNodeChainList holding its half. add_link(piece, rank_in, rank_out):
  // rank 0's piece takes the model input and sends its output to rank 1; rank 1's piece receives
  // from rank 0 and produces the model output (no rank_out).
  auto chain = std::make_shared<kusari::mn::MultiNodeChainList>(comm);
  std::shared_ptr<kusari::Link> model;  // what the optimizer trains: the loss lives on rank 1
  if (comm->rank() == 0) {
    chain->add_link(example::first_half(args.unit), std::nullopt, 1);
    model = chain;  // forward_batch({x, t}) = chain->forward(x): a delegate variable
  } else {
    chain->add_link(example::second_half(args.unit), 0, std::nullopt);
    model = std::make_shared<kusari::links::Classifier>(chain);  // loss and accuracy of y and t
  }
  chain->validate();  // both ranks: every send has its receive (a clear error instead of a hang)

  auto optimizer = std::make_shared<kusari::optimizers::Adam>();
  optimizer->setup(model);

  auto [train, test] = kusari::get_fashion_mnist();
  // The same seed on both ranks: rank 0's images and rank 1's labels belong together.
  auto train_iter =
      std::make_shared<kusari::SerialIterator>(train, args.batchsize, true, true, /*seed=*/0);
  auto updater = std::make_shared<kusari::training::StandardUpdater>(train_iter, optimizer);
  kusari::training::Trainer trainer(updater, kusari::training::interval(args.epoch, "epoch"),
                                    args.out);
  trainer.extend(example::test_evaluator(test, args.batchsize, chain, has_loss));
  if (has_loss) trainer.extend(std::make_shared<example::EpochReport>());
  trainer.run();
  return 0;
}
