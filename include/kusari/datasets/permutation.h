// Random permutations drawn from a kusari::Generator, shared by dataset splitting and iterator
// shuffling so that both are reproducible from a seed.
#pragma once

#include <cstdint>
#include <vector>

#include "kusari/core/random.h"

namespace kusari {

/// A uniform integer in [0, bound) from `gen` (bound >= 1), without modulo bias.
uint64_t random_below(Generator& gen, uint64_t bound);

/// A uniformly random permutation of 0, 1, ..., n - 1 (Fisher-Yates), advancing `gen`.
std::vector<int64_t> random_permutation(int64_t n, Generator& gen);

}  // namespace kusari
