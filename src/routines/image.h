// The routine of the image kernels (src/kernels/image.h), used by transforms::Normalize and the
// ImageLoader: checks once, runs the kernel, or composes generic routines where it declines.
#pragma once

#include "kusari/core/array.h"

namespace kusari::routines {

/// A batch of uint8 images (B, H, W, C) normalised through a per-channel table (float32 (C, 256),
/// on the images' device): out[b, c, y, x] (planar) or out[b, y, x, c] = table[c, value], in
/// `dtype` (floating; rounded from the float32 table values). The same values on every device.
Array normalize_image_batch(const Array& images, const Array& table, Dtype dtype, bool planar);

}  // namespace kusari::routines
