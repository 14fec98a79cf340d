// The host memory statistics of CPU arrays (kusari/core/host_memory.h).
#include <gtest/gtest.h>

#include "kusari/core/array.h"
#include "kusari/core/host_memory.h"

namespace kusari {
namespace {

TEST(HostMemory, CountsArraysInUseTheirPeakAndTheCache) {
  cpu_empty_cache();
  const HostMemoryStats before = cpu_memory_stats();
  EXPECT_EQ(before.cached_bytes, 0u);
  reset_cpu_peak_memory_stats();
  constexpr size_t kBytes = size_t{4} << 20;  // a large block (cached when freed)
  {
    Array a = Array::zeros({static_cast<int64_t>(kBytes / 4)}, Dtype::kFloat32, Device::cpu());
    Array small = Array::zeros({1000}, Dtype::kFloat32, Device::cpu());  // (a small block, from malloc)
    const HostMemoryStats held = cpu_memory_stats();
    EXPECT_EQ(held.requested_bytes - before.requested_bytes, kBytes + 4000);
    EXPECT_GE(held.in_use_bytes - before.in_use_bytes, kBytes + 4000);
    EXPECT_EQ(held.peak_requested_bytes, held.requested_bytes);
  }
  const HostMemoryStats after = cpu_memory_stats();
  EXPECT_EQ(after.requested_bytes, before.requested_bytes);
  EXPECT_EQ(after.in_use_bytes, before.in_use_bytes);
  EXPECT_GE(after.peak_requested_bytes, before.requested_bytes + kBytes);
  EXPECT_GE(after.cached_bytes, kBytes);  // the large block is kept for reuse
  reset_cpu_peak_memory_stats();
  EXPECT_EQ(cpu_memory_stats().peak_requested_bytes, before.requested_bytes);
  cpu_empty_cache();
  EXPECT_EQ(cpu_memory_stats().cached_bytes, 0u);
}

}  // namespace
}  // namespace kusari
