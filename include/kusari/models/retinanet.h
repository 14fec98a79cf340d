// RetinaNet (Lin et al., "Focal Loss for Dense Object Detection"): a ResNet backbone, a feature
// pyramid, and two small convolutional heads shared by every level that score each anchor for
// each class and regress its box; trained with the focal loss and the smooth L1 loss, predicting
// through score thresholds and non-maximum suppression per class. Boxes follow ChainerCV's
// conventions (functions/detection.h): (y_min, x_min, y_max, x_max) in input pixels.
//
//   namespace M = kusari::models;
//   M::RetinaNetOptions o;
//   o.num_classes = 3;
//   auto model = M::retinanet_resnet50_fpn(o);
//   kusari::Variable loss = model->loss(images, bboxes, labels);  // images (N, 3, H, W)
//   M::Detections d = model->predict(images);                      // per image: boxes, labels,
//   scores
//
// Note [RetinaNet layout]
// The backbone is a ResNet (Note [ResNet layout]) without its pooling and classifier: its stages
// give C2 ... C5 at strides 4, 8, 16 and 32. The pyramid has levels min_level ... max_level (3 ...
// 7 by default, as the paper): for each level up to 5 a 1x1 "lateral" convolution of C_l, added to
// the level above upsampled by 2 (nearest, cropped to the size of C_l), then a 3x3 "output"
// convolution gives P_l; P6 is a 3x3 stride-2 convolution of C5 and P7 one of relu(P6). Each
// head is head_convs 3x3 convolutions with ReLU, then a 3x3 convolution to A * K class logits or
// A * 4 box offsets (A anchors per position, K classes); the same head runs on every level. The
// classification bias starts at -log((1 - prior) / prior), so that every anchor begins as
// background with probability 1 - prior and the focal loss of the many easy negatives does not
// swamp the first steps; the heads' other filters start from N(0, 0.01), their biases at 0.
// Children are named "backbone/layer1/...", "fpn/lateral3/...", "fpn/output3/...",
// "classification_head/...", "regression_head/...".
//
// Note [RetinaNet anchors and targets]
// Level l has stride s = 2^l and anchors of size anchor_scale * s times each of `scales`, with
// each aspect ratio r = height / width of `ratios` (height size sqrt(r), width size / sqrt(r)),
// centred on each position's centre ((y + 0.5) s, (x + 0.5) s). They are ordered by level, then
// position (row-major), then ratio, then scale: the order in which the heads' (N, A * K, H, W)
// outputs are flattened. An anchor whose best IoU with a ground-truth box is at least
// positive_iou is a positive of that box's class; below negative_iou it is background; between
// the two it is ignored by the loss. So that no box goes without an anchor, each box also takes
// the anchors whose IoU with it is the largest of any anchor's (ties included; each keeps its
// own best box: torchvision's low-quality matches). The classification loss is the focal loss
// summed over every anchor that is not ignored and every class (one-hot targets, background all
// zero), the regression loss is the smooth L1 loss (huber_loss with delta 1/9, times 9: beta
// 1/9 of Detectron's form) of the positives' offsets (bbox_to_loc, unscaled) summed; both are
// divided by the number of positives in the batch (at least 1).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kusari/autograd/variable.h"
#include "kusari/links/convolution_2d.h"
#include "kusari/links/link.h"
#include "kusari/models/resnet.h"

namespace kusari::models {

namespace detail {
class AnchorCache;      // src/models/detection_util.h
class BackbonePyramid;  // src/models/detection_util.h
}  // namespace detail

/// The anchors of one (height, width) feature map of stride `stride` (Note [RetinaNet anchors
/// and targets]): float32 (height * width * ratios * scales, 4) on `device`, ordered by position
/// (row-major), ratio, scale. A box's height is size * scale * sqrt(ratio), its width size * scale
/// / sqrt(ratio).
Array generate_anchors(int64_t height, int64_t width, double stride, double size,
                       const std::vector<double>& ratios, const std::vector<double>& scales,
                       Device device = Device::cpu());

/// What each anchor is trained to predict (match_anchors).
struct AnchorTargets {
  /// int32 (A,): the class of the matched box for a positive, -1 for background, -2 for an
  /// anchor the loss ignores.
  Array labels;
  /// float32 (A, 4): bbox_to_loc(anchor, matched box) for a positive, 0 otherwise.
  Array locs;
  /// int32 (A,): the index of the matched box for a positive, -1 otherwise.
  Array matched;
};

/// Matches anchors (A, 4) to the ground-truth boxes bbox (G, 4) of classes label (G,) (Note
/// [RetinaNet anchors and targets]); G may be 0 (every anchor is background). The arrays are read
/// on the host; the targets are CPU arrays. Requires 0 <= negative_iou <= positive_iou <= 1.
AnchorTargets match_anchors(const Array& anchors, const Array& bbox, const Array& label,
                            double positive_iou = 0.5, double negative_iou = 0.4,
                            bool low_quality_matches = true);

/// How a RetinaNet is built, trained and read out.
struct RetinaNetOptions {
  /// Object classes (without background).
  int64_t num_classes = 80;
  /// The backbone: a ResNet of this block, blocks per stage and width (Note [ResNet layout]).
  ResNetBlock block = ResNetBlock::kBottleneck;
  std::vector<int64_t> blocks_per_stage = {3, 4, 6, 3};
  int64_t width = 64;
  /// Channels of every pyramid level and of the heads.
  int64_t fpn_channels = 256;
  /// The pyramid's levels: 2 <= min_level <= 5, min_level <= max_level <= 7.
  int min_level = 3;
  int max_level = 7;
  /// 3x3 convolutions with ReLU in each head before its last.
  int64_t head_convs = 4;
  /// Anchors: size anchor_scale * stride at each level, times each scale, with each ratio.
  double anchor_scale = 4.0;
  std::vector<double> ratios = {0.5, 1.0, 2.0};
  std::vector<double> scales = {1.0, 1.2599210498948732, 1.5874010519681994};
  /// Matching (match_anchors).
  double positive_iou = 0.5;
  double negative_iou = 0.4;
  /// The focal loss's alpha and gamma, and the classification prior of Note [RetinaNet layout].
  double focal_alpha = 0.25;
  double focal_gamma = 2.0;
  double prior_probability = 0.01;
  /// predict(): the boxes of each level scoring at least score_threshold, at most
  /// candidates_per_level of them (the best), decoded, then non-maximum suppression per class
  /// at nms_threshold, keeping at most max_detections per image.
  double score_threshold = 0.05;
  int64_t candidates_per_level = 1000;
  double nms_threshold = 0.5;
  int64_t max_detections = 100;
};

/// The outputs of the heads for a batch: every anchor of every level, in the anchors' order.
struct RetinaNetOutputs {
  Variable scores;  ///< (N, anchors, num_classes) logits
  Variable locs;    ///< (N, anchors, 4) offsets from the anchors (bbox_to_loc's form)
  Array anchors;    ///< float32 (anchors, 4), on the outputs' device
  /// The same anchors on the CPU, which detections() reads (it copies `anchors` when this is
  /// undefined). Both are the model's cached arrays, shared between calls at one input size: do
  /// not write into them.
  Array host_anchors;
  /// The anchors of each level, in order (they sum to the anchor count).
  std::vector<int64_t> anchors_per_level;
};

/// The detections of a batch, one entry per image (CPU arrays).
struct Detections {
  std::vector<Array> bboxes;  ///< float32 (R, 4), clipped to the image
  std::vector<Array> labels;  ///< int32 (R,)
  std::vector<Array> scores;  ///< float32 (R,), highest first
};

/// The two parts of RetinaNet's loss, for reports.
struct RetinaNetLoss {
  Variable total;           ///< classification + regression
  Variable classification;  ///< the focal loss per positive
  Variable regression;      ///< the smooth L1 loss per positive
  int64_t positives = 0;    ///< positive anchors in the batch
};

/// RetinaNet; see Note [RetinaNet layout].
class RetinaNet : public Chain {
 public:
  explicit RetinaNet(const RetinaNetOptions& options = {});

  /// The heads' outputs and the anchors for images x (N, 3, H, W).
  RetinaNetOutputs outputs(const Variable& x);
  /// The loss of images x (N, 3, H, W) against each image's boxes (G_i, 4) and labels (G_i,)
  /// (Note [RetinaNet anchors and targets]).
  RetinaNetLoss loss(const Variable& x, const std::vector<Array>& bboxes,
                     const std::vector<Array>& labels);
  /// The detections of images x (N, 3, H, W), without building a graph.
  Detections predict(const Variable& x);
  /// The detections that outputs `out` of images of `height` x `width` give.
  Detections detections(const RetinaNetOutputs& out, int64_t height, int64_t width) const;

  /// The options it was built with.
  const RetinaNetOptions& options() const { return options_; }
  /// Anchors per position (ratios x scales).
  int64_t anchors_per_position() const;

  /// The backbone's stem and stages (a ResNet's conv1, bn1, layer1 ... layer4).
  std::shared_ptr<Chain> backbone;
  /// The pyramid: lateral and output convolutions of levels min_level ... min(max_level, 5), then
  /// those of levels 6 and 7.
  std::shared_ptr<Chain> fpn;
  std::shared_ptr<Sequential> classification_head, regression_head;

 protected:
  const char* type_name() const override { return "RetinaNet"; }

 private:
  RetinaNetOptions options_;
  std::shared_ptr<detail::BackbonePyramid> pyramid_;  // the backbone's and the pyramid's links
  std::shared_ptr<detail::AnchorCache> anchors_;      // Note [Anchor cache]
};

/// RetinaNet with a ResNet-50 backbone and levels 3 ... 7 (the paper's, torchvision's
/// retinanet_resnet50_fpn layout); `options` gives the classes and any other setting.
std::shared_ptr<RetinaNet> retinanet_resnet50_fpn(RetinaNetOptions options = {});

}  // namespace kusari::models
