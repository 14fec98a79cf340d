// Writes a synthetic COCO-style detection dataset: pictures of coloured squares, disks and
// triangles on a grey background (Note [Synthetic detection pictures] in detection.h), as
//
//   <out>/train/000000.jpg ...              <out>/annotations/instances_train.json
//   <out>/val/000000.jpg ...                <out>/annotations/instances_val.json
//
// which CocoDetectionDataset (and torchvision's CocoDetection, pycocotools) reads:
//
//   make_detection_set --out shapes [--train 200] [--val 50] [--size 64] [--max-objects 3]
//                      [--seed 0] [--quality 90]
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <string>

#include "kusari/core/program.h"
#include "kusari/datasets/detection.h"
#include "kusari/datasets/image.h"

namespace {

// Draws `count` pictures of split `split` and writes them to out/name/ and their annotations to
// out/annotations/instances_<name>.json.
void write_split(const std::filesystem::path& out, const std::string& name, int64_t count,
                 kusari::SyntheticDetectionOptions options, uint64_t split, int quality) {
  options.split = split;
  const kusari::SyntheticDetectionSet set = kusari::make_synthetic_detection_images(count, options);
  const std::filesystem::path dir = out / name;
  std::filesystem::create_directories(dir);
  std::filesystem::create_directories(out / "annotations");
  for (size_t i = 0; i < set.images.size(); ++i) {
    kusari::write_jpeg((dir / set.records[i].file_name).string(), set.images[i], quality);
  }
  // The annotations last: a folder with its JSON file is complete.
  kusari::write_coco_detection((out / "annotations" / ("instances_" + name + ".json")).string(),
                               set.records, set.class_names);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "A synthetic COCO-style detection dataset: coloured squares, disks and triangles on a grey "
      "background, as JPEGs and COCO instances JSON files"};
  std::string out;
  int64_t train = 200, val = 50, size = 64, max_objects = 3;
  uint64_t seed = 0;
  int quality = 90;
  app.add_option("--out", out, "Folder to write (train/, val/ and annotations/ are created in it)")
      ->required();
  app.add_option("--train", train, "Training pictures to write")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--val", val, "Validation pictures to write")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--size", size, "Side of the square pictures in pixels")
      ->capture_default_str()
      ->check(CLI::Range(12, 4096));
  app.add_option("--max-objects", max_objects,
                 "Most objects in a picture (each has 1 to this many)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--seed", seed, "Seed of the pictures (the same seed writes the same files)")
      ->capture_default_str();
  app.add_option("--quality", quality, "JPEG quality")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("make_detection_set")) return 0;
  try {
    kusari::SyntheticDetectionOptions o;
    o.size = size;
    o.max_objects = max_objects;
    o.seed = seed;
    const std::filesystem::path root(out);
    write_split(root, "train", train, o, /*split=*/0, quality);
    write_split(root, "val", val, o, /*split=*/1, quality);
    std::printf(
        "make_detection_set: wrote %lld training and %lld validation pictures of %lldx%lld with "
        "their annotations to %s\n",
        static_cast<long long>(train), static_cast<long long>(val), static_cast<long long>(size),
        static_cast<long long>(size), out.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_detection_set: %s\n", e.what());
    return 1;
  }
  return 0;
}
