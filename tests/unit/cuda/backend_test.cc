// The CUDA backend itself: device detection and errors, the caching memory pool, transfers in
// both directions and between devices.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "kusari/core/cuda.h"

namespace kusari {
namespace {

using testing::CudaTest;
using testing::GpuMatchesCpu;

// Runs on every machine: without a GPU, using one is a DeviceError that says why; with GPUs, a
// device past the last one is a DeviceError that says how many there are.
TEST(CudaBackend, MissingDeviceIsADeviceError) {
  const int count = cuda_device_count();
  ASSERT_GE(count, 0);
  const Device missing = Device::cuda(count);
  try {
    Array::zeros({4}, float32, missing);
    FAIL() << "expected DeviceError for " << missing;
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(missing.str()), std::string::npos) << msg;
    if (count == 0) {
      EXPECT_NE(msg.find("no CUDA device"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(count)), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(cuda::memory_stats(count), DeviceError);
  EXPECT_NO_THROW(cuda::empty_cache());
}

TEST(CudaBackend, Tf32SwitchesRoundTrip) {
  const testing::Tf32Scope restore(cuda::allow_tf32_convolution(), cuda::allow_tf32_matmul());
  cuda::set_allow_tf32(true);
  EXPECT_TRUE(cuda::allow_tf32_convolution());
  EXPECT_TRUE(cuda::allow_tf32_matmul());
  cuda::set_allow_tf32_matmul(false);
  EXPECT_TRUE(cuda::allow_tf32_convolution());
  EXPECT_FALSE(cuda::allow_tf32_matmul());
  cuda::set_allow_tf32_convolution(false);
  EXPECT_FALSE(cuda::allow_tf32_convolution());
  cuda::set_allow_tf32(true);
  EXPECT_TRUE(cuda::allow_tf32_matmul());
}

class CudaMemoryPool : public CudaTest {};

TEST_F(CudaMemoryPool, FreedBlockIsReusedWithoutADriverCall) {
  void* first = nullptr;
  {
    Array a = Array::empty({1000}, float32, gpu());
    first = a.raw_data();
  }
  const cuda::MemoryStats before = cuda::memory_stats(0);
  Array b = Array::empty({1000}, float32, gpu());
  EXPECT_EQ(b.raw_data(), first);
  // 3900 bytes fall into the same 512-byte class as 4000 bytes.
  b = Array();
  Array c = Array::empty({3900}, uint8, gpu());
  EXPECT_EQ(c.raw_data(), first);
  const cuda::MemoryStats after = cuda::memory_stats(0);
  EXPECT_EQ(after.device_allocations, before.device_allocations);
}

TEST_F(CudaMemoryPool, StatisticsFollowAllocations) {
  cuda::empty_cache();
  const cuda::MemoryStats base = cuda::memory_stats(0);
  constexpr int64_t kBytes = int64_t{64} << 20;
  {
    Array big = Array::empty({kBytes}, uint8, gpu());
    const cuda::MemoryStats s = cuda::memory_stats(0);
    EXPECT_GE(s.in_use_bytes, base.in_use_bytes + static_cast<size_t>(kBytes));
    EXPECT_GE(s.reserved_bytes, s.in_use_bytes);
    EXPECT_GE(s.peak_in_use_bytes, s.in_use_bytes);
    EXPECT_EQ(s.requested_bytes, base.requested_bytes + static_cast<size_t>(kBytes));
    EXPECT_GE(s.peak_requested_bytes, s.requested_bytes);
    EXPECT_EQ(s.device_allocations, base.device_allocations + 1);
  }
  const cuda::MemoryStats released = cuda::memory_stats(0);
  EXPECT_EQ(released.in_use_bytes, base.in_use_bytes);
  EXPECT_EQ(released.requested_bytes, base.requested_bytes);
  EXPECT_GE(released.reserved_bytes, base.reserved_bytes + static_cast<size_t>(kBytes));
  cuda::empty_cache();
  const cuda::MemoryStats emptied = cuda::memory_stats(0);
  EXPECT_EQ(emptied.reserved_bytes, emptied.in_use_bytes);
  EXPECT_GT(emptied.device_frees, released.device_frees);
}

TEST_F(CudaMemoryPool, ResettingThePeaksForgetsEarlierAllocations) {
  constexpr int64_t kBytes = int64_t{96} << 20;
  { Array big = Array::empty({kBytes}, uint8, gpu()); }
  const cuda::MemoryStats before = cuda::memory_stats(0);
  EXPECT_GE(before.peak_requested_bytes, before.requested_bytes + static_cast<size_t>(kBytes));
  cuda::reset_peak_memory_stats(0);
  const cuda::MemoryStats reset = cuda::memory_stats(0);
  EXPECT_EQ(reset.peak_requested_bytes, reset.requested_bytes);
  EXPECT_EQ(reset.peak_in_use_bytes, reset.in_use_bytes);
  Array small = Array::empty({int64_t{1} << 20}, uint8, gpu());
  const cuda::MemoryStats after = cuda::memory_stats(0);
  EXPECT_EQ(after.peak_requested_bytes, reset.requested_bytes + (size_t{1} << 20));
  EXPECT_THROW(cuda::reset_peak_memory_stats(99), DeviceError);
}

TEST_F(CudaMemoryPool, SlightlyDifferentLargeSizesShareBlocks) {
  void* first = nullptr;
  {
    Array a = Array::empty({int64_t{10} << 20}, uint8, gpu());
    first = a.raw_data();
  }
  // A 9 MiB request may take the cached 10 MiB block (at most 1/4 larger).
  Array b = Array::empty({(int64_t{9} << 20) - 1000}, uint8, gpu());
  EXPECT_EQ(b.raw_data(), first);
}

TEST_F(CudaMemoryPool, OutOfMemoryIsADeviceErrorAndThePoolStillWorks) {
  try {
    Array::empty({int64_t{1} << 50}, uint8, gpu());
    FAIL() << "expected an out-of-memory DeviceError";
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  }
  Array ok = Array::ones({16}, float32, gpu());
  EXPECT_EQ(sum(ok).item<float>(), 16.0f);
}

TEST_F(CudaMemoryPool, ThreadsAllocateAndReleaseConcurrently) {
  const size_t base = cuda::memory_stats(0).in_use_bytes;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        Array a = Array::empty({(t + 1) * 1000 + i}, float32, Device::cuda(0));
        Array b = Array::empty({(i % 7 + 1) << 18}, uint8, Device::cuda(0));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(cuda::memory_stats(0).in_use_bytes, base);
}

class CudaTransfer : public CudaTest {};

TEST_F(CudaTransfer, RoundTripsOfEverySize) {
  // Small (direct copy), and above the staging threshold with a partial last chunk.
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3} << 20, (int64_t{5} << 20) + 3}) {
    const Array host = testing::random_array({n}, float32, -1, 1, static_cast<uint64_t>(n));
    const Array dev = host.to_device(gpu());
    EXPECT_EQ(dev.device(), gpu());
    const Array back = dev.to_device(Device::cpu());
    EXPECT_EQ(testing::bytes_of(back), testing::bytes_of(host)) << "n = " << n;
  }
}

TEST_F(CudaTransfer, NonContiguousArraysBothWays) {
  const Array host = Array::arange(0.0, 120.0, 1.0, float32, Device::cpu()).reshape({2, 3, 4, 5});
  const Array view = host.transpose({3, 1, 0, 2}).at({Slice(std::nullopt, std::nullopt, 2)});
  // Host view -> GPU.
  const Array dev = view.to_device(gpu());
  EXPECT_TRUE(GpuMatchesCpu(dev, view.copy()));
  // GPU view -> host.
  const Array dev_full = host.to_device(gpu());
  const Array dev_view =
      dev_full.transpose({3, 1, 0, 2}).at({Slice(std::nullopt, std::nullopt, 2)});
  EXPECT_EQ(dev_view.to_vector<float>(), view.to_vector<float>());
  EXPECT_EQ(dev_view.to_device(Device::cpu()).to_vector<float>(), view.to_vector<float>());
}

TEST_F(CudaTransfer, AssignIntoAStridedView) {
  Array cpu = Array::zeros({6, 8}, float64, Device::cpu());
  Array dev = Array::zeros({6, 8}, float64, gpu());
  const Array src = testing::random_array({3, 4}, float64, -1, 1, 7);
  cpu.at({Slice(1, 6, 2), Slice(0, 8, 2)}).assign(src);
  dev.at({Slice(1, 6, 2), Slice(0, 8, 2)}).assign(src.to_device(gpu()));
  EXPECT_TRUE(GpuMatchesCpu(dev, cpu));
}

TEST_F(CudaTransfer, BetweenDevices) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  const Array host = testing::random_array({1 << 20}, float32, -1, 1, 3);
  const Array a = host.to_device(Device::cuda(0));
  const Array b = a.to_device(Device::cuda(1));
  EXPECT_EQ(b.device(), Device::cuda(1));
  EXPECT_EQ(testing::bytes_of(b), testing::bytes_of(host));
  const Array c = (b * 2.0).to_device(Device::cuda(0));
  EXPECT_TRUE(GpuMatchesCpu(c, host * 2.0));
}

TEST_F(CudaTransfer, SynchronizeWaitsForQueuedWork) {
  Array x = Array::ones({1 << 22}, float32, gpu());
  for (int i = 0; i < 10; ++i) x = x * 1.5;
  EXPECT_NO_THROW(gpu().synchronize());
  EXPECT_NEAR(x.to_vector<float>()[123], std::pow(1.5, 10), 1e-2);
}

}  // namespace
}  // namespace kusari
