#include "kusari/core/random.h"

#include "backends/common/philox.h"

namespace kusari {

uint64_t Generator::next_uint64() {
  const uint64_t c = advance(1);
  const auto k = key();
  const common::Philox4 r = common::philox4x32(c, k[0], k[1]);
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kusari
