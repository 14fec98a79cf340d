// Images per second through the ImageNet training input pipeline -- read a JPEG, decode, random
// resized crop to 224x224, random horizontal flip, normalise to float32 CHW, batch -- by worker
// count, kusari's ImageLoader beside PyTorch's DataLoader with torchvision's transforms (PIL) on
// the same files with the same number of workers, in the same run.
//
// The files are photographs: the nature pictures of Debian's mate-backgrounds package cut into
// 500x375 quality-90 JPEGs (about ImageNet's typical size), written on the first run into
// --dir (one class folder per source photograph) and reused afterwards.
//
//   bench_image_loader [--python /usr/bin/python3] [--workers 1,2] [--images 2000] [--batch 64]
//                      [--dir image_loader_photos] [--photos /usr/share/backgrounds/mate/nature]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "bench_util.h"
#include "kusari/datasets/image.h"
#include "kusari/datasets/transforms.h"
#include "kusari/iterators/image_loader.h"

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

// Cuts `count` 500x375 JPEGs out of the photographs in `photos`: each tile is a random region
// of 1 to 2.5 times the tile's size, shrunk to 500x375 (a few flipped to 375x500 portraits).
void make_photo_set(const fs::path& photos, const fs::path& dir, int64_t count) {
  std::vector<fs::path> sources;
  std::error_code ec;
  if (fs::is_directory(photos, ec)) {
    for (const auto& e : fs::directory_iterator(photos)) {
      if (e.path().extension() == ".jpg") sources.push_back(e.path());
    }
  }
  if (sources.empty()) {
    throw std::runtime_error("no .jpg photographs in " + photos.string() +
                             " (install Debian's mate-backgrounds package, or pass --photos)");
  }
  std::sort(sources.begin(), sources.end());
  std::printf("cutting %lld 500x375 JPEGs from %zu photographs in %s into %s ...\n",
              static_cast<long long>(count), sources.size(), photos.string().c_str(),
              dir.string().c_str());
  std::fflush(stdout);
  T::Rng rng(2026);
  const auto per =
      (count + static_cast<int64_t>(sources.size()) - 1) / static_cast<int64_t>(sources.size());
  int64_t written = 0;
  for (const fs::path& src : sources) {
    const fs::path cls = dir / src.stem();
    fs::create_directories(cls);
    kusari::DecodeOptions o;
    const std::vector<uint8_t> bytes = kusari::read_file_bytes(src.string());
    const kusari::ImageInfo info =
        kusari::read_image_info(bytes.data(), bytes.size(), src.string());
    o.scale_denom = kusari::jpeg_scale_denom_for(info.height, info.width, 938, 1250);
    const kusari::Image photo = kusari::decode_image(bytes.data(), bytes.size(), src.string(), o);
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

// Images per second of `batches` batches after the first (which includes starting the workers).
double kusari_images_per_second(const std::shared_ptr<kusari::Dataset>& ds, int workers,
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
  const auto start = std::chrono::steady_clock::now();
  int64_t images = 0;
  for (int64_t b = 0; b < batches; ++b) images += loader.next_batch()[0].shape()[0];
  return static_cast<double>(images) /
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Image input pipeline (decode + RandomResizedCrop(224) + flip + normalise), kusari beside "
      "PyTorch"};
  std::string python = "/usr/bin/python3", workers_list = "1,2", dir = "image_loader_photos",
              photos = "/usr/share/backgrounds/mate/nature";
  int64_t images = 2000, batch = 64;
  bool skip_peer = false;
  app.add_option("--python", python, "Interpreter with torch and torchvision for the peer")
      ->capture_default_str();
  app.add_option("--workers", workers_list, "Worker counts, comma-separated")
      ->capture_default_str();
  app.add_option("--images", images, "JPEGs in the benchmark set (made once in --dir)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 20));
  app.add_option("--batch", batch, "Batch size")->capture_default_str()->check(CLI::Range(1, 4096));
  app.add_option("--dir", dir, "Folder of the benchmark set")->capture_default_str();
  app.add_option("--photos", photos, "Folder of photographs to cut the set from")
      ->capture_default_str();
  app.add_flag("--no-peer", skip_peer, "Run kusari only");
  kusari::bench::setup(app);
  CLI11_PARSE(app, argc, argv);
  try {
    if (count_jpegs(dir) < images) make_photo_set(photos, dir, images);
    auto ds = std::make_shared<kusari::ImageFolderDataset>(dir);
    const int64_t batches = std::max<int64_t>(1, ds->size() / batch - 1);
    std::printf(
        "ImageNet training input pipeline on %lld JPEGs of 500x375 in %s: images per second over "
        "%lld "
        "batches of %lld\n(read + decode + RandomResizedCrop(224) + RandomHorizontalFlip + "
        "Normalize to "
        "float32 CHW + batch)\n",
        static_cast<long long>(ds->size()), dir.c_str(), static_cast<long long>(batches),
        static_cast<long long>(batch));
    std::printf("%-8s %14s %18s %14s %10s\n", "workers", "kusari", "kusari full-size", "pytorch",
                "ratio");
    std::stringstream ss(workers_list);
    std::string w;
    while (std::getline(ss, w, ',')) {
      const int n = std::stoi(w);
      const double k = kusari_images_per_second(ds, n, batch, batches, true);
      const double kf = kusari_images_per_second(ds, n, batch, batches, false);
      std::optional<double> p;
      if (!skip_peer) {
        if (auto peer = kusari::bench::try_peer(python, "image_loader.py",
                                                "--dir " + dir + " --workers " + w + " --batch " +
                                                    std::to_string(batch) + " --batches " +
                                                    std::to_string(batches))) {
          p = peer->at("images_per_second");
        }
      }
      std::printf("%-8d %14.1f %18.1f %14s %10s\n", n, k, kf, kusari::bench::cell(p, 1).c_str(),
                  p && *p > 0 ? (std::to_string(k / *p).substr(0, 5) + "x").c_str() : "-");
    }
    std::printf("kusari full-size: the same pipeline without decoding at a reduced DCT size\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_image_loader: %s\n", e.what());
    return 1;
  }
  return kusari::bench::finish(argc, argv);
}
