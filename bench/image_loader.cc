// The ImageNet input pipeline, kusari's ImageLoader beside PyTorch's DataLoader with
// torchvision's transforms (PIL) on the same files with the same number of workers, in the same
// run. Two modes:
//
// Decode (default): images per second of read a JPEG, decode, random resized crop to 224x224,
// random horizontal flip, normalise to float32 CHW, batch -- by worker count, of wall-clock time
// and of CPU time (the loader's process, and for PyTorch its worker processes: a shared machine
// disturbs it less). Each figure is the best of --repeat runs, kusari's and PyTorch's
// alternating.
//
//   bench_image_loader [--python /usr/bin/python3] [--workers 1,2] [--images 2000] [--batch 64]
//                      [--repeat 3] [--dir image_loader_photos]
//                      [--photos /usr/share/backgrounds/mate/nature]
//
// Training (--train): the end-to-end rate of a ResNet training step (forward, backward,
// MomentumSGD) fed by the loader from real JPEGs, against the same step on one random batch that
// stays in memory, and the loader alone (its ceiling); on a GPU the loader runs the GPU path
// (Note [ImageLoader on a GPU]: pinned ring, upload stream, Normalize on the GPU into the model's
// dtype and layout). The peer does the same with torchvision's ResNet (autocast for bfloat16)
// and a DataLoader with pin_memory.
//
//   bench_image_loader --train [--device cuda] [--arch resnet50] [--dtype bfloat16]
//                      [--channels-last] [--batch 256] [--workers 16] [--steps 50] [--warmup 10]
//                      [--size 224] [--images 20000] [--dir ...] [--no-peer]
//
// The files are photographs: the nature pictures of Debian's mate-backgrounds package cut into
// 500x375 quality-90 JPEGs (about ImageNet's typical size), written on the first run into
// --dir (one class folder per source photograph) and reused afterwards. `--photos synthetic`
// cuts them from a generated picture instead (for tests where the package is missing; its decode
// speed is not that of photographs).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "kusari/core/cuda.h"
#include "kusari/datasets/image.h"
#include "kusari/datasets/transforms.h"
#include "kusari/iterators/image_loader.h"
#include "kusari/kusari.h"
#include "kusari/models.h"

namespace fs = std::filesystem;
namespace T = kusari::transforms;

namespace {

int64_t count_jpegs(const fs::path& dir) {
  int64_t n = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) n += e.path().extension() == ".jpg";
  return n;
}

// A 1500x2000 stand-in for a photograph: smooth colour fields, waves and fine noise.
kusari::Image synthetic_picture(int seed) {
  kusari::Image img = kusari::Image::zeros(1500, 2000, 3);
  T::Rng rng(static_cast<uint64_t>(seed));
  for (int64_t y = 0; y < img.height; ++y) {
    for (int64_t x = 0; x < img.width; ++x) {
      for (int64_t c = 0; c < 3; ++c) {
        const double v = 128 + 60 * std::sin(0.004 * x * (c + 1) + seed) +
                         40 * std::cos(0.007 * y * (3 - c) + 0.002 * x) +
                         T::uniform(rng, -12.0, 12.0);
        img.pixels[static_cast<size_t>((y * img.width + x) * 3 + c)] =
            static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return img;
}

// Cuts `count` 500x375 JPEGs out of the photographs in `photos` ("synthetic": generated pictures):
// each tile is a random region of 1 to 2.5 times the tile's size, shrunk to 500x375 (a few
// flipped to 375x500 portraits).
void make_photo_set(const std::string& photos, const fs::path& dir, int64_t count) {
  std::vector<std::pair<std::string, std::function<kusari::Image()>>> sources;
  if (photos == "synthetic") {
    for (int k = 0; k < 4; ++k) {
      sources.emplace_back("synthetic" + std::to_string(k), [k] { return synthetic_picture(k); });
    }
  } else {
    std::vector<fs::path> files;
    std::error_code ec;
    if (fs::is_directory(photos, ec)) {
      for (const auto& e : fs::directory_iterator(photos)) {
        if (e.path().extension() == ".jpg") files.push_back(e.path());
      }
    }
    if (files.empty()) {
      throw std::runtime_error("no .jpg photographs in " + photos +
                               " (install Debian's mate-backgrounds package, or pass --photos)");
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& src : files) {
      sources.emplace_back(src.stem().string(), [src] {
        kusari::DecodeOptions o;
        const std::vector<uint8_t> bytes = kusari::read_file_bytes(src.string());
        const kusari::ImageInfo info =
            kusari::read_image_info(bytes.data(), bytes.size(), src.string());
        o.scale_denom = kusari::jpeg_scale_denom_for(info.height, info.width, 938, 1250);
        return kusari::decode_image(bytes.data(), bytes.size(), src.string(), o);
      });
    }
  }
  std::printf("cutting %lld 500x375 JPEGs from %zu pictures (%s) into %s ...\n",
              static_cast<long long>(count), sources.size(), photos.c_str(), dir.string().c_str());
  std::fflush(stdout);
  T::Rng rng(2026);
  const auto per =
      (count + static_cast<int64_t>(sources.size()) - 1) / static_cast<int64_t>(sources.size());
  int64_t written = 0;
  for (const auto& [name, load] : sources) {
    const fs::path cls = dir / name;
    fs::create_directories(cls);
    const kusari::Image photo = load();
    for (int64_t k = 0; k < per && written < count; ++k, ++written) {
      const bool portrait = k % 5 == 4;
      const int64_t th = portrait ? 500 : 375, tw = portrait ? 375 : 500;
      double f = T::uniform(rng, 1.0, 2.5);
      f = std::min(
          {f, static_cast<double>(photo.height) / th, static_cast<double>(photo.width) / tw});
      T::CropPlan p;
      p.height = th * f;
      p.width = tw * f;
      p.top = T::uniform(rng, 0.0, photo.height - p.height);
      p.left = T::uniform(rng, 0.0, photo.width - p.width);
      p.out_height = th;
      p.out_width = tw;
      char name[32];
      std::snprintf(name, sizeof(name), "%05lld.jpg", static_cast<long long>(k));
      kusari::write_jpeg((cls / name).string(), T::resample(photo, p), 90);
    }
  }
}

/// CPU time (user + system) of this process so far, all its threads.
double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct DecodeRate {
  double per_second = 0;      // images per second of wall-clock time
  double per_cpu_second = 0;  // images per CPU-second of the process (workers included)
};

// Images per second of `batches` batches after the first (which includes starting the workers).
DecodeRate kusari_images_per_second(const std::shared_ptr<kusari::Dataset>& ds, int workers,
                                    int64_t batch, int64_t batches, bool reduced) {
  kusari::ImageLoaderOptions o;
  o.batch_size = batch;
  o.seed = 0;
  o.n_workers = workers;
  o.n_prefetch = std::max(2, workers);
  o.transform = T::imagenet_train_transform(224);
  o.reduced_decode = reduced;
  kusari::ImageLoader loader(ds, o);
  loader.next_batch();
  const double cpu = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  int64_t images = 0;
  for (int64_t b = 0; b < batches; ++b) images += loader.next_batch()[0].shape()[0];
  DecodeRate r;
  r.per_second = static_cast<double>(images) /
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.per_cpu_second = static_cast<double>(images) / (process_cpu_seconds() - cpu);
  return r;
}

/// The peer's results, or nullopt (with the reason printed) when it fails or runs past --timeout
/// (Note [Runs with a time limit]).
std::optional<std::map<std::string, double>> try_peer(const std::string& python,
                                                      const std::string& args) {
  return kusari::bench::try_run(
      python + " " + kusari::bench::bench_dir() + "/peers/image_loader.py " + args,
      "the pytorch peer (image_loader.py " + args + ")");
}

// --- training mode ---------------------------------------------------------------------------

struct TrainConfig {
  std::string device = "cuda", arch = "resnet50", dtype = "bfloat16";
  bool channels_last = false;
  int64_t batch = 256, size = 224, steps = 50, warmup = 10;
  int workers = 16;
};

struct TrainRates {
  double random = 0, loader = 0, loader_only = 0;  // images per second
};

// One ResNet training step on (x, t).
class Step {
 public:
  Step(const TrainConfig& c, kusari::Device device) : device_(device) {
    kusari::manual_seed(0);
    kusari::models::ResNetOptions options;
    options.dtype = c.dtype == "bfloat16" ? kusari::bfloat16 : kusari::float32;
    options.memory_format =
        c.channels_last ? kusari::MemoryFormat::kChannelsLast : kusari::MemoryFormat::kContiguous;
    model_ = kusari::models::resnet(std::stoi(c.arch.substr(6)), options);
    model_->to_device(device);
    opt_ = std::make_unique<kusari::optimizers::MomentumSGD>(0.1, 0.9);
    opt_->setup(model_);
    if (options.dtype != kusari::float32) opt_->use_fp32_update();
  }
  void operator()(const kusari::Array& x, const kusari::Array& t) {
    model_->cleargrads();
    kusari::Variable loss =
        kusari::functions::softmax_cross_entropy((*model_)(kusari::Variable(x)), t);
    loss.backward();
    loss = kusari::Variable();  // free the graph before the update
    opt_->update();
  }

 private:
  kusari::Device device_;
  std::shared_ptr<kusari::models::ResNet> model_;
  std::unique_ptr<kusari::optimizers::MomentumSGD> opt_;
};

// Images per second of c.steps calls of f after c.warmup, with one synchronisation at the end.
double rate(const TrainConfig& c, kusari::Device device, const std::function<void()>& f) {
  for (int64_t i = 0; i < c.warmup; ++i) f();
  device.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < c.steps; ++i) f();
  device.synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(c.steps * c.batch) / s;
}

TrainRates kusari_training(const TrainConfig& c, const std::shared_ptr<kusari::Dataset>& ds) {
  if (c.device == "cuda") ::setenv("KUSARI_CUDNN_BENCHMARK", "1", 0);  // as the peer's
  const kusari::Device device =
      c.device == "cuda" ? kusari::Device::cuda(0) : kusari::Device::cpu();
  const kusari::Dtype dtype = c.dtype == "bfloat16" ? kusari::bfloat16 : kusari::float32;
  const auto format =
      c.channels_last ? kusari::MemoryFormat::kChannelsLast : kusari::MemoryFormat::kContiguous;
  // An HWC Normalize gives (B, H, W, C) batches: transpose({0, 3, 1, 2}) is their channels-last
  // NCHW view (Note [ImageLoader on a GPU]).
  auto loader_for = [&] {
    kusari::ImageLoaderOptions o;
    o.batch_size = c.batch;
    o.seed = 0;
    o.n_workers = c.workers;
    o.n_prefetch = std::max(2, c.workers / 4);
    o.transform = T::imagenet_train_transform(c.size, !c.channels_last);
    o.device = device;
    o.normalize_on_device = device.is_cuda();
    o.dtype = dtype;
    return std::make_unique<kusari::ImageLoader>(ds, o);
  };
  auto as_model_input = [&](const kusari::Array& images) {
    return c.channels_last ? images.transpose({0, 3, 1, 2}) : images;
  };
  TrainRates r;
  {
    Step step(c, device);
    const kusari::Array x =
        kusari::Array::uniform({c.batch, 3, c.size, c.size}, -2, 2, kusari::float32, device)
            .astype(dtype)
            .to_memory_format(format);
    std::vector<int32_t> labels(static_cast<size_t>(c.batch));
    for (int64_t i = 0; i < c.batch; ++i) labels[static_cast<size_t>(i)] = (i * 37) % 1000;
    const kusari::Array t = kusari::Array::from_vector(labels, std::nullopt, device);
    r.random = rate(c, device, [&] { step(x, t); });
  }
  {
    Step step(c, device);
    auto loader = loader_for();
    r.loader = rate(c, device, [&] {
      const std::vector<kusari::Array> b = loader->next_batch();
      step(as_model_input(b[0]), b[1]);
    });
  }
  {
    auto loader = loader_for();
    r.loader_only = rate(c, device, [&] { loader->next_batch(); });
  }
  return r;
}

void train_main(const TrainConfig& c, const std::string& dir, const std::string& python,
                bool skip_peer) {
  auto ds = std::make_shared<kusari::ImageFolderDataset>(dir);
  std::printf(
      "ResNet training fed by the input pipeline: %s %s%s on %s, batch %lld, %lldx%lld crops, "
      "%d loader workers, %lld JPEGs in %s; images per second over %lld steps after %lld\n",
      c.arch.c_str(), c.dtype.c_str(), c.channels_last ? " channels-last" : "", c.device.c_str(),
      static_cast<long long>(c.batch), static_cast<long long>(c.size),
      static_cast<long long>(c.size), c.workers, static_cast<long long>(ds->size()), dir.c_str(),
      static_cast<long long>(c.steps), static_cast<long long>(c.warmup));
  std::fflush(stdout);
  const TrainRates k = kusari_training(c, ds);
  std::printf("RESULT kusari_random %.3f\nRESULT kusari_loader %.3f\nRESULT kusari_loader_only %.3f\n",
              k.random, k.loader, k.loader_only);
  std::optional<std::map<std::string, double>> p;
  if (!skip_peer) {
    std::ostringstream args;
    args << "--train --dir " << dir << " --device " << c.device << " --arch " << c.arch
         << " --dtype " << c.dtype << (c.channels_last ? " --channels-last" : "") << " --batch "
         << c.batch << " --size " << c.size << " --workers " << c.workers << " --steps "
         << c.steps << " --warmup " << c.warmup;
    p = try_peer(python, args.str());
  }
  auto peer = [&](const char* key) { return p ? p->at(key) : 0.0; };
  std::printf("%-34s %12s %12s %8s\n", "images per second", "kusari", "pytorch", "ratio");
  auto line = [&](const char* what, double kv, double pv) {
    std::printf("%-34s %12.1f %12.1f %8s\n", what, kv, pv,
                pv > 0 ? (std::to_string(kv / pv).substr(0, 5) + "x").c_str() : "-");
  };
  line("step on random data in memory", k.random, peer("random"));
  line("step fed by the loader (JPEGs)", k.loader, peer("loader"));
  line("loader alone (its ceiling)", k.loader_only, peer("loader_only"));
  std::printf("loader-fed / random: kusari %.3f", k.loader / k.random);
  if (p) std::printf(", pytorch %.3f", peer("loader") / peer("random"));
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "The ImageNet input pipeline (decode + RandomResizedCrop(224) + flip + normalise), and with "
      "--train a ResNet fed by it, kusari beside PyTorch"};
  std::string python = "/usr/bin/python3", workers_list = "1,2", dir = "image_loader_photos",
              photos = "/usr/share/backgrounds/mate/nature";
  int64_t images = 2000, batch = 64;
  int repeat = 3;
  bool skip_peer = false, train = false;
  TrainConfig tc;
  app.add_option("--python", python, "Interpreter with torch and torchvision for the peer")
      ->capture_default_str();
  app.add_option("--workers", workers_list, "Worker counts, comma-separated")
      ->capture_default_str();
  app.add_option("--images", images, "JPEGs in the benchmark set (made once in --dir)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 22));
  app.add_option("--batch", batch, "Batch size")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--repeat", repeat, "Decode mode: runs of each side, the best one counts")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--dir", dir, "Folder of the benchmark set")->capture_default_str();
  app.add_option("--photos", photos,
                 "Folder of photographs to cut the set from, or 'synthetic' (generated pictures)")
      ->capture_default_str();
  app.add_flag("--no-peer", skip_peer, "Run kusari only");
  app.add_flag("--train", train, "Training mode: a ResNet step fed by the loader vs random data");
  app.add_option("--device", tc.device, "--train: cuda (GPU 0) or cpu")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--arch", tc.arch, "--train: the model")
      ->capture_default_str()
      ->check(CLI::IsMember({"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"}));
  app.add_option("--dtype", tc.dtype, "--train: float32 or bfloat16 (mixed precision)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  app.add_flag("--channels-last", tc.channels_last, "--train: NHWC model and batches");
  app.add_option("--size", tc.size, "--train: crop size")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{8}, int64_t{1024}));
  app.add_option("--steps", tc.steps, "--train: timed steps")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("--warmup", tc.warmup, "--train: untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("bench_image_loader")) return 0;
  try {
    if (count_jpegs(dir) < images) make_photo_set(photos, dir, images);
    std::vector<int> workers;
    std::stringstream ss(workers_list);
    for (std::string w; std::getline(ss, w, ',');) workers.push_back(std::stoi(w));
    if (train) {
      tc.batch = batch;
      for (const int n : workers) {
        tc.workers = n;
        train_main(tc, dir, python, skip_peer);
      }
      return kusari::bench::finish(argc, argv);
    }
    auto ds = std::make_shared<kusari::ImageFolderDataset>(dir);
    const int64_t batches = std::max<int64_t>(1, ds->size() / batch - 1);
    std::printf(
        "ImageNet training input pipeline on %lld JPEGs of 500x375 in %s: images per second over "
        "%lld batches of %lld, the best of %d runs\n(read + decode + RandomResizedCrop(224) + "
        "RandomHorizontalFlip + Normalize to float32 CHW + batch)\n",
        static_cast<long long>(ds->size()), dir.c_str(), static_cast<long long>(batches),
        static_cast<long long>(batch), repeat);
    std::printf("%-8s %10s %10s %10s %8s | %12s %12s %8s\n", "workers", "kusari", "full-size",
                "pytorch", "ratio", "kusari/cpu-s", "pytorch/cpu-s", "ratio");
    auto ratio = [](double a, double b) {
      return b > 0 ? std::to_string(a / b).substr(0, 5) + "x" : std::string("-");
    };
    for (const int n : workers) {
      DecodeRate k, kf, p;
      for (int r = 0; r < repeat; ++r) {
        const DecodeRate a = kusari_images_per_second(ds, n, batch, batches, true);
        const DecodeRate b = kusari_images_per_second(ds, n, batch, batches, false);
        k.per_second = std::max(k.per_second, a.per_second);
        k.per_cpu_second = std::max(k.per_cpu_second, a.per_cpu_second);
        kf.per_second = std::max(kf.per_second, b.per_second);
        if (!skip_peer) {
          if (const auto res = try_peer(python, "--dir " + dir + " --workers " + std::to_string(n) +
                                                    " --batch " + std::to_string(batch) +
                                                    " --batches " + std::to_string(batches))) {
            p.per_second = std::max(p.per_second, res->at("images_per_second"));
            p.per_cpu_second = std::max(p.per_cpu_second, res->at("images_per_cpu_second"));
          }
        }
      }
      std::printf("%-8d %10.1f %10.1f %10.1f %8s | %12.1f %12.1f %8s\n", n, k.per_second,
                  kf.per_second, p.per_second, ratio(k.per_second, p.per_second).c_str(),
                  k.per_cpu_second, p.per_cpu_second,
                  ratio(k.per_cpu_second, p.per_cpu_second).c_str());
      std::fflush(stdout);
    }
    std::printf(
        "full-size: kusari without decoding at a reduced DCT size; /cpu-s: images per CPU-second "
        "of the loader's process (and, for PyTorch, of its worker processes), which a shared "
        "machine disturbs less than the wall clock\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_image_loader: %s\n", e.what());
    return 1;
  }
  return kusari::bench::finish(argc, argv);
}
