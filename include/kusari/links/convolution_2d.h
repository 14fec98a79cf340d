// 2-d convolution layer (Chainer's L.Convolution2D).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kusari/functions/int_pair.h"
#include "kusari/links/initializers.h"
#include "kusari/links/link.h"

namespace kusari::links {

/// functions::convolution_2d with parameters W (out_channels, in_channels / groups, kh, kw) and
/// b (out_channels,). The number of input channels may be left unknown (std::nullopt): W is then
/// sized at the first forward from the input's axis 1, as in Chainer's `in_channels=None`.
///
///   links::Convolution2D conv(3, 64, 3, 1, 1);           // 3 -> 64 channels, 3x3, pad 1
///   links::Convolution2D lazy(std::nullopt, 64, {5, 3});  // input channels from the first x
class Convolution2D : public Link {
 public:
  /// Chainer's constructor and defaults: initialW nullptr means LeCunNormal, initial_bias nullptr
  /// zeros (in initialW's dtype). ksize, stride, pad and dilate take one int for both axes or
  /// {h, w}. Sizes must be positive (pad non-negative) and the channel counts multiples of groups.
  Convolution2D(std::optional<int64_t> in_channels, int64_t out_channels, functions::IntPair ksize,
                functions::IntPair stride = 1, functions::IntPair pad = 0, bool nobias = false,
                std::shared_ptr<Initializer> initialW = nullptr,
                std::shared_ptr<Initializer> initial_bias = nullptr, functions::IntPair dilate = 1,
                int64_t groups = 1);
  /// Chainer's two-argument form `Convolution2D(out_channels, ksize)`: input channels inferred.
  Convolution2D(int64_t out_channels, functions::IntPair ksize)
      : Convolution2D(std::nullopt, out_channels, ksize) {}

  /// Convolves x (N, C, H, W); sizes W from C on the first call when in_channels was not given.
  Variable forward(const Variable& x) override;

  /// The filter, (out_channels, in_channels / groups, kh, kw); uninitialised until sized.
  Parameter W;
  /// The bias, (out_channels,); undefined when nobias.
  Parameter b;
  /// The number of output channels.
  int64_t out_channels() const { return out_channels_; }
  /// Filter size, stride, padding and dilation as (h, w).
  functions::IntPair ksize() const { return ksize_; }
  functions::IntPair stride() const { return stride_; }
  functions::IntPair pad() const { return pad_; }
  functions::IntPair dilate() const { return dilate_; }
  /// The number of channel groups.
  int64_t groups() const { return groups_; }

 protected:
  const char* type_name() const override { return "Convolution2D"; }

 private:
  void initialize_W(int64_t in_channels);

  int64_t out_channels_;
  functions::IntPair ksize_, stride_, pad_, dilate_;
  int64_t groups_;
};

}  // namespace kusari::links
