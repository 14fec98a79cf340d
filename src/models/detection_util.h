// What the detectors (retinanet.cc, faster_rcnn.cc) share (not installed): the ResNet backbone
// with its feature pyramid, the heads' output layout, and boxes on the host.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kusari/autograd/variable.h"
#include "kusari/links/convolution_2d.h"
#include "kusari/links/initializers.h"
#include "kusari/links/link.h"
#include "kusari/models/resnet.h"
#include "kusari/models/retinanet.h"

namespace kusari::models::detail {

/// The boxes of `a` as doubles, after checking that it is floating (R, 4); `fn` and `name` name
/// the caller and the argument in the ShapeError.
std::vector<double> host_boxes(const Array& a, const char* fn, const char* name);

/// The IoU of two boxes (y_min, x_min, y_max, x_max); 0 when they do not overlap.
double iou(const double* a, const double* b);

/// loc_to_bbox (functions/detection.h) of one reference box `src` and offsets `loc` divided by
/// `weights` (dy, dx, dh, dw; Faster R-CNN's box coding), with dh and dw clamped at log(1000 / 16)
/// (Detectron's), clipped to [0, height] x [0, width]; written to out[0 ... 3].
void decode_box(const float* src, const float* loc, const double weights[4], int64_t height,
                int64_t width, float* out);

/// Appends one image's detections to `d`: of the candidate boxes (R * 4 values), scores (R) and
/// classes (R), those that non-maximum suppression per class at nms_threshold keeps, at most
/// max_detections, highest score first.
void append_detections(Detections& d, const std::vector<float>& boxes,
                       const std::vector<float>& scores, const std::vector<int32_t>& classes,
                       double nms_threshold, int64_t max_detections);

// Note [Anchor cache]
// A pyramid's anchors depend only on each level's size, stride and anchor size and on the ratios
// and scales, never on the pictures: a detector makes them once per input size, on the host,
// where the matching (match_anchors) and the read-out (proposals, detections) use them, and
// copies them once to each device its outputs live on. Its AnchorCache keeps the last few input
// sizes' anchors (least recently used out), so a step at a size seen before reads them without
// generating, concatenating or copying anything: the outputs' `anchors` (on the outputs' device)
// and `host_anchors` (on the CPU) are the cache's arrays themselves, shared, not to be written
// into. A step at a new size (multi-scale training) builds them as before.

/// The settings of one level's anchors: generate_anchors(height, width, stride, size, ...).
struct AnchorLevel {
  int64_t height = 0, width = 0;
  double stride = 0, size = 0;
  friend bool operator==(const AnchorLevel&, const AnchorLevel&) = default;
};

/// The anchors of every level of a pyramid, concatenated in level order (Note [Anchor cache]).
struct PyramidAnchors {
  Array host;    ///< float32 (anchors, 4) on the CPU
  Array device;  ///< the same on the device asked for (`host` itself on the CPU)
  /// The anchors of each level, in order (they sum to the anchor count).
  std::vector<int64_t> per_level;
};

/// A detector's anchors per input size (Note [Anchor cache]); safe to call from several threads.
class AnchorCache {
 public:
  /// The anchors of levels made with `ratios` and `scales`; at most `capacity` (at least 1) input
  /// sizes are kept.
  AnchorCache(std::vector<double> ratios, std::vector<double> scales, size_t capacity = 8);

  /// The anchors of `levels`, with a copy on `device`: the cached arrays when these levels were
  /// asked for before (and, for the copy, that device), else made and cached.
  PyramidAnchors get(const std::vector<AnchorLevel>& levels, Device device);

 private:
  struct Entry {
    std::vector<AnchorLevel> levels;
    Array host;
    std::vector<int64_t> per_level;
    std::vector<std::pair<Device, Array>> copies;  // host to each other device, made on demand
  };

  std::vector<double> ratios_, scales_;
  size_t capacity_;
  std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
};

/// The host copy of `anchors` for the read-out: `host` when it is defined and of the same shape
/// (the outputs' own, Note [Anchor cache]), else `anchors` copied to the CPU (outputs a caller
/// put together without it).
Array host_anchors(const Array& anchors, const Array& host);

/// A convolution with padding ksize / 2 (a "same" convolution for odd sizes at stride 1).
std::shared_ptr<links::Convolution2D> conv(int64_t in, int64_t out, int64_t ksize, int64_t stride,
                                           std::shared_ptr<Initializer> w = nullptr,
                                           std::shared_ptr<Initializer> b = nullptr);

/// x (N, A * C, H, W) as (N, H * W * A, C): the anchors' order (Note [RetinaNet anchors and
/// targets]).
Variable per_anchor(const Variable& x, int64_t channels);

/// How the levels above 5 of a pyramid are made.
enum class ExtraLevels {
  kConvolution,  ///< P6 a 3x3 stride-2 convolution of C5, P7 one of relu(P6) (RetinaNet's)
  kMaxPooling,   ///< P6 = P5 subsampled by 2 (1x1 max pooling, stride 2; FPN's, torchvision's)
};

/// The backbone and pyramid of a detector.
struct PyramidOptions {
  ResNetBlock block = ResNetBlock::kBottleneck;
  std::vector<int64_t> blocks_per_stage;
  int64_t width = 64;
  int64_t fpn_channels = 256;
  int min_level = 3;
  int max_level = 7;
  ExtraLevels extra = ExtraLevels::kConvolution;
};

/// A ResNet backbone without its pooling and classifier and a feature pyramid of levels
/// min_level ... max_level over it (Note [RetinaNet layout]; levels above 5 as `extra` says).
class BackbonePyramid {
 public:
  /// Makes the links and registers them as `owner`'s children "backbone" (conv1, bn1, layer1 ...
  /// layer4) and "fpn" (lateral<l>, output<l>, p6, p7). Checks the levels and the channels,
  /// naming `who` (the model) in the ValueError.
  BackbonePyramid(Chain& owner, const PyramidOptions& options, const char* who);

  /// P_min_level ... P_max_level of images x (N, 3, H, W), level l of stride 2^l (rounded up).
  /// A ShapeError naming `who` for x of another shape.
  std::vector<Variable> operator()(const Variable& x) const;

  std::shared_ptr<Chain> backbone, fpn;

 private:
  PyramidOptions options_;
  std::string who_;
  std::shared_ptr<ResNet> resnet_;  // owns the backbone's links (its fc is not a child)
  std::vector<std::shared_ptr<links::Convolution2D>> lateral_, output_;
  std::shared_ptr<links::Convolution2D> p6_, p7_;
};

}  // namespace kusari::models::detail
