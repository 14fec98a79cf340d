// 2-d transposed convolution layer (Chainer's L.Deconvolution2D).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kusari/functions/int_pair.h"
#include "kusari/links/initializers.h"
#include "kusari/links/link.h"

namespace kusari::links {

/// functions::deconvolution_2d with parameters W (in_channels, out_channels / groups, kh, kw) and
/// b (out_channels,). Note W's first axis is the input's channels, as in Chainer. The number of
/// input channels may be left unknown (std::nullopt): W is then sized at the first forward.
///
///   links::Deconvolution2D up(64, 32, 4, 2, 1);   // 64 -> 32 channels, doubles H and W
class Deconvolution2D : public Link {
 public:
  /// Chainer's constructor and defaults: initialW nullptr means LeCunNormal, initial_bias nullptr
  /// zeros (in initialW's dtype); outsize std::nullopt means the smallest output size
  /// stride (in - 1) + dilate (k - 1) + 1 - 2 pad. Sizes must be positive (pad non-negative) and
  /// the channel counts multiples of groups.
  Deconvolution2D(std::optional<int64_t> in_channels, int64_t out_channels,
                  functions::IntPair ksize, functions::IntPair stride = 1,
                  functions::IntPair pad = 0, bool nobias = false,
                  std::optional<functions::IntPair> outsize = std::nullopt,
                  std::shared_ptr<Initializer> initialW = nullptr,
                  std::shared_ptr<Initializer> initial_bias = nullptr,
                  functions::IntPair dilate = 1, int64_t groups = 1);
  /// Chainer's two-argument form `Deconvolution2D(out_channels, ksize)`: input channels inferred.
  Deconvolution2D(int64_t out_channels, functions::IntPair ksize)
      : Deconvolution2D(std::nullopt, out_channels, ksize) {}

  /// Applies the transposed convolution to x (N, C, H, W); sizes W from C on the first call when
  /// in_channels was not given.
  Variable forward(const Variable& x) override;

  /// The filter, (in_channels, out_channels / groups, kh, kw); uninitialised until sized.
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
  /// The requested output size (std::nullopt: the smallest one).
  const std::optional<functions::IntPair>& outsize() const { return outsize_; }
  /// The number of channel groups.
  int64_t groups() const { return groups_; }

 protected:
  const char* type_name() const override { return "Deconvolution2D"; }

 private:
  void initialize_W(int64_t in_channels);

  int64_t out_channels_;
  functions::IntPair ksize_, stride_, pad_, dilate_;
  std::optional<functions::IntPair> outsize_;
  int64_t groups_;
};

}  // namespace kusari::links
