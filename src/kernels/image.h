// Kernels: the input pipeline's last step on the device (uint8 images to normalised floats).
// See Note [Kernel families].
#pragma once

#include "kernels/kernel.h"
#include "kusari/core/array.h"

namespace kusari::kernels {

/// out = table[c, images[b, y, x, c]] for a batch of uint8 images (B, H, W, C), written as
/// (B, C, H, W) when `planar`, else (B, H, W, C); the table is float32 (C, 256) and out's dtype
/// floating (its values the table's, rounded to nearest even). All operands contiguous, on one
/// device, out allocated. May decline (a dtype, too many channels); the routine then composes
/// take and astype (routines::normalize_image_batch).
inline constinit Kernel<bool(const Array& images, const Array& table, bool planar, Array& out)>
    normalize_image_batch{"normalize_image_batch"};

}  // namespace kusari::kernels
