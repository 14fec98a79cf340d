// Helpers of the image tests: a temporary folder and synthetic pictures.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "kusari/datasets/image.h"

namespace kusari::testing {

/// A fresh folder under the system's temporary folder, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("kusari_image_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// The folder.
  const std::filesystem::path& path() const { return path_; }
  /// A path inside the folder.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

/// A smooth colour picture with some detail, different for each `seed`.
inline Image test_picture(int64_t height, int64_t width, int64_t channels, int seed = 0) {
  Image img = Image::zeros(height, width, channels);
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      for (int64_t c = 0; c < channels; ++c) {
        const int64_t v =
            (x * (7 + c) + y * (3 + 2 * c) + seed * 37 + ((x / 4 + y / 4) % 2) * 40) % 256;
        img.pixels[static_cast<size_t>((y * width + x) * channels + c)] = static_cast<uint8_t>(v);
      }
    }
  }
  return img;
}

/// n image files in `dir` -- JPEGs, every fifth a PNG -- of a few sizes, as a dataset whose
/// example i is labelled 100 + i.
inline std::shared_ptr<LabeledImageDataset> make_image_files(const TempDir& dir, int n) {
  std::vector<std::pair<std::string, int32_t>> pairs;
  for (int i = 0; i < n; ++i) {
    const std::string name = "img" + std::to_string(i) + (i % 5 == 4 ? ".png" : ".jpg");
    const Image pic = test_picture(40 + 7 * (i % 4), 50 + 5 * (i % 3), 3, i);
    if (i % 5 == 4) {
      write_png(dir.file(name), pic);
    } else {
      write_jpeg(dir.file(name), pic, 90);
    }
    pairs.emplace_back(name, 100 + i);
  }
  return std::make_shared<LabeledImageDataset>(std::move(pairs), dir.path().string());
}

}  // namespace kusari::testing
