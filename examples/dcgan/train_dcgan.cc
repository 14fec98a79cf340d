// Data-parallel DCGAN on Fashion-MNIST: Chainer's examples/dcgan made multi-node as in
// ChainerMN's. Two models (a generator and a discriminator), two multi-node optimizers and an
// updater that takes a step of each per batch. Run it as one process, or on many with
//
//   mpiexec -n 2 ./train_dcgan                                     # CPUs, "naive" communicator
//   mpiexec -n 8 ./train_dcgan --gpu --communicator pure_nccl       # one GPU per process
//
// Every epoch rank 0 writes a 10x10 grid of samples drawn from fixed noise to
// <out>/preview/image_epoch_<N>.png. The lines that make it multi-node are marked "(multi-node)".
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "kusari/datasets/image.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"

namespace F = kusari::functions;
namespace L = kusari::links;
namespace E = kusari::training::extensions;
using kusari::Array;
using kusari::Variable;

// Weights drawn from N(0, 0.02), as in the DCGAN paper and Chainer's example.
std::shared_ptr<kusari::Initializer> w_init() { return std::make_shared<kusari::initializers::Normal>(0.02); }

// z (N, n_hidden) -> Linear -> BN -> ReLU -> (ch, 7, 7) -> Deconv -> BN -> ReLU -> (ch/2, 14, 14)
// -> Deconv -> sigmoid -> (1, 28, 28), pixels in [0, 1] like the data.
class Generator : public kusari::Chain {
 public:
  Generator(int64_t n_hidden, int64_t ch) : n_hidden_(n_hidden), ch_(ch) {
    l0 = add_link("l0", std::make_shared<L::Linear>(n_hidden, 7 * 7 * ch, false, w_init()));
    bn0 = add_link("bn0", std::make_shared<L::BatchNormalization>(7 * 7 * ch));
    dc1 = add_link("dc1", std::make_shared<L::Deconvolution2D>(ch, ch / 2, 4, 2, 1, false, std::nullopt, w_init()));
    bn1 = add_link("bn1", std::make_shared<L::BatchNormalization>(ch / 2));
    dc2 = add_link("dc2", std::make_shared<L::Deconvolution2D>(ch / 2, 1, 4, 2, 1, false, std::nullopt, w_init()));
  }
  // Noise for n images, drawn from N(0, 1) by `gen`.
  Array make_hidden(int64_t n, kusari::Device device, kusari::Generator& gen) const {
    return Array::normal({n, n_hidden_}, 0.0, 1.0, kusari::float32, device, &gen);
  }
  Variable forward(const Variable& z) override {
    Variable h = F::reshape(F::relu((*bn0)((*l0)(z))), {z.array().shape()[0], ch_, 7, 7});
    h = F::relu((*bn1)((*dc1)(h)));
    return F::sigmoid((*dc2)(h));
  }

 private:
  int64_t n_hidden_, ch_;
  std::shared_ptr<L::Linear> l0;
  std::shared_ptr<L::BatchNormalization> bn0, bn1;
  std::shared_ptr<L::Deconvolution2D> dc1, dc2;
};

// x (N, 1, 28, 28) -> Conv -> LeakyReLU -> (ch/2, 14, 14) -> Conv -> BN -> LeakyReLU -> (ch, 7, 7)
// -> Linear -> one logit per image ("real" when large).
class Discriminator : public kusari::Chain {
 public:
  explicit Discriminator(int64_t ch) {
    c0 = add_link("c0", std::make_shared<L::Convolution2D>(1, ch / 2, 4, 2, 1, false, w_init()));
    c1 = add_link("c1", std::make_shared<L::Convolution2D>(ch / 2, ch, 4, 2, 1, false, w_init()));
    bn1 = add_link("bn1", std::make_shared<L::BatchNormalization>(ch));
    l2 = add_link("l2", std::make_shared<L::Linear>(7 * 7 * ch, 1, false, w_init()));
  }
  Variable forward(const Variable& x) override {
    Variable h = F::leaky_relu((*c0)(x));
    h = F::leaky_relu((*bn1)((*c1)(h)));
    return (*l2)(h);
  }

 private:
  std::shared_ptr<L::Convolution2D> c0, c1;
  std::shared_ptr<L::BatchNormalization> bn1;
  std::shared_ptr<L::Linear> l2;
};

// Per batch: a discriminator step on real and generated images, then a generator step against
// the updated discriminator (Chainer's DCGANUpdater; the losses are its softplus forms).
class DCGANUpdater : public kusari::training::StandardUpdater {
 public:
  DCGANUpdater(std::shared_ptr<kusari::Iterator> iterator, std::shared_ptr<kusari::Optimizer> gen_opt,
               std::shared_ptr<kusari::Optimizer> dis_opt, std::shared_ptr<Generator> gen, kusari::Device device,
               uint64_t noise_seed)
      : StandardUpdater(std::move(iterator), dis_opt, device), gen_opt_(std::move(gen_opt)),
        gen_(std::move(gen)), noise_(noise_seed) {}

  void update_core() override {
    Array x_real = kusari::concat_examples(iterator_->next(), device_)[0];
    const int64_t n = x_real.shape()[0];
    Variable x_fake = (*gen_)(Variable(gen_->make_hidden(n, device_, noise_)));
    Link* dis = optimizer_->target();
    // D step: the fake images enter as constants, so only the discriminator gets gradients.
    optimizer_->update([&]() {
      Variable y_real = (*dis)(Variable(x_real)), y_fake = (*dis)(x_fake.detached());
      Variable loss = F::mean(F::softplus(-y_real)) + F::mean(F::softplus(y_fake));
      kusari::report({{"dis/loss", loss.array()}});
      return loss;
    });
    // G step: gradients flow through the discriminator into the generator; the discriminator's
    // are cleared by its next step.
    gen_opt_->update([&]() {
      Variable loss = F::mean(F::softplus(-(*dis)(x_fake)));
      kusari::report({{"gen/loss", loss.array()}});
      return loss;
    });
  }
  kusari::Optimizer& optimizer(const std::string& name) override {
    if (name == "gen") return *gen_opt_;
    KUSARI_CHECK(name == "main" || name == "dis", ValueError, "DCGANUpdater::optimizer: no optimizer '",
                 name, "' (expected 'gen', 'dis' or 'main', which is 'dis')");
    return *optimizer_;
  }
  // Chainer's layout with two optimizers: "optimizer:gen", "model:gen", "optimizer:dis", ...
  void serialize(kusari::Serializer& s) override {
    iterator_->serialize(*s.child("iterator:main"));
    gen_opt_->serialize(*s.child("optimizer:gen"));
    gen_->serialize(*s.child("model:gen"));
    optimizer_->serialize(*s.child("optimizer:dis"));
    optimizer_->target()->serialize(*s.child("model:dis"));
    s.count("iteration", iteration_);
  }

 private:
  using Link = kusari::Link;
  std::shared_ptr<kusari::Optimizer> gen_opt_;
  std::shared_ptr<Generator> gen_;
  kusari::Generator noise_;
};

// Writes a rows x rows grid of samples from fixed noise (test mode: BN uses its running
// statistics) and prints their pixel standard deviation (near 0 when the generator collapsed).
void write_preview(Generator& gen, const Array& z, int64_t rows, const std::string& path) {
  kusari::NoBackpropMode no_backprop;
  kusari::TrainMode test_mode(false);
  Array x = gen(Variable(z)).array().to_device(kusari::Device::cpu());
  Array grid = x.reshape({rows, rows, 28, 28}).transpose({0, 2, 1, 3}).reshape({rows * 28, rows * 28});
  std::vector<float> v = grid.to_vector<float>();
  double mean = 0, sq = 0;
  for (float p : v) mean += p;
  mean /= static_cast<double>(v.size());
  for (float p : v) sq += (p - mean) * (p - mean);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  kusari::write_png(path, kusari::image_from_array((kusari::clip(grid, 0.0, 1.0) * 255.0 + 0.5).astype(kusari::uint8)));
  std::printf("preview %s: pixel standard deviation %.4f\n", path.c_str(), std::sqrt(sq / v.size()));
  std::fflush(stdout);
}

// Flag checks whose messages name the value and what is expected.
const CLI::Validator kPositive(
    [](std::string& v) { return std::atof(v.c_str()) > 0 ? std::string() : "must be positive, got " + v; }, "POSITIVE");
const CLI::Validator kNonNegative(
    [](std::string& v) { return std::atof(v.c_str()) >= 0 ? std::string() : "must be 0 or more, got " + v; }, ">=0");

int main(int argc, char** argv) {
  CLI::App app{"kusari example: data-parallel DCGAN on Fashion-MNIST"};
  int batchsize = 50, epoch = 20, n_hidden = 100, seed = 0, snapshot_interval = -1, train_size = 0, threads = 0;
  bool gpu = false;
  std::string communicator = "pure_nccl", out = "result", resume;
  app.add_option("-b,--batchsize", batchsize, "Number of images in each mini-batch (per process)")
      ->capture_default_str()->check(kPositive);
  app.add_option("--communicator", communicator,
                 "Type of communicator (on CPUs, a GPU one such as the default falls back to naive)")
      ->capture_default_str()->check(CLI::IsMember(kusari::mn::communicator_names()));
  app.add_option("-e,--epoch", epoch, "Number of sweeps over the dataset to train")
      ->capture_default_str()->check(kPositive);
  app.add_flag("-g,--gpu", gpu, "Use GPUs: each process uses the GPU of its rank within its host");
  app.add_option("-o,--out", out, "Directory to output the result")->capture_default_str();
  app.add_option("-r,--resume", resume,
                 "Resume from a snapshot, e.g. result/snapshot_iter_600 (each process loads its own file)");
  app.add_option("-n,--n-hidden", n_hidden, "Number of hidden units (z)")->capture_default_str()
      ->check(kPositive);
  app.add_option("--seed", seed, "Random seed of the weights and of the preview's fixed noise")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("--snapshot-interval", snapshot_interval,
                 "Epochs between snapshots (a positive number; -1: at the end)")
      ->capture_default_str()->check(CLI::Validator(
          [](std::string& v) {
            return v == "-1" || std::atof(v.c_str()) > 0 ? std::string()
                                                        : "must be -1 (at the end) or positive, got " + v;
          },
          "-1 or >0"));
  app.add_option("--train-size", train_size, "Train on the first N images only (0: all 60000)")
      ->capture_default_str()->check(kNonNegative);
  app.add_option("--threads", threads, "BLAS threads per process on CPUs (0: the cores divided among the processes)")
      ->capture_default_str()->check(kNonNegative);
  CLI11_PARSE(app, argc, argv);

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
  if (kusari::only_check_arguments("train_dcgan")) return 0;
  auto comm = kusari::mn::create_communicator(communicator);
  kusari::Device device = gpu ? kusari::Device::cuda(comm->intra_rank()) : kusari::Device::cpu();
  if (threads == 0) threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm->intra_size());
  kusari::set_blas_num_threads(threads);
  if (comm->rank() == 0) {
    if (warn_fallback) std::printf("Warning: using naive communicator because only naive supports CPU-only execution\n");
    std::printf("==========================================\n");
    std::printf("Num process (COMM_WORLD): %d\n", comm->size());
    if (gpu) std::printf("Using GPUs\n");
    std::printf("Using %s communicator\n", communicator.c_str());
    std::printf("Num hidden unit: %d\nNum Minibatch-size: %d\nNum epoch: %d\n", n_hidden, batchsize, epoch);
    std::printf("==========================================\n");
    std::fflush(stdout);
  }

  // Same weights everywhere (the multi-node optimizers also broadcast rank 0's at the first step).
  kusari::manual_seed(static_cast<uint64_t>(seed));
  auto gen = std::make_shared<Generator>(n_hidden, 64);
  auto dis = std::make_shared<Discriminator>(64);
  gen->to_device(device);
  dis->to_device(device);
  auto make_optimizer = [&](std::shared_ptr<kusari::Link> model) {  // (multi-node)
    auto opt = kusari::mn::create_multi_node_optimizer(std::make_shared<kusari::optimizers::Adam>(2e-4, 0.5), comm);
    opt->setup(model);
    return opt;
  };
  auto gen_opt = make_optimizer(gen), dis_opt = make_optimizer(dis);

  // Rank 0 reads the images (no labels, (1, 28, 28) in [0, 1]); every process gets its shard.
  std::shared_ptr<kusari::Dataset> train;
  if (comm->rank() == 0) {
    kusari::MnistOptions options;
    options.withlabel = false;
    options.ndim = 3;
    train = kusari::get_fashion_mnist(options).first;
    if (train_size > 0 && train_size < train->size()) train = std::make_shared<kusari::SubDataset>(train, 0, train_size);
  }
  train = kusari::mn::scatter_dataset(train, comm, 0, true);  // (multi-node)
  kusari::mn::check_same_settings(comm,
                                  {{"--batchsize", std::to_string(batchsize)},
                                   {"examples per process", std::to_string(train->size())},
                                   {"--epoch", std::to_string(epoch)},
                                   {"--n-hidden", std::to_string(n_hidden)},
                                   {"--seed", std::to_string(seed)},
                                   {"--snapshot-interval", std::to_string(snapshot_interval)},
                                   {"--communicator", communicator},
                                   {"--gpu", gpu ? "on" : "off"},
                                   {"--resume", resume.empty() ? "(none)" : "given"}},
                                  "train_dcgan");

  auto train_iter = std::make_shared<kusari::SerialIterator>(train, batchsize);
  // Each process draws its own noise.                                          (multi-node)
  auto updater = std::make_shared<DCGANUpdater>(train_iter, gen_opt, dis_opt, gen, device,
                                                static_cast<uint64_t>(seed) * 1000003u + 1 + comm->rank());
  kusari::training::Trainer trainer(updater, kusari::training::interval(epoch, "epoch"), out);

  const int snapshot_every = snapshot_interval == -1 ? epoch : snapshot_interval;
  if (comm->size() == 1) {
    trainer.extend(E::snapshot(), "", kusari::training::interval(snapshot_every, "epoch"));
  } else {
    trainer.extend(kusari::mn::multi_node_snapshot(comm, E::snapshot()), "",  // (multi-node)
                   kusari::training::interval(snapshot_every, "epoch"));
  }
  if (comm->rank() == 0) {
    kusari::Generator preview_noise(static_cast<uint64_t>(seed));
    const Array z = gen->make_hidden(100, device, preview_noise);
    trainer.extend(kusari::training::make_extension(
                       [gen, z, out](kusari::training::Trainer& t) {
                         write_preview(*gen, z, 10,
                                       out + "/preview/image_epoch_" + std::to_string(t.updater().epoch()) + ".png");
                       },
                       "preview", kusari::training::interval(1, "epoch")));
    trainer.extend(std::make_shared<E::LogReport>());
    trainer.extend(std::make_shared<E::PrintReport>(
        std::vector<std::string>{"epoch", "iteration", "gen/loss", "dis/loss", "elapsed_time"}));
    trainer.extend(std::make_shared<E::ProgressBar>());
  }
  if (!resume.empty()) kusari::mn::load_snapshot_of_each_rank(resume, trainer, comm);  // (multi-node)
  trainer.run();
  return 0;
}
