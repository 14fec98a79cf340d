// Model parallelism and data parallelism together: two copies of the split MLP of
// train_mnist_model_parallel, each on its own half of the data, with their gradients averaged.
//
//   mpiexec -n 4 ./train_mnist_dual_parallel [-b 100] [-e 20] [-u 1000] [-o result]
//
//                       replica 0   replica 1
//   first half  (784 -> unit)     rank 0      rank 2      <- data-parallel group "first halves"
//   second half (unit -> 10)      rank 1      rank 3      <- data-parallel group "second halves"
//                                 \_ pair _/  \_ pair _/     (model-parallel groups)
//
// The world communicator is split twice (MPI_Comm_split):
//   mp_comm: the two ranks of one replica (the model-parallel pair); activations and their
//            gradients go over it, exactly as in train_mnist_model_parallel.
//   dp_comm: the ranks holding the same half in each replica; the multi-node optimizer averages
//            gradients over it, so both replicas of a half take the same step, as if one process
//            had trained on both replicas' batches.
// Minibatch size per replica is --batchsize, so the effective minibatch is twice that.
#include <cstdio>
#include <exception>

#include "model_parallel_common.h"

int main(int argc, char** argv) {
  auto comm = kusari::mn::create_communicator("naive");
  example::Args args;
  constexpr char kDescription[] =
      "kusari example: MNIST on 4 processes"
      ", 2 data-parallel copies of an MLP split over 2 (model parallelism)";
  if (auto code = example::parse_args(argc, argv, kDescription, comm->rank() == 0, args)) {
    return *code;
  }
  if (kusari::only_check_arguments("train_mnist_dual_parallel")) return 0;
  if (comm->size() != 4) {
    if (comm->rank() == 0)
      std::fprintf(stderr, "error: this example needs exactly 4 processes (mpiexec -n 4)\n");
    return 2;
  }
  example::check_same_args(*comm, args, "train_mnist_dual_parallel");
  const int replica = comm->rank() / 2;  // which copy of the model
  const int half = comm->rank() % 2;     // 0: first half, 1: second half (with the loss)
  // split(color, key): same color -> same group, ordered by key.
  auto mp_comm = comm->split(/*color=*/replica, /*key=*/half);  // mp rank = half
  auto dp_comm = comm->split(/*color=*/half, /*key=*/replica);  // dp rank = replica
  const bool reports = comm->rank() == 1;                       // the second half of replica 0
  if (reports) {
    std::printf(
        "dual parallel MNIST: 2 replicas x 2 model-parallel pieces, %lld units, minibatch %lld per "
        "replica, "
        "%lld epochs\n",
        static_cast<long long>(args.unit), static_cast<long long>(args.batchsize),
        static_cast<long long>(args.epoch));
  }

  // The model-parallel part is train_mnist_model_parallel's, over mp_comm.
  auto chain = std::make_shared<kusari::mn::MultiNodeChainList>(mp_comm);
  std::shared_ptr<kusari::Link> model;
  if (half == 0) {
    chain->add_link(example::first_half(args.unit), std::nullopt, 1);
    model = chain;
  } else {
    chain->add_link(example::second_half(args.unit), 0, std::nullopt);
    model = std::make_shared<kusari::links::Classifier>(chain);
  }
  chain->validate();

  // The data-parallel part: the optimizer averages each half's gradients over dp_comm. Its first
  // update copies dp rank 0's parameters to the other replica, so both replicas start equal.
  auto optimizer = kusari::mn::create_multi_node_optimizer(
      std::make_shared<kusari::optimizers::Adam>(), dp_comm);
  optimizer->setup(model);

  // Each replica trains on its own half of the data. scatter_dataset over dp_comm gives replica r
  // the r-th shard; both ranks of a pair draw the same permutation (same seed), so they get the
  // same shard, and iterate it in the same order (same iterator seed).
  auto [train_all, test] = kusari::get_fashion_mnist();
  auto train = kusari::mn::scatter_dataset(train_all, *dp_comm, 0, /*shuffle=*/true, /*seed=*/0);
  auto train_iter =
      std::make_shared<kusari::SerialIterator>(train, args.batchsize, true, true, /*seed=*/0);
  auto updater = std::make_shared<kusari::training::StandardUpdater>(train_iter, optimizer);
  kusari::training::Trainer trainer(updater, kusari::training::interval(args.epoch, "epoch"),
                                    args.out);
  // Every pair evaluates the whole test set (the replicas hold equal weights); rank 1 prints.
  trainer.extend(example::test_evaluator(test, args.batchsize, chain, half == 1));
  if (reports) trainer.extend(std::make_shared<example::EpochReport>());
  trainer.run();
  return 0;
}
