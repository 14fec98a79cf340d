// Faster R-CNN (Note [Faster R-CNN layout] in faster_rcnn.h).
#include "kusari/models/faster_rcnn.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "kusari/autograd/mode.h"
#include "kusari/core/error.h"
#include "kusari/core/routines.h"
#include "kusari/datasets/permutation.h"
#include "kusari/functions.h"
#include "kusari/links/initializers.h"
#include "models/detection_util.h"

namespace kusari::models {
namespace {

namespace F = functions;
using detail::conv;
using detail::host_boxes;
using detail::per_anchor;

// The smooth L1 loss's beta in both heads (Note [Faster R-CNN layout], 6).
constexpr double kBeta = 1.0 / 9.0;
// Boxes of predict() with a side below this are dropped (torchvision's).
constexpr double kMinDetectionSize = 1e-2;
constexpr double kUnitWeights[4] = {1, 1, 1, 1};

// Draws, without replacement, at most batch * fraction of `positive` and then negatives up to
// `batch` in all (torchvision's BalancedPositiveNegativeSampler); the two lists are cut to the
// drawn indices, each in the order drawn.
void sample_balanced(std::vector<int64_t>& positive, std::vector<int64_t>& negative, int64_t batch,
                     double fraction, Generator& gen) {
  const auto draw = [&gen](std::vector<int64_t>& v, int64_t keep) {
    const std::vector<int64_t> p = random_permutation(static_cast<int64_t>(v.size()), gen);
    std::vector<int64_t> out;
    for (int64_t k = 0; k < keep; ++k)
      out.push_back(v[static_cast<size_t>(p[static_cast<size_t>(k)])]);
    v = std::move(out);
  };
  const int64_t pos = std::min(static_cast<int64_t>(positive.size()),
                               static_cast<int64_t>(static_cast<double>(batch) * fraction));
  const int64_t neg = std::min(static_cast<int64_t>(negative.size()), batch - pos);
  draw(positive, pos);
  draw(negative, neg);
}

// The indices of the `keep` largest of v[begin, end), largest first (ties: lower index first).
std::vector<int64_t> top_k(const std::vector<float>& v, int64_t begin, int64_t end, int64_t keep) {
  std::vector<int64_t> idx(static_cast<size_t>(end - begin));
  std::iota(idx.begin(), idx.end(), begin);
  const size_t k = std::min(idx.size(), static_cast<size_t>(std::max<int64_t>(keep, 0)));
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                    [&v](int64_t a, int64_t b) {
                      const float x = v[static_cast<size_t>(a)], y = v[static_cast<size_t>(b)];
                      return x > y || (x == y && a < b);
                    });
  idx.resize(k);
  return idx;
}

// values (rows * last) as a float32 array (rows, last) of `dtype` on `device`.
Array device_array(const std::vector<float>& values, const Shape& shape, Dtype dtype,
                   Device device) {
  return Array::from_vector(values, shape).to_device(device).astype(dtype);
}

}  // namespace

std::vector<int64_t> fpn_roi_levels(const Array& rois, int min_level, int max_level,
                                    double canonical_scale, int canonical_level) {
  const char* fn = "fpn_roi_levels";
  KUSARI_CHECK(min_level <= max_level, ValueError, fn,
               ": needs min_level <= max_level, got min_level ", min_level, " and max_level ",
               max_level);
  KUSARI_CHECK(canonical_scale > 0, ValueError, fn, ": canonical_scale must be positive, got ",
               canonical_scale);
  const std::vector<double> b = host_boxes(rois, fn, "rois");
  std::vector<int64_t> levels(b.size() / 4);
  for (size_t r = 0; r < levels.size(); ++r) {
    const double area =
        std::max(b[4 * r + 2] - b[4 * r], 0.0) * std::max(b[4 * r + 3] - b[4 * r + 1], 0.0);
    // log2(0) is -inf: an empty RoI goes to the lowest level.
    const double k =
        std::floor(canonical_level + std::log2(std::sqrt(area) / canonical_scale) + 1e-6);
    levels[r] = static_cast<int64_t>(
        std::clamp(k, static_cast<double>(min_level), static_cast<double>(max_level)));
  }
  return levels;
}

FasterRCNN::FasterRCNN(const FasterRCNNOptions& options, Generator* generator)
    : options_(options), generator_(generator) {
  const FasterRCNNOptions& o = options_;
  const char* fn = "FasterRCNN";
  KUSARI_CHECK(o.num_classes > 0, ValueError, fn, ": num_classes must be positive, got ",
               o.num_classes);
  detail::PyramidOptions pyramid;
  pyramid.block = o.block;
  pyramid.blocks_per_stage = o.blocks_per_stage;
  pyramid.width = o.width;
  pyramid.fpn_channels = o.fpn_channels;
  pyramid.min_level = o.min_level;
  pyramid.max_level = o.max_level;
  pyramid.extra = detail::ExtraLevels::kMaxPooling;
  // The levels are checked first: the anchor sizes are counted against them.
  pyramid_ = std::make_shared<detail::BackbonePyramid>(*this, pyramid, fn);
  backbone = pyramid_->backbone;
  fpn = pyramid_->fpn;

  const int64_t levels = o.max_level - o.min_level + 1;
  KUSARI_CHECK(static_cast<int64_t>(o.anchor_sizes.size()) == levels, ValueError, fn,
               ": needs one anchor size per level (", levels, " for levels ", o.min_level, " ... ",
               o.max_level, "), got ", o.anchor_sizes.size());
  for (double s : o.anchor_sizes)
    KUSARI_CHECK(s > 0, ValueError, fn, ": anchor sizes must be positive, got ", s);
  KUSARI_CHECK(o.rpn_pre_nms_top_n_train > 0 && o.rpn_pre_nms_top_n_test > 0 &&
                   o.rpn_post_nms_top_n_train > 0 && o.rpn_post_nms_top_n_test > 0,
               ValueError, fn, ": the RPN's top-ks must be positive, got pre-NMS ",
               o.rpn_pre_nms_top_n_train, " (train) and ", o.rpn_pre_nms_top_n_test,
               " (test), post-NMS ", o.rpn_post_nms_top_n_train, " (train) and ",
               o.rpn_post_nms_top_n_test, " (test)");
  KUSARI_CHECK(o.rpn_batch_size_per_image > 0 && o.roi_batch_size_per_image > 0, ValueError, fn,
               ": the sampled anchors and RoIs per image must be positive, got ",
               o.rpn_batch_size_per_image, " and ", o.roi_batch_size_per_image);
  KUSARI_CHECK(o.rpn_positive_fraction >= 0 && o.rpn_positive_fraction <= 1 &&
                   o.roi_positive_fraction >= 0 && o.roi_positive_fraction <= 1,
               ValueError, fn, ": the positive fractions must be in [0, 1], got ",
               o.rpn_positive_fraction, " (RPN) and ", o.roi_positive_fraction, " (RoI)");
  KUSARI_CHECK(o.roi_positive_iou >= 0 && o.roi_positive_iou <= 1, ValueError, fn,
               ": roi_positive_iou must be in [0, 1], got ", o.roi_positive_iou);
  KUSARI_CHECK(o.roi_output_size > 0 && o.roi_sampling_ratio > 0 && o.representation_size > 0,
               ValueError, fn,
               ": roi_output_size, roi_sampling_ratio and representation_size must be positive, "
               "got ",
               o.roi_output_size, ", ", o.roi_sampling_ratio, " and ", o.representation_size);
  KUSARI_CHECK(o.box_coder_weights.size() == 4 &&
                   std::all_of(o.box_coder_weights.begin(), o.box_coder_weights.end(),
                               [](double w) { return w > 0; }),
               ValueError, fn, ": box_coder_weights must be 4 positive numbers, got ",
               o.box_coder_weights.size(), " of them");
  KUSARI_CHECK(o.max_detections >= 0, ValueError, fn, ": max_detections must be at least 0, got ",
               o.max_detections);
  // generate_anchors and match_anchors check the ratios and the RPN's thresholds; check them here
  // too so that a bad setting fails when the model is made.
  generate_anchors(1, 1, 1.0, 1.0, o.ratios, {1.0});
  anchors_ = std::make_shared<detail::AnchorCache>(o.ratios, std::vector<double>{1.0});
  match_anchors(Array::zeros({0, 4}), Array::zeros({0, 4}), Array::zeros({0}, int32),
                o.rpn_positive_iou, o.rpn_negative_iou);

  const int64_t c = o.fpn_channels, a = anchors_per_position();
  const auto normal = [](double s) { return std::make_shared<initializers::Normal>(s); };
  const auto zero = [] { return std::make_shared<initializers::Constant>(0.0); };
  rpn_head = add_link("rpn", std::make_shared<Chain>());
  rpn_conv_ = rpn_head->add_link("conv", conv(c, c, 3, 1, normal(0.01), zero()));
  rpn_objectness_ = rpn_head->add_link("objectness", conv(c, a, 1, 1, normal(0.01), zero()));
  rpn_loc_ = rpn_head->add_link("loc", conv(c, 4 * a, 1, 1, normal(0.01), zero()));

  const int64_t k = o.num_classes + 1, r = o.representation_size;
  box_head = add_link("box_head", std::make_shared<Chain>());
  fc6_ = box_head->add_link(
      "fc6", std::make_shared<links::Linear>(c * o.roi_output_size * o.roi_output_size, r));
  fc7_ = box_head->add_link("fc7", std::make_shared<links::Linear>(r, r));
  cls_ =
      box_head->add_link("cls", std::make_shared<links::Linear>(r, k, false, normal(0.01), zero()));
  loc_ = box_head->add_link(
      "loc", std::make_shared<links::Linear>(r, 4 * k, false, normal(0.001), zero()));
}

Generator& FasterRCNN::generator() const {
  return generator_ ? *generator_ : default_generator();
}

std::vector<Variable> FasterRCNN::features(const Variable& x) {
  return (*pyramid_)(x);
}

RPNOutputs FasterRCNN::rpn_outputs(const std::vector<Variable>& features) {
  const FasterRCNNOptions& o = options_;
  KUSARI_CHECK(static_cast<int>(features.size()) == o.max_level - o.min_level + 1, ValueError,
               "FasterRCNN::rpn_outputs: expected the ", o.max_level - o.min_level + 1,
               " levels of features(), got ", features.size());
  RPNOutputs out;
  std::vector<Variable> scores, locs;
  std::vector<detail::AnchorLevel> levels;
  for (size_t i = 0; i < features.size(); ++i) {
    const double stride = std::ldexp(1.0, o.min_level + static_cast<int>(i));
    const Variable& p = features[i];
    const Variable h = F::relu((*rpn_conv_)(p));
    scores.push_back(per_anchor((*rpn_objectness_)(h), 1));
    locs.push_back(per_anchor((*rpn_loc_)(h), 4));
    levels.push_back({p.shape()[2], p.shape()[3], stride, o.anchor_sizes[i]});
  }
  const Variable s = scores.size() == 1 ? scores[0] : F::concat(scores, 1);
  out.objectness = F::reshape(s, {s.shape()[0], s.shape()[1]});
  out.locs = locs.size() == 1 ? locs[0] : F::concat(locs, 1);
  detail::PyramidAnchors anchors = anchors_->get(levels, features[0].device());
  out.anchors = std::move(anchors.device);
  out.host_anchors = std::move(anchors.host);
  out.anchors_per_level = std::move(anchors.per_level);
  return out;
}

std::vector<Array> FasterRCNN::proposals(const RPNOutputs& rpn, int64_t height, int64_t width,
                                         bool training) const {
  const FasterRCNNOptions& o = options_;
  const int64_t pre = training ? o.rpn_pre_nms_top_n_train : o.rpn_pre_nms_top_n_test;
  const int64_t post = training ? o.rpn_post_nms_top_n_train : o.rpn_post_nms_top_n_test;
  const Array cpu_scores = rpn.objectness.data().astype(float32).to_device(Device::cpu());
  const std::vector<float> scores = cpu_scores.to_vector<float>();
  const std::vector<float> locs =
      rpn.locs.data().astype(float32).to_device(Device::cpu()).to_vector<float>();
  const std::vector<float> anchors =
      detail::host_anchors(rpn.anchors, rpn.host_anchors).astype(float32).to_vector<float>();
  const int64_t n = cpu_scores.shape()[0], na = cpu_scores.shape()[1];
  std::vector<Array> out;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> boxes, kept_scores;
    std::vector<int32_t> levels;
    int64_t begin = 0;
    for (size_t level = 0; level < rpn.anchors_per_level.size(); ++level) {
      const int64_t end = begin + rpn.anchors_per_level[level];
      for (int64_t j : top_k(scores, i * na + begin, i * na + end, pre)) {
        const int64_t anchor = j - i * na;
        float box[4];
        detail::decode_box(&anchors[static_cast<size_t>(4 * anchor)],
                           &locs[static_cast<size_t>(4 * j)], kUnitWeights, height, width, box);
        if (box[2] - box[0] < o.rpn_min_size || box[3] - box[1] < o.rpn_min_size) continue;
        boxes.insert(boxes.end(), box, box + 4);
        kept_scores.push_back(scores[static_cast<size_t>(j)]);
        levels.push_back(static_cast<int32_t>(level));
      }
      begin = end;
    }
    const int64_t r = static_cast<int64_t>(kept_scores.size());
    const std::vector<int32_t> keep =
        F::non_maximum_suppression(Array::from_vector(boxes, Shape{r, 4}), o.rpn_nms_threshold,
                                   Array::from_vector(kept_scores, Shape{r}), post,
                                   Array::from_vector(levels, Shape{r}))
            .to_vector<int32_t>();
    std::vector<float> kept;
    for (int32_t j : keep)
      kept.insert(kept.end(), boxes.begin() + 4 * j, boxes.begin() + 4 * j + 4);
    out.push_back(Array::from_vector(kept, Shape{static_cast<int64_t>(keep.size()), 4}));
  }
  return out;
}

RoISamples FasterRCNN::sample_rois(const std::vector<Array>& proposals,
                                   const std::vector<Array>& bboxes,
                                   const std::vector<Array>& labels) {
  const FasterRCNNOptions& o = options_;
  const char* fn = "FasterRCNN::sample_rois";
  KUSARI_CHECK(proposals.size() == bboxes.size() && proposals.size() == labels.size(), ValueError,
               fn, ": needs the proposals, boxes and labels of each image, got ", proposals.size(),
               " proposals, ", bboxes.size(), " boxes and ", labels.size(), " labels");
  std::vector<float> rois, locs;
  std::vector<int32_t> images, classes;
  int64_t positives = 0;
  for (size_t i = 0; i < proposals.size(); ++i) {
    // The proposals, then the ground-truth boxes (so that every box has a foreground RoI).
    std::vector<float> candidates =
        proposals[i].astype(float32).to_device(Device::cpu()).to_vector<float>();
    const std::string name = "bboxes[" + std::to_string(i) + "]";
    const std::vector<double> gt = host_boxes(bboxes[i], fn, name.c_str());
    for (double v : gt) candidates.push_back(static_cast<float>(v));
    const int64_t nc = static_cast<int64_t>(candidates.size() / 4);
    const AnchorTargets t = match_anchors(Array::from_vector(candidates, Shape{nc, 4}), bboxes[i],
                                          labels[i], o.roi_positive_iou, o.roi_positive_iou,
                                          /*low_quality_matches=*/false);
    const std::vector<int32_t> matched_class = t.labels.to_vector<int32_t>();
    const std::vector<float> offsets = t.locs.to_vector<float>();
    std::vector<int64_t> pos, neg;
    for (int64_t j = 0; j < nc; ++j)
      (matched_class[static_cast<size_t>(j)] >= 0 ? pos : neg).push_back(j);
    sample_balanced(pos, neg, o.roi_batch_size_per_image, o.roi_positive_fraction, generator());
    positives += static_cast<int64_t>(pos.size());
    for (const std::vector<int64_t>* part : {&pos, &neg}) {
      for (int64_t j : *part) {
        const size_t row = static_cast<size_t>(j);
        rois.insert(rois.end(), candidates.begin() + 4 * j, candidates.begin() + 4 * j + 4);
        images.push_back(static_cast<int32_t>(i));
        const bool foreground = part == &pos;
        classes.push_back(foreground ? matched_class[row] + 1 : 0);
        for (size_t d = 0; d < 4; ++d)
          locs.push_back(foreground
                             ? static_cast<float>(offsets[4 * row + d] * o.box_coder_weights[d])
                             : 0.0f);
      }
    }
  }
  const int64_t r = static_cast<int64_t>(images.size());
  RoISamples s;
  s.rois = Array::from_vector(rois, Shape{r, 4});
  s.roi_indices = Array::from_vector(images, Shape{r});
  s.labels = Array::from_vector(classes, Shape{r});
  s.locs = Array::from_vector(locs, Shape{r, 4});
  s.positives = positives;
  return s;
}

RoIHeadOutputs FasterRCNN::roi_head(const std::vector<Variable>& features, const Array& rois,
                                    const Array& roi_indices) {
  const FasterRCNNOptions& o = options_;
  const char* fn = "FasterRCNN::roi_head";
  KUSARI_CHECK(static_cast<int>(features.size()) == o.max_level - o.min_level + 1, ValueError, fn,
               ": expected the ", o.max_level - o.min_level + 1, " levels of features(), got ",
               features.size());
  const std::vector<double> boxes = host_boxes(rois, fn, "rois");
  const int64_t r = rois.shape()[0];
  KUSARI_CHECK(roi_indices.defined() && roi_indices.ndim() == 1 && roi_indices.shape()[0] == r &&
                   is_integral(roi_indices.dtype()),
               ShapeError, fn, ": roi_indices must be integer (R,) with R = ", r,
               " (the rows of rois), got ", roi_indices.defined() ? roi_indices.shape() : Shape{});
  const int top = std::min(o.max_level, 5);
  const std::vector<int64_t> level =
      fpn_roi_levels(rois, o.min_level, top, o.canonical_scale, o.canonical_level);
  const std::vector<int64_t> image =
      roi_indices.astype(int64).to_device(Device::cpu()).to_vector<int64_t>();
  const int64_t s = o.roi_output_size, c = o.fpn_channels;
  // The RoIs grouped by level, then by image (roi_average_align_2d runs one pair of products per
  // run of one image's RoIs); `order` is the grouped order, undone after pooling.
  std::vector<int64_t> order(static_cast<size_t>(r));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::pair(level[static_cast<size_t>(a)], image[static_cast<size_t>(a)]) <
           std::pair(level[static_cast<size_t>(b)], image[static_cast<size_t>(b)]);
  });
  std::vector<Variable> parts;
  for (size_t first = 0; first < order.size();) {
    const int64_t l = level[static_cast<size_t>(order[first])];
    size_t end = first;
    std::vector<float> part_boxes;
    std::vector<int32_t> part_images;
    for (; end < order.size() && level[static_cast<size_t>(order[end])] == l; ++end) {
      const size_t j = static_cast<size_t>(order[end]);
      for (size_t d = 0; d < 4; ++d) part_boxes.push_back(static_cast<float>(boxes[4 * j + d]));
      part_images.push_back(static_cast<int32_t>(image[j]));
    }
    const int64_t k = static_cast<int64_t>(end - first);
    parts.push_back(F::roi_average_align_2d(
        features[static_cast<size_t>(l - o.min_level)], Array::from_vector(part_boxes, Shape{k, 4}),
        Array::from_vector(part_images, Shape{k}), Shape{s, s},
        std::ldexp(1.0, -static_cast<int>(l)), o.roi_sampling_ratio));
    first = end;
  }
  const Variable& f0 = features[0];
  Variable pooled = parts.empty() ? Variable(Array::zeros({0, c, s, s}, f0.dtype(), f0.device()))
                    : parts.size() == 1 ? parts[0]
                                        : F::concat(parts, 0);
  if (!std::is_sorted(order.begin(), order.end())) {
    std::vector<int64_t> inverse(order.size());
    for (size_t i = 0; i < order.size(); ++i)
      inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
    pooled = F::take(pooled, Array::from_vector(inverse, Shape{r}).to_device(f0.device()), 0);
  }
  Variable h = F::reshape(pooled, {r, c * s * s});
  h = F::relu((*fc6_)(h));
  h = F::relu((*fc7_)(h));
  RoIHeadOutputs out;
  out.scores = (*cls_)(h);
  out.locs = F::reshape((*loc_)(h), {r, o.num_classes + 1, 4});
  return out;
}

void FasterRCNN::check_targets(const Variable& x, const std::vector<Array>& bboxes,
                               const std::vector<Array>& labels, const char* fn) const {
  KUSARI_CHECK(x.ndim() == 4 && x.shape()[1] == 3, ShapeError, fn,
               ": expected images (N, 3, H, W), got ", x.shape());
  const int64_t n = x.shape()[0], k = options_.num_classes;
  KUSARI_CHECK(static_cast<int64_t>(bboxes.size()) == n && static_cast<int64_t>(labels.size()) == n,
               ValueError, fn, ": needs the boxes and labels of each of the ", n, " images, got ",
               bboxes.size(), " boxes and ", labels.size(), " labels");
  for (int64_t i = 0; i < n; ++i) {
    const Array& b = bboxes[static_cast<size_t>(i)];
    const Array& l = labels[static_cast<size_t>(i)];
    const std::string name = "bboxes[" + std::to_string(i) + "]";
    host_boxes(b, fn, name.c_str());
    const int64_t g = b.shape()[0];
    KUSARI_CHECK(l.defined() && l.ndim() == 1 && l.shape()[0] == g && is_integral(l.dtype()),
                 ShapeError, fn, ": labels[", i, "] must be integer (G,) with G = ", g,
                 " (the rows of bboxes[", i, "]), got ", l.defined() ? l.dtype() : int32, " ",
                 l.defined() ? l.shape() : Shape{});
    for (int64_t c : l.astype(int64).to_device(Device::cpu()).to_vector<int64_t>()) {
      KUSARI_CHECK(c >= 0 && c < k, ValueError, fn, ": image ", i, " has a box of class ", c,
                   ", but the model has ", k, " classes (labels 0 ... ", k - 1, ")");
    }
  }
}

FasterRCNNLoss FasterRCNN::loss(const Variable& x, const std::vector<Array>& bboxes,
                                const std::vector<Array>& labels) {
  const FasterRCNNOptions& o = options_;
  check_targets(x, bboxes, labels, "FasterRCNN::loss");
  const int64_t n = x.shape()[0], height = x.shape()[2], width = x.shape()[3];
  const std::vector<Variable> feats = features(x);
  const RPNOutputs rpn = rpn_outputs(feats);
  const Device device = x.device();
  const Dtype dtype = rpn.locs.dtype();

  // The RPN: matched, sampled anchors.
  const Array& anchors = rpn.host_anchors;
  const int64_t na = anchors.shape()[0];
  std::vector<int32_t> objectness(static_cast<size_t>(n * na), -1);
  std::vector<float> rpn_targets(static_cast<size_t>(n * na * 4), 0.0f);
  std::vector<float> rpn_mask(static_cast<size_t>(n * na * 4), 0.0f);
  int64_t rpn_sampled = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Array& b = bboxes[static_cast<size_t>(i)];
    const AnchorTargets t = match_anchors(anchors, b, Array::zeros({b.shape()[0]}, int32),
                                          o.rpn_positive_iou, o.rpn_negative_iou);
    const std::vector<int32_t> cls = t.labels.to_vector<int32_t>();
    const std::vector<float> loc = t.locs.to_vector<float>();
    std::vector<int64_t> pos, neg;
    for (int64_t j = 0; j < na; ++j) {
      const int32_t c = cls[static_cast<size_t>(j)];
      if (c >= 0) pos.push_back(j);
      if (c == -1) neg.push_back(j);
    }
    sample_balanced(pos, neg, o.rpn_batch_size_per_image, o.rpn_positive_fraction, generator());
    rpn_sampled += static_cast<int64_t>(pos.size() + neg.size());
    for (int64_t j : neg) objectness[static_cast<size_t>(i * na + j)] = 0;
    for (int64_t j : pos) {
      const size_t row = static_cast<size_t>(i * na + j);
      objectness[row] = 1;
      for (size_t d = 0; d < 4; ++d) {
        rpn_targets[4 * row + d] = loc[4 * static_cast<size_t>(j) + d];
        rpn_mask[4 * row + d] = 1.0f;
      }
    }
  }
  FasterRCNNLoss result;
  result.rpn_objectness = F::sigmoid_cross_entropy(
      rpn.objectness, Array::from_vector(objectness, Shape{n, na}).to_device(device));
  const Shape rpn_shape{n, na, 4};
  Variable rpn_smooth =
      F::huber_loss(rpn.locs, Variable(device_array(rpn_targets, rpn_shape, dtype, device)), kBeta,
                    F::HuberReduce::kNone);
  result.rpn_loc = F::sum(rpn_smooth * Variable(device_array(rpn_mask, rpn_shape, dtype, device))) /
                   (kBeta * static_cast<double>(std::max<int64_t>(rpn_sampled, 1)));

  // The RoI head: sampled proposals and boxes.
  const RoISamples samples =
      sample_rois(proposals(rpn, height, width, /*training=*/true), bboxes, labels);
  const RoIHeadOutputs head = roi_head(feats, samples.rois, samples.roi_indices);
  const int64_t r = samples.rois.shape()[0], k = o.num_classes + 1;
  result.roi_cls = F::softmax_cross_entropy(head.scores, samples.labels.to_device(device));
  // Each foreground RoI's offsets at its own class's slot; nothing elsewhere.
  const std::vector<int32_t> cls = samples.labels.to_vector<int32_t>();
  const std::vector<float> loc = samples.locs.to_vector<float>();
  std::vector<float> roi_targets(static_cast<size_t>(r * k * 4), 0.0f);
  std::vector<float> roi_mask(static_cast<size_t>(r * k * 4), 0.0f);
  for (int64_t j = 0; j < r; ++j) {
    const int32_t c = cls[static_cast<size_t>(j)];
    if (c == 0) continue;
    const size_t at = static_cast<size_t>((j * k + c) * 4);
    for (size_t d = 0; d < 4; ++d) {
      roi_targets[at + d] = loc[static_cast<size_t>(4 * j) + d];
      roi_mask[at + d] = 1.0f;
    }
  }
  const Shape roi_shape{r, k, 4};
  Variable roi_smooth =
      F::huber_loss(head.locs, Variable(device_array(roi_targets, roi_shape, dtype, device)), kBeta,
                    F::HuberReduce::kNone);
  result.roi_loc = F::sum(roi_smooth * Variable(device_array(roi_mask, roi_shape, dtype, device))) /
                   (kBeta * static_cast<double>(std::max<int64_t>(r, 1)));
  result.total = result.rpn_objectness + result.rpn_loc + result.roi_cls + result.roi_loc;
  return result;
}

Detections FasterRCNN::predict(const Variable& x) {
  TrainMode eval(false);
  return detections(x);
}

Detections FasterRCNN::detections(const Variable& x) {
  NoBackpropMode no_graph;
  const FasterRCNNOptions& o = options_;
  const std::vector<Variable> feats = features(x);
  const int64_t n = x.shape()[0], height = x.shape()[2], width = x.shape()[3];
  const std::vector<Array> props = proposals(rpn_outputs(feats), height, width, /*training=*/false);
  std::vector<int32_t> images;
  for (int64_t i = 0; i < n; ++i) {
    images.insert(images.end(), static_cast<size_t>(props[static_cast<size_t>(i)].shape()[0]),
                  static_cast<int32_t>(i));
  }
  const Array rois = concatenate(props, 0);
  const int64_t r = rois.shape()[0], k = o.num_classes + 1;
  std::vector<float> probs, locs;  // (R, K + 1) and (R, K + 1, 4)
  if (r > 0) {
    const RoIHeadOutputs head = roi_head(feats, rois, Array::from_vector(images, Shape{r}));
    probs =
        F::softmax(head.scores).data().astype(float32).to_device(Device::cpu()).to_vector<float>();
    locs = head.locs.data().astype(float32).to_device(Device::cpu()).to_vector<float>();
  }
  const std::vector<float> boxes_in = rois.to_vector<float>();
  Detections d;
  int64_t row = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> boxes, scores;
    std::vector<int32_t> classes;
    for (const int64_t end = row + props[static_cast<size_t>(i)].shape()[0]; row < end; ++row) {
      for (int64_t c = 1; c < k; ++c) {
        const float p = probs[static_cast<size_t>(row * k + c)];
        if (p < o.score_threshold) continue;
        float box[4];
        detail::decode_box(&boxes_in[static_cast<size_t>(4 * row)],
                           &locs[static_cast<size_t>((row * k + c) * 4)],
                           o.box_coder_weights.data(), height, width, box);
        if (box[2] - box[0] < kMinDetectionSize || box[3] - box[1] < kMinDetectionSize) continue;
        boxes.insert(boxes.end(), box, box + 4);
        scores.push_back(p);
        classes.push_back(static_cast<int32_t>(c - 1));
      }
    }
    detail::append_detections(d, boxes, scores, classes, o.nms_threshold, o.max_detections);
  }
  return d;
}

std::shared_ptr<FasterRCNN> faster_rcnn_resnet50_fpn(FasterRCNNOptions options) {
  options.block = ResNetBlock::kBottleneck;
  options.blocks_per_stage = {3, 4, 6, 3};
  options.width = 64;
  options.min_level = 2;
  options.max_level = 6;
  return std::make_shared<FasterRCNN>(options);
}

}  // namespace kusari::models
