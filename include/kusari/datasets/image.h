// Image files: decoding (JPEG, PNG), encoding, and datasets of image files (Chainer's
// LabeledImageDataset and ImageDataset, torchvision's ImageFolder).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/datasets/dataset.h"

namespace kusari {

/// A decoded image in host memory: height x width x channels, either uint8 pixels (as decoded)
/// or float32 values (after Normalize), laid out HWC (interleaved) or CHW (planar).
struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  /// True when the values are CHW (one plane per channel); HWC otherwise.
  bool planar = false;
  /// The pixels when !is_float: height * width * channels bytes.
  std::vector<uint8_t> pixels;
  /// The values when is_float: height * width * channels floats.
  std::vector<float> values;

  /// True when the image holds float32 `values`; false when it holds uint8 `pixels`.
  bool is_float = false;

  /// Number of values (height * width * channels).
  int64_t size() const { return height * width * channels; }
  /// A uint8 HWC image of the given size, filled with zeros.
  static Image zeros(int64_t height, int64_t width, int64_t channels);
};

/// A rectangle of pixels: rows [top, top + height) and columns [left, left + width).
struct PixelWindow {
  int64_t top = 0;     ///< first row
  int64_t left = 0;    ///< first column
  int64_t height = 0;  ///< rows
  int64_t width = 0;   ///< columns
};

/// How decode_image shapes its output.
struct DecodeOptions {
  /// 3: RGB (grey is replicated, CMYK converted); 1: grey (colour is converted to luma); 0: as
  /// stored (1 for grey, 3 otherwise).
  int channels = 3;
  /// JPEG only: decode at 1/scale_denom of the full size through libjpeg's DCT scaling (1, 2, 4
  /// or 8); the result is ceil(size / scale_denom). Ignored for PNG.
  int scale_denom = 1;
  /// Decode only this window of the image (of the image at 1/scale_denom size); the result is
  /// window->height x window->width and equals that window of a full decode. A JPEG is decoded
  /// only as far as the window needs (Note [Decoding a window of a JPEG]); a PNG is decoded
  /// whole and the window cut out.
  std::optional<PixelWindow> window;
};

/// The format of an image file, from its first bytes.
enum class ImageFormat { kUnknown, kJpeg, kPng };

/// Size and stored channels of an encoded image, read from its header without decoding.
struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t height = 0;
  int64_t width = 0;
  /// Channels as stored: 1 (grey), 3 (colour), 4 (CMYK JPEG, or PNG with alpha).
  int64_t channels = 0;
};

/// Reads a whole file into memory. Throws IOError naming the file when it cannot be read.
std::vector<uint8_t> read_file_bytes(const std::string& path);

/// The header of an encoded image (JPEG or PNG). `name` names the data in errors (a path).
/// Throws IOError when the bytes are not a JPEG or PNG image or the header is corrupt.
ImageInfo read_image_info(const uint8_t* data, size_t size, const std::string& name);

/// Decodes a JPEG or PNG image held in memory into uint8 HWC pixels; see DecodeOptions.
/// Throws IOError naming `name` when the data is empty, not an image, truncated or corrupt.
Image decode_image(const uint8_t* data, size_t size, const std::string& name,
                   const DecodeOptions& options = {});

/// Reads and decodes the image file at `path`.
Image decode_image(const std::string& path, const DecodeOptions& options = {});

/// The largest DCT scale denominator d (1, 2, 4 or 8) of libjpeg for which a crop of
/// crop_height x crop_width source pixels stays at least out_height x out_width after scaling
/// (ceil(crop / d) >= out on both axes), so that resizing the crop of an image decoded at 1/d
/// still only shrinks it (or keeps its size). 1 when no scaling fits.
int jpeg_scale_denom_for(int64_t crop_height, int64_t crop_width, int64_t out_height,
                         int64_t out_width);

/// Encodes uint8 HWC pixels (1 or 3 channels) as a baseline JPEG of the given quality (1..100,
/// 4:2:0 chroma subsampling for colour).
std::vector<uint8_t> encode_jpeg(const Image& image, int quality = 90);

/// Encodes uint8 HWC pixels (1, 3 or 4 channels) as a PNG.
std::vector<uint8_t> encode_png(const Image& image);

/// Writes bytes to `path` through a temporary file in the same folder that is then renamed, so a
/// reader never sees half a file. Throws IOError naming the file on failure.
void write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes);

/// encode_jpeg, then write_file_bytes.
void write_jpeg(const std::string& path, const Image& image, int quality = 90);
/// encode_png, then write_file_bytes.
void write_png(const std::string& path, const Image& image);

/// A uint8 (H, W, C) CPU array holding a copy of the image's pixels (float32 (C, H, W) or
/// (H, W, C) for a float image, following `planar`).
Array image_to_array(const Image& image);
/// An Image holding a copy of a uint8 (H, W, C) or (H, W) CPU array.
Image image_from_array(const Array& array);

// Note [Image file datasets]
// The three datasets hold paths (and labels), never pixels: get_example(i) reads and decodes
// file i on every call, so a dataset of a million images costs a few tens of megabytes, and
// scatter_dataset over one shares paths, not pixels. Example i is {image, label} with the image
// a uint8 (H, W, C) array (C = DecodeOptions::channels) and the label an int32 0-d array
// (ImageDataset: {image} only). Images of one dataset may differ in size; a transform
// (transforms.h) makes them one shape before batching. Errors name the file: a missing file, an
// unreadable one, or one that is not a decodable JPEG or PNG throws IOError with its path.
// The loader (iterators/image_loader.h) reads path(i) itself, so it can read the header first
// and decode at a reduced size when its crop allows it.

/// Base of the datasets whose examples are image files on disk; see Note [Image file datasets].
class ImageFileDataset : public Dataset {
 public:
  /// The full path of file i.
  virtual std::string path(int64_t i) const = 0;
  /// The label of example i, or nullopt for a dataset without labels.
  virtual std::optional<int32_t> label(int64_t i) const = 0;
  /// How the files are decoded.
  const DecodeOptions& decode_options() const { return options_; }
  /// {image} or {image, label} for file i (decoded with decode_options()).
  Example get_example(int64_t i) const override;

 protected:
  explicit ImageFileDataset(DecodeOptions options) : options_(options) {}
  /// i after checking 0 <= i < size() (negative i counts from the end).
  int64_t checked_index(int64_t i, const char* fn) const;

 private:
  DecodeOptions options_;
};

/// Images listed with their labels (Chainer's LabeledImageDataset). The list file holds one
/// `path label` pair per line (the path may contain spaces; the label is the last field, a
/// non-negative integer); blank lines and lines starting with '#' are skipped. Relative paths
/// are taken from `root`.
class LabeledImageDataset : public ImageFileDataset {
 public:
  /// Reads the list file. Throws IOError naming the list file and line for a malformed line.
  LabeledImageDataset(const std::string& list_file, std::string root = ".",
                      DecodeOptions options = {});
  /// The (path, label) pairs given directly.
  LabeledImageDataset(std::vector<std::pair<std::string, int32_t>> pairs, std::string root = ".",
                      DecodeOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(pairs_.size()); }
  std::string path(int64_t i) const override;
  std::optional<int32_t> label(int64_t i) const override;

 private:
  std::vector<std::pair<std::string, int32_t>> pairs_;
  std::string root_;
};

/// Images without labels (Chainer's ImageDataset): a list file of one path per line (or the
/// paths), relative ones taken from `root`.
class ImageDataset : public ImageFileDataset {
 public:
  /// Reads the list file (blank lines and '#' lines skipped).
  ImageDataset(const std::string& list_file, std::string root = ".", DecodeOptions options = {});
  /// The paths given directly.
  ImageDataset(std::vector<std::string> paths, std::string root = ".", DecodeOptions options = {});

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  std::string path(int64_t i) const override;
  std::optional<int32_t> label(int64_t) const override { return std::nullopt; }

 private:
  std::vector<std::string> paths_;
  std::string root_;
};

/// A folder with one subfolder per class (torchvision's ImageFolder): the class names are the
/// subfolders' names sorted (byte order), class k gets label k, and the files of each class
/// whose extension is one of `extensions` (case-insensitive) are taken in sorted order.
class ImageFolderDataset : public ImageFileDataset {
 public:
  /// Scans `root`. Throws IOError when root is not a folder or holds no class with an image.
  explicit ImageFolderDataset(const std::string& root, DecodeOptions options = {},
                              std::vector<std::string> extensions = {".jpg", ".jpeg", ".png"});

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  std::string path(int64_t i) const override;
  std::optional<int32_t> label(int64_t i) const override;
  /// The class names; label k is classes()[k].
  const std::vector<std::string>& classes() const { return classes_; }

 private:
  std::vector<std::string> classes_;
  std::vector<std::pair<std::string, int32_t>> samples_;
};

}  // namespace kusari
