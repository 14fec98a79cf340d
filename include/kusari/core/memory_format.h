// MemoryFormat: how the elements of a 4-d (N, C, H, W) array are laid out in memory.
#pragma once

#include "kusari/core/shape.h"

namespace kusari {

/// The memory layout of an array. The shape is always NCHW for images; only the strides differ.
/// See Note [Memory formats] in src/core/array.cc.
enum class MemoryFormat {
  /// C order (row-major): for (N, C, H, W), NCHW memory.
  kContiguous,
  /// Channels last: a 4-d (N, C, H, W) array stored as NHWC memory (strides (HWC, 1, WC, C)).
  kChannelsLast,
};

/// "contiguous" or "channels_last".
const char* memory_format_name(MemoryFormat format);

/// The strides of a dense array of `shape` in `format` (kChannelsLast needs a 4-d shape).
Strides memory_format_strides(const Shape& shape, MemoryFormat format);

}  // namespace kusari
