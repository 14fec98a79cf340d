// Argument checks shared by Convolution2D and Deconvolution2D.
#pragma once

#include <cstdint>
#include <optional>

#include "kusari/core/error.h"
#include "kusari/functions/int_pair.h"

namespace kusari::links::detail {

/// Throws ValueError naming `link` unless the sizes are valid for a 2-d (de)convolution layer.
inline void check_conv_args(const char* link, std::optional<int64_t> in_channels,
                            int64_t out_channels, functions::IntPair ksize,
                            functions::IntPair stride, functions::IntPair pad,
                            functions::IntPair dilate, int64_t groups) {
  KUSARI_CHECK(out_channels > 0, ValueError, link, ": out_channels must be positive, got ",
               out_channels);
  KUSARI_CHECK(!in_channels || *in_channels > 0, ValueError, link,
               ": in_channels must be positive, got ", in_channels.value_or(0));
  KUSARI_CHECK(ksize.h > 0 && ksize.w > 0, ValueError, link, ": ksize must be positive, got ",
               ksize);
  KUSARI_CHECK(stride.h > 0 && stride.w > 0, ValueError, link, ": stride must be positive, got ",
               stride);
  KUSARI_CHECK(pad.h >= 0 && pad.w >= 0, ValueError, link, ": pad must be non-negative, got ", pad);
  KUSARI_CHECK(dilate.h > 0 && dilate.w > 0, ValueError, link, ": dilate must be positive, got ",
               dilate);
  KUSARI_CHECK(groups > 0, ValueError, link, ": groups must be positive, got ", groups);
  KUSARI_CHECK(out_channels % groups == 0, ValueError, link, ": out_channels (", out_channels,
               ") must be a multiple of groups (", groups, ")");
}

/// Throws unless `in_channels` (given or inferred) is positive and a multiple of groups.
inline void check_in_channels(const char* link, int64_t in_channels, int64_t groups) {
  KUSARI_CHECK(in_channels > 0, ValueError, link, ": in_channels must be positive, got ",
               in_channels);
  KUSARI_CHECK(in_channels % groups == 0, ValueError, link, ": in_channels (", in_channels,
               ") must be a multiple of groups (", groups, ")");
}

/// Throws ShapeError naming `link` unless x is 4-d (N, C, H, W).
template <typename V>
void check_nchw(const char* link, const V& x) {
  KUSARI_CHECK(x.ndim() == 4, ShapeError, link,
               ": expected an input of 4 axes (N, C, H, W), got shape ", x.shape());
}

}  // namespace kusari::links::detail
