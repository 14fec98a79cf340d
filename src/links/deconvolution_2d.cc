#include "kusari/links/deconvolution_2d.h"

#include "kusari/functions/convolution.h"
#include "links/conv_util.h"

namespace kusari::links {

Deconvolution2D::Deconvolution2D(std::optional<int64_t> in_channels, int64_t out_channels,
                                 functions::IntPair ksize, functions::IntPair stride,
                                 functions::IntPair pad, bool nobias,
                                 std::optional<functions::IntPair> outsize,
                                 std::shared_ptr<Initializer> initialW,
                                 std::shared_ptr<Initializer> initial_bias,
                                 functions::IntPair dilate, int64_t groups)
    : out_channels_(out_channels),
      ksize_(ksize),
      stride_(stride),
      pad_(pad),
      dilate_(dilate),
      outsize_(outsize),
      groups_(groups) {
  detail::check_conv_args("Deconvolution2D", in_channels, out_channels, ksize, stride, pad, dilate,
                          groups);
  KUSARI_CHECK(!outsize || (outsize->h > 0 && outsize->w > 0), ValueError,
               "Deconvolution2D: outsize must be positive, got ",
               outsize.value_or(functions::IntPair(0)));
  if (!initialW) initialW = std::make_shared<initializers::LeCunNormal>();
  W = add_param("W", Parameter(initialW, std::nullopt, device()));
  if (in_channels) initialize_W(*in_channels);
  if (!nobias) {
    if (!initial_bias) initial_bias = std::make_shared<initializers::Zero>(initialW->dtype());
    b = add_param("b", Parameter(initial_bias, Shape{out_channels}, device()));
  }
}

void Deconvolution2D::initialize_W(int64_t in_channels) {
  detail::check_in_channels("Deconvolution2D", in_channels, groups_);
  W.initialize({in_channels, out_channels_ / groups_, ksize_.h, ksize_.w});
}

Variable Deconvolution2D::forward(const Variable& x) {
  detail::check_nchw("Deconvolution2D", x);
  if (!W.is_initialized()) initialize_W(x.shape()[1]);
  KUSARI_CHECK(x.shape()[1] == W.shape()[0], ShapeError, "Deconvolution2D: the input has ",
               x.shape()[1], " channels (shape ", x.shape(), ") but W of shape ", W.shape(),
               W.shape_origin(), " expects ", W.shape()[0]);
  return functions::deconvolution_2d(x, W, b.defined() ? Variable(b) : Variable(), stride_, pad_,
                                     outsize_, dilate_, groups_);
}

}  // namespace kusari::links
