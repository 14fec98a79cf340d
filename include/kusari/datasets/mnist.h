// MNIST and Fashion-MNIST from the standard IDX files (Chainer's get_mnist / get_fashion_mnist).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "kusari/core/array.h"
#include "kusari/datasets/tuple_dataset.h"

namespace kusari {

// Note [MNIST files]
// Both data sets ship as four IDX files, each optionally gzip-compressed:
//   train-images-idx3-ubyte  train-labels-idx1-ubyte  t10k-images-idx3-ubyte t10k-labels-idx1-ubyte
// An IDX file is a big-endian header -- two zero bytes, an element-type byte (0x08: unsigned
// byte), a byte with the number of dimensions, then one uint32 per dimension -- followed by the
// elements in C order. Image files have magic 0x00000803 and shape (N, 28, 28); label files
// have magic 0x00000801 and shape (N,). For each name the loader takes `name` if it exists, else
// `name.gz`. The whole file is read in one pass (zlib's gzread also reads uncompressed files),
// then pixels go through a 256-entry table to the requested dtype, so loading costs about one
// decompression plus one pass over the pixels.
//
// Directories: MnistOptions::directory when set; otherwise $KUSARI_DATASET_ROOT/<name> when that
// variable is set (name = "mnist" or "fashion-mnist"); otherwise, for Fashion-MNIST only, the
// system copy in /usr/share/datasets/fashion-mnist.

/// How get_mnist / get_fashion_mnist shape the data (Chainer's arguments, plus the directory).
struct MnistOptions {
  /// When true each example is {image, label}; when false it is {image}.
  bool withlabel = true;
  /// Image shape: 1 -> (784,), 2 -> (28, 28), 3 -> (1, 28, 28).
  int ndim = 1;
  /// Pixels are scaled to [0, scale]. An integer dtype keeps the raw values (needs scale 255).
  double scale = 1.0;
  /// Dtype of the images (floating, or uint8/int32/int64 for raw pixels).
  Dtype dtype = float32;
  /// Dtype of the labels (0-d arrays with values 0..9).
  Dtype label_dtype = int32;
  /// Folder holding the IDX files; see Note [MNIST files] for the default.
  std::string directory;
};

/// (train, test) datasets.
using TupleDatasetPair = std::pair<std::shared_ptr<TupleDataset>, std::shared_ptr<TupleDataset>>;

/// MNIST: 60000 training and 10000 test examples of handwritten digits, read from the original
/// files in options.directory (or $KUSARI_DATASET_ROOT/mnist). Throws IOError naming the file that
/// is missing or malformed and what was expected.
TupleDatasetPair get_mnist(const MnistOptions& options);

/// Fashion-MNIST: the same layout as MNIST with pictures of clothing, read from
/// options.directory, $KUSARI_DATASET_ROOT/fashion-mnist or /usr/share/datasets/fashion-mnist.
TupleDatasetPair get_fashion_mnist(const MnistOptions& options = {});

/// Reads one IDX file of unsigned bytes (plain or gzip-compressed) into a uint8 CPU array whose
/// shape is the one in the header. Throws IOError when the file cannot be read, its header is not
/// an IDX header of unsigned bytes, or its length does not match the header.
Array read_idx(const std::string& path);

}  // namespace kusari
