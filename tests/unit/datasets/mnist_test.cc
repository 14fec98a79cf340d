#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "kusari/core/routines.h"
#include "kusari/datasets/mnist.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace fs = std::filesystem;

const char* const kFashionDir = "/usr/share/datasets/fashion-mnist";

using testing::ThrowsWith;

// ---------------------------------------------------------------------------------------------
// The real Fashion-MNIST files.
// ---------------------------------------------------------------------------------------------

class FashionMnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(kFashionDir) / "train-images-idx3-ubyte.gz")) {
      GTEST_SKIP() << "Fashion-MNIST is not installed in " << kFashionDir
                   << " (the dataset-fashion-mnist package provides it)";
    }
    unsetenv("KUSARI_DATASET_ROOT");
  }
};

TEST_F(FashionMnistTest, LoadsTrainAndTestWithLabels) {
  const auto t0 = std::chrono::steady_clock::now();
  auto [train, test] = get_fashion_mnist();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "[ info     ] get_fashion_mnist() took " << seconds << " s\n";
  EXPECT_LT(seconds, 5.0);
  ASSERT_EQ(train->size(), 60000);
  ASSERT_EQ(test->size(), 10000);
  ASSERT_EQ(train->width(), 2u);
  EXPECT_EQ(train->column(0).shape(), (Shape{60000, 784}));
  EXPECT_EQ(train->column(0).dtype(), float32);
  EXPECT_EQ(train->column(1).shape(), (Shape{60000}));
  EXPECT_EQ(train->column(1).dtype(), int32);
  EXPECT_EQ(test->column(0).shape(), (Shape{10000, 784}));

  Example first = train->get_example(0);
  EXPECT_EQ(first[0].shape(), (Shape{784}));
  EXPECT_EQ(first[1].ndim(), 0);
  // The first training label of Fashion-MNIST is 9 (ankle boot), as is the first test label;
  // the first image's raw pixels sum to 76247.
  EXPECT_EQ(first[1].item<int32_t>(), 9);
  EXPECT_EQ(test->get_example(0)[1].item<int32_t>(), 9);
  EXPECT_EQ(train->get_example(1)[1].item<int32_t>(), 0);
  EXPECT_NEAR(sum(first[0]).item<double>(), 76247.0 / 255.0, 1e-2);

  for (const auto& ds : {train, test}) {
    EXPECT_EQ(amin(ds->column(0)).item<float>(), 0.0f);
    EXPECT_LE(amax(ds->column(0)).item<float>(), 1.0f);
    EXPECT_GE(amax(ds->column(0)).item<float>(), 0.999f);
    EXPECT_EQ(amin(ds->column(1)).item<int32_t>(), 0);
    EXPECT_EQ(amax(ds->column(1)).item<int32_t>(), 9);
  }
  // Fashion-MNIST is balanced: 6000 training examples per class.
  std::vector<int32_t> labels = train->column(1).to_vector<int32_t>();
  std::vector<int> counts(10, 0);
  for (int32_t l : labels) ++counts[l];
  for (int c : counts) EXPECT_EQ(c, 6000);
}

TEST_F(FashionMnistTest, ShapesForEachNdim) {
  MnistOptions o;
  o.ndim = 2;
  auto [train2, test2] = get_fashion_mnist(o);
  EXPECT_EQ(train2->get_example(0)[0].shape(), (Shape{28, 28}));
  EXPECT_EQ(test2->column(0).shape(), (Shape{10000, 28, 28}));
  o.ndim = 3;
  auto [train3, test3] = get_fashion_mnist(o);
  EXPECT_EQ(train3->get_example(0)[0].shape(), (Shape{1, 28, 28}));
  EXPECT_EQ(test3->column(0).shape(), (Shape{10000, 1, 28, 28}));
}

TEST_F(FashionMnistTest, ScaleDtypeAndNoLabels) {
  MnistOptions o;
  o.withlabel = false;
  o.scale = 255.0;
  o.dtype = uint8;
  auto [train, test] = get_fashion_mnist(o);
  ASSERT_EQ(train->width(), 1u);
  EXPECT_EQ(train->column(0).dtype(), uint8);
  EXPECT_EQ(sum(train->get_example(0)[0].astype(int64)).item<int64_t>(), 76247);
  EXPECT_EQ(test->size(), 10000);

  MnistOptions d;
  d.scale = 2.0;
  d.dtype = float64;
  d.label_dtype = int64;
  auto [train64, test64] = get_fashion_mnist(d);
  EXPECT_EQ(train64->column(0).dtype(), float64);
  EXPECT_EQ(train64->column(1).dtype(), int64);
  EXPECT_NEAR(amax(train64->column(0)).item<double>(), 2.0, 1e-12);
  EXPECT_NEAR(sum(train64->get_example(0)[0]).item<double>(), 2.0 * 76247.0 / 255.0, 1e-9);
}

// ---------------------------------------------------------------------------------------------
// Small IDX files written by the tests.
// ---------------------------------------------------------------------------------------------

std::vector<unsigned char> idx_header(uint32_t magic, const std::vector<uint32_t>& dims) {
  std::vector<unsigned char> out;
  auto put = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<unsigned char>(v >> s));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  return out;
}

std::vector<unsigned char> image_file(uint32_t n, uint32_t rows = 28, uint32_t cols = 28) {
  std::vector<unsigned char> out = idx_header(0x00000803, {n, rows, cols});
  for (uint32_t i = 0; i < n * rows * cols; ++i)
    out.push_back(static_cast<unsigned char>((i * 7) % 256));
  return out;
}

std::vector<unsigned char> label_file(const std::vector<unsigned char>& labels) {
  std::vector<unsigned char> out = idx_header(0x00000801, {static_cast<uint32_t>(labels.size())});
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

class IdxFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("kusari_idx_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(dir_);
    unsetenv("KUSARI_DATASET_ROOT");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    unsetenv("KUSARI_DATASET_ROOT");
  }
  void write(const std::string& name, const std::vector<unsigned char>& bytes,
             const fs::path& dir = {}) {
    std::ofstream f((dir.empty() ? dir_ : dir) / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }
  // A complete, valid set: 3 training and 2 test examples.
  void write_valid_set(const fs::path& dir = {}) {
    write("train-images-idx3-ubyte", image_file(3), dir);
    write("train-labels-idx1-ubyte", label_file({5, 0, 9}), dir);
    write("t10k-images-idx3-ubyte", image_file(2), dir);
    write("t10k-labels-idx1-ubyte", label_file({1, 2}), dir);
  }
  MnistOptions options() const {
    MnistOptions o;
    o.directory = dir_.string();
    return o;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(IdxFilesTest, ReadsASmallValidSet) {
  write_valid_set();
  auto [train, test] = get_mnist(options());
  ASSERT_EQ(train->size(), 3);
  ASSERT_EQ(test->size(), 2);
  EXPECT_EQ(train->get_example(2)[1].item<int32_t>(), 9);
  EXPECT_EQ(test->get_example(1)[1].item<int32_t>(), 2);
  // Pixel k of the file is (k * 7) % 256, scaled to [0, 1] as Chainer does (float32 arithmetic).
  std::vector<float> px = train->get_example(1)[0].to_vector<float>();
  ASSERT_EQ(px.size(), 784u);
  for (int k = 0; k < 784; ++k) {
    const int raw = ((784 + k) * 7) % 256;
    ASSERT_EQ(px[k], static_cast<float>(raw) * static_cast<float>(1.0 / 255.0)) << "pixel " << k;
  }
  Array raw = read_idx(path("train-images-idx3-ubyte"));
  EXPECT_EQ(raw.shape(), (Shape{3, 28, 28}));
  EXPECT_EQ(raw.dtype(), uint8);
  EXPECT_EQ(raw.at({0, 0, 1}).item<int>(), 7);
}

TEST_F(IdxFilesTest, DatasetRootEnvironmentVariable) {
  fs::create_directories(dir_ / "fashion-mnist");
  write_valid_set(dir_ / "fashion-mnist");
  fs::create_directories(dir_ / "mnist");
  write_valid_set(dir_ / "mnist");
  setenv("KUSARI_DATASET_ROOT", dir_.c_str(), 1);
  EXPECT_EQ(get_fashion_mnist().first->size(), 3);
  EXPECT_EQ(get_mnist({}).second->size(), 2);
  // An explicit directory wins over the variable.
  MnistOptions o;
  o.directory = (dir_ / "nowhere").string();
  EXPECT_THROW(get_fashion_mnist(o), IOError);
}

TEST_F(IdxFilesTest, GetMnistNeedsADirectory) {
  EXPECT_TRUE(ThrowsWith<IOError>([] { get_mnist({}); }, {"get_mnist", "KUSARI_DATASET_ROOT"}));
}

TEST_F(IdxFilesTest, MissingDirectoryAndFilesAreNamed) {
  MnistOptions o;
  o.directory = (dir_ / "absent").string();
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { get_mnist(o); }, {"get_mnist", o.directory, "does not exist"}));
  write("train-images-idx3-ubyte", image_file(3));
  EXPECT_TRUE(ThrowsWith<IOError>(
      [&] { get_mnist(options()); },
      {"cannot find train-labels-idx1-ubyte", path("train-labels-idx1-ubyte.gz")}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { read_idx(path("nothing-here")); },
                                  {"read_idx", path("nothing-here")}));
}

TEST_F(IdxFilesTest, BadMagicNumbers) {
  write_valid_set();
  std::vector<unsigned char> bad = image_file(3);
  bad[0] = 0x12;
  write("train-images-idx3-ubyte", bad);
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { get_mnist(options()); },
                          {path("train-images-idx3-ubyte"), "IDX magic number", "0x12000803"}));
  // A label file where an image file belongs.
  write("train-images-idx3-ubyte", label_file({1, 2, 3}));
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { get_mnist(options()); },
                          {path("train-images-idx3-ubyte"), "0x00000801", "needs 0x00000803"}));
  // Elements that are not unsigned bytes.
  std::vector<unsigned char> ints = idx_header(0x00000C01, {1});
  ints.insert(ints.end(), {0, 0, 0, 1});
  write("t.idx", ints);
  EXPECT_TRUE(ThrowsWith<IOError>([&] { read_idx(path("t.idx")); }, {"only unsigned bytes"}));
}

TEST_F(IdxFilesTest, TruncatedAndOverlongFiles) {
  write_valid_set();
  std::vector<unsigned char> img = image_file(3);
  img.resize(img.size() - 100);
  write("train-images-idx3-ubyte", img);
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { get_mnist(options()); },
                          {path("train-images-idx3-ubyte"), "truncated", "2352 bytes", "2252"}));
  // Truncated inside the header.
  write("train-images-idx3-ubyte", std::vector<unsigned char>{0, 0, 8, 3, 0, 0});
  EXPECT_TRUE(ThrowsWith<IOError>([&] { get_mnist(options()); }, {"truncated in its header"}));
  write("train-images-idx3-ubyte", std::vector<unsigned char>{0, 0});
  EXPECT_TRUE(ThrowsWith<IOError>([&] { get_mnist(options()); }, {"too short"}));
  // Extra bytes after the data.
  std::vector<unsigned char> labels = label_file({1, 2, 3});
  labels.push_back(4);
  write_valid_set();
  write("train-labels-idx1-ubyte", labels);
  EXPECT_TRUE(ThrowsWith<IOError>([&] { get_mnist(options()); },
                                  {path("train-labels-idx1-ubyte"), "longer"}));
}

TEST_F(IdxFilesTest, TruncatedGzipFile) {
  const fs::path real = fs::path(kFashionDir) / "t10k-labels-idx1-ubyte.gz";
  if (!fs::exists(real)) GTEST_SKIP() << "needs " << real << " as a source of gzip data";
  std::ifstream in(real, std::ios::binary);
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)),
                                   std::istreambuf_iterator<char>());
  bytes.resize(bytes.size() / 2);
  write("labels.gz", bytes);
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { read_idx(path("labels.gz")); }, {path("labels.gz"), "truncated"}));
  // The whole file reads as 10000 labels; a gzip file is found under name.gz.
  fs::copy_file(real, dir_ / "t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(read_idx(path("t10k-labels-idx1-ubyte.gz")).shape(), (Shape{10000}));
}

// A header that promises more data than the file can hold is an IOError naming the file before
// anything is allocated (Note [IDX headers against the file size]); before, get_mnist tried to
// allocate 52 GB and failed with an out-of-memory message that named no file.
TEST_F(IdxFilesTest, LyingHeaderIsCaughtBeforeAllocating) {
  write_valid_set();
  std::vector<unsigned char> img = image_file(3);
  const std::vector<unsigned char> lie = idx_header(0x00000803, {16777215, 28, 28});
  std::copy(lie.begin(), lie.end(), img.begin());
  write("train-images-idx3-ubyte", img);
  EXPECT_TRUE(ThrowsWith<IOError>(
      [&] { get_mnist(options()); },
      {path("train-images-idx3-ubyte"), "promises 13153336560 bytes", "file holds only 2352"}));
  // The same lie in a gzip file: a few hundred compressed bytes cannot expand to 13 GB.
  fs::remove(dir_ / "train-images-idx3-ubyte");
  write("train-images-idx3-ubyte", img);
  ASSERT_EQ(std::system(("gzip -n " + path("train-images-idx3-ubyte")).c_str()), 0);
  EXPECT_TRUE(ThrowsWith<IOError>([&] { get_mnist(options()); },
                                  {path("train-images-idx3-ubyte.gz"), "promises 13153336560",
                                   "a gzip file of"}));
}

// A directory where an IDX file should be is named as a directory, not as a missing file.
TEST_F(IdxFilesTest, DirectoryInPlaceOfAFileIsNamed) {
  write_valid_set();
  fs::remove(dir_ / "train-labels-idx1-ubyte");
  fs::create_directories(dir_ / "train-labels-idx1-ubyte.gz");
  EXPECT_TRUE(ThrowsWith<IOError>(
      [&] { get_mnist(options()); },
      {path("train-labels-idx1-ubyte.gz") + " is a directory", "expected an IDX file"}));
}

TEST_F(IdxFilesTest, InconsistentContents) {
  write_valid_set();
  write("train-labels-idx1-ubyte", label_file({1, 2}));
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { get_mnist(options()); }, {"holds 3 images", "holds 2 labels"}));
  write("train-labels-idx1-ubyte", label_file({1, 10, 2}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { get_mnist(options()); }, {"label 10 at index 1"}));
  write_valid_set();
  write("t10k-images-idx3-ubyte", image_file(2, 27, 28));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { get_mnist(options()); },
                                  {path("t10k-images-idx3-ubyte"), "(27, 28)"}));
}

TEST_F(IdxFilesTest, RejectsBadOptions) {
  write_valid_set();
  MnistOptions o = options();
  o.ndim = 4;
  EXPECT_THROW(get_mnist(o), ValueError);
  o = options();
  o.dtype = int32;  // raw pixels need scale 255
  EXPECT_THROW(get_mnist(o), ValueError);
  o.scale = 255.0;
  EXPECT_EQ(get_mnist(o).first->column(0).dtype(), int32);
  o = options();
  o.dtype = bool_;
  EXPECT_THROW(get_mnist(o), DtypeError);
  o = options();
  o.scale = 0.0;
  EXPECT_THROW(get_mnist(o), ValueError);
}

}  // namespace
}  // namespace kusari
