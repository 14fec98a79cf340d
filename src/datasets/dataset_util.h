// Helpers the dataset implementations share (not installed).
#pragma once

#include <cstdint>

#include "kusari/core/error.h"

namespace kusari::detail {

/// Example i of a dataset of n images after checking 0 <= i < n (negative i counts from the end);
/// `fn` names the caller in the IndexError.
inline int64_t checked_image_index(int64_t i, int64_t n, const char* fn) {
  const int64_t j = i < 0 ? i + n : i;
  KUSARI_CHECK(j >= 0 && j < n, IndexError, fn, ": index ", i, " is out of range for a dataset of ",
               n, " images");
  return j;
}

/// SplitMix64's finaliser: a well-mixed 64-bit value of x, to seed one generator per example
/// from (seed, index) so that example i's random numbers do not depend on the others.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace kusari::detail
