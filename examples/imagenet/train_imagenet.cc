// Data-parallel training of a ResNet on ImageNet, or any folder of labelled images: ChainerMN's
// train_imagenet. Run it as one process, or on many with
//
//   mpiexec -n 2 ./train_imagenet train/ val/ --arch resnet18 -B 32          # CPUs, naive
//   mpiexec -n 8 ./train_imagenet train/ val/ --gpu --communicator pure_nccl  # one GPU per process
//   mpiexec -n 8 ./train_imagenet train.txt val.txt --root /data/imagenet --gpu --dtype bfloat16
//
// The training and validation sets are folders with one subfolder per class (ImageFolderDataset)
// or list files of "path label" lines (LabeledImageDataset, paths relative to --root). The
// datasets hold paths only: every process lists the files, scatter_dataset hands each its shard
// of indices, and each process decodes only its own images on its loader threads.
//
// Schedule (Goyal et al., "Accurate, Large Minibatch SGD"): MomentumSGD with the learning rate
// scaled linearly with the global batch (0.1 per 256 images), ramped up linearly from the rate
// of one process's batch over the first --warmup-epochs, and divided by 10 at each epoch of
// --lr-decay-epochs (or a cosine, --lr-schedule cosine); weight decay on every parameter.
//
// The large-minibatch recipe (docs/imagenet.md, "Large minibatches"), each piece a flag:
//   --lr-scaling linear|none       the default rate: --base-lr per --base-batchsize images, or
//                                  --base-lr whatever the batch
//   --warmup-epochs, --warmup-start-lr   Goyal et al.'s gradual warm-up
//   --optimizer sgd|rmsprop-warmup|lars|lamb   momentum SGD, Akiba et al.'s RMSprop warm-up
//                                  switching to momentum SGD, LARS, LAMB
//   --label-smoothing 0.1          softmax cross entropy against smoothed labels
//   --no-bn-weight-decay           no weight decay on biases and batch normalization
//   --bn-freeze-epochs K           running statistics as plain averages over the last K epochs
//   --allreduce-dtype float16      gradients travel in float16 (or bfloat16)
//
// --overlap averages the gradients in buckets while backward still runs (--bucket-mb each), as
// PyTorch DDP does; the numbers are those without it (docs/cluster.md, "Overlapping the
// gradient allreduce with backward").
#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kusari/datasets/image.h"
#include "kusari/datasets/sub_dataset.h"
#include "kusari/datasets/transforms.h"
#include "kusari/iterators/image_loader.h"
#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "kusari/models/resnet.h"

namespace E = kusari::training::extensions;
namespace T = kusari::transforms;

namespace {

// A folder means ImageFolderDataset; anything else is a list file read by LabeledImageDataset.
std::shared_ptr<kusari::ImageFileDataset> open_dataset(const std::string& where,
                                                       const std::string& root) {
  if (std::filesystem::is_directory(where)) {
    return std::make_shared<kusari::ImageFolderDataset>(where);
  }
  if (!std::filesystem::exists(where)) {
    throw kusari::IOError("train_imagenet: '" + where +
                          "' is neither a folder of class folders nor a list file of "
                          "'path label' lines");
  }
  return std::make_shared<kusari::LabeledImageDataset>(where, root);
}

// One more than the largest label (a list file does not name its classes).
int64_t count_classes(const kusari::ImageFileDataset& dataset) {
  if (auto* folder = dynamic_cast<const kusari::ImageFolderDataset*>(&dataset)) {
    return static_cast<int64_t>(folder->classes().size());
  }
  int64_t n = 0;
  for (int64_t i = 0; i < dataset.size(); ++i) {
    n = std::max<int64_t>(n, dataset.label(i).value_or(0) + 1);
  }
  return n;
}

// `n` examples of `dataset` drawn without replacement by a fixed seed (the --test subset: a
// prefix of a class-per-folder dataset would hold a single class).
std::shared_ptr<kusari::Dataset> random_subset(std::shared_ptr<kusari::Dataset> dataset,
                                               int64_t n) {
  const int64_t size = dataset->size();
  if (n >= size) return dataset;
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937_64 rng(0);
  std::shuffle(order.begin(), order.end(), rng);
  return std::make_shared<kusari::SubDataset>(std::move(dataset), 0, n, std::move(order));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kusari example: data-parallel ResNet training on ImageNet-layout images"};
  std::string train_path, val_path, root = ".", arch = "resnet50", communicator = "pure_nccl";
  std::string out = "result", resume, dtype_name = "float32";
  int batchsize = 32, val_batchsize = 250, epoch = 90, loaderjob = 0, frequency = -1, threads = 0;
  int64_t size = 224, num_classes = 0, checkpoint_interval = 0, width = 64;
  double lr = -1, momentum = 0.9, weight_decay = 1e-4, warmup_epochs = 5, min_crop_scale = 0.08;
  std::vector<double> decay_epochs = {30, 60, 80};
  uint64_t seed = 0;
  bool gpu = false, mnbn = false, channels_last = false, test = false, noplot = false;
  bool no_progress = false, zero_init_residual = false;
  // The large-minibatch recipe.
  std::string lr_scaling = "linear", lr_schedule = "step", optimizer_name = "sgd";
  std::string allreduce_dtype = "(gradients' dtype)";
  double base_lr = 0.1, warmup_start_lr = -1, label_smoothing = 0.0, rmsprop_lr = 1e-3;
  double rmsprop_center = 10, rmsprop_period = 5, lars_eta = 0.001;
  int64_t base_batchsize = 256;
  int bn_freeze_epochs = 0;
  bool no_bn_weight_decay = false;
  bool overlap = false;
  double bucket_mb = 25;

  // CLI11's PositiveNumber prints the double range in full; say plainly what is expected.
  const CLI::Validator positive(
      [](const std::string& value) -> std::string {
        double v = 0;
        try {
          v = std::stod(value);
        } catch (const std::exception&) {
          return "expected a positive number, got " + value;
        }
        if (v > 0) return {};
        return "expected a positive number, got " + value;
      },
      ">0", "Positive");
  // The image sets are ChainerMN's positional arguments; --train and --val name them too, and
  // stay out of --help (one entry each there).
  app.add_option("train", train_path,
                 "Training images: a folder with one subfolder per class, or a list file of 'path label' lines");
  app.add_option("val", val_path, "Validation images, as train");
  app.add_option("--train", train_path, "Training images, as the first argument")->group("");
  app.add_option("--val", val_path, "Validation images, as the second argument")->group("");
  app.add_option("-R,--root", root, "Folder the relative paths of list files start from")
      ->capture_default_str();
  app.add_option("-a,--arch", arch, "Network architecture (the ResNet model zoo)")
      ->capture_default_str()
      ->check(CLI::IsMember({"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}));
  app.add_option("--width", width,
                 "Channels of the first stage (the later ones have 2, 4 and 8 times as many); "
                 "64 is the paper's network, less a narrower one for small experiments")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("-B,--batchsize", batchsize, "Training mini-batch size (per process)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("-b,--val-batchsize", val_batchsize, "Validation mini-batch size (per process)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("-E,--epoch", epoch, "Number of epochs to train")
      ->capture_default_str()
      ->check(positive);
  app.add_option("-j,--loaderjob", loaderjob,
                 "Loader threads per process that decode and transform images (0: the host's "
                 "hardware threads divided among its processes)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option(
         "--communicator", communicator,
         "Type of communicator (on CPUs, a GPU one such as the default falls back to naive)")
      ->capture_default_str()
      ->check(CLI::IsMember(kusari::mn::communicator_names()));
  app.add_flag("-g,--gpu", gpu, "Use GPUs: each process uses the GPU of its rank within its host");
  app.add_option("--dtype", dtype_name,
                 "Dtype of the parameters and the computation; float16 and bfloat16 train in mixed "
                 "precision (float32 master weights; float16 also scales the loss)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  app.add_option("--size", size, "Side of the square crops the network is trained on (>= 32)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{32}, int64_t{4096}));
  app.add_option("--num-classes", num_classes,
                 "Outputs of the network (0: the number of classes of the training set)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", lr,
                 "Peak learning rate (default: from --lr-scaling, --base-lr and "
                 "--base-batchsize: 0.1 x global batch / 256, Goyal et al.'s linear scaling)")
      ->check(positive);
  app.add_option("--lr-scaling", lr_scaling,
                 "Default peak rate when --lr is not given: 'linear' (--base-lr per "
                 "--base-batchsize images of the global batch) or 'none' (--base-lr)")
      ->capture_default_str()
      ->check(CLI::IsMember({"linear", "none"}));
  app.add_option("--base-lr", base_lr, "Learning rate per --base-batchsize images")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--base-batchsize", base_batchsize,
                 "Batch size that --base-lr is meant for (linear scaling)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--lr-schedule", lr_schedule,
                 "After the warm-up: 'step' (divided by 10 at --lr-decay-epochs) or 'cosine' (a "
                 "half cosine down to 0 at the last epoch)")
      ->capture_default_str()
      ->check(CLI::IsMember({"step", "cosine"}));
  app.add_option("--optimizer", optimizer_name,
                 "'sgd' (MomentumSGD), 'rmsprop-warmup' (RMSprop moving to MomentumSGD, Akiba et "
                 "al.), 'lars' or 'lamb' (layer-wise trust ratios; biases and batch "
                 "normalization left out of the ratio and the decay)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "rmsprop-warmup", "lars", "lamb"}));
  app.add_option("--rmsprop-lr", rmsprop_lr, "RMSprop's learning rate in rmsprop-warmup")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--rmsprop-warmup-center", rmsprop_center,
                 "rmsprop-warmup: the epoch at which RMSprop and MomentumSGD weigh the same")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rmsprop-warmup-period", rmsprop_period,
                 "rmsprop-warmup: the width of the switch in epochs (pure MomentumSGD from "
                 "center + period / 2)")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--lars-eta", lars_eta, "LARS's trust coefficient")
      ->capture_default_str()
      ->check(positive);
  app.add_option("--label-smoothing", label_smoothing,
                 "Label smoothing of the softmax cross entropy (0: none; 0.1 is usual)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](const std::string& value) -> std::string {
            double v = -1;
            try {
              v = std::stod(value);
            } catch (const std::exception&) {
            }
            if (v >= 0 && v < 1) return {};
            return "expected a number in [0, 1), got " + value;
          },
          "[0,1)", "LabelSmoothing"));
  app.add_flag("--no-bn-weight-decay", no_bn_weight_decay,
               "No weight decay on biases and batch normalization's gamma and beta");
  app.add_option("--bn-freeze-epochs", bn_freeze_epochs,
                 "In the last this many epochs batch normalization's running statistics are the "
                 "plain average of the batch statistics instead of moving averages (0: never)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--allreduce-dtype", allreduce_dtype,
                 "Dtype gradients travel in between processes: float16 or bfloat16 halve the "
                 "traffic (the flat and NCCL communicators; default: the gradients' own)")
      ->check(CLI::IsMember({"float32", "float16", "bfloat16"}));
  auto* overlap_flag = app.add_flag(
      "--overlap", overlap,
      "Average the gradients in buckets while backward runs, as PyTorch DDP does (on CPUs, give "
      "each process a core to spare: docs/cluster.md)");
  app.add_option("--bucket-mb", bucket_mb, "With --overlap: MiB of gradients per bucket")
      ->capture_default_str()
      ->check(positive)
      ->needs(overlap_flag);
  app.add_option("--momentum", momentum, "Momentum of MomentumSGD")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--weight-decay", weight_decay, "L2 weight decay rate (0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup-epochs", warmup_epochs,
                 "Epochs over which the learning rate ramps up linearly from --warmup-start-lr "
                 "to --lr (0: no warm-up)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup-start-lr", warmup_start_lr,
                 "Learning rate at the start of the warm-up (default: --lr divided by the number "
                 "of processes, the rate of one process's batch)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr-decay-epochs", decay_epochs,
                 "Epochs at which the learning rate is divided by 10")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  app.add_option("--min-crop-scale", min_crop_scale,
                 "Smallest fraction of a training picture's area that its random crop covers")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  app.add_flag("--mnbn", mnbn,
               "Multi-node batch normalization: statistics over the global batch "
               "(create_mnbn_model)");
  app.add_flag("--zero-init-residual", zero_init_residual,
               "Start the last batch normalization of every residual block with gamma 0");
  app.add_flag("--channels-last", channels_last,
               "NHWC memory for the images, activations and filters (fastest on GPUs)");
  app.add_option("-o,--out", out, "Directory to output the result")->capture_default_str();
  app.add_option(
      "-r,--resume", resume,
      "Resume the training from a snapshot, e.g. result/snapshot_iter_600; under mpiexec "
      "each process writes its own snapshot_iter_<iteration>.<rank> and resumes from its "
      "own file (give the name without the rank, and as many processes). A folder (or the --out folder): "
      "its newest snapshot set that every process completed, or a fresh start when there is none");
  app.add_option("-f,--frequency", frequency,
                 "Frequency of taking a snapshot (epochs, a positive number; -1: at the end)")
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
            return "the snapshot frequency must be -1 (at the end) or a positive number of "
                   "epochs, got " +
                   value;
          },
          "-1 or >0", "SnapshotFrequency"));
  app.add_option("--checkpoint-interval", checkpoint_interval,
                 "Every this many iterations each process writes a checkpoint that a restarted "
                 "job resumes from by itself (the multi-node checkpointer; 0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", threads,
                 "Compute threads per process on CPUs (0: the host's cores divided among its "
                 "processes)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "Seed of the data split, the order and the augmentation")
      ->capture_default_str();
  app.add_flag("--test", test,
               "A tiny run: 512 training and 256 validation images, one epoch unless -E says");
  app.add_flag("--noplot", noplot, "Disable PlotReport extension");
  app.add_flag("--no-progress", no_progress, "Disable ProgressBar extension");
  CLI11_PARSE(app, argc, argv);
  for (const auto& [name, what] : {std::pair{"train", "training"}, std::pair{"val", "validation"}}) {
    if (app.count(name) > 0 && app.count(std::string("--") + name) > 0) {
      std::fprintf(stderr, "Error: the %s images are given twice (as an argument and as --%s); give them once\n",
                   what, name);
      return 106;
    }
  }
  if (train_path.empty() || val_path.empty()) {
    std::fprintf(stderr,
                 "Error: train_imagenet needs the %s images: give the training and the validation images as its "
                 "first two arguments (folders with one subfolder per class, or list files), e.g. "
                 "train_imagenet imagenet/train imagenet/val\nRun with --help for more information.\n",
                 train_path.empty() ? "training" : "validation");
    return 106;  // (CLI11's status for a missing required argument)
  }

  for (double d : decay_epochs) {
    if (d <= warmup_epochs && warmup_epochs > 0) {
      std::fprintf(stderr,
                   "Error: --lr-decay-epochs: epoch %g comes before the end of the warm-up "
                   "(--warmup-epochs %g); expected decay epochs after the warm-up\n",
                   d, warmup_epochs);
      return 1;
    }
  }
  if (test && app.count("--epoch") == 0) epoch = 1;
  if (lr_schedule == "cosine" && warmup_epochs >= epoch) {
    std::fprintf(stderr,
                 "Error: --lr-schedule cosine: the warm-up (--warmup-epochs %g) must end before "
                 "the last epoch (--epoch %d)\n",
                 warmup_epochs, epoch);
    return 1;
  }
  if (bn_freeze_epochs >= epoch) {
    std::fprintf(stderr,
                 "Error: --bn-freeze-epochs: %d epochs of plain averages leave no epoch of "
                 "training with moving averages (--epoch %d); expected fewer than --epoch\n",
                 bn_freeze_epochs, epoch);
    return 1;
  }

  // Prepare the communicator: a GPU one with --gpu, "naive" on CPUs.          (multi-node)
  const bool cpu_communicator =
      communicator == "naive" || communicator == "flat" || communicator == "dummy";
  if (gpu && communicator == "naive") {
    std::fprintf(stderr,
                 "Error: 'naive' communicator does not support GPU; use e.g. --communicator "
                 "pure_nccl\n");
    return 1;
  }
  bool warn_fallback = false;
  if (!gpu && !cpu_communicator) {
    warn_fallback = app.count("--communicator") > 0;
    communicator = "naive";
  }
  kusari::mn::CommunicatorOptions comm_options;
  if (app.count("--allreduce-dtype") > 0) {
    if (communicator == "naive") {
      std::fprintf(stderr,
                   "Error: --allreduce-dtype %s: the 'naive' communicator reduces each gradient "
                   "in its own dtype; use --communicator flat on CPUs, or a NCCL communicator\n",
                   allreduce_dtype.c_str());
      return 1;
    }
    comm_options.allreduce_grad_dtype = kusari::dtype_from_name(allreduce_dtype);
  }
  if (kusari::only_check_arguments("train_imagenet")) return 0;
  auto comm = kusari::mn::create_communicator(communicator, comm_options);
  kusari::Device device = gpu ? kusari::Device::cuda(comm->intra_rank()) : kusari::Device::cpu();
  const int per_host =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm->intra_size());
  if (threads == 0) threads = per_host;
  if (!std::getenv("OMP_NUM_THREADS")) kusari::set_num_threads(gpu ? 1 : threads);
  kusari::set_blas_num_threads(threads);
  if (loaderjob == 0) loaderjob = per_host;
  const kusari::Dtype dtype = kusari::dtype_from_name(dtype_name);
  kusari::manual_seed(seed);  // the initial weights

  // Every process lists the files (a shared file system); only paths and labels are held.
  std::shared_ptr<kusari::ImageFileDataset> train_files, val_files;
  try {
    train_files = open_dataset(train_path, root);
    val_files = open_dataset(val_path, root);
  } catch (const std::exception& e) {
    if (comm->rank() == 0) std::fprintf(stderr, "Error: %s\n", e.what());
    return 1;
  }
  const int64_t dataset_classes = count_classes(*train_files);
  const int64_t val_classes = count_classes(*val_files);
  if (num_classes == 0) num_classes = dataset_classes;
  if (dataset_classes > num_classes || val_classes > num_classes) {
    if (comm->rank() == 0) {
      std::fprintf(stderr,
                   "Error: --num-classes %lld is too small: the training set has %lld classes "
                   "and the validation set %lld\n",
                   static_cast<long long>(num_classes), static_cast<long long>(dataset_classes),
                   static_cast<long long>(val_classes));
    }
    return 1;
  }
  std::shared_ptr<kusari::Dataset> train = train_files, val = val_files;
  if (test) {
    train = random_subset(train, 512);
    val = random_subset(val, 256);
  }
  const int64_t train_size = train->size(), val_size = val->size();
  // Each rank gets its shard of indices; the files stay where they are.          (multi-node)
  train = kusari::mn::scatter_dataset(train, comm, 0, true, seed);
  val = kusari::mn::scatter_dataset(val, comm, 0, true, seed + 1);

  // Every process must have been started with the same settings: a batch size or a number of
  // epochs that differs between them would make them wait for each other forever.   (multi-node)
  const int64_t shard = train->size();
  const int64_t common = std::gcd(shard, static_cast<int64_t>(batchsize));
  std::string iterations_per_epoch = std::to_string(shard / common);
  if (common != batchsize) iterations_per_epoch += "/" + std::to_string(batchsize / common);
  iterations_per_epoch +=
      " (" + std::to_string(shard) + " examples in batches of " + std::to_string(batchsize) + ")";
  const auto on_off = [](bool b) { return std::string(b ? "on" : "off"); };
  const std::string overlap_setting =
      overlap ? "on, --bucket-mb " + std::to_string(bucket_mb) : "off";
  kusari::mn::check_same_settings(comm,
                                  {{"--batchsize", std::to_string(batchsize)},
                                   {"iterations per epoch", iterations_per_epoch},
                                   {"--val-batchsize", std::to_string(val_batchsize)},
                                   {"--epoch", std::to_string(epoch)},
                                   {"--frequency", std::to_string(frequency)},
                                   {"--checkpoint-interval", std::to_string(checkpoint_interval)},
                                   {"--arch", arch},
                                   {"--width", std::to_string(width)},
                                   {"--num-classes", std::to_string(num_classes)},
                                   {"--size", std::to_string(size)},
                                   {"--communicator", communicator},
                                   {"--gpu", on_off(gpu)},
                                   {"--mnbn", on_off(mnbn)},
                                   {"--dtype", dtype_name},
                                   {"--channels-last", on_off(channels_last)},
                                   {"--optimizer", optimizer_name},
                                   {"--label-smoothing", std::to_string(label_smoothing)},
                                   {"--no-bn-weight-decay", on_off(no_bn_weight_decay)},
                                   {"--bn-freeze-epochs", std::to_string(bn_freeze_epochs)},
                                   {"--allreduce-dtype", allreduce_dtype},
                                   {"--overlap", overlap_setting},
                                   {"--resume", resume.empty() ? "(none)" : "given"}},
                                  "train_imagenet");

  const int64_t global_batch = static_cast<int64_t>(batchsize) * comm->size();
  if (lr < 0) {
    lr = lr_scaling == "linear" ? E::linear_scaled_lr(base_lr, global_batch, base_batchsize)
                                : base_lr;
  }
  const double warmup_start = warmup_start_lr >= 0 ? warmup_start_lr : lr / comm->size();

  if (comm->rank() == 0) {
    if (warn_fallback) {
      std::printf(
          "Warning: using naive communicator because only naive supports CPU-only execution\n");
    }
    std::printf("==========================================\n");
    std::printf("Num process (COMM_WORLD): %d\n", comm->size());
    if (gpu) std::printf("Using GPUs\n");
    std::printf("Using %s communicator\n", communicator.c_str());
    std::printf("Using %s arch%s, %lld classes, %lldx%lld crops\n", arch.c_str(),
                width == 64 ? "" : (" of width " + std::to_string(width)).c_str(),
                static_cast<long long>(num_classes), static_cast<long long>(size),
                static_cast<long long>(size));
    std::printf("Num images: %lld training, %lld validation\n", static_cast<long long>(train_size),
                static_cast<long long>(val_size));
    std::printf("Num Minibatch-size: %d per process, %lld in all\n", batchsize,
                static_cast<long long>(global_batch));
    std::printf("Num epoch: %d\n", epoch);
    if (warmup_epochs > 0) {
      std::printf("Learning rate: %g (warm-up from %g over %g epochs)\n", lr, warmup_start,
                  warmup_epochs);
    } else {
      std::printf("Learning rate: %g\n", lr);
    }
    std::printf("Dtype: %s%s%s\n", dtype_name.c_str(), channels_last ? ", channels-last" : "",
                mnbn ? ", multi-node batch normalization" : "");
    std::printf("Optimizer: %s, %s decay%s%s\n", optimizer_name.c_str(), lr_schedule.c_str(),
                no_bn_weight_decay ? ", no weight decay on biases and batch normalization" : "",
                app.count("--allreduce-dtype") ? (", gradients reduced in " + allreduce_dtype).c_str()
                                               : "");
    if (overlap) {
      std::printf("Gradients: averaged in buckets of %g MiB while backward runs\n", bucket_mb);
    }
    if (label_smoothing > 0) std::printf("Label smoothing: %g\n", label_smoothing);
    if (bn_freeze_epochs > 0) {
      std::printf("Batch normalization: plain averages over the last %d epochs\n",
                  bn_freeze_epochs);
    }
    std::printf("==========================================\n");
    std::fflush(stdout);
  }

  kusari::models::ResNetOptions options;
  options.num_classes = num_classes;
  options.zero_init_residual = zero_init_residual;
  options.width = width;
  options.dtype = dtype;  // (mixed precision)
  if (channels_last) options.memory_format = kusari::MemoryFormat::kChannelsLast;
  std::shared_ptr<kusari::Link> net = kusari::models::resnet(std::stoi(arch.substr(6)), options);
  if (mnbn) net = kusari::mn::create_mnbn_model(net, comm);  // (multi-node)
  auto model = std::make_shared<kusari::links::Classifier>(
      net, [label_smoothing](const kusari::Variable& y, const kusari::Array& t) {
        return kusari::functions::softmax_cross_entropy(
            y, t, -1, kusari::functions::Reduce::kMean, label_smoothing);
      });
  model->to_device(device);

  // The optimizer; its "lr" follows the schedule below (set before the first step).
  namespace O = kusari::optimizers;
  std::shared_ptr<kusari::Optimizer> actual;
  bool decay_in_optimizer = false;  // LARS and LAMB apply the weight decay in their step
  if (optimizer_name == "sgd") {
    actual = std::make_shared<O::MomentumSGD>(lr, momentum);
  } else if (optimizer_name == "rmsprop-warmup") {
    actual = std::make_shared<O::RMSpropWarmup>(lr, rmsprop_lr, momentum);
  } else if (optimizer_name == "lars") {
    actual = std::make_shared<O::LARS>(O::LARSOptions{
        .lr = lr, .momentum = momentum, .weight_decay_rate = weight_decay, .eta = lars_eta});
    decay_in_optimizer = true;
  } else {
    actual = std::make_shared<O::LAMB>(O::LAMBOptions{.lr = lr, .weight_decay_rate = weight_decay});
    decay_in_optimizer = true;
  }
  // Average the gradients over the processes before each update.               (multi-node)
  kusari::mn::MultiNodeOptimizerOptions mn_options;
  mn_options.overlap = overlap;  // (--overlap: buckets sent while backward runs)
  mn_options.bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * (1 << 20)));
  auto optimizer = kusari::mn::create_multi_node_optimizer(actual, comm, mn_options);
  optimizer->setup(model);
  if (weight_decay > 0 && !decay_in_optimizer) {
    optimizer->add_hook(std::make_shared<O::WeightDecay>(
        weight_decay, no_bn_weight_decay ? O::ParamPredicate(O::is_bias_or_norm) : nullptr));
  }
  if (dtype != kusari::float32) {
    optimizer->use_fp32_update();                             // (mixed precision)
    if (dtype == kusari::float16) optimizer->loss_scaling();  // (mixed precision)
  }

  // Training: a random crop of 8% (--min-crop-scale) to 100% of the picture, resized to the
  // crop size, a flip, ImageNet's normalisation (imagenet_train_transform at the default scale).
  // Validation: the shorter side resized to size * 8/7 (256 for 224), the centre crop.
  // With --channels-last the loader writes HWC images, viewed as NCHW with NHWC strides.
  // With --gpu the batches go to the GPU through pinned buffers and a copy stream, and the
  // normalisation runs there, into the training dtype (Note [ImageLoader on a GPU]): the loader
  // threads make uint8 pictures, a quarter of the bytes to copy.
  const bool planar = !channels_last;
  kusari::ImageLoaderOptions train_options;
  train_options.batch_size = batchsize;
  train_options.seed = seed + 1000 + static_cast<uint64_t>(comm->rank());
  train_options.n_workers = loaderjob;
  train_options.device = device;
  train_options.normalize_on_device = gpu;
  train_options.dtype = dtype;  // (mixed precision)
  train_options.transform =
      std::make_shared<T::Compose>(std::vector<std::shared_ptr<const T::Transform>>{
          std::make_shared<T::RandomResizedCrop>(size, std::array<double, 2>{min_crop_scale, 1.0}),
          std::make_shared<T::RandomHorizontalFlip>(),
          std::make_shared<T::Normalize>(T::kImageNetMean, T::kImageNetStd, planar)});
  kusari::ImageLoaderOptions val_options = train_options;
  val_options.batch_size = val_batchsize;
  val_options.repeat = false;
  val_options.shuffle = false;
  val_options.transform = T::imagenet_eval_transform(size, (size * 8 + 6) / 7, planar);
  auto train_iter = std::make_shared<kusari::ImageLoader>(train, train_options);
  auto val_iter = std::make_shared<kusari::ImageLoader>(val, val_options);

  // The loaders' examples are rows of one batch array in the training dtype, on the device:
  // concat_examples copies it in one piece.
  kusari::training::Converter converter =
      [channels_last](const std::vector<kusari::Example>& batch, kusari::Device dev) {
        std::vector<kusari::Array> arrays = kusari::concat_examples(batch, dev);
        if (channels_last) arrays[0] = arrays[0].transpose({0, 3, 1, 2});  // (B,H,W,C) as NCHW
        return arrays;
      };

  auto updater =
      std::make_shared<kusari::training::StandardUpdater>(train_iter, optimizer, device, converter);
  kusari::training::Trainer trainer(updater, kusari::training::interval(epoch, "epoch"), out);

  // The learning rate of the next iteration, from the position in the training (so a resumed
  // run continues the schedule without state of its own).
  E::WarmupSchedule schedule;
  schedule.peak = lr;
  schedule.warmup_start = warmup_start;
  schedule.warmup_epochs = warmup_epochs;
  if (lr_schedule == "cosine") {
    schedule.decay = E::WarmupSchedule::Decay::kCosine;
    schedule.total_epochs = epoch;
  } else {
    schedule.decay = E::WarmupSchedule::Decay::kStep;
    schedule.decay_epochs = decay_epochs;
  }
  trainer.extend(std::make_shared<E::EpochShift>("lr", schedule), "lr_schedule");
  if (optimizer_name == "rmsprop-warmup") {
    // The weight of MomentumSGD in the step rises from about 0 to 1 (Note [RMSprop warm-up]).
    trainer.extend(std::make_shared<E::EpochShift>(
                       "sgd_weight",
                       O::RMSpropWarmupTransition{.center = rmsprop_center, .period = rmsprop_period}),
                   "sgd_weight_schedule");
  }
  const double freeze_from = static_cast<double>(epoch - bn_freeze_epochs);
  auto switched = std::make_shared<bool>(false);
  if (bn_freeze_epochs > 0) {
    // The last epochs' running statistics are plain averages of their batches' (Note [Batch
    // normalization without moving averages]): switched once, after the iteration that enters
    // the window, which restarts the average (a run resumed inside the window switches before
    // its first iteration, below, and goes on with the average loaded from the snapshot).
    auto freeze = [net, freeze_from, switched](kusari::training::Trainer& t) {
      if (*switched || t.updater().epoch_detail() < freeze_from) return;
      kusari::links::set_running_statistics(*net,
                                            kusari::links::RunningStatistics::kCumulativeAverage);
      *switched = true;
    };
    trainer.extend(kusari::training::make_extension(freeze, "bn_freeze",
                                                    kusari::training::interval(1, "iteration"),
                                                    kusari::training::kPriorityWriter));
  }
  // Batch normalization's running statistics averaged over the processes before each evaluation
  // (the same on every process, as a single-process run would have them).       (multi-node)
  if (!mnbn) trainer.extend(std::make_shared<kusari::mn::AllreducePersistent>(model, comm));
  // Evaluate the model with the validation dataset for each epoch, over all processes.
  trainer.extend(kusari::mn::create_multi_node_evaluator(
      E::Evaluator(val_iter, model, converter, device), comm));

  std::shared_ptr<kusari::mn::MultiNodeCheckpointer> checkpointer;
  if (checkpoint_interval > 0) {
    checkpointer = kusari::mn::create_multi_node_checkpointer("train_imagenet", comm, 2);
    trainer.extend(
        checkpointer, "",
        kusari::training::interval(static_cast<double>(checkpoint_interval), "iteration"));
  }

  // Snapshots: one process writes Chainer's snapshot_iter_<iteration>; under mpiexec each process
  // writes its own snapshot_iter_<iteration>.<rank>, with its own loader state.     (multi-node)
  const int snapshot_every = frequency == -1 ? epoch : frequency;
  if (comm->size() == 1) {
    trainer.extend(E::snapshot(), "", kusari::training::interval(snapshot_every, "epoch"));
  } else {
    trainer.extend(kusari::mn::multi_node_snapshot(comm, E::snapshot()), "",
                   kusari::training::interval(snapshot_every, "epoch"));
  }

  // Some display and output extensions are necessary only for one worker.
  if (comm->rank() == 0) {
    trainer.extend(E::observe_lr());
    trainer.extend(std::make_shared<E::LogReport>());
    if (!noplot) {
      trainer.extend(std::make_shared<E::PlotReport>(
          std::vector<std::string>{"main/loss", "validation/main/loss"}, "epoch", nullptr,
          "loss.png"));
      trainer.extend(std::make_shared<E::PlotReport>(
          std::vector<std::string>{"main/accuracy", "validation/main/accuracy"}, "epoch", nullptr,
          "accuracy.png"));
    }
    trainer.extend(std::make_shared<E::PrintReport>(
        std::vector<std::string>{"epoch", "main/loss", "validation/main/loss", "main/accuracy",
                                 "validation/main/accuracy", "lr", "elapsed_time"}));
    if (!no_progress) trainer.extend(std::make_shared<E::ProgressBar>(std::nullopt, 10));
  }

  // An exception from here on (an unreadable image, a snapshot of another model) ends the whole
  // job: the library prints it and aborts every process, so none waits on a dead peer.
  if (kusari::mn::names_snapshot_folder(resume, out)) {
    // The newest snapshot set that every process wrote (each process's loader state is its own:
    // the set must come from as many processes; Note [Resuming on another number of processes]).
    kusari::mn::load_newest_snapshot_set(resume, trainer, comm);
  } else if (!resume.empty()) {
    // Every process loads its own file of the snapshot (<resume>.<rank> under mpiexec): the same
    // weights, and its own loader position and order, so the run goes on bit for bit. (multi-node)
    kusari::mn::load_snapshot_of_each_rank(resume, trainer, comm);
  }
  if (checkpointer) {
    // A job restarted after a crash or a time limit goes on from the newest complete set.
    if (auto it = checkpointer->maybe_load(trainer, optimizer.get()); it && comm->rank() == 0) {
      std::printf("Resumed from the checkpoint of iteration %lld\n", static_cast<long long>(*it));
    }
  }
  if (comm->rank() == 0 && updater->iteration() > 0) {
    std::printf("Continuing at epoch %lld, iteration %lld\n",
                static_cast<long long>(train_iter->epoch()),
                static_cast<long long>(updater->iteration()));
    std::fflush(stdout);
  }
  if (bn_freeze_epochs > 0 && updater->epoch_detail() >= freeze_from) {
    // Resumed inside the averaging window: go on with the loaded average.
    kusari::links::set_running_statistics(
        *net, kusari::links::RunningStatistics::kCumulativeAverage, /*restart=*/false);
    *switched = true;
  }
  trainer.run();
  return 0;
}
