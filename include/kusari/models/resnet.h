// Residual networks (He et al., "Deep Residual Learning for Image Recognition"), built layer for
// layer like torchvision's resnet18 ... resnet152, so that parameter counts, shapes and the
// initialisation match and a figure measured against torchvision compares the same network:
//
//   auto model = kusari::models::resnet50();                      // 1000 classes, 25,557,032
//   params kusari::models::ResNetOptions options; options.num_classes = 10; auto small =
//   kusari::models::resnet18(options);
//   small->to_memory_format(kusari::MemoryFormat::kChannelsLast);  // NHWC training on GPUs
//   kusari::Variable y =
//   (*small)(kusari::Variable(x.to_memory_format(kusari::MemoryFormat::kChannelsLast)));
//
// Note [ResNet layout]
// The stem is a 7x7 stride-2 convolution (no bias), batch normalization, ReLU and a 3x3 stride-2
// max pooling with padding 1 (floor mode: Chainer's cover_all = false); four stages of blocks
// with 64, 128, 256 and 512 channels (ResNetOptions::width times 1, 2, 4 and 8) follow, the
// first block of stages 2-4 halving the spatial size; global average pooling (the mean over H
// and W) and a Linear layer end it.
//   - BasicBlock (ResNet-18/34): two 3x3 convolutions, the first carrying the stride.
//   - Bottleneck (ResNet-50/101/152): 1x1 reduce, 3x3, 1x1 expand (x4); the stride is on the
//     3x3 convolution (torchvision's "ResNet v1.5", not the paper's stride on the first 1x1).
//   - The shortcut is the input itself, or a 1x1 convolution (with the block's stride) and batch
//     normalization when the block changes the channels or the spatial size.
// Convolutions have no bias (batch normalization follows each one). Batch normalization uses
// eps 1e-5 and decay 0.9 (torchvision's momentum 0.1). Children are named as torchvision's
// modules ("layer1/0/conv1/W", "layer2/0/downsample/0/W", "fc/b"), so the npz keys line up
// with a torchvision state_dict's.
//
// Note [ResNet initialisation]
// As torchvision: convolution filters from N(0, 2 / fan_out) with fan_out = out_channels * kh *
// kw (He's "fan_out" mode for ReLU), batch normalization gamma 1 and beta 0, and the Linear
// layer as PyTorch's nn.Linear, W and b from U(-1/sqrt(in), 1/sqrt(in)). zero_init_residual
// starts the last batch normalization of every block with gamma 0, so each residual branch
// begins as zero and every block as the identity (Goyal et al.); it helps large-batch training.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kusari/core/dtype.h"
#include "kusari/core/memory_format.h"
#include "kusari/links/batch_normalization.h"
#include "kusari/links/convolution_2d.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"

namespace kusari::models {

/// How a ResNet is built beyond its depth.
struct ResNetOptions {
  /// Outputs of the final Linear layer.
  int64_t num_classes = 1000;
  /// Starts the last batch normalization of every block with gamma 0 (Note [ResNet
  /// initialisation]).
  bool zero_init_residual = false;
  /// The parameters' dtype: float16 or bfloat16 give a mixed-precision model whose batch
  /// normalization keeps float32 parameters and statistics (Note [Link dtype]).
  Dtype dtype = Dtype::kFloat32;
  /// The layout of the convolution filters; kChannelsLast for NHWC training (feed channels-last
  /// inputs too). The same as calling to_memory_format() on the model.
  MemoryFormat memory_format = MemoryFormat::kContiguous;
  /// Channels of the stem and the first stage (64 in the paper); the later stages have 2, 4 and
  /// 8 times as many. A smaller width makes a narrow ResNet for small experiments.
  int64_t width = 64;
};

/// Two 3x3 convolutions and a shortcut (ResNet-18/34). See Note [ResNet layout].
class BasicBlock : public Chain {
 public:
  /// Output channels per `channels`.
  static constexpr int64_t kExpansion = 1;
  /// A block from `in_channels` to `channels`, the first convolution and the shortcut with
  /// `stride`; zero_init_residual starts bn2's gamma at 0.
  BasicBlock(int64_t in_channels, int64_t channels, int64_t stride,
             bool zero_init_residual = false);
  /// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
  Variable forward(const Variable& x) override;

  std::shared_ptr<links::Convolution2D> conv1, conv2;
  std::shared_ptr<links::BatchNormalization> bn1, bn2;
  /// The projection shortcut (1x1 convolution, batch normalization); null when the input passes.
  std::shared_ptr<Sequential> downsample;

 protected:
  const char* type_name() const override { return "BasicBlock"; }
};

/// 1x1, 3x3 (with the stride) and 1x1 (x4 channels) convolutions and a shortcut
/// (ResNet-50/101/152, torchvision's v1.5). See Note [ResNet layout].
class Bottleneck : public Chain {
 public:
  /// Output channels per `channels`.
  static constexpr int64_t kExpansion = 4;
  /// A block from `in_channels` to channels * 4 through a `channels`-wide middle, the 3x3
  /// convolution and the shortcut with `stride`; zero_init_residual starts bn3's gamma at 0.
  Bottleneck(int64_t in_channels, int64_t channels, int64_t stride,
             bool zero_init_residual = false);
  /// relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x)).
  Variable forward(const Variable& x) override;

  std::shared_ptr<links::Convolution2D> conv1, conv2, conv3;
  std::shared_ptr<links::BatchNormalization> bn1, bn2, bn3;
  /// The projection shortcut (1x1 convolution, batch normalization); null when the input passes.
  std::shared_ptr<Sequential> downsample;

 protected:
  const char* type_name() const override { return "Bottleneck"; }
};

/// The kind of block a ResNet is made of.
enum class ResNetBlock { kBasic, kBottleneck };

/// A residual network for (N, 3, H, W) images returning (N, num_classes) logits; any H, W of at
/// least 32 or so work (the output of the last stage is averaged). See Note [ResNet layout].
class ResNet : public Chain {
 public:
  /// `blocks_per_stage` blocks of kind `block` in each of the four stages, e.g. kBasic {2, 2, 2, 2}
  /// for ResNet-18 or kBottleneck {3, 4, 6, 3} for ResNet-50.
  ResNet(ResNetBlock block, const std::vector<int64_t>& blocks_per_stage,
         const ResNetOptions& options = {});
  /// The logits (N, num_classes) of images x (N, 3, H, W), NCHW or channels-last.
  Variable forward(const Variable& x) override;
  /// The pooled features (N, 8 * width * expansion; 512 * expansion by default) before fc.
  Variable features(const Variable& x);

  /// The kind of block, and how many per stage.
  ResNetBlock block() const { return block_; }
  const std::vector<int64_t>& blocks_per_stage() const { return blocks_per_stage_; }
  /// The options the network was built with.
  const ResNetOptions& options() const { return options_; }

  std::shared_ptr<links::Convolution2D> conv1;
  std::shared_ptr<links::BatchNormalization> bn1;
  /// The four stages, Sequentials of blocks named "0", "1", ...
  std::shared_ptr<Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<links::Linear> fc;

 protected:
  const char* type_name() const override { return "ResNet"; }

 private:
  ResNetBlock block_;
  std::vector<int64_t> blocks_per_stage_;
  ResNetOptions options_;
};

/// ResNet-18: basic blocks {2, 2, 2, 2}; 11,689,512 parameters with 1000 classes.
std::shared_ptr<ResNet> resnet18(const ResNetOptions& options = {});
/// ResNet-34: basic blocks {3, 4, 6, 3}; 21,797,672 parameters with 1000 classes.
std::shared_ptr<ResNet> resnet34(const ResNetOptions& options = {});
/// ResNet-50: bottlenecks {3, 4, 6, 3}; 25,557,032 parameters with 1000 classes.
std::shared_ptr<ResNet> resnet50(const ResNetOptions& options = {});
/// ResNet-101: bottlenecks {3, 4, 23, 3}; 44,549,160 parameters with 1000 classes.
std::shared_ptr<ResNet> resnet101(const ResNetOptions& options = {});
/// ResNet-152: bottlenecks {3, 8, 36, 3}; 60,192,808 parameters with 1000 classes.
std::shared_ptr<ResNet> resnet152(const ResNetOptions& options = {});
/// The ResNet of `depth` layers: 18, 34, 50, 101 or 152 (ValueError naming the depth otherwise).
std::shared_ptr<ResNet> resnet(int depth, const ResNetOptions& options = {});

}  // namespace kusari::models
