#include "kusari/links/convolution_2d.h"

#include "kusari/functions/convolution.h"
#include "links/conv_util.h"

namespace kusari::links {

Convolution2D::Convolution2D(std::optional<int64_t> in_channels, int64_t out_channels,
                             functions::IntPair ksize, functions::IntPair stride,
                             functions::IntPair pad, bool nobias,
                             std::shared_ptr<Initializer> initialW,
                             std::shared_ptr<Initializer> initial_bias, functions::IntPair dilate,
                             int64_t groups)
    : out_channels_(out_channels),
      ksize_(ksize),
      stride_(stride),
      pad_(pad),
      dilate_(dilate),
      groups_(groups) {
  detail::check_conv_args("Convolution2D", in_channels, out_channels, ksize, stride, pad, dilate,
                          groups);
  if (!initialW) initialW = std::make_shared<initializers::LeCunNormal>();
  W = add_param("W", Parameter(initialW, std::nullopt, device()));
  if (in_channels) initialize_W(*in_channels);
  if (!nobias) {
    if (!initial_bias) initial_bias = std::make_shared<initializers::Zero>(initialW->dtype());
    b = add_param("b", Parameter(initial_bias, Shape{out_channels}, device()));
  }
}

void Convolution2D::initialize_W(int64_t in_channels) {
  detail::check_in_channels("Convolution2D", in_channels, groups_);
  W.initialize({out_channels_, in_channels / groups_, ksize_.h, ksize_.w});
}

Variable Convolution2D::forward(const Variable& x) {
  detail::check_nchw("Convolution2D", x);
  if (!W.is_initialized()) initialize_W(x.shape()[1]);
  KUSARI_CHECK(x.shape()[1] == W.shape()[1] * groups_, ShapeError, "Convolution2D: the input has ",
               x.shape()[1], " channels (shape ", x.shape(), ") but W of shape ", W.shape(),
               W.shape_origin(), " with groups=", groups_, " expects ", W.shape()[1] * groups_);
  return functions::convolution_2d(x, W, b.defined() ? Variable(b) : Variable(), stride_, pad_,
                                   dilate_, groups_);
}

}  // namespace kusari::links
