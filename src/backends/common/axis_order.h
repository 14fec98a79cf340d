// The axis order of a strided loop: outermost first, by the output's strides.
//
// Note [Axis order of strided loops]
// A loop over views of one shape walks its axes in C order by default. When the output is not
// C-ordered (a channels-last output, Note [Memory formats] in src/core/array.cc), walking in C
// order would make every operand a gather; instead the axes are sorted so that the output's
// strides decrease, as PyTorch's TensorIterator does (reorder_dimensions): axis a goes inside
// axis b when the first operand, in operand order, with non-zero strides on both says so
// (stride[a] < stride[b]); a tie or all-zero strides keep the C order. The sort is a stable
// insertion sort over at most kMaxNdim axes. It is skipped when the output's strides already
// decrease (every contiguous output), so the contiguous path pays one pass over the strides.
// The merging of neighbouring axes then sees an NHWC elementwise op as one flat row.
#pragma once

#include <array>
#include <cstdint>

#include "kusari/core/shape.h"

namespace kusari::common {

/// Permutes sizes[0, nd) and strides[k][0, nd) in place into the loop order of
/// Note [Axis order of strided loops]; operand 0 is the output. Axes of length 1 must already be
/// dropped. `Strides` is indexable as strides[k][d].
template <int N, typename StridesT>
inline void order_axes_by_output(int nd, int64_t* sizes, StridesT& strides) {
  if (nd < 2) return;
  bool ordered = true;
  for (int d = 0; d + 1 < nd; ++d) {
    if (strides[0][d] < strides[0][d + 1]) {
      ordered = false;
      break;
    }
  }
  if (ordered) return;
  // should_swap(a, b): axis a (now outer) belongs inside axis b (now inner).
  auto inner_first = [&](int a, int b) {
    for (int k = 0; k < N; ++k) {
      const int64_t sa = strides[k][a], sb = strides[k][b];
      if (sa == 0 || sb == 0) continue;
      if (sa != sb) return sa < sb;
    }
    return false;
  };
  auto swap_axes = [&](int a, int b) {
    const int64_t t = sizes[a];
    sizes[a] = sizes[b];
    sizes[b] = t;
    for (int k = 0; k < N; ++k) {
      const int64_t s = strides[k][a];
      strides[k][a] = strides[k][b];
      strides[k][b] = s;
    }
  };
  for (int i = 1; i < nd; ++i) {
    for (int j = i; j > 0 && inner_first(j - 1, j); --j) swap_axes(j - 1, j);
  }
}

}  // namespace kusari::common
