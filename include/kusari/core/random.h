// Seedable random numbers: a counter-based generator (Philox4x32-10) that every backend can
// evaluate independently for any element, so CPU and GPU draw the same numbers for the same seed.
#pragma once

#include <array>
#include <cstdint>

namespace kusari {

/// One Philox4x32-10 block: four 32-bit random words from a 128-bit counter and a 64-bit key.
inline std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    std::array<uint32_t, 4> next = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
                                    static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    ctr = next;
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

/// Maps a 32-bit word to a float in [0, 1) with 24 random bits.
inline float uint32_to_unit_float(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

/// Maps two 32-bit words to a double in [0, 1) with 53 random bits.
inline double uint32x2_to_unit_double(uint32_t hi, uint32_t lo) {
  uint64_t v = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(v & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/// A seed and a position in the stream. Each draw of n numbers advances the position, so two
/// generators with the same seed produce the same sequence of arrays on any device.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void set_offset(uint64_t offset) { offset_ = offset; }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }

  /// Reserves `n_blocks` Philox blocks and returns the first block's counter.
  uint64_t advance(uint64_t n_blocks) {
    uint64_t start = offset_;
    offset_ += n_blocks;
    return start;
  }

  /// A 64-bit random integer for host-side decisions (e.g. shuffling), from the same stream.
  uint64_t next_uint64() {
    uint64_t c = advance(1);
    auto r = philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}, key());
    return (static_cast<uint64_t>(r[0]) << 32) | r[1];
  }

  std::array<uint32_t, 2> key() const { return {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)}; }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

/// The process-wide default generator (seed 0 until manual_seed is called). Not thread-safe:
/// give each thread its own Generator when drawing from several threads.
Generator& default_generator();

/// Reseeds the default generator.
void manual_seed(uint64_t seed);

}  // namespace kusari
