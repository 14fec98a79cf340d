// LabeledImageDataset, ImageDataset and ImageFolderDataset (Note [Image file datasets]).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "datasets/dataset_util.h"
#include "kusari/core/error.h"
#include "kusari/datasets/image.h"

namespace kusari {
namespace {

namespace fs = std::filesystem;

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// The non-blank, non-comment lines of a list file, each with its line number.
std::vector<std::pair<std::string, int64_t>> read_list_lines(const std::string& list_file,
                                                             const char* fn) {
  std::error_code ec;
  KUSARI_CHECK(!fs::is_directory(list_file, ec), IOError, fn, ": the list file ", list_file,
               " is a directory, expected a text file of image paths");
  std::ifstream in(list_file);
  KUSARI_CHECK(in.good(), IOError, fn, ": cannot open the list file ", list_file, ": ",
               std::strerror(errno));
  std::vector<std::pair<std::string, int64_t>> lines;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    lines.emplace_back(std::move(t), number);
  }
  KUSARI_CHECK(!in.bad(), IOError, fn, ": cannot read the list file ", list_file);
  return lines;
}

std::string join_root(const std::string& root, const std::string& path) {
  const fs::path p(path);
  if (p.is_absolute() || root.empty()) return path;
  return (fs::path(root) / p).string();
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join_words(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
  return out;
}

}  // namespace

int64_t ImageFileDataset::checked_index(int64_t i, const char* fn) const {
  return detail::checked_image_index(i, size(), fn);
}

Example ImageFileDataset::get_example(int64_t i) const {
  const int64_t j = checked_index(i, "ImageFileDataset::get_example");
  Example ex{image_to_array(decode_image(path(j), options_))};
  if (std::optional<int32_t> t = label(j)) ex.push_back(Array::scalar(*t, int32, Device::cpu()));
  return ex;
}

LabeledImageDataset::LabeledImageDataset(const std::string& list_file, std::string root,
                                         DecodeOptions options)
    : ImageFileDataset(options), root_(std::move(root)) {
  const char* fn = "LabeledImageDataset";
  for (auto& [line, number] : read_list_lines(list_file, fn)) {
    const size_t space = line.find_last_of(" \t");
    KUSARI_CHECK(space != std::string::npos, IOError, fn, ": ", list_file, " line ", number,
                 " is '", line, "', expected 'path label' (a path, whitespace, an integer label)");
    const std::string label_text = line.substr(space + 1);
    int64_t label = -1;
    const auto [end, err] =
        std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
    KUSARI_CHECK(err == std::errc() && end == label_text.data() + label_text.size() && label >= 0 &&
                     label <= INT32_MAX,
                 IOError, fn, ": ", list_file, " line ", number, ": the label '", label_text,
                 "' is not a non-negative 32-bit integer (expected 'path label')");
    pairs_.emplace_back(trim(line.substr(0, space)), static_cast<int32_t>(label));
  }
}

LabeledImageDataset::LabeledImageDataset(std::vector<std::pair<std::string, int32_t>> pairs,
                                         std::string root, DecodeOptions options)
    : ImageFileDataset(options), pairs_(std::move(pairs)), root_(std::move(root)) {
  for (size_t i = 0; i < pairs_.size(); ++i) {
    KUSARI_CHECK(pairs_[i].second >= 0, ValueError, "LabeledImageDataset: the label of ",
                 pairs_[i].first, " (entry ", i, ") is ", pairs_[i].second,
                 "; labels must be non-negative");
  }
}

std::string LabeledImageDataset::path(int64_t i) const {
  return join_root(
      root_, pairs_[static_cast<size_t>(checked_index(i, "LabeledImageDataset::path"))].first);
}

std::optional<int32_t> LabeledImageDataset::label(int64_t i) const {
  return pairs_[static_cast<size_t>(checked_index(i, "LabeledImageDataset::label"))].second;
}

ImageDataset::ImageDataset(const std::string& list_file, std::string root, DecodeOptions options)
    : ImageFileDataset(options), root_(std::move(root)) {
  for (auto& [line, number] : read_list_lines(list_file, "ImageDataset"))
    paths_.push_back(std::move(line));
}

ImageDataset::ImageDataset(std::vector<std::string> paths, std::string root, DecodeOptions options)
    : ImageFileDataset(options), paths_(std::move(paths)), root_(std::move(root)) {}

std::string ImageDataset::path(int64_t i) const {
  return join_root(root_, paths_[static_cast<size_t>(checked_index(i, "ImageDataset::path"))]);
}

ImageFolderDataset::ImageFolderDataset(const std::string& root, DecodeOptions options,
                                       std::vector<std::string> extensions)
    : ImageFileDataset(options) {
  const char* fn = "ImageFolderDataset";
  std::error_code ec;
  KUSARI_CHECK(fs::is_directory(root, ec), IOError, fn, ": ", root,
               " is not a folder (expected one subfolder per class)");
  for (std::string& e : extensions) e = lower(e);
  std::vector<std::string> names;
  for (const fs::directory_entry& d : fs::directory_iterator(root)) {
    if (d.is_directory()) names.push_back(d.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    std::vector<std::string> files;
    for (const fs::directory_entry& f : fs::recursive_directory_iterator(fs::path(root) / name)) {
      if (!f.is_regular_file()) continue;
      const std::string ext = lower(f.path().extension().string());
      if (std::find(extensions.begin(), extensions.end(), ext) != extensions.end()) {
        files.push_back(f.path().string());
      }
    }
    // torchvision gives a label to every class folder, also to one without images.
    const auto label = static_cast<int32_t>(classes_.size());
    classes_.push_back(name);
    std::sort(files.begin(), files.end());
    for (std::string& f : files) samples_.emplace_back(std::move(f), label);
  }
  KUSARI_CHECK(!samples_.empty(), IOError, fn, ": found no images in ", root, " (", classes_.size(),
               " class folders; looked for files ending in ", join_words(extensions), ")");
}

std::string ImageFolderDataset::path(int64_t i) const {
  return samples_[static_cast<size_t>(checked_index(i, "ImageFolderDataset::path"))].first;
}

std::optional<int32_t> ImageFolderDataset::label(int64_t i) const {
  return samples_[static_cast<size_t>(checked_index(i, "ImageFolderDataset::label"))].second;
}

}  // namespace kusari
