// Data-parallel training of an MLP on MNIST / Fashion-MNIST: Chainer's train_mnist made
// multi-node as in ChainerMN's example. Run it as one process, or on many with
//
//   mpiexec -n 2 ./train_mnist                                     # CPUs, "naive" communicator
//   mpiexec -n 8 ./train_mnist --gpu --communicator pure_nccl       # one GPU per process
//   ./train_mnist --dtype bfloat16                                  # mixed precision
//   ./train_mnist --predict result/mlp.npz                          # the trained model's predictions
//   kusari-run -n 2:3 -- ./train_mnist --elastic -r result          # go on when a process is lost
//
// The two lines that make a single-device program multi-node are marked "(multi-node)"; the
// lines that train in float16 or bfloat16 are marked "(mixed precision)".
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>

#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace F = kusari::functions;
namespace L = kusari::links;
namespace E = kusari::training::extensions;
using kusari::Variable;

// Network definition: 784 -> n_units -> n_units -> n_out, ReLU in between.
class MLP : public kusari::Chain {
 public:
  // With dropout > 0 the hidden layers are dropped out while training, with random numbers of
  // this model's own generator, which the snapshot keeps (so a resumed run draws what an
  // uninterrupted one would).
  MLP(int64_t n_units, int64_t n_out, double dropout = 0, uint64_t seed = 0) : dropout_(dropout), rng_(seed) {
    l1 = add_link("l1", std::make_shared<L::Linear>(n_units));  // input size inferred
    l2 = add_link("l2", std::make_shared<L::Linear>(n_units));
    l3 = add_link("l3", std::make_shared<L::Linear>(n_out));
  }
  Variable forward(const Variable& x) override {
    Variable h1 = drop(F::relu((*l1)(x)));
    Variable h2 = drop(F::relu((*l2)(h1)));
    return (*l3)(h2);
  }
  void serialize(kusari::Serializer& serializer) override {
    kusari::Chain::serialize(serializer);
    if (dropout_ > 0) {
      auto offset = static_cast<int64_t>(rng_.offset());
      serializer("dropout_generator_offset", offset);
      rng_.set_offset(static_cast<uint64_t>(offset));
    }
  }

 private:
  Variable drop(const Variable& h) { return dropout_ > 0 ? F::dropout(h, dropout_, &rng_) : h; }
  std::shared_ptr<L::Linear> l1, l2, l3;
  double dropout_;
  kusari::Generator rng_;
};

// Loads a trained MLP and prints its predictions for the first `count` test images and its
// accuracy over the whole test set. `file` is the mlp.npz a run writes into its --out folder, or
// one of its snapshots (snapshot_iter_<n>, whose model is under updater/model:main/predictor/).
int predict(const std::string& file, const std::string& data, int count) {
  std::string prefix;
  int64_t unit = 0;
  {
    kusari::NpzFile npz(file, "train_mnist --predict");
    for (const char* p : {"", "predictor/", "updater/model:main/predictor/"}) {
      if (npz.contains(std::string(p) + "l1/W")) {
        prefix = p;
        unit = npz.get(prefix + "l1/W").shape()[0];
        break;
      }
    }
    if (unit == 0) {
      std::fprintf(stderr,
                   "Error: --predict %s holds no MLP (no l1/W, predictor/l1/W or "
                   "updater/model:main/predictor/l1/W); give the mlp.npz or a snapshot a run wrote\n",
                   file.c_str());
      return 1;
    }
  }
  auto mlp = std::make_shared<MLP>(unit, 10);  // the width is the file's
  kusari::load_npz(file, *mlp, prefix);
  kusari::MnistOptions options;
  std::shared_ptr<kusari::TupleDataset> test;
  if (data.empty()) {
    test = kusari::get_fashion_mnist(options).second;
  } else {
    options.directory = data;
    test = kusari::get_mnist(options).second;
  }
  kusari::NoBackpropMode no_backprop;
  std::vector<int64_t> indices(static_cast<size_t>(test->size()));
  std::iota(indices.begin(), indices.end(), int64_t{0});
  std::vector<kusari::Array> batch = kusari::concat_examples(test->get_examples(indices), kusari::Device::cpu());
  const std::vector<int64_t> predicted =
      kusari::argmax(mlp->forward(Variable(batch[0])).data(), 1).astype(kusari::int64).to_vector<int64_t>();
  const std::vector<int64_t> labels = batch[1].astype(kusari::int64).to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) correct += predicted[i] == labels[i];
  std::printf("%s (%lld units): predictions for the first %d test images\n", file.c_str(),
              static_cast<long long>(unit), count);
  for (int i = 0; i < count && i < static_cast<int>(labels.size()); ++i) {
    std::printf("  image %d: predicted %lld, label %lld%s\n", i, static_cast<long long>(predicted[i]),
                static_cast<long long>(labels[i]), predicted[i] == labels[i] ? "" : "  (wrong)");
  }
  std::printf("accuracy over the %zu test images: %.4f\n", labels.size(),
              static_cast<double>(correct) / static_cast<double>(labels.size()));
  return 0;
}

// A flag that must be a positive whole number, refused when the flags are parsed: "--batchsize:
// the mini-batch size must be a positive whole number, got 0".
CLI::Validator positive_integer(const std::string& what) {
  return CLI::Validator(
      [what](const std::string& value) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == value.size() && v > 0 && v <= (1LL << 30)) return {};
        return what + " must be a positive whole number (at most 2^30), got " + value;
      },
      ">0", "PositiveInteger");
}

int main(int argc, char** argv) {
  CLI::App app{"kusari example: data-parallel MNIST"};
  int batchsize = 100, epoch = 20, unit = 1000, frequency = -1, threads = 0;
  bool gpu = false, noplot = false, double_buffering = false, cuda_graph = false, elastic = false;
  std::string elastic_batch = "global";
  int64_t snapshot_interval = 0;
  std::string communicator = "pure_nccl", out = "result", resume, data, dtype_name = "float32";
  std::string iterator_kind = "serial";
  double dropout = 0;
  int64_t seed = 0;
  std::string predict_file;
  int predict_count = 10;
  app.add_option("-b,--batchsize", batchsize, "Number of images in each mini-batch (per process)")
      ->capture_default_str()
      ->check(positive_integer("the mini-batch size"));
  app.add_option("--communicator", communicator,
                 "Type of communicator (on CPUs, a GPU one such as the default falls back to naive)")
      ->capture_default_str()
      ->check(CLI::IsMember(kusari::mn::communicator_names()));
  app.add_option("-e,--epoch", epoch, "Number of sweeps over the dataset to train")
      ->capture_default_str()
      ->check(positive_integer("the number of epochs"));
  app.add_flag("-g,--gpu", gpu, "Use GPUs: each process uses the GPU of its rank within its host");
  app.add_option("-o,--out", out, "Directory to output the result")->capture_default_str();
  app.add_option(
      "-r,--resume", resume,
      "Resume the training from a snapshot, e.g. result/snapshot_iter_600; under mpiexec each "
      "process writes its own snapshot_iter_<iteration>.<rank> and resumes from its own file "
      "(give the name without the rank, and as many processes). A folder instead: the newest snapshot set "
      "every process of the job that wrote it completed, or a fresh start when it holds none (with --elastic "
      "the set may come from another number of processes)");
  app.add_option("-u,--unit", unit, "Number of units")->capture_default_str()->check(positive_integer("the number of units"));
  // 0 and negatives other than -1 used to mean "every epoch" silently; they are refused.
  app.add_option("-f,--frequency", frequency, "Frequency of taking a snapshot (epochs, a positive number; -1: at the end)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& value) -> std::string {
            int f = 0;
            try {
              f = std::stoi(value);
            } catch (const std::exception&) {
              return "the snapshot frequency must be an integer, got " + value;
            }
            if (f == -1 || f > 0) return {};
            return "the snapshot frequency must be -1 (at the end) or a positive number of epochs, got " + value;
          },
          "-1 or >0", "SnapshotFrequency"));
  app.add_option("--data", data,
                 "Directory with the MNIST IDX files (train-images-idx3-ubyte[.gz], ...); default: the Fashion-MNIST "
                 "install (/usr/share/datasets/fashion-mnist or $KUSARI_DATASET_ROOT/fashion-mnist)");
  app.add_option("--threads", threads,
                 "BLAS threads per process on CPUs, 0 or more (0: automatic, the cores divided among the host's "
                 "processes); other kernels use OMP_NUM_THREADS threads, 1 by default")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  app.add_option("--dtype", dtype_name,
                 "Dtype of the parameters and the computation. float16 and bfloat16 train in mixed precision: "
                 "float32 master weights in the optimizer, float32 softmax cross entropy; float16 also scales the "
                 "loss dynamically (its range is small), bfloat16 has float32's range and needs no loss scaling")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_option("--seed", seed, "Seed of the initial weights, the shuffling and the dropout masks")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--iterator", iterator_kind,
                 "How batches are gathered: serial (SerialIterator) or multithread (MultithreadIterator, 2 "
                 "threads); both give the same batches")
      ->capture_default_str()
      ->check(CLI::IsMember({"serial", "multithread"}));
  app.add_option("--dropout", dropout, "Dropout ratio of the hidden layers while training (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.95));
  app.add_flag("--noplot", noplot, "Disable PlotReport extension");
  app.add_flag("--elastic", elastic,
               "Every process reads the whole training set and takes its part of each global batch "
               "(DistributedIterator), so that a snapshot resumes on another number of processes (kusari-run)");
  app.add_option("--elastic-batch", elastic_batch,
                 "With --elastic, what a resume on another number of processes keeps: the global batch (global: "
                 "the same steps and samples) or each process's batch (process: the learning rate scales with the "
                 "global batch)")
      ->capture_default_str()
      ->check(CLI::IsMember({"global", "process"}));
  app.add_option("--snapshot-interval", snapshot_interval,
                 "Take a snapshot every this many iterations instead of by --frequency (0: by --frequency)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_flag("--double-buffering", double_buffering,
               "Overlap each step's gradient allreduce with the next step (NCCL communicators; one step stale)");
  app.add_flag("--cuda-graph", cuda_graph,
               "With --gpu: run each step's forward and backward as a replayed CUDA graph (fewer launches)");
  app.add_option("--predict", predict_file,
                 "Instead of training: load a trained model (the mlp.npz of an --out folder, or a snapshot) and "
                 "print its predictions for the first --predict-count test images (of --data, or Fashion-MNIST) "
                 "and its test accuracy");
  app.add_option("--predict-count", predict_count, "How many test images --predict shows")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (cuda_graph && !gpu) {
    std::fprintf(stderr, "Error: --cuda-graph records GPU work; add --gpu\n");
    return 1;
  }
  if (app.count("--elastic-batch") > 0 && !elastic) {
    std::fprintf(stderr, "Error: --elastic-batch %s chooses how an --elastic run resumes; add --elastic\n",
                 elastic_batch.c_str());
    return 1;
  }
  if (kusari::only_check_arguments("train_mnist")) return 0;
  if (!predict_file.empty()) return predict(predict_file, data, predict_count);
  const kusari::Dtype dtype = kusari::dtype_from_name(dtype_name);

  // Prepare the communicator: a GPU one with --gpu, "naive" on CPUs.          (multi-node)
  const bool cpu_communicator = communicator == "naive" || communicator == "flat" || communicator == "dummy";
  if (gpu && communicator == "naive") {
    std::fprintf(stderr, "Error: 'naive' communicator does not support GPU; use e.g. --communicator pure_nccl\n");
    return 1;
  }
  bool warn_fallback = false;
  if (!gpu && !cpu_communicator) {
    warn_fallback = app.count("--communicator") > 0;
    communicator = "naive";
  }
  auto comm = kusari::mn::create_communicator(communicator);
  kusari::Device device = gpu ? kusari::Device::cuda(comm->intra_rank()) : kusari::Device::cpu();
  // On CPUs the matrix products (BLAS) get the cores; the small elementwise kernels of this MLP
  // run best on one thread (measured in docs/benchmarks.md: 2 + 2 threads on 2 cores thrash).
  if (threads == 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm->intra_size());
  if (!std::getenv("OMP_NUM_THREADS")) kusari::set_num_threads(1);
  kusari::set_blas_num_threads(threads);

  if (comm->rank() == 0) {
    if (warn_fallback) std::printf("Warning: using naive communicator because only naive supports CPU-only execution\n");
    std::printf("==========================================\n");
    std::printf("Num process (COMM_WORLD): %d\n", comm->size());
    if (gpu) std::printf("Using GPUs\n");
    std::printf("Using %s communicator\n", communicator.c_str());
    std::printf("Num unit: %d\n", unit);
    std::printf("Num Minibatch-size: %d\n", batchsize);
    std::printf("Num epoch: %d\n", epoch);
    std::printf("Dtype: %s\n", dtype_name.c_str());
    std::printf("==========================================\n");
    std::fflush(stdout);
  }

  kusari::manual_seed(static_cast<uint64_t>(seed));
  // Each process drops other units: its dropout stream is seeded with its rank too.
  const uint64_t dropout_seed = static_cast<uint64_t>(seed) * 1000003u + static_cast<uint64_t>(comm->rank());
  auto model = std::make_shared<L::Classifier>(std::make_shared<MLP>(unit, 10, dropout, dropout_seed));
  model->to_device(device);
  // Parameters in the training dtype; the lazily sized l1.W is created in it.   (mixed precision)
  model->to_dtype(dtype);
  // Average the gradients over the processes before each update.               (multi-node)
  auto adam = std::make_shared<kusari::optimizers::Adam>();
  const double base_alpha = adam->alpha();
  auto optimizer = kusari::mn::create_multi_node_optimizer(adam, comm, double_buffering);
  optimizer->setup(model);
  if (dtype != kusari::float32) {
    optimizer->use_fp32_update();                                           // (mixed precision)
    if (dtype == kusari::float16) optimizer->loss_scaling();                // (mixed precision)
  }
  // Batches are stacked in float32 on the device, then cast to the training dtype there.
  kusari::training::Converter converter = [dtype](const std::vector<kusari::Example>& batch, kusari::Device dev) {
    std::vector<kusari::Array> arrays = kusari::concat_examples(batch, dev);
    for (kusari::Array& a : arrays) {
      if (kusari::is_floating(a.dtype())) a = a.astype(dtype);
    }
    return arrays;
  };

  // Rank 0 reads the dataset and every process receives its shard. With --elastic every process
  // reads it and keeps the whole training set (Note [Distributed iterator]).
  std::shared_ptr<kusari::Dataset> train, test;
  if (comm->rank() == 0 || elastic) {
    kusari::MnistOptions options;
    std::pair<std::shared_ptr<kusari::TupleDataset>, std::shared_ptr<kusari::TupleDataset>> sets;
    if (data.empty()) {
      sets = kusari::get_fashion_mnist(options);
    } else {
      options.directory = data;
      sets = kusari::get_mnist(options);
    }
    train = sets.first;
    test = sets.second;
  }
  if (!elastic) train = kusari::mn::scatter_dataset(train, comm, 0, true);
  test = kusari::mn::scatter_dataset(test, comm, 0, true);

  // Every process must have been started with the same settings: a batch size or a number of
  // epochs that differs between them would make them wait for each other forever.   (multi-node)
  const int64_t shard = train->size();
  const int64_t step = elastic ? static_cast<int64_t>(batchsize) * comm->size() : batchsize;
  const int64_t common = std::gcd(shard, step);
  std::string iterations_per_epoch = std::to_string(shard / common);
  if (common != step) iterations_per_epoch += "/" + std::to_string(step / common);
  iterations_per_epoch += " (" + std::to_string(shard) + " examples in batches of " + std::to_string(step) + ")";
  kusari::mn::check_same_settings(comm,
                                  {{"--batchsize", std::to_string(batchsize)},
                                   {"iterations per epoch", iterations_per_epoch},
                                   {"--epoch", std::to_string(epoch)},
                                   {"--frequency", std::to_string(frequency)},
                                   {"--unit", std::to_string(unit)},
                                   {"--communicator", communicator},
                                   {"--gpu", gpu ? "on" : "off"},
                                   {"--double-buffering", double_buffering ? "on" : "off"},
                                   {"--dtype", dtype_name},
                                   {"--dropout", std::to_string(dropout)},
                                   {"--resume", resume.empty() ? "(none)" : "given"},
                                   {"--elastic", elastic ? elastic_batch : "off"},
                                   {"--snapshot-interval", std::to_string(snapshot_interval)}},
                                  "train_mnist");

  std::shared_ptr<kusari::Iterator> train_iter;
  std::shared_ptr<kusari::mn::DistributedIterator> elastic_iter;
  if (elastic) {
    kusari::mn::DistributedIteratorOptions options;
    options.resize =
        elastic_batch == "global" ? kusari::mn::ElasticBatch::kKeepGlobal : kusari::mn::ElasticBatch::kKeepPerProcess;
    elastic_iter = std::make_shared<kusari::mn::DistributedIterator>(train, batchsize, comm, options);
    train_iter = elastic_iter;
  } else if (iterator_kind == "multithread") {
    train_iter = std::make_shared<kusari::MultithreadIterator>(train, batchsize, true, true, std::nullopt, 2);
  } else {
    train_iter = std::make_shared<kusari::SerialIterator>(train, batchsize);
  }
  auto test_iter = std::make_shared<kusari::SerialIterator>(test, batchsize, false, false);
  auto updater = std::make_shared<kusari::training::StandardUpdater>(train_iter, optimizer, device, converter);
  updater->set_use_cuda_graph(cuda_graph);
  kusari::training::Trainer trainer(updater, kusari::training::interval(epoch, "epoch"), out);

  // Evaluate the model with the test dataset for each epoch, over all processes.
  trainer.extend(
      kusari::mn::create_multi_node_evaluator(E::Evaluator(test_iter, model, converter, device), comm));

  // Snapshots: one process writes Chainer's snapshot_iter_<iteration>; under mpiexec each process
  // writes its own snapshot_iter_<iteration>.<rank>, with its own iterator state.   (multi-node)
  const int snapshot_every = frequency == -1 ? epoch : frequency;
  auto snapshot_trigger = snapshot_interval > 0 ? kusari::training::interval(snapshot_interval, "iteration")
                                                : kusari::training::interval(snapshot_every, "epoch");
  if (comm->size() == 1) {
    trainer.extend(E::snapshot(), "", snapshot_trigger);
  } else {
    trainer.extend(kusari::mn::multi_node_snapshot(comm, E::snapshot()), "", snapshot_trigger);
  }

  // Some display and output extensions are necessary only for one worker.
  if (comm->rank() == 0) {
    trainer.extend(std::make_shared<E::LogReport>());
    if (!noplot) {
      trainer.extend(std::make_shared<E::PlotReport>(std::vector<std::string>{"main/loss", "validation/main/loss"},
                                                     "epoch", nullptr, "loss.png"));
      trainer.extend(std::make_shared<E::PlotReport>(
          std::vector<std::string>{"main/accuracy", "validation/main/accuracy"}, "epoch", nullptr, "accuracy.png"));
    }
    trainer.extend(std::make_shared<E::PrintReport>(std::vector<std::string>{
        "epoch", "main/loss", "validation/main/loss", "main/accuracy", "validation/main/accuracy", "elapsed_time"}));
    trainer.extend(std::make_shared<E::ProgressBar>());
  }

  // -r naming a folder, or the --out folder even before it exists (a first start), resumes from
  // the newest complete snapshot set in it, if any.
  if (kusari::mn::names_snapshot_folder(resume, out)) {
    // A folder: the newest snapshot set that every process of the job that wrote it completed,
    // possibly another number of processes (Note [Resuming on another number of processes]).
    kusari::mn::load_newest_snapshot_set(resume, trainer, comm);
    if (elastic_iter && elastic_iter->learning_rate_factor() != 1.0) {
      // --elastic-batch process: the global batch changed with the number of processes; the
      // linear scaling rule changes the step size with it.
      adam->alpha() = base_alpha * elastic_iter->learning_rate_factor();
      if (comm->rank() == 0) {
        std::printf("The global batch is %lld (it was %lld at the first start): Adam's alpha is %g\n",
                    static_cast<long long>(elastic_iter->global_batch_size()),
                    static_cast<long long>(elastic_iter->initial_global_batch_size()), adam->alpha());
      }
    }
  } else if (!resume.empty()) {
    // Every process loads its own file of the snapshot (<resume>.<rank> under mpiexec): the same
    // weights, and its own iterator position and order, so the run goes on bit for bit.
    kusari::mn::load_snapshot_of_each_rank(resume, trainer, comm);  // (multi-node)
  }
  trainer.run();
  // The trained model alone, for --predict (and for Chainer: serializers.load_npz into its MLP).
  if (comm->rank() == 0) kusari::save_npz(out + "/mlp.npz", model->predictor());
  return 0;
}
