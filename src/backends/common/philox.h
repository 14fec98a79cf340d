// Philox4x32-10, the counter-based generator behind kusari::Generator, for the CPU and CUDA
// kernels alike (Note [Random streams], Note [Shared backend code]).
#pragma once

#include <cstdint>

#include "backends/common/host_device.h"

namespace kusari::common {

/// Four 32-bit random words.
struct Philox4 {
  uint32_t v[4];
};

/// One Philox4x32-10 block for the 64-bit `counter` (the upper 64 counter bits are 0) and the
/// key (key0, key1). The 32 x 32 -> 64 products are plain 64-bit multiplications on both
/// backends, so every block is bit-identical on the CPU and the GPU.
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE Philox4 philox4x32(uint64_t counter, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ key0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ key1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    key0 += kW0;
    key1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

/// Maps a 32-bit word to a float in [0, 1) with 24 random bits.
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE float unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

/// Maps two 32-bit words to a double in [0, 1) with 53 random bits.
KUSARI_HOST_DEVICE KUSARI_FORCE_INLINE double unit_double(uint32_t hi, uint32_t lo) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

}  // namespace kusari::common
