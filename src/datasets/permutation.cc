#include "kusari/datasets/permutation.h"

#include <numeric>
#include <utility>

#include "kusari/core/error.h"

namespace kusari {

uint64_t random_below(Generator& gen, uint64_t bound) {
  KUSARI_CHECK(bound >= 1, ValueError, "random_below: the bound must be at least 1, got ", bound);
  // Rejecting the lowest (2^64 mod bound) values leaves a range whose size is a multiple of bound.
  const uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const uint64_t r = gen.next_uint64();
    if (r >= threshold) return r % bound;
  }
}

std::vector<int64_t> random_permutation(int64_t n, Generator& gen) {
  KUSARI_CHECK(n >= 0, ValueError, "random_permutation: n must be non-negative, got ", n);
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), int64_t{0});
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(random_below(gen, static_cast<uint64_t>(i) + 1));
    std::swap(p[i], p[j]);
  }
  return p;
}

}  // namespace kusari
