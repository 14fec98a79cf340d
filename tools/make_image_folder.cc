// Writes an ImageNet-layout folder of JPEGs made from Fashion-MNIST: <out>/train/<class>/*.jpg and
// <out>/val/<class>/*.jpg, one folder per class, each 28x28 picture enlarged to --size pixels.
// The class folders are named "0_t-shirt_top", "1_trouser", ... so that their sorted order (the
// labels ImageFolderDataset and torchvision's ImageFolder give) is Fashion-MNIST's label order.
//
//   make_image_folder --out fashion_images [--size 64] [--train 60000] [--val 10000] [--quality 90]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "kusari/datasets/image.h"
#include "kusari/datasets/mnist.h"
#include "kusari/datasets/transforms.h"
#include "kusari/core/program.h"

namespace {

const char* const kClassNames[10] = {"0_t-shirt_top", "1_trouser",   "2_pullover", "3_dress",
                                     "4_coat",        "5_sandal",    "6_shirt",    "7_sneaker",
                                     "8_bag",         "9_ankle_boot"};

// Writes the first `count` examples of `split` under out/name; returns how many were written.
int64_t write_split(const kusari::TupleDataset& split, const std::filesystem::path& dir,
                    int64_t count, int64_t size, int quality, bool rgb) {
  namespace T = kusari::transforms;
  for (const char* c : kClassNames) std::filesystem::create_directories(dir / c);
  const int64_t n = std::min(count, split.size());
  const T::Resize resize(size);
  T::Rng rng(0);
  for (int64_t i = 0; i < n; ++i) {
    kusari::Example ex = split.get_example(i);
    kusari::Image img = kusari::image_from_array(ex[0]);  // (28, 28) uint8 -> 28x28x1
    if (size != img.width) resize.apply(img, rng);
    if (rgb) {
      kusari::Image c = kusari::Image::zeros(img.height, img.width, 3);
      for (size_t p = 0; p < img.pixels.size(); ++p)
        c.pixels[3 * p] = c.pixels[3 * p + 1] = c.pixels[3 * p + 2] = img.pixels[p];
      img = std::move(c);
    }
    const int label = ex[1].item<int32_t>();
    char name[32];
    std::snprintf(name, sizeof(name), "%06lld.jpg", static_cast<long long>(i));
    kusari::write_jpeg((dir / kClassNames[label] / name).string(), img, quality);
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "An ImageNet-layout JPEG folder (train/ and val/, one folder per class) made from "
      "Fashion-MNIST"};
  std::string out, data_dir;
  int64_t size = 64, train = 60000, val = 10000;
  int quality = 90;
  bool rgb = false;
  app.add_option("--out", out, "Folder to write (train/ and val/ are created in it)")->required();
  app.add_option("--size", size, "Side of the written pictures (28: unchanged)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--train", train, "Training pictures to write (at most 60000)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--val", val, "Validation pictures to write (at most 10000)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--quality", quality, "JPEG quality")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_flag("--rgb", rgb,
               "Write 3-channel JPEGs (default: greyscale JPEGs, decoded to RGB when asked)");
  app.add_option("--data", data_dir,
                 "Folder of the Fashion-MNIST IDX files (default: as get_fashion_mnist)");
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("make_image_folder")) return 0;
  try {
    kusari::MnistOptions o;
    o.ndim = 2;
    o.dtype = kusari::uint8;
    o.scale = 255.0;
    o.directory = data_dir;
    auto [train_set, val_set] = kusari::get_fashion_mnist(o);
    const std::filesystem::path root(out);
    const int64_t a = write_split(*train_set, root / "train", train, size, quality, rgb);
    const int64_t b = write_split(*val_set, root / "val", val, size, quality, rgb);
    std::printf(
        "make_image_folder: wrote %lld training and %lld validation pictures of %lldx%lld to %s\n",
        static_cast<long long>(a), static_cast<long long>(b), static_cast<long long>(size),
        static_cast<long long>(size), out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_image_folder: %s\n", e.what());
    return 1;
  }
  return 0;
}
