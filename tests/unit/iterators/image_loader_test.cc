// ImageLoader: the same batches as a serial loop for any worker count, snapshots, errors.
#include <gtest/gtest.h>

#include <fstream>

#include "image_test_util.h"
#include "kusari/datasets/sub_dataset.h"
#include "kusari/datasets/tuple_dataset.h"
#include "kusari/iterators/image_loader.h"
#include "kusari/iterators/serial_iterator.h"
#include "map_serializer.h"
#include "test_util.h"

namespace kusari {
namespace {

using testing::MapSerializer;
using testing::TempDir;
using testing::test_picture;
using testing::ThrowsWith;
namespace T = transforms;

std::shared_ptr<LabeledImageDataset> make_files(const TempDir& dir, int n) {
  return testing::make_image_files(dir, n);
}

std::shared_ptr<T::Compose> small_train_transform() {
  return std::make_shared<T::Compose>(std::vector<std::shared_ptr<const T::Transform>>{
      std::make_shared<T::RandomResizedCrop>(8), std::make_shared<T::RandomHorizontalFlip>(),
      std::make_shared<T::Normalize>(T::kImageNetMean, T::kImageNetStd)});
}

// The batches a serial loop makes: SerialIterator's state machine for the order, and for each
// index the transform seeded by (seed, epoch, index), decoded through the same pipeline.
std::vector<std::vector<float>> serial_batches(const LabeledImageDataset& ds, const T::Compose& tf,
                                               uint64_t seed, uint64_t transform_seed,
                                               int64_t batch, int steps,
                                               std::vector<std::vector<int32_t>>* labels) {
  IteratorState s = initial_iterator_state(Generator(seed), true, ds.size());
  std::vector<std::vector<float>> out;
  for (int k = 0; k < steps; ++k) {
    const int64_t epoch = s.epoch, pos = s.current_position, n = ds.size();
    std::vector<int64_t> idx = *advance_iterator_state(s, batch, true, n, "test");
    std::vector<float> values;
    std::vector<int32_t> ls;
    for (size_t j = 0; j < idx.size(); ++j) {
      const int64_t e = static_cast<int64_t>(j) >= n - pos ? epoch + 1 : epoch;
      T::Rng rng(T::example_seed(transform_seed, e, idx[j]));
      const std::vector<uint8_t> bytes = read_file_bytes(ds.path(idx[j]));
      const Image img = tf.decode_and_apply(bytes.data(), bytes.size(), ds.path(idx[j]),
                                            ds.decode_options(), rng);
      values.insert(values.end(), img.values.begin(), img.values.end());
      ls.push_back(*ds.label(idx[j]));
    }
    out.push_back(std::move(values));
    labels->push_back(std::move(ls));
  }
  return out;
}

std::vector<float> as_floats(const Array& a) {
  const Array c = a.contiguous();
  const auto* p = static_cast<const float*>(c.raw_data());
  return std::vector<float>(p, p + c.size());
}

std::vector<int32_t> as_ints(const Array& a) {
  const Array c = a.contiguous();
  const auto* p = static_cast<const int32_t*>(c.raw_data());
  return std::vector<int32_t>(p, p + c.size());
}

TEST(ImageLoaderTest, SameBatchesAsASerialLoopForAnyWorkerCount) {
  TempDir dir;
  auto ds = make_files(dir, 13);
  auto tf = small_train_transform();
  constexpr int kSteps = 8;  // 40 examples: three epochs, with batches across the wraps
  for (int workers : {1, 2, 4}) {
    SCOPED_TRACE(::testing::Message() << workers << " workers");
    ImageLoaderOptions o;
    o.batch_size = 5;
    o.seed = 42;
    o.n_workers = workers;
    o.n_prefetch = 3;
    o.transform = tf;
    ImageLoader loader(ds, o);
    std::vector<std::vector<int32_t>> ref_labels;
    const auto ref = serial_batches(*ds, *tf, 42, loader.transform_seed(), 5, kSteps, &ref_labels);
    for (int k = 0; k < kSteps; ++k) {
      const std::vector<Array> b = loader.next_batch();
      ASSERT_EQ(b.size(), 2u);
      EXPECT_EQ(b[0].shape(), (Shape{5, 3, 8, 8}));
      EXPECT_EQ(b[0].dtype(), float32);
      ASSERT_EQ(as_floats(b[0]), ref[static_cast<size_t>(k)]) << "batch " << k;
      ASSERT_EQ(as_ints(b[1]), ref_labels[static_cast<size_t>(k)]) << "batch " << k;
    }
    EXPECT_EQ(loader.epoch(), 3);
  }
}

TEST(ImageLoaderTest, EpochBookkeepingAndExamplesMatchSerialIterator) {
  TempDir dir;
  auto ds = make_files(dir, 7);
  ImageLoaderOptions o;
  o.batch_size = 3;
  o.seed = 5;
  o.n_workers = 2;
  o.transform = small_train_transform();
  ImageLoader loader(ds, o);
  SerialIterator serial(ds, 3, true, true, 5);
  for (int k = 0; k < 6; ++k) {
    const std::vector<Example> got = loader.next();
    const std::vector<Example> want = serial.next();
    ASSERT_EQ(got.size(), want.size());
    for (size_t j = 0; j < got.size(); ++j) {
      ASSERT_EQ(got[j][1].item<int32_t>(), want[j][1].item<int32_t>());  // same indices
      EXPECT_EQ(got[j][0].shape(), (Shape{3, 8, 8}));
    }
    EXPECT_EQ(loader.epoch(), serial.epoch());
    EXPECT_DOUBLE_EQ(loader.epoch_detail(), serial.epoch_detail());
    EXPECT_DOUBLE_EQ(loader.previous_epoch_detail(), serial.previous_epoch_detail());
    EXPECT_EQ(loader.is_new_epoch(), serial.is_new_epoch());
  }
}

TEST(ImageLoaderTest, SnapshotResumesAtTheSamePosition) {
  TempDir dir;
  auto ds = make_files(dir, 11);
  ImageLoaderOptions o;
  o.batch_size = 4;
  o.seed = 8;
  o.n_workers = 2;
  o.transform = small_train_transform();
  ImageLoader first(ds, o);
  for (int k = 0; k < 4; ++k) first.next_batch();
  auto store = std::make_shared<MapSerializer::Store>();
  MapSerializer saver(store, false);
  first.serialize(saver);
  std::vector<std::vector<float>> expected;
  for (int k = 0; k < 5; ++k) expected.push_back(as_floats(first.next_batch()[0]));

  ImageLoaderOptions other = o;
  other.seed = 999;  // the snapshot's seeds win
  other.n_workers = 3;
  ImageLoader resumed(ds, other);
  resumed.next_batch();
  MapSerializer loader(store, true);
  resumed.serialize(loader);
  EXPECT_EQ(resumed.epoch(), 1);
  EXPECT_EQ(resumed.transform_seed(), first.transform_seed());
  for (int k = 0; k < 5; ++k)
    ASSERT_EQ(as_floats(resumed.next_batch()[0]), expected[static_cast<size_t>(k)]) << k;
}

TEST(ImageLoaderTest, NonRepeatingStopsWithAShortBatch) {
  TempDir dir;
  auto ds = make_files(dir, 7);
  ImageLoaderOptions o;
  o.batch_size = 3;
  o.repeat = false;
  o.shuffle = false;
  o.n_workers = 2;
  o.transform = small_train_transform();
  ImageLoader loader(ds, o);
  std::vector<int32_t> labels;
  for (int k = 0; k < 3; ++k) {
    const auto b = loader.next_batch();
    ASSERT_EQ(b.size(), 2u);
    for (int32_t t : as_ints(b[1])) labels.push_back(t);
  }
  EXPECT_EQ(labels, (std::vector<int32_t>{100, 101, 102, 103, 104, 105, 106}));
  EXPECT_TRUE(loader.next_batch().empty());
  EXPECT_TRUE(loader.next().empty());
}

TEST(ImageLoaderTest, ReadsFilesThroughSubDatasets) {
  TempDir dir;
  auto ds = make_files(dir, 9);
  auto order = std::vector<int64_t>{8, 7, 6, 5, 4, 3, 2, 1, 0};
  auto sub = std::make_shared<SubDataset>(ds, 2, 6, order);  // base examples 6, 5, 4, 3
  ImageLoaderOptions o;
  o.batch_size = 4;
  o.repeat = false;
  o.shuffle = false;
  o.transform = small_train_transform();
  ImageLoader loader(sub, o);
  const auto b = loader.next_batch();
  EXPECT_EQ(as_ints(b[1]), (std::vector<int32_t>{106, 105, 104, 103}));
}

TEST(ImageLoaderTest, ArrayDatasetsAndNoTransform) {
  // uint8 (N, H, W, C) images in memory, no transform: the batch is the images themselves.
  Array images =
      Array::arange(4 * 2 * 3 * 3, int64, Device::cpu()).astype(uint8).reshape({4, 2, 3, 3});
  Array labels = Array::arange(4, int64, Device::cpu());
  auto ds = std::make_shared<TupleDataset>(std::vector<Array>{images, labels});
  ImageLoaderOptions o;
  o.batch_size = 4;
  o.shuffle = false;
  o.n_workers = 3;
  ImageLoader loader(ds, o);
  const auto b = loader.next_batch();
  EXPECT_EQ(b[0].shape(), (Shape{4, 2, 3, 3}));
  EXPECT_TRUE(array_equal(b[0], images));
  EXPECT_EQ(as_ints(b[1]), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(ImageLoaderTest, ErrorsNameTheFile) {
  TempDir dir;
  auto ds = make_files(dir, 6);
  std::ofstream(dir.file("img3.jpg"), std::ios::binary | std::ios::trunc) << "broken";
  ImageLoaderOptions o;
  o.batch_size = 3;
  o.shuffle = false;
  o.n_workers = 2;
  o.transform = small_train_transform();
  ImageLoader loader(ds, o);
  EXPECT_NO_THROW(loader.next_batch());
  EXPECT_TRUE(ThrowsWith<IOError>([&] { loader.next_batch(); },
                                  {"ImageLoader: example 3", dir.file("img3.jpg")}));
  EXPECT_NO_THROW(loader.next_batch());  // the failed batch counts as consumed

  // Images of different sizes without a transform that makes them one size.
  ImageLoaderOptions plain;
  plain.batch_size = 3;
  plain.shuffle = false;
  plain.n_workers = 1;
  ImageLoader mixed(make_files(dir, 3), plain);
  EXPECT_TRUE(
      ThrowsWith<ShapeError>([&] { mixed.next_batch(); }, {"ImageLoader", "shape", "transform"}));

  ImageLoaderOptions big;
  big.batch_size = 10;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { ImageLoader(make_files(dir, 3), big); },
                                     {"batch_size 10", "3 examples"}));
}

TEST(ImageLoaderTest, AWorkerGoesOnAfterAJpegWithADamagedHeader) {
  TempDir dir;
  auto ds = make_files(dir, 9);
  std::vector<uint8_t> damaged = read_file_bytes(dir.file("img3.jpg"));
  for (size_t i = 2; i + 4 < damaged.size(); ++i) {  // 3-bit samples: libjpeg refuses the header
    if (damaged[i] == 0xFF && damaged[i + 1] == 0xC0) {
      damaged[i + 4] = 3;
      break;
    }
  }
  write_file_bytes(dir.file("img3.jpg"), damaged);
  ImageLoaderOptions o;
  o.batch_size = 3;
  o.shuffle = false;
  o.n_workers = 1;  // every file on the thread that met the damaged one
  o.transform = small_train_transform();
  ImageLoader loader(ds, o);
  EXPECT_NO_THROW(loader.next_batch());
  EXPECT_TRUE(ThrowsWith<IOError>([&] { loader.next_batch(); },
                                  {"ImageLoader: example 3", dir.file("img3.jpg"), "JPEG"}));
  std::vector<Array> last;
  EXPECT_NO_THROW(last = loader.next_batch());
  EXPECT_EQ(as_ints(last[1]), (std::vector<int32_t>{106, 107, 108}));
}

TEST(ImageLoaderTest, DtypeConvertsNormalisedBatchesAndLeavesUint8Alone) {
  TempDir dir;
  auto ds = make_files(dir, 8);
  ImageLoaderOptions o;
  o.batch_size = 4;
  o.seed = 3;
  o.n_workers = 2;
  o.transform = small_train_transform();
  ImageLoader f32(ds, o);
  o.dtype = bfloat16;
  ImageLoader bf16(ds, o);
  for (int k = 0; k < 3; ++k) {
    const Array a = f32.next_batch()[0], b = bf16.next_batch()[0];
    ASSERT_EQ(b.dtype(), bfloat16);
    EXPECT_TRUE(array_equal(b, a.astype(bfloat16))) << "batch " << k;
  }
  // uint8 batches (no Normalize) stay uint8.
  o.transform = std::make_shared<T::Compose>(
      std::vector<std::shared_ptr<const T::Transform>>{std::make_shared<T::RandomResizedCrop>(8)});
  ImageLoader bytes(ds, o);
  EXPECT_EQ(bytes.next_batch()[0].dtype(), uint8);
  o.dtype = int32;
  EXPECT_TRUE(ThrowsWith<DtypeError>([&] { ImageLoader(ds, o); },
                                     {"ImageLoader", "dtype must be float32, bfloat16 or float16"}));
}

TEST(ImageLoaderTest, OnTheCpuEachBatchIsAFreshArray) {
  TempDir dir;
  auto ds = make_files(dir, 8);
  ImageLoaderOptions o;
  o.batch_size = 4;
  o.seed = 3;
  o.n_workers = 2;
  o.transform = small_train_transform();
  ImageLoader loader(ds, o);
  const Array first = loader.next_batch()[0];
  const std::vector<float> kept = as_floats(first);
  for (int k = 0; k < 5; ++k) loader.next_batch();
  EXPECT_EQ(as_floats(first), kept);  // later batches did not write into it
  EXPECT_GE(loader.host_batch_allocations(), 6);
}

TEST(ImageLoaderTest, NormalizeOnDeviceNeedsAGpuAndATrailingNormalize) {
  TempDir dir;
  auto ds = make_files(dir, 4);
  ImageLoaderOptions o;
  o.batch_size = 2;
  o.transform = small_train_transform();
  o.normalize_on_device = true;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { ImageLoader(ds, o); },
                                     {"normalize_on_device", "GPU", "cpu"}));
  o.device = Device::cuda(0);
  o.transform = std::make_shared<T::Compose>(
      std::vector<std::shared_ptr<const T::Transform>>{std::make_shared<T::RandomResizedCrop>(8)});
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { ImageLoader(ds, o); },
                                     {"normalize_on_device", "last step is a Normalize",
                                      "RandomResizedCrop(8"}));
}

}  // namespace
}  // namespace kusari
