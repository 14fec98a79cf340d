// Faster R-CNN with a feature pyramid (Ren et al., "Faster R-CNN"; Lin et al., "Feature Pyramid
// Networks for Object Detection"; torchvision's fasterrcnn_resnet50_fpn): a ResNet backbone and
// pyramid as RetinaNet's (retinanet.h), a region proposal network (RPN) over every level, and a
// RoI head that classifies and refines the proposals. Boxes follow ChainerCV's conventions
// (functions/detection.h): (y_min, x_min, y_max, x_max) in input pixels; labels are 0 ...
// num_classes - 1, as RetinaNet's.
//
//   namespace M = kusari::models;
//   M::FasterRCNNOptions o;
//   o.num_classes = 3;
//   auto model = M::faster_rcnn_resnet50_fpn(o);
//   M::FasterRCNNLoss loss = model->loss(images, bboxes, labels);  // images (N, 3, H, W)
//   loss.total.backward();
//   M::Detections d = model->predict(images);  // per image: boxes, labels, scores
//
// Note [Faster R-CNN layout]
// Data flow, with what carries a gradient marked (d):
//   1. features(x): the backbone and pyramid (Note [RetinaNet layout]) give P_min_level ...
//      P_max_level (d); levels above 5 are P5 subsampled by 2 (a 1x1 max pooling of stride 2,
//      FPN's), so they add no parameters and serve the RPN alone.
//   2. rpn_outputs(features): on every level a shared 3x3 convolution with ReLU, then 1x1
//      convolutions to A objectness logits and 4A box offsets per position (d), flattened in the
//      anchors' order (Note [RetinaNet anchors and targets]). Level l has stride 2^l and A =
//      ratios.size() anchors of size anchor_sizes[l - min_level] (generate_anchors with the one
//      scale 1).
//   3. proposals(rpn, height, width, training): per image and level the rpn_pre_nms_top_n
//      best-scored anchors, decoded (loc_to_bbox of the offsets, unscaled), clipped to the image;
//      boxes with a side below rpn_min_size are dropped; non-maximum suppression at
//      rpn_nms_threshold per image, each level on its own (torchvision's batched NMS over levels);
//      the rpn_post_nms_top_n best of the image kept. Host arrays, no gradient: the RoI head does
//      not train the RPN through the proposals' coordinates (torchvision's and Chainer's
//      "approximate joint training").
//   4. sample_rois (training only): each image's proposals with its ground-truth boxes added,
//      matched to the boxes (match_anchors: IoU >= roi_positive_iou is the box's class, below is
//      background, no low-quality matches), then roi_batch_size_per_image of them drawn at random
//      with at most roi_positive_fraction foreground; the targets are class c + 1 (0 is
//      background) and bbox_to_loc(RoI, box) times box_coder_weights.
//   5. roi_head(features, rois, roi_indices): each RoI's level by the canonical rule of
//      Note [FPN level of a RoI], RoI Align (roi_average_align_2d, roi_output_size squared,
//      roi_sampling_ratio) on that level's map at scale 2^-l (d, in the features, not in the
//      boxes), flattened, two fully connected layers with ReLU ("fc6", "fc7") of
//      representation_size, then num_classes + 1 class logits and (num_classes + 1) x 4
//      class-specific offsets (d).
//   6. loss: the RPN's anchors are matched to the boxes (rpn_positive_iou, rpn_negative_iou,
//      with low-quality matches so that every box has an anchor) and rpn_batch_size_per_image
//      anchors sampled with at most rpn_positive_fraction positives; rpn_objectness is the sigmoid
//      cross entropy of the sampled anchors (their mean), rpn_loc the smooth L1 loss of the
//      sampled positives' offsets summed over the batch and divided by the number of sampled
//      anchors; roi_cls is the softmax cross entropy of the sampled RoIs (their mean), roi_loc the
//      smooth L1 loss of each foreground RoI's offsets for its own class, summed and divided by
//      the number of sampled RoIs. The smooth L1 loss has beta 1/9 in both (torchvision's:
//      0.5 d^2 / beta below beta, |d| - beta / 2 above). total is the sum of the four.
//   7. predict: proposals with the test top-ks, the RoI head, softmax probabilities; for every
//      RoI and class (background excluded) a score of at least score_threshold gives the box
//      decoded from that class's offsets (divided by box_coder_weights) and clipped; boxes with a
//      side below 0.01 are dropped; non-maximum suppression per class at nms_threshold keeps the
//      max_detections best.
// Random sampling draws from the generator given to the constructor, or kusari's default
// generator (so manual_seed makes training reproducible). Children are named
// "backbone/...", "fpn/lateral2/...", "rpn/conv", "rpn/objectness", "rpn/loc", "box_head/fc6",
// "box_head/fc7", "box_head/cls", "box_head/loc". Multi-node batch normalization
// (mn::create_mnbn_model) applies to the backbone's batch normalizations as for RetinaNet.
//
// Note [FPN level of a RoI]
// A RoI of area w h is pooled from level k = floor(canonical_level + log2(sqrt(w h) /
// canonical_scale) + 1e-6), clamped to the RoI levels min_level ... min(max_level, 5) (FPN's
// equation 1; 224 and 4: an ImageNet-sized RoI pools from P4; the 1e-6 is torchvision's, so
// that sqrt(w h) = 112 lands on level 3 despite rounding). So with the defaults sqrt(w h) in
// [56, 112) is level 2, [112, 224) level 3, [224, 448) level 4, [448, 896) level 5; smaller and
// larger RoIs take the lowest and the highest RoI level.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kusari/autograd/variable.h"
#include "kusari/core/random.h"
#include "kusari/links/convolution_2d.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"
#include "kusari/models/resnet.h"
#include "kusari/models/retinanet.h"

namespace kusari::models {

/// How a Faster R-CNN is built, trained and read out (Note [Faster R-CNN layout]; torchvision's
/// defaults).
struct FasterRCNNOptions {
  /// Object classes (without background).
  int64_t num_classes = 80;
  /// The backbone: a ResNet of this block, blocks per stage and width (Note [ResNet layout]).
  ResNetBlock block = ResNetBlock::kBottleneck;
  std::vector<int64_t> blocks_per_stage = {3, 4, 6, 3};
  int64_t width = 64;
  /// Channels of every pyramid level and of the RPN's convolution.
  int64_t fpn_channels = 256;
  /// The pyramid's levels: 2 <= min_level <= 5, min_level <= max_level <= 7; the RoI head
  /// pools from min_level ... min(max_level, 5).
  int min_level = 2;
  int max_level = 6;
  /// Anchors: one size per level (min_level first), each with every height/width ratio.
  std::vector<double> anchor_sizes = {32, 64, 128, 256, 512};
  std::vector<double> ratios = {0.5, 1.0, 2.0};
  /// Proposals: the best rpn_pre_nms_top_n anchors per level and image, NMS, then the best
  /// rpn_post_nms_top_n per image; in training and in test.
  int64_t rpn_pre_nms_top_n_train = 2000;
  int64_t rpn_pre_nms_top_n_test = 1000;
  int64_t rpn_post_nms_top_n_train = 2000;
  int64_t rpn_post_nms_top_n_test = 1000;
  double rpn_nms_threshold = 0.7;
  /// Proposals with a side below this (pixels) are dropped.
  double rpn_min_size = 1e-3;
  /// RPN training: anchors with IoU >= rpn_positive_iou are objects, below rpn_negative_iou
  /// background; rpn_batch_size_per_image of them sampled, at most rpn_positive_fraction objects.
  double rpn_positive_iou = 0.7;
  double rpn_negative_iou = 0.3;
  int64_t rpn_batch_size_per_image = 256;
  double rpn_positive_fraction = 0.5;
  /// RoI head training: RoIs with IoU >= roi_positive_iou are foreground, else background;
  /// roi_batch_size_per_image sampled per image, at most roi_positive_fraction foreground.
  double roi_positive_iou = 0.5;
  int64_t roi_batch_size_per_image = 512;
  double roi_positive_fraction = 0.25;
  /// RoI Align: roi_output_size x roi_output_size bins of roi_sampling_ratio^2 samples; the level
  /// of a RoI by Note [FPN level of a RoI].
  int64_t roi_output_size = 7;
  int64_t roi_sampling_ratio = 2;
  double canonical_scale = 224;
  int canonical_level = 4;
  /// Units of the box head's two fully connected layers.
  int64_t representation_size = 1024;
  /// The RoI head's offsets are bbox_to_loc times these (dy, dx, dh, dw).
  std::vector<double> box_coder_weights = {10, 10, 5, 5};
  /// predict(): class probabilities of at least score_threshold, non-maximum suppression per class
  /// at nms_threshold, at most max_detections per image.
  double score_threshold = 0.05;
  double nms_threshold = 0.5;
  int64_t max_detections = 100;
};

/// The RPN's outputs for a batch: every anchor of every level, in the anchors' order.
struct RPNOutputs {
  Variable objectness;  ///< (N, anchors) logits
  Variable locs;        ///< (N, anchors, 4) offsets from the anchors (bbox_to_loc's form)
  Array anchors;        ///< float32 (anchors, 4), on the outputs' device
  /// The same anchors on the CPU, which proposals() reads (it copies `anchors` when this is
  /// undefined). Both are the model's cached arrays, shared between calls at one input size: do
  /// not write into them.
  Array host_anchors;
  /// The anchors of each level, in order (they sum to the anchor count).
  std::vector<int64_t> anchors_per_level;
};

/// The RoIs of a batch that train the RoI head, with their targets (CPU arrays).
struct RoISamples {
  Array rois;         ///< float32 (R, 4)
  Array roi_indices;  ///< int32 (R,): the image of each RoI
  Array labels;       ///< int32 (R,): 0 for background, c + 1 for a RoI of class c
  Array locs;         ///< float32 (R, 4): the weighted offsets onto its box; 0 for background
  /// Foreground RoIs in the batch.
  int64_t positives = 0;
};

/// The RoI head's outputs, one row per RoI.
struct RoIHeadOutputs {
  Variable scores;  ///< (R, num_classes + 1) logits, background first
  Variable locs;    ///< (R, num_classes + 1, 4) weighted offsets of each class's box
};

/// The parts of Faster R-CNN's loss (Note [Faster R-CNN layout]).
struct FasterRCNNLoss {
  Variable total;           ///< the sum of the four
  Variable rpn_objectness;  ///< sigmoid cross entropy of the sampled anchors
  Variable rpn_loc;         ///< smooth L1 of the sampled positive anchors' offsets
  Variable roi_cls;         ///< softmax cross entropy of the sampled RoIs
  Variable roi_loc;         ///< smooth L1 of the foreground RoIs' own-class offsets
};

/// The pyramid level of each RoI of rois (R, 4) (Note [FPN level of a RoI]): floor(
/// canonical_level + log2(sqrt(area) / canonical_scale) + 1e-6) clamped to [min_level,
/// max_level].
std::vector<int64_t> fpn_roi_levels(const Array& rois, int min_level, int max_level,
                                    double canonical_scale = 224, int canonical_level = 4);

/// Faster R-CNN with a feature pyramid; see Note [Faster R-CNN layout].
class FasterRCNN : public Chain {
 public:
  /// Random sampling (RPN anchors, RoIs) draws from `generator` when given (it must outlive the
  /// model), else from kusari's default generator.
  explicit FasterRCNN(const FasterRCNNOptions& options = {}, Generator* generator = nullptr);

  /// The pyramid's levels P_min_level ... P_max_level of images x (N, 3, H, W).
  std::vector<Variable> features(const Variable& x);
  /// The RPN's outputs on the pyramid's levels, with the anchors.
  RPNOutputs rpn_outputs(const std::vector<Variable>& features);
  /// Each image's proposals (P_i, 4), float32 CPU arrays inside [0, height] x [0, width], at most
  /// the post-NMS top-k of `training` or of test, best first (Note [Faster R-CNN layout], 3).
  std::vector<Array> proposals(const RPNOutputs& rpn, int64_t height, int64_t width,
                               bool training) const;
  /// The RoIs that train the head: each image's proposals and ground-truth boxes, matched and
  /// sampled (Note [Faster R-CNN layout], 4); foreground first within each image.
  RoISamples sample_rois(const std::vector<Array>& proposals, const std::vector<Array>& bboxes,
                         const std::vector<Array>& labels);
  /// The RoI head on rois (R, 4) of images roi_indices (R,) (integer) of the features.
  RoIHeadOutputs roi_head(const std::vector<Variable>& features, const Array& rois,
                          const Array& roi_indices);
  /// The loss of images x (N, 3, H, W) against each image's boxes (G_i, 4) and labels (G_i,)
  /// in 0 ... num_classes - 1.
  FasterRCNNLoss loss(const Variable& x, const std::vector<Array>& bboxes,
                      const std::vector<Array>& labels);
  /// The detections of images x (N, 3, H, W) in test mode, without building a graph.
  Detections predict(const Variable& x);
  /// The detections of images x in the current mode (training mode's batch statistics when
  /// TrainMode is on), without building a graph: predict() without switching to test mode.
  Detections detections(const Variable& x);

  /// The options it was built with.
  const FasterRCNNOptions& options() const { return options_; }
  /// Anchors per position (the ratios).
  int64_t anchors_per_position() const { return static_cast<int64_t>(options_.ratios.size()); }

  /// The backbone's stem and stages, and the pyramid (as RetinaNet's).
  std::shared_ptr<Chain> backbone, fpn;
  /// The RPN: "conv" (3x3), "objectness" and "loc" (1x1).
  std::shared_ptr<Chain> rpn_head;
  /// The RoI head: "fc6", "fc7", "cls", "loc".
  std::shared_ptr<Chain> box_head;

 protected:
  const char* type_name() const override { return "FasterRCNN"; }

 private:
  Generator& generator() const;
  // Checks x, bboxes and labels for loss(); `fn` names the caller.
  void check_targets(const Variable& x, const std::vector<Array>& bboxes,
                     const std::vector<Array>& labels, const char* fn) const;

  FasterRCNNOptions options_;
  Generator* generator_;
  std::shared_ptr<detail::BackbonePyramid> pyramid_;
  std::shared_ptr<detail::AnchorCache> anchors_;  // Note [Anchor cache]
  std::shared_ptr<links::Convolution2D> rpn_conv_, rpn_objectness_, rpn_loc_;
  std::shared_ptr<links::Linear> fc6_, fc7_, cls_, loc_;
};

/// Faster R-CNN with a ResNet-50 backbone and levels 2 ... 6 (torchvision's
/// fasterrcnn_resnet50_fpn layout); `options` gives the classes and any other setting.
std::shared_ptr<FasterRCNN> faster_rcnn_resnet50_fpn(FasterRCNNOptions options = {});

}  // namespace kusari::models
