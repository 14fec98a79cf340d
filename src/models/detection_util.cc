#include "models/detection_util.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>

#include "kusari/core/error.h"
#include "kusari/core/routines.h"
#include "kusari/functions.h"

namespace kusari::models::detail {

namespace F = functions;

std::vector<double> host_boxes(const Array& a, const char* fn, const char* name) {
  KUSARI_CHECK(a.defined(), ShapeError, fn, ": ", name,
               " must be floating (R, 4) boxes (y_min, x_min, y_max, x_max), got an undefined "
               "array");
  KUSARI_CHECK(a.ndim() == 2 && a.shape()[1] == 4 && is_floating(a.dtype()), ShapeError, fn, ": ",
               name, " must be floating (R, 4) boxes (y_min, x_min, y_max, x_max), got ", a.dtype(),
               " ", a.shape());
  return a.astype(float64).to_device(Device::cpu()).to_vector<double>();
}

double iou(const double* a, const double* b) {
  const double h = std::min(a[2], b[2]) - std::max(a[0], b[0]);
  const double w = std::min(a[3], b[3]) - std::max(a[1], b[1]);
  if (h <= 0 || w <= 0) return 0.0;
  const double inter = h * w;
  const double uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
  return uni > 0 ? inter / uni : 0.0;
}

void decode_box(const float* src, const float* loc, const double weights[4], int64_t height,
                int64_t width, float* out) {
  const double clamp = std::log(1000.0 / 16);
  const double sh = src[2] - src[0], sw = src[3] - src[1];
  const double cy = src[0] + 0.5 * sh + loc[0] / weights[0] * sh;
  const double cx = src[1] + 0.5 * sw + loc[1] / weights[1] * sw;
  const double h = sh * std::exp(std::min<double>(loc[2] / weights[2], clamp));
  const double w = sw * std::exp(std::min<double>(loc[3] / weights[3], clamp));
  const auto clip = [](double v, int64_t hi) {
    return static_cast<float>(std::clamp(v, 0.0, static_cast<double>(hi)));
  };
  out[0] = clip(cy - h / 2, height);
  out[1] = clip(cx - w / 2, width);
  out[2] = clip(cy + h / 2, height);
  out[3] = clip(cx + w / 2, width);
}

void append_detections(Detections& d, const std::vector<float>& boxes,
                       const std::vector<float>& scores, const std::vector<int32_t>& classes,
                       double nms_threshold, int64_t max_detections) {
  const int64_t r = static_cast<int64_t>(scores.size());
  const std::vector<int32_t> keep =
      F::non_maximum_suppression(Array::from_vector(boxes, Shape{r, 4}), nms_threshold,
                                 Array::from_vector(scores, Shape{r}), max_detections,
                                 Array::from_vector(classes, Shape{r}))
          .to_vector<int32_t>();
  std::vector<float> out_boxes, out_scores;
  std::vector<int32_t> out_labels;
  for (int32_t j : keep) {
    out_boxes.insert(out_boxes.end(), boxes.begin() + 4 * j, boxes.begin() + 4 * j + 4);
    out_scores.push_back(scores[static_cast<size_t>(j)]);
    out_labels.push_back(classes[static_cast<size_t>(j)]);
  }
  const int64_t kept = static_cast<int64_t>(keep.size());
  d.bboxes.push_back(Array::from_vector(out_boxes, Shape{kept, 4}));
  d.scores.push_back(Array::from_vector(out_scores, Shape{kept}));
  d.labels.push_back(Array::from_vector(out_labels, Shape{kept}));
}

AnchorCache::AnchorCache(std::vector<double> ratios, std::vector<double> scales, size_t capacity)
    : ratios_(std::move(ratios)),
      scales_(std::move(scales)),
      capacity_(std::max<size_t>(capacity, 1)) {}

PyramidAnchors AnchorCache::get(const std::vector<AnchorLevel>& levels, Device device) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&levels](const Entry& e) { return e.levels == levels; });
  if (it != entries_.end()) {
    entries_.splice(entries_.begin(), entries_, it);
  } else {
    Entry e;
    e.levels = levels;
    std::vector<Array> parts;
    for (const AnchorLevel& l : levels) {
      parts.push_back(generate_anchors(l.height, l.width, l.stride, l.size, ratios_, scales_));
      e.per_level.push_back(parts.back().shape()[0]);
    }
    e.host = parts.size() == 1 ? parts[0] : concatenate(parts, 0);
    entries_.push_front(std::move(e));
    if (entries_.size() > capacity_) entries_.pop_back();
  }
  Entry& e = entries_.front();
  PyramidAnchors out;
  out.host = e.host;
  out.per_level = e.per_level;
  if (device == e.host.device()) {
    out.device = e.host;
  } else {
    auto copy = std::find_if(e.copies.begin(), e.copies.end(),
                             [device](const auto& c) { return c.first == device; });
    if (copy == e.copies.end()) {
      e.copies.emplace_back(device, e.host.to_device(device));
      copy = std::prev(e.copies.end());
    }
    out.device = copy->second;
  }
  return out;
}

Array host_anchors(const Array& anchors, const Array& host) {
  if (host.defined() && host.device().is_cpu() && anchors.defined() &&
      host.shape() == anchors.shape())
    return host;
  return anchors.to_device(Device::cpu());
}

std::shared_ptr<links::Convolution2D> conv(int64_t in, int64_t out, int64_t ksize, int64_t stride,
                                           std::shared_ptr<Initializer> w,
                                           std::shared_ptr<Initializer> b) {
  return std::make_shared<links::Convolution2D>(in, out, ksize, stride, ksize / 2, false,
                                                std::move(w), std::move(b));
}

Variable per_anchor(const Variable& x, int64_t channels) {
  const Shape& s = x.shape();
  const int64_t n = s[0], h = s[2], w = s[3], a = s[1] / channels;
  return F::reshape(F::transpose(x, {0, 2, 3, 1}), {n, h * w * a, channels});
}

namespace {

// Channels of stage C_level (2 ... 5) of the backbone.
int64_t stage_channels(const PyramidOptions& o, int level) {
  const int64_t expansion =
      o.block == ResNetBlock::kBasic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  return o.width * expansion << (level - 2);
}

}  // namespace

BackbonePyramid::BackbonePyramid(Chain& owner, const PyramidOptions& options, const char* who)
    : options_(options), who_(who) {
  const PyramidOptions& o = options_;
  KUSARI_CHECK(
      2 <= o.min_level && o.min_level <= 5 && o.min_level <= o.max_level && o.max_level <= 7,
      ValueError, who,
      ": the levels must satisfy 2 <= min_level <= 5 and min_level <= max_level <= 7, got "
      "min_level ",
      o.min_level, " and max_level ", o.max_level);
  KUSARI_CHECK(o.fpn_channels > 0, ValueError, who, ": fpn_channels must be positive, got ",
               o.fpn_channels);

  ResNetOptions backbone_options;
  backbone_options.width = o.width;
  resnet_ = std::make_shared<ResNet>(o.block, o.blocks_per_stage, backbone_options);
  backbone = owner.add_link("backbone", std::make_shared<Chain>());
  backbone->add_link("conv1", resnet_->conv1);
  backbone->add_link("bn1", resnet_->bn1);
  backbone->add_link("layer1", resnet_->layer1);
  backbone->add_link("layer2", resnet_->layer2);
  backbone->add_link("layer3", resnet_->layer3);
  backbone->add_link("layer4", resnet_->layer4);

  fpn = owner.add_link("fpn", std::make_shared<Chain>());
  const int64_t c = o.fpn_channels;
  for (int level = o.min_level; level <= std::min(o.max_level, 5); ++level) {
    lateral_.push_back(
        fpn->add_link("lateral" + std::to_string(level), conv(stage_channels(o, level), c, 1, 1)));
    output_.push_back(fpn->add_link("output" + std::to_string(level), conv(c, c, 3, 1)));
  }
  if (o.extra == ExtraLevels::kConvolution) {
    if (o.max_level >= 6) p6_ = fpn->add_link("p6", conv(stage_channels(o, 5), c, 3, 2));
    if (o.max_level >= 7) p7_ = fpn->add_link("p7", conv(c, c, 3, 2));
  }
}

std::vector<Variable> BackbonePyramid::operator()(const Variable& x) const {
  KUSARI_CHECK(x.ndim() == 4 && x.shape()[1] == 3, ShapeError, who_,
               ": expected images (N, 3, H, W), got ", x.shape());
  const PyramidOptions& o = options_;
  Variable h = resnet_->bn1->forward_relu((*resnet_->conv1)(x));
  h = F::max_pooling_2d(h, 3, 2, 1, /*cover_all=*/false);
  std::vector<Variable> stages;  // C2 ... C5
  stages.push_back((*resnet_->layer1)(h));
  stages.push_back((*resnet_->layer2)(stages.back()));
  stages.push_back((*resnet_->layer3)(stages.back()));
  stages.push_back((*resnet_->layer4)(stages.back()));
  const int top = std::min(o.max_level, 5);
  std::vector<Variable> levels(static_cast<size_t>(top - o.min_level + 1));
  Variable inner;
  for (int level = top; level >= o.min_level; --level) {
    const size_t i = static_cast<size_t>(level - o.min_level);
    Variable lateral = (*lateral_[i])(stages[static_cast<size_t>(level - 2)]);
    if (level < top) {
      // Nearest upsampling by 2, cropped to this level's size (an odd size rounds up above).
      Variable up = F::unpooling_2d(inner, 2, 2, 0, std::nullopt, /*cover_all=*/false);
      const int64_t lh = lateral.shape()[2], lw = lateral.shape()[3];
      if (up.shape()[2] != lh || up.shape()[3] != lw)
        up = F::get_item(up, {Slice(), Slice(), Slice(0, lh), Slice(0, lw)});
      lateral = lateral + up;
    }
    inner = lateral;
    levels[i] = (*output_[i])(inner);
  }
  for (int level = 6; level <= o.max_level; ++level) {
    if (o.extra == ExtraLevels::kMaxPooling) {
      levels.push_back(F::max_pooling_2d(levels.back(), 1, 2, 0, /*cover_all=*/false));
    } else if (level == 6) {
      levels.push_back((*p6_)(stages[3]));
    } else {
      levels.push_back((*p7_)(F::relu(levels.back())));
    }
  }
  return levels;
}

}  // namespace kusari::models::detail
