// Helpers of the image tests: a temporary folder and synthetic pictures.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <string>

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

}  // namespace kusari::testing
