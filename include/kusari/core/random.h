// Seedable random numbers: a counter-based generator (Philox4x32-10) that every backend can
// evaluate independently for any element, so CPU and GPU draw the same numbers for the same seed.
// The generator itself is written once for all backends (src/backends/common/philox.h).
#pragma once

#include <array>
#include <cstdint>

namespace kusari {

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
  uint64_t next_uint64();

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
