// Residual networks as torchvision builds them: see Note [ResNet layout] and
// Note [ResNet initialisation] (include/kusari/models/resnet.h).
#include "kusari/models/resnet.h"

#include <cmath>
#include <string>
#include <utility>

#include "kusari/core/error.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/math.h"
#include "kusari/functions/pooling.h"
#include "kusari/links/initializers.h"

namespace kusari::models {
namespace {

namespace F = kusari::functions;
using links::BatchNormalization;
using links::Convolution2D;

constexpr double kBnDecay = 0.9;  // torchvision's momentum 0.1
constexpr double kBnEps = 1e-5;

/// A convolution without bias whose filter is drawn from N(0, 2 / fan_out) (Note [ResNet
/// initialisation]).
std::shared_ptr<Convolution2D> conv(int64_t in_channels, int64_t out_channels, int64_t ksize,
                                    int64_t stride, int64_t pad) {
  const double fan_out = static_cast<double>(out_channels * ksize * ksize);
  return std::make_shared<Convolution2D>(
      in_channels, out_channels, ksize, stride, pad, /*nobias=*/true,
      std::make_shared<initializers::Normal>(std::sqrt(2.0 / fan_out)));
}

/// Batch normalization over `channels` with gamma 1 (or 0) and beta 0.
std::shared_ptr<BatchNormalization> bn(int64_t channels, bool zero_gamma = false) {
  std::shared_ptr<Initializer> gamma =
      zero_gamma ? std::make_shared<initializers::Zero>() : nullptr;
  return std::make_shared<BatchNormalization>(channels, kBnDecay, kBnEps, Dtype::kFloat32, true,
                                              true, std::move(gamma));
}

/// The projection shortcut when a block changes the shape, else null.
std::shared_ptr<Sequential> shortcut(int64_t in_channels, int64_t out_channels, int64_t stride) {
  if (stride == 1 && in_channels == out_channels) return nullptr;
  auto seq = std::make_shared<Sequential>();
  seq->add(conv(in_channels, out_channels, 1, stride, 0));
  seq->add(bn(out_channels));
  return seq;
}

void check_block_sizes(const char* fn, int64_t in_channels, int64_t channels, int64_t stride) {
  KUSARI_CHECK(in_channels > 0 && channels > 0 && stride > 0, ValueError, fn,
               ": in_channels, channels and stride must be positive (got ", in_channels, ", ",
               channels, ", ", stride, ")");
}

}  // namespace

BasicBlock::BasicBlock(int64_t in_channels, int64_t channels, int64_t stride,
                       bool zero_init_residual) {
  check_block_sizes("BasicBlock", in_channels, channels, stride);
  conv1 = add_link("conv1", conv(in_channels, channels, 3, stride, 1));
  bn1 = add_link("bn1", bn(channels));
  conv2 = add_link("conv2", conv(channels, channels, 3, 1, 1));
  bn2 = add_link("bn2", bn(channels, zero_init_residual));
  downsample = shortcut(in_channels, channels * kExpansion, stride);
  if (downsample) add_link("downsample", downsample);
}

// The relus and the residual join run inside the batch norms' normalising passes
// (BatchNormalization::forward_relu, Note [Batch norm epilogues]).
Variable BasicBlock::forward(const Variable& x) {
  Variable h = bn1->forward_relu((*conv1)(x));
  return bn2->forward_relu((*conv2)(h), downsample ? (*downsample)(x) : x);
}

Bottleneck::Bottleneck(int64_t in_channels, int64_t channels, int64_t stride,
                       bool zero_init_residual) {
  check_block_sizes("Bottleneck", in_channels, channels, stride);
  conv1 = add_link("conv1", conv(in_channels, channels, 1, 1, 0));
  bn1 = add_link("bn1", bn(channels));
  conv2 = add_link("conv2", conv(channels, channels, 3, stride, 1));
  bn2 = add_link("bn2", bn(channels));
  conv3 = add_link("conv3", conv(channels, channels * kExpansion, 1, 1, 0));
  bn3 = add_link("bn3", bn(channels * kExpansion, zero_init_residual));
  downsample = shortcut(in_channels, channels * kExpansion, stride);
  if (downsample) add_link("downsample", downsample);
}

Variable Bottleneck::forward(const Variable& x) {
  Variable h = bn1->forward_relu((*conv1)(x));
  h = bn2->forward_relu((*conv2)(h));
  return bn3->forward_relu((*conv3)(h), downsample ? (*downsample)(x) : x);
}

ResNet::ResNet(ResNetBlock block, const std::vector<int64_t>& blocks_per_stage,
               const ResNetOptions& options)
    : block_(block), blocks_per_stage_(blocks_per_stage), options_(options) {
  KUSARI_CHECK(blocks_per_stage.size() == 4, ValueError,
               "ResNet: blocks_per_stage needs one count per stage (4), got ",
               blocks_per_stage.size());
  for (size_t i = 0; i < blocks_per_stage.size(); ++i) {
    KUSARI_CHECK(blocks_per_stage[i] > 0, ValueError, "ResNet: stage ", i + 1,
                 " needs at least one block, got ", blocks_per_stage[i]);
  }
  KUSARI_CHECK(options.num_classes > 0, ValueError, "ResNet: num_classes must be positive, got ",
               options.num_classes);
  KUSARI_CHECK(options.width > 0, ValueError, "ResNet: width must be positive, got ",
               options.width);
  const int64_t expansion =
      block == ResNetBlock::kBasic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  const int64_t width = options.width;
  conv1 = add_link("conv1", conv(3, width, 7, 2, 3));
  bn1 = add_link("bn1", bn(width));
  int64_t in_channels = width;
  std::shared_ptr<Sequential>* stages[4] = {&layer1, &layer2, &layer3, &layer4};
  for (int s = 0; s < 4; ++s) {
    const int64_t channels = width << s;
    auto stage = std::make_shared<Sequential>();
    for (int64_t b = 0; b < blocks_per_stage[static_cast<size_t>(s)]; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;
      if (block == ResNetBlock::kBasic) {
        stage->add(std::make_shared<BasicBlock>(in_channels, channels, stride,
                                                options.zero_init_residual));
      } else {
        stage->add(std::make_shared<Bottleneck>(in_channels, channels, stride,
                                                options.zero_init_residual));
      }
      in_channels = channels * expansion;
    }
    *stages[s] = add_link("layer" + std::to_string(s + 1), stage);
  }
  // nn.Linear's initialisation: W and b from U(-1/sqrt(in), 1/sqrt(in)).
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_channels));
  fc = add_link("fc",
                std::make_shared<links::Linear>(in_channels, options.num_classes, false,
                                                std::make_shared<initializers::Uniform>(bound),
                                                std::make_shared<initializers::Uniform>(bound)));
  if (options.dtype != Dtype::kFloat32) to_dtype(options.dtype);
  if (options.memory_format != MemoryFormat::kContiguous) to_memory_format(options.memory_format);
}

Variable ResNet::features(const Variable& x) {
  KUSARI_CHECK(x.ndim() == 4 && x.shape()[1] == 3, ShapeError,
               "ResNet: expected images (N, 3, H, W), got ", x.shape());
  Variable h = bn1->forward_relu((*conv1)(x));
  h = F::max_pooling_2d(h, 3, 2, 1, /*cover_all=*/false);
  h = (*layer4)((*layer3)((*layer2)((*layer1)(h))));
  return F::mean(h, Axes{2, 3});
}

Variable ResNet::forward(const Variable& x) {
  return (*fc)(features(x));
}

std::shared_ptr<ResNet> resnet18(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBasic, std::vector<int64_t>{2, 2, 2, 2}, options);
}

std::shared_ptr<ResNet> resnet34(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBasic, std::vector<int64_t>{3, 4, 6, 3}, options);
}

std::shared_ptr<ResNet> resnet50(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBottleneck, std::vector<int64_t>{3, 4, 6, 3},
                                  options);
}

std::shared_ptr<ResNet> resnet101(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBottleneck, std::vector<int64_t>{3, 4, 23, 3},
                                  options);
}

std::shared_ptr<ResNet> resnet152(const ResNetOptions& options) {
  return std::make_shared<ResNet>(ResNetBlock::kBottleneck, std::vector<int64_t>{3, 8, 36, 3},
                                  options);
}

std::shared_ptr<ResNet> resnet(int depth, const ResNetOptions& options) {
  switch (depth) {
    case 18:
      return resnet18(options);
    case 34:
      return resnet34(options);
    case 50:
      return resnet50(options);
    case 101:
      return resnet101(options);
    case 152:
      return resnet152(options);
    default:
      KUSARI_THROW(ValueError, "models::resnet: depth ", depth,
                   " is not a ResNet depth; the valid depths are 18, 34, 50, 101 and 152");
  }
}

}  // namespace kusari::models
