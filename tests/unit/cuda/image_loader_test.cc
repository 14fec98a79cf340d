// The input pipeline on a GPU: pinned host memory, the upload stream and its events, the
// normalisation kernel, and ImageLoader with a CUDA device, whose batches must equal the CPU
// loader's bit for bit (Note [ImageLoader on a GPU]).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "image_test_util.h"
#include "kusari/core/cuda.h"
#include "kusari/datasets/convert.h"
#include "kusari/datasets/sub_dataset.h"
#include "kusari/datasets/transforms.h"
#include "kusari/iterators/image_loader.h"
#include "kusari/links/classifier.h"
#include "kusari/links/linear.h"
#include "kusari/optimizers/sgd.h"
#include "kusari/training/extensions/evaluator.h"
#include "kusari/training/updater.h"
#include "map_serializer.h"

namespace kusari {
namespace {

using testing::bytes_of;
using testing::CudaTest;
using testing::MapSerializer;
using testing::TempDir;
namespace T = transforms;

class CudaImageLoader : public CudaTest {};

using Steps = std::vector<std::shared_ptr<const T::Transform>>;

std::shared_ptr<T::Compose> crop_flip(Steps tail = {}) {
  Steps steps{std::make_shared<T::RandomResizedCrop>(8), std::make_shared<T::RandomHorizontalFlip>()};
  steps.insert(steps.end(), tail.begin(), tail.end());
  return std::make_shared<T::Compose>(std::move(steps));
}

std::shared_ptr<T::Compose> crop_flip_normalize(bool planar) {
  return crop_flip({std::make_shared<T::Normalize>(T::kImageNetMean, T::kImageNetStd, planar)});
}

TEST_F(CudaImageLoader, PinnedMemoryIsPageLockedAndCounted) {
  const cuda::PinnedMemoryStats before = cuda::pinned_memory_stats();
  {
    Array a = cuda::pinned_empty({3, 5}, float32, gpu());
    EXPECT_TRUE(a.device().is_cpu());
    EXPECT_TRUE(cuda::is_pinned(a));
    EXPECT_TRUE(cuda::is_pinned(a.at({1})));  // a view inside it
    EXPECT_FALSE(cuda::is_pinned(Array::zeros({3, 5}, float32, Device::cpu())));
    a.fill(2.5f);
    EXPECT_EQ(a.to_vector<float>(), std::vector<float>(15, 2.5f));
    const cuda::PinnedMemoryStats during = cuda::pinned_memory_stats();
    EXPECT_EQ(during.allocations, before.allocations + 1);
    EXPECT_EQ(during.in_use_bytes, before.in_use_bytes + 60);
  }
  const cuda::PinnedMemoryStats after = cuda::pinned_memory_stats();
  EXPECT_EQ(after.frees, before.frees + 1);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
}

TEST_F(CudaImageLoader, UploadStreamCopiesAndTheComputeStreamWaitsForIt) {
  cuda::UploadStream upload(gpu());
  Array host = cuda::pinned_empty({1 << 20}, float32, gpu());
  Array device = Array::empty({1 << 20}, float32, gpu());
  for (int round = 0; round < 3; ++round) {
    static_cast<float*>(host.raw_data())[0] = static_cast<float>(round);
    host.at({Slice(1, std::nullopt)}).fill(static_cast<float>(round) + 0.5f);
    cuda::Event consumed, copied;
    consumed.record_compute(gpu());
    upload.wait(consumed);
    upload.copy(host, device);
    upload.record(copied);
    copied.block_compute();
    const Array total = sum(device.astype(float64));  // on the compute stream, after the copy
    EXPECT_DOUBLE_EQ(total.item<double>(), round + (round + 0.5) * ((1 << 20) - 1));
    copied.synchronize();
    EXPECT_TRUE(copied.done());
  }
  cuda::Event never;
  EXPECT_TRUE(never.done());
  EXPECT_FALSE(never.recorded());
  EXPECT_THROW(upload.copy(host, Array::empty({4}, float32, gpu())), ShapeError);
  EXPECT_THROW(upload.copy(device, device), DeviceError);
}

TEST_F(CudaImageLoader, NormalizeKernelEqualsTheCpuBitForBit) {
  Generator gen(5);
  const Array images = Array::uniform({3, 7, 9, 3}, 0, 256, float32, Device::cpu(), &gen).astype(uint8);
  for (bool planar : {true, false}) {
    const T::Normalize n(T::kImageNetMean, T::kImageNetStd, planar);
    for (Dtype d : {float32, bfloat16, float16}) {
      SCOPED_TRACE(::testing::Message() << (planar ? "NCHW " : "NHWC ") << dtype_name(d));
      const Array cpu = n.apply_batch(images, d);
      const Array gpu_out = n.apply_batch(images.to_device(gpu()), d);
      ASSERT_EQ(gpu_out.device(), gpu());
      ASSERT_EQ(gpu_out.shape(), cpu.shape());
      EXPECT_EQ(bytes_of(gpu_out), bytes_of(cpu));
    }
  }
}

// The loader options of a GPU case and its CPU twin.
struct LoaderCase {
  std::string name;
  std::shared_ptr<T::Compose> transform;
  bool normalize_on_device;
  Dtype dtype;
};

std::vector<LoaderCase> loader_cases() {
  std::vector<LoaderCase> cases;
  cases.push_back({"uint8 (no Normalize)", crop_flip(), false, float32});
  for (Dtype d : {float32, bfloat16}) {
    const std::string dt = dtype_name(d);
    cases.push_back({"Normalize on the CPU, NCHW, " + dt, crop_flip_normalize(true), false, d});
    cases.push_back({"Normalize on the GPU, NCHW, " + dt, crop_flip_normalize(true), true, d});
    cases.push_back({"Normalize on the GPU, channels-last, " + dt, crop_flip_normalize(false), true, d});
  }
  return cases;
}

ImageLoaderOptions options_of(const LoaderCase& c, Device device, int workers) {
  ImageLoaderOptions o;
  o.batch_size = 5;
  o.seed = 42;
  o.n_workers = workers;
  o.n_prefetch = 3;
  o.transform = c.transform;
  o.dtype = c.dtype;
  o.device = device;
  o.normalize_on_device = device.is_cuda() && c.normalize_on_device;
  return o;
}

TEST_F(CudaImageLoader, BatchesEqualTheCpuLoadersBitForBit) {
  TempDir dir;
  auto ds = testing::make_image_files(dir, 13);
  constexpr int kSteps = 8;  // three epochs, with batches across the wraps
  for (const LoaderCase& c : loader_cases()) {
    for (int workers : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << c.name << ", " << workers << " workers");
      ImageLoader cpu(ds, options_of(c, Device::cpu(), workers));
      ImageLoader gpu_loader(ds, options_of(c, gpu(), workers));
      for (int k = 0; k < kSteps; ++k) {
        const std::vector<Array> want = cpu.next_batch();
        const std::vector<Array> got = gpu_loader.next_batch();
        ASSERT_EQ(got.size(), 2u);
        ASSERT_EQ(got[0].device(), gpu());
        ASSERT_EQ(got[0].dtype(), want[0].dtype()) << "batch " << k;
        ASSERT_EQ(got[0].shape(), want[0].shape()) << "batch " << k;
        ASSERT_EQ(bytes_of(got[0]), bytes_of(want[0])) << "batch " << k;
        ASSERT_EQ(bytes_of(got[1]), bytes_of(want[1])) << "batch " << k;
        EXPECT_EQ(gpu_loader.epoch(), cpu.epoch());
        EXPECT_EQ(gpu_loader.is_new_epoch(), cpu.is_new_epoch());
      }
    }
  }
}

TEST_F(CudaImageLoader, ChannelsLastBatchesViewAsNchwWithoutACopy) {
  TempDir dir;
  auto ds = testing::make_image_files(dir, 6);
  const LoaderCase c{"channels-last", crop_flip_normalize(false), true, bfloat16};
  ImageLoader loader(ds, options_of(c, gpu(), 2));
  const Array hwc = loader.next_batch()[0];
  EXPECT_EQ(hwc.shape(), (Shape{5, 8, 8, 3}));
  const Array nchw = hwc.transpose({0, 3, 1, 2});
  EXPECT_EQ(nchw.memory_format(), MemoryFormat::kChannelsLast);
  EXPECT_TRUE(nchw.shares_memory_with(hwc));
}

TEST_F(CudaImageLoader, RingSlotsAreReusedAndNothingIsAllocatedPerBatch) {
  TempDir dir;
  auto ds = testing::make_image_files(dir, 11);
  const LoaderCase c{"GPU normalisation", crop_flip_normalize(true), true, float32};
  ImageLoaderOptions o = options_of(c, gpu(), 2);
  o.n_prefetch = 2;
  const int64_t before = cuda::pinned_memory_stats().allocations;
  ImageLoader loader(ds, o);
  for (int k = 0; k < 12; ++k) loader.next_batch();
  // One images buffer and one labels buffer per slot, n_prefetch + 2 slots.
  EXPECT_EQ(loader.host_batch_allocations(), 4);
  const int64_t after_warm_up = cuda::pinned_memory_stats().allocations;
  EXPECT_EQ(after_warm_up - before, 8);
  for (int k = 0; k < 30; ++k) loader.next_batch();
  EXPECT_EQ(loader.host_batch_allocations(), 4);
  EXPECT_EQ(cuda::pinned_memory_stats().allocations, after_warm_up);
  // A reset drops the planned batches; the slots stay.
  loader.reset();
  for (int k = 0; k < 5; ++k) loader.next_batch();
  EXPECT_EQ(cuda::pinned_memory_stats().allocations, after_warm_up);
}

TEST_F(CudaImageLoader, ResumesFromASnapshotAtTheSamePosition) {
  TempDir dir;
  auto ds = testing::make_image_files(dir, 11);
  const LoaderCase c{"GPU normalisation", crop_flip_normalize(true), true, bfloat16};
  ImageLoader first(ds, options_of(c, gpu(), 2));
  for (int k = 0; k < 4; ++k) first.next_batch();
  auto store = std::make_shared<MapSerializer::Store>();
  MapSerializer saver(store, false);
  first.serialize(saver);
  std::vector<std::vector<uint8_t>> expected;
  for (int k = 0; k < 5; ++k) expected.push_back(bytes_of(first.next_batch()[0]));

  ImageLoaderOptions other = options_of(c, gpu(), 3);
  other.seed = 999;  // the snapshot's seeds win
  ImageLoader resumed(ds, other);
  resumed.next_batch();  // batches planned and uploaded before the load are dropped
  MapSerializer loader(store, true);
  resumed.serialize(loader);
  for (int k = 0; k < 5; ++k) {
    ASSERT_EQ(bytes_of(resumed.next_batch()[0]), expected[static_cast<size_t>(k)]) << k;
  }
}

TEST_F(CudaImageLoader, NextYieldsExamplesOnTheGpuAndShardsWork) {
  TempDir dir;
  auto ds = testing::make_image_files(dir, 9);
  // A shard as scatter_dataset makes it: a SubDataset of the files.
  auto shard = std::make_shared<SubDataset>(ds, 2, 8, std::vector<int64_t>{8, 7, 6, 5, 4, 3, 2, 1, 0});
  const LoaderCase c{"GPU normalisation", crop_flip_normalize(true), true, float32};
  ImageLoaderOptions o = options_of(c, gpu(), 2);
  o.batch_size = 3;
  ImageLoader examples(shard, o);
  ImageLoaderOptions cpu_o = options_of(c, Device::cpu(), 2);
  cpu_o.batch_size = 3;
  ImageLoader cpu(shard, cpu_o);
  for (int k = 0; k < 4; ++k) {
    const std::vector<Example> batch = examples.next();
    ASSERT_EQ(batch.size(), 3u);
    ASSERT_EQ(batch[0][0].device(), gpu());
    const std::vector<Array> stacked = concat_examples(batch, gpu());
    const std::vector<Array> want = cpu.next_batch();
    ASSERT_EQ(bytes_of(stacked[0]), bytes_of(want[0])) << k;
    ASSERT_EQ(bytes_of(stacked[1]), bytes_of(want[1])) << k;
  }
}

TEST_F(CudaImageLoader, ANonRepeatingLoaderEndsWithAShortBatch) {
  TempDir dir;
  auto ds = testing::make_image_files(dir, 7);
  const LoaderCase c{"GPU normalisation", crop_flip_normalize(false), true, float32};
  ImageLoaderOptions o = options_of(c, gpu(), 2);
  o.batch_size = 3;
  o.repeat = false;
  o.shuffle = false;
  ImageLoader loader(ds, o);
  ImageLoaderOptions cpu_o = options_of(c, Device::cpu(), 2);
  cpu_o.batch_size = 3;
  cpu_o.repeat = false;
  cpu_o.shuffle = false;
  ImageLoader cpu(ds, cpu_o);
  for (int64_t rows : {3, 3, 1}) {
    const std::vector<Array> got = loader.next_batch(), want = cpu.next_batch();
    ASSERT_EQ(got[0].dim(0), rows);
    ASSERT_EQ(bytes_of(got[0]), bytes_of(want[0]));
    ASSERT_EQ(bytes_of(got[1]), bytes_of(want[1]));
  }
  EXPECT_TRUE(loader.next_batch().empty());
}

// The Trainer's pieces take the GPU loader as an Iterator: a StandardUpdater fed by it trains the
// same parameters, and an Evaluator over it reports the same means, as with the CPU loader whose
// batches the converter copies to the GPU.
TEST_F(CudaImageLoader, FeedsTheUpdaterAndTheEvaluatorLikeTheCpuLoader) {
  TempDir dir;
  auto ds = testing::make_image_files(dir, 12);
  const LoaderCase c{"GPU normalisation", crop_flip_normalize(true), true, float32};
  auto run = [&](Device loader_device) {
    manual_seed(7);
    auto model = std::make_shared<links::Classifier>(std::make_shared<links::Linear>(3 * 8 * 8, 112));
    model->to_device(gpu());
    auto opt = std::make_shared<optimizers::SGD>(0.1);
    opt->setup(model);
    ImageLoaderOptions o = options_of(c, loader_device, 2);
    o.batch_size = 4;
    training::StandardUpdater updater(std::make_shared<ImageLoader>(ds, o), opt, gpu());
    for (int k = 0; k < 5; ++k) updater.update();
    ImageLoaderOptions v = o;
    v.repeat = false;
    v.shuffle = false;
    training::extensions::Evaluator evaluator(std::make_shared<ImageLoader>(ds, v), model, nullptr,
                                              gpu());
    std::vector<std::vector<uint8_t>> params;
    for (const auto& [name, p] : model->namedparams()) params.push_back(bytes_of(p.data()));
    return std::make_pair(params, evaluator.evaluate());
  };
  const auto [gpu_params, gpu_means] = run(gpu());
  const auto [cpu_params, cpu_means] = run(Device::cpu());
  EXPECT_EQ(gpu_params, cpu_params);
  ASSERT_EQ(gpu_means.size(), cpu_means.size());
  for (const auto& [key, value] : cpu_means) EXPECT_EQ(gpu_means.at(key), value) << key;
}

}  // namespace
}  // namespace kusari
