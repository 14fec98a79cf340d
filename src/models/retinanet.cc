#include "kusari/models/retinanet.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

#include "kusari/autograd/mode.h"
#include "kusari/core/error.h"
#include "kusari/core/routines.h"
#include "kusari/functions.h"
#include "kusari/links/initializers.h"
#include "models/detection_util.h"

namespace kusari::models {
namespace {

namespace F = functions;
using detail::conv;
using detail::host_boxes;
using detail::iou;
using detail::per_anchor;

// A head: `convs` 3x3 convolutions with ReLU, then one to `outputs` channels whose bias starts at
// `bias` (Note [RetinaNet layout]).
std::shared_ptr<Sequential> head(int64_t channels, int64_t convs, int64_t outputs, double bias) {
  auto seq = std::make_shared<Sequential>();
  for (int64_t i = 0; i < convs; ++i) {
    seq->add(conv(channels, channels, 3, 1, std::make_shared<initializers::Normal>(0.01),
                  std::make_shared<initializers::Constant>(0.0)));
    seq->add([](const Variable& v) { return F::relu(v); });
  }
  seq->add(conv(channels, outputs, 3, 1, std::make_shared<initializers::Normal>(0.01),
                std::make_shared<initializers::Constant>(bias)));
  return seq;
}

}  // namespace

Array generate_anchors(int64_t height, int64_t width, double stride, double size,
                       const std::vector<double>& ratios, const std::vector<double>& scales,
                       Device device) {
  const char* fn = "generate_anchors";
  KUSARI_CHECK(height >= 0 && width >= 0, ValueError, fn,
               ": the feature map's size must not be negative, got ", height, " x ", width);
  KUSARI_CHECK(stride > 0 && size > 0, ValueError, fn,
               ": stride and size must be positive, got stride ", stride, " and size ", size);
  KUSARI_CHECK(!ratios.empty() && !scales.empty(), ValueError, fn,
               ": needs at least one ratio and one scale, got ", ratios.size(), " and ",
               scales.size());
  for (double r : ratios) KUSARI_CHECK(r > 0, ValueError, fn, ": ratios must be positive, got ", r);
  for (double s : scales) KUSARI_CHECK(s > 0, ValueError, fn, ": scales must be positive, got ", s);
  const int64_t per = static_cast<int64_t>(ratios.size() * scales.size());
  std::vector<float> out(static_cast<size_t>(height * width * per * 4));
  size_t k = 0;
  for (int64_t y = 0; y < height; ++y) {
    for (int64_t x = 0; x < width; ++x) {
      const double cy = (static_cast<double>(y) + 0.5) * stride;
      const double cx = (static_cast<double>(x) + 0.5) * stride;
      for (double r : ratios) {
        for (double s : scales) {
          const double h = size * s * std::sqrt(r), w = size * s / std::sqrt(r);
          out[k++] = static_cast<float>(cy - h / 2);
          out[k++] = static_cast<float>(cx - w / 2);
          out[k++] = static_cast<float>(cy + h / 2);
          out[k++] = static_cast<float>(cx + w / 2);
        }
      }
    }
  }
  return Array::from_vector(out, Shape{height * width * per, 4}).to_device(device);
}

AnchorTargets match_anchors(const Array& anchors, const Array& bbox, const Array& label,
                            double positive_iou, double negative_iou, bool low_quality_matches) {
  const char* fn = "match_anchors";
  KUSARI_CHECK(0 <= negative_iou && negative_iou <= positive_iou && positive_iou <= 1, ValueError,
               fn, ": needs 0 <= negative_iou <= positive_iou <= 1, got negative_iou ",
               negative_iou, " and positive_iou ", positive_iou);
  const std::vector<double> a = host_boxes(anchors, fn, "anchors");
  const std::vector<double> g = host_boxes(bbox, fn, "bbox");
  const int64_t na = anchors.shape()[0], ng = bbox.shape()[0];
  KUSARI_CHECK(label.ndim() == 1 && label.shape()[0] == ng && is_integral(label.dtype()),
               ShapeError, fn, ": label must be integer (G,) with G = ", ng,
               " (the rows of bbox), got ", label.dtype(), " ", label.shape());
  const std::vector<int64_t> cls =
      label.astype(int64).to_device(Device::cpu()).to_vector<int64_t>();
  for (int64_t j = 0; j < ng; ++j) {
    KUSARI_CHECK(cls[static_cast<size_t>(j)] >= 0, ValueError, fn, ": label[", j, "] is ",
                 cls[static_cast<size_t>(j)], "; classes start at 0");
  }
  std::vector<int32_t> labels(static_cast<size_t>(na), -1), matched(static_cast<size_t>(na), -1);
  std::vector<float> locs(static_cast<size_t>(na * 4), 0.0f);
  if (ng > 0) {
    std::vector<double> best(static_cast<size_t>(na), -1.0);
    std::vector<int64_t> best_gt(static_cast<size_t>(na), -1);
    // Each box's largest IoU and the anchors that reach it (ties kept), found in the same pass.
    std::vector<double> gt_best(static_cast<size_t>(ng), 0.0);
    std::vector<std::vector<int64_t>> gt_best_anchors(static_cast<size_t>(ng));
    for (int64_t i = 0; i < na; ++i) {
      for (int64_t j = 0; j < ng; ++j) {
        const double v = iou(&a[static_cast<size_t>(4 * i)], &g[static_cast<size_t>(4 * j)]);
        if (v > best[static_cast<size_t>(i)]) {
          best[static_cast<size_t>(i)] = v;
          best_gt[static_cast<size_t>(i)] = j;
        }
        double& top = gt_best[static_cast<size_t>(j)];
        std::vector<int64_t>& at_top = gt_best_anchors[static_cast<size_t>(j)];
        if (v > top) {
          top = v;
          at_top.assign(1, i);
        } else if (v == top && v > 0) {
          at_top.push_back(i);
        }
      }
    }
    std::vector<char> positive(static_cast<size_t>(na), 0);
    for (int64_t i = 0; i < na; ++i) {
      const double v = best[static_cast<size_t>(i)];
      if (v >= positive_iou) {
        positive[static_cast<size_t>(i)] = 1;
      } else if (v >= negative_iou) {
        labels[static_cast<size_t>(i)] = -2;
      }
    }
    if (low_quality_matches) {
      for (const std::vector<int64_t>& at_top : gt_best_anchors) {
        for (int64_t i : at_top) positive[static_cast<size_t>(i)] = 1;
      }
    }
    for (int64_t i = 0; i < na; ++i) {
      if (!positive[static_cast<size_t>(i)]) continue;
      const int64_t j = best_gt[static_cast<size_t>(i)];
      labels[static_cast<size_t>(i)] = static_cast<int32_t>(cls[static_cast<size_t>(j)]);
      matched[static_cast<size_t>(i)] = static_cast<int32_t>(j);
      // bbox_to_loc of the anchor onto its box (functions/detection.h).
      const double* s = &a[static_cast<size_t>(4 * i)];
      const double* d = &g[static_cast<size_t>(4 * j)];
      const double sh = s[2] - s[0], sw = s[3] - s[1];
      const double dh = d[2] - d[0], dw = d[3] - d[1];
      float* l = &locs[static_cast<size_t>(4 * i)];
      l[0] = static_cast<float>((d[0] + 0.5 * dh - (s[0] + 0.5 * sh)) / sh);
      l[1] = static_cast<float>((d[1] + 0.5 * dw - (s[1] + 0.5 * sw)) / sw);
      l[2] = static_cast<float>(std::log(dh / sh));
      l[3] = static_cast<float>(std::log(dw / sw));
    }
  }
  AnchorTargets t;
  t.labels = Array::from_vector(labels, Shape{na});
  t.locs = Array::from_vector(locs, Shape{na, 4});
  t.matched = Array::from_vector(matched, Shape{na});
  return t;
}

RetinaNet::RetinaNet(const RetinaNetOptions& options) : options_(options) {
  const RetinaNetOptions& o = options_;
  const char* fn = "RetinaNet";
  KUSARI_CHECK(o.num_classes > 0, ValueError, fn, ": num_classes must be positive, got ",
               o.num_classes);
  KUSARI_CHECK(o.head_convs >= 0, ValueError, fn, ": head_convs must be at least 0, got ",
               o.head_convs);
  KUSARI_CHECK(o.anchor_scale > 0, ValueError, fn, ": anchor_scale must be positive, got ",
               o.anchor_scale);
  KUSARI_CHECK(o.prior_probability > 0 && o.prior_probability < 1, ValueError, fn,
               ": prior_probability must be in (0, 1), got ", o.prior_probability);
  KUSARI_CHECK(o.max_detections >= 0 && o.candidates_per_level >= 0, ValueError, fn,
               ": max_detections and candidates_per_level must be at least 0, got ",
               o.max_detections, " and ", o.candidates_per_level);
  // generate_anchors and match_anchors check the anchors' and the matching's settings; check
  // them here too so that a bad setting fails when the model is made.
  generate_anchors(1, 1, 1.0, 1.0, o.ratios, o.scales);
  anchors_ = std::make_shared<detail::AnchorCache>(o.ratios, o.scales);
  match_anchors(Array::zeros({0, 4}), Array::zeros({0, 4}), Array::zeros({0}, int32),
                o.positive_iou, o.negative_iou);

  detail::PyramidOptions pyramid;
  pyramid.block = o.block;
  pyramid.blocks_per_stage = o.blocks_per_stage;
  pyramid.width = o.width;
  pyramid.fpn_channels = o.fpn_channels;
  pyramid.min_level = o.min_level;
  pyramid.max_level = o.max_level;
  pyramid.extra = detail::ExtraLevels::kConvolution;
  pyramid_ = std::make_shared<detail::BackbonePyramid>(*this, pyramid, fn);
  backbone = pyramid_->backbone;
  fpn = pyramid_->fpn;

  const int64_t c = o.fpn_channels;
  const int64_t a = anchors_per_position();
  const double prior = -std::log((1.0 - o.prior_probability) / o.prior_probability);
  classification_head =
      add_link("classification_head", head(c, o.head_convs, a * o.num_classes, prior));
  regression_head = add_link("regression_head", head(c, o.head_convs, a * 4, 0.0));
}

int64_t RetinaNet::anchors_per_position() const {
  return static_cast<int64_t>(options_.ratios.size() * options_.scales.size());
}

RetinaNetOutputs RetinaNet::outputs(const Variable& x) {
  const RetinaNetOptions& o = options_;
  std::vector<Variable> levels = (*pyramid_)(x);
  RetinaNetOutputs out;
  std::vector<Variable> scores, locs;
  std::vector<detail::AnchorLevel> anchor_levels;
  for (size_t i = 0; i < levels.size(); ++i) {
    const int level = o.min_level + static_cast<int>(i);
    const double stride = std::ldexp(1.0, level);
    const Variable& p = levels[i];
    scores.push_back(per_anchor((*classification_head)(p), o.num_classes));
    locs.push_back(per_anchor((*regression_head)(p), 4));
    anchor_levels.push_back({p.shape()[2], p.shape()[3], stride, o.anchor_scale * stride});
  }
  out.scores = scores.size() == 1 ? scores[0] : F::concat(scores, 1);
  out.locs = locs.size() == 1 ? locs[0] : F::concat(locs, 1);
  detail::PyramidAnchors anchors = anchors_->get(anchor_levels, x.device());
  out.anchors = std::move(anchors.device);
  out.host_anchors = std::move(anchors.host);
  out.anchors_per_level = std::move(anchors.per_level);
  return out;
}

RetinaNetLoss RetinaNet::loss(const Variable& x, const std::vector<Array>& bboxes,
                              const std::vector<Array>& labels) {
  const RetinaNetOptions& o = options_;
  const int64_t n = x.ndim() == 4 ? x.shape()[0] : -1;
  KUSARI_CHECK(static_cast<int64_t>(bboxes.size()) == n && static_cast<int64_t>(labels.size()) == n,
               ValueError, "RetinaNet::loss: needs the boxes and labels of each of the ", n,
               " images, got ", bboxes.size(), " boxes and ", labels.size(), " labels");
  RetinaNetOutputs out = outputs(x);
  const int64_t na = out.anchors.shape()[0], k = o.num_classes;
  const Array& anchors = out.host_anchors;
  std::vector<float> onehot(static_cast<size_t>(n * na * k), 0.0f);
  std::vector<float> valid(static_cast<size_t>(n * na * k), 0.0f);
  std::vector<float> positive(static_cast<size_t>(n * na * 4), 0.0f);
  std::vector<float> targets(static_cast<size_t>(n * na * 4), 0.0f);
  int64_t positives = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Array& label = labels[static_cast<size_t>(i)];
    if (label.defined() && label.size() > 0 && is_integral(label.dtype())) {
      const int64_t top = amax(label.astype(int64).to_device(Device::cpu())).item<int64_t>();
      KUSARI_CHECK(top < k, ValueError, "RetinaNet::loss: image ", i, " has a box of class ", top,
                   ", but the model has ", k, " classes");
    }
    const AnchorTargets t =
        match_anchors(anchors, bboxes[static_cast<size_t>(i)], labels[static_cast<size_t>(i)],
                      o.positive_iou, o.negative_iou);
    const std::vector<int32_t> cls = t.labels.to_vector<int32_t>();
    const std::vector<float> loc = t.locs.to_vector<float>();
    for (int64_t j = 0; j < na; ++j) {
      const int32_t c = cls[static_cast<size_t>(j)];
      const size_t row = static_cast<size_t>(i * na + j);
      if (c == -2) continue;
      std::fill_n(valid.begin() + static_cast<std::ptrdiff_t>(row * k), k, 1.0f);
      if (c < 0) continue;
      ++positives;
      onehot[row * static_cast<size_t>(k) + static_cast<size_t>(c)] = 1.0f;
      for (size_t d = 0; d < 4; ++d) {
        positive[row * 4 + d] = 1.0f;
        targets[row * 4 + d] = loc[static_cast<size_t>(j) * 4 + d];
      }
    }
  }
  const Device device = x.device();
  const Dtype dtype = out.scores.dtype();
  const auto on_device = [&](const std::vector<float>& v, int64_t last) {
    return Array::from_vector(v, Shape{n, na, last}).to_device(device).astype(dtype);
  };
  const double normalizer = static_cast<double>(std::max<int64_t>(positives, 1));
  Variable focal = F::sigmoid_focal_loss(out.scores, on_device(onehot, k), o.focal_alpha,
                                         o.focal_gamma, F::Reduce::kNone);
  RetinaNetLoss result;
  result.classification = F::sum(focal * Variable(on_device(valid, k))) / normalizer;
  // Smooth L1 with beta 1/9 (Note [RetinaNet anchors and targets]).
  constexpr double kBeta = 1.0 / 9.0;
  Variable smooth =
      F::huber_loss(out.locs, Variable(on_device(targets, 4)), kBeta, F::HuberReduce::kNone);
  result.regression = F::sum(smooth * Variable(on_device(positive, 4))) / (kBeta * normalizer);
  result.total = result.classification + result.regression;
  result.positives = positives;
  return result;
}

Detections RetinaNet::predict(const Variable& x) {
  NoBackpropMode no_graph;
  TrainMode eval(false);
  return detections(outputs(x), x.shape()[2], x.shape()[3]);
}

Detections RetinaNet::detections(const RetinaNetOutputs& out, int64_t height, int64_t width) const {
  const RetinaNetOptions& o = options_;
  const Array scores = out.scores.data().astype(float32).to_device(Device::cpu());
  const Array locs = out.locs.data().astype(float32).to_device(Device::cpu());
  const std::vector<float> anchors =
      detail::host_anchors(out.anchors, out.host_anchors).astype(float32).to_vector<float>();
  const int64_t n = scores.shape()[0], na = scores.shape()[1], k = scores.shape()[2];
  const std::vector<float> all_scores = scores.to_vector<float>();
  const std::vector<float> all_locs = locs.to_vector<float>();
  // The logit of score_threshold, a little lower so that rounding never drops a candidate (the
  // probability itself decides).
  const float min_logit =
      o.score_threshold <= 0 ? -std::numeric_limits<float>::infinity()
      : o.score_threshold >= 1
          ? std::numeric_limits<float>::infinity()
          : static_cast<float>(std::log(o.score_threshold / (1 - o.score_threshold)) - 1e-3);
  constexpr double kUnitWeights[4] = {1, 1, 1, 1};  // RetinaNet's offsets are unscaled
  Detections d;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> boxes, kept_scores;
    std::vector<int32_t> classes;
    int64_t begin = 0;
    for (int64_t level_size : out.anchors_per_level) {
      // The candidates of this level: (anchor, class) pairs above the threshold, best first.
      std::vector<std::pair<float, int64_t>> cand;
      for (int64_t j = begin; j < begin + level_size; ++j) {
        for (int64_t c = 0; c < k; ++c) {
          // p >= threshold exactly when the logit reaches the threshold's logit: no exp for the
          // many anchors below it.
          const float logit = all_scores[static_cast<size_t>((i * na + j) * k + c)];
          if (logit < min_logit) continue;
          const float p = 1.0f / (1.0f + std::exp(-logit));
          if (p >= o.score_threshold) cand.emplace_back(p, j * k + c);
        }
      }
      const size_t keep = std::min(cand.size(), static_cast<size_t>(o.candidates_per_level));
      std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(keep), cand.end(),
                        [](const auto& a, const auto& b) {
                          return a.first > b.first || (a.first == b.first && a.second < b.second);
                        });
      for (size_t m = 0; m < keep; ++m) {
        const int64_t j = cand[m].second / k, c = cand[m].second % k;
        const float* l = &all_locs[static_cast<size_t>((i * na + j) * 4)];
        float box[4];
        detail::decode_box(&anchors[static_cast<size_t>(4 * j)], l, kUnitWeights, height, width,
                           box);
        boxes.insert(boxes.end(), box, box + 4);
        kept_scores.push_back(cand[m].first);
        classes.push_back(static_cast<int32_t>(c));
      }
      begin += level_size;
    }
    detail::append_detections(d, boxes, kept_scores, classes, o.nms_threshold, o.max_detections);
  }
  return d;
}

std::shared_ptr<RetinaNet> retinanet_resnet50_fpn(RetinaNetOptions options) {
  options.block = ResNetBlock::kBottleneck;
  options.blocks_per_stage = {3, 4, 6, 3};
  options.width = 64;
  options.min_level = 3;
  options.max_level = 7;
  return std::make_shared<RetinaNet>(options);
}

}  // namespace kusari::models
