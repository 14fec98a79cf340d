#include "kusari/core/random.h"

namespace kusari {

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace kusari
