#include "kusari/models/detection_metrics.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numeric>
#include <utility>

#include "kusari/core/error.h"

namespace kusari {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// (y_min, x_min, y_max, x_max).
struct Box {
  double y_min, x_min, y_max, x_max;
};

double box_area(const Box& b) {
  return std::max(0.0, b.y_max - b.y_min) * std::max(0.0, b.x_max - b.x_min);
}

/// Continuous coordinates, no +1 (Note [Detection mAP]); 0 when the union has no area.
double box_iou(const Box& a, const Box& b) {
  const double h = std::min(a.y_max, b.y_max) - std::max(a.y_min, b.y_min);
  const double w = std::min(a.x_max, b.x_max) - std::max(a.x_min, b.x_min);
  const double inter = std::max(0.0, h) * std::max(0.0, w);
  const double uni = box_area(a) + box_area(b) - inter;
  return uni > 0 ? inter / uni : 0.0;
}

/// The inputs of eval_detection's caller, by name, for the error messages.
struct Inputs {
  const std::vector<Array>& pred_bboxes;
  const std::vector<Array>& pred_labels;
  const std::vector<Array>& pred_scores;
  const std::vector<Array>& gt_bboxes;
  const std::vector<Array>& gt_labels;
  const std::vector<Array>& gt_difficults;
};

/// One image's boxes on the host.
struct Image {
  std::vector<Box> pred_boxes;
  std::vector<int64_t> pred_labels;
  std::vector<double> pred_scores;
  std::vector<Box> gt_boxes;
  std::vector<int64_t> gt_labels;
  std::vector<bool> gt_difficult;
};

std::vector<Box> read_boxes(const char* fn, const Array& a, const char* name, size_t i) {
  KUSARI_CHECK(a.defined(), ValueError, fn, ": ", name, "[", i,
               "] is an undefined Array; expected boxes of shape (R, 4)");
  KUSARI_CHECK(a.ndim() == 2 && a.dim(1) == 4, ShapeError, fn, ": ", name, "[", i, "] has shape ",
               a.shape(), "; expected (R, 4) boxes (y_min, x_min, y_max, x_max)");
  KUSARI_CHECK(is_floating(a.dtype()), DtypeError, fn, ": ", name, "[", i, "] has dtype ",
               a.dtype(), "; expected a floating dtype (float32 or float64)");
  const std::vector<double> v = a.to_vector<double>();
  std::vector<Box> boxes(v.size() / 4);
  for (size_t r = 0; r < boxes.size(); ++r) {
    for (size_t k = 0; k < 4; ++k) {
      KUSARI_CHECK(std::isfinite(v[4 * r + k]), ValueError, fn, ": ", name, "[", i, "] box ", r,
                   " has the coordinate ", v[4 * r + k], "; expected finite coordinates");
    }
    boxes[r] = Box{v[4 * r], v[4 * r + 1], v[4 * r + 2], v[4 * r + 3]};
  }
  return boxes;
}

/// Checks that name[i] is a defined (n,) array, one entry per box of boxes_name[i].
void check_vector(const char* fn, const Array& a, const char* name, size_t i, int64_t n,
                  const char* boxes_name, const Array& boxes) {
  KUSARI_CHECK(a.defined(), ValueError, fn, ": ", name, "[", i,
               "] is an undefined Array; expected shape (", n, ",)");
  KUSARI_CHECK(a.ndim() == 1 && a.dim(0) == n, ShapeError, fn, ": ", name, "[", i, "] has shape ",
               a.shape(), " but ", boxes_name, "[", i, "] has shape ", boxes.shape(),
               "; expected (", n, ",), one entry per box");
}

std::vector<int64_t> read_labels(const char* fn, const Array& a, const char* name, size_t i,
                                 const char* boxes_name, const Array& boxes, int64_t n_classes) {
  check_vector(fn, a, name, i, boxes.dim(0), boxes_name, boxes);
  KUSARI_CHECK(is_integral(a.dtype()) && a.dtype() != bool_, DtypeError, fn, ": ", name, "[", i,
               "] has dtype ", a.dtype(), "; expected an integer dtype (int32 or int64)");
  std::vector<int64_t> labels = a.to_vector<int64_t>();
  for (size_t r = 0; r < labels.size(); ++r) {
    KUSARI_CHECK(labels[r] >= 0, ValueError, fn, ": ", name, "[", i, "] holds the label ",
                 labels[r], " at ", r, "; expected class indices >= 0");
    KUSARI_CHECK(n_classes < 0 || labels[r] < n_classes, ValueError, fn, ": ", name, "[", i,
                 "] holds the label ", labels[r], " at ", r, "; expected labels in [0, ", n_classes,
                 ") for n_classes = ", n_classes);
  }
  return labels;
}

std::vector<Image> read_inputs(const char* fn, const Inputs& in, int64_t n_classes) {
  const size_t n = in.pred_bboxes.size();
  KUSARI_CHECK(in.pred_labels.size() == n && in.pred_scores.size() == n &&
                   in.gt_bboxes.size() == n && in.gt_labels.size() == n &&
                   (in.gt_difficults.empty() || in.gt_difficults.size() == n),
               ValueError, fn, ": the inputs hold different numbers of images: pred_bboxes ", n,
               ", pred_labels ", in.pred_labels.size(), ", pred_scores ", in.pred_scores.size(),
               ", gt_bboxes ", in.gt_bboxes.size(), ", gt_labels ", in.gt_labels.size(),
               ", gt_difficults ", in.gt_difficults.size(),
               "; expected one array per image in each (gt_difficults may be empty)");
  KUSARI_CHECK(n_classes >= -1, ValueError, fn, ": n_classes is ", n_classes,
               "; expected a number of classes >= 0, or -1 for one more than the largest label");
  std::vector<Image> images(n);
  for (size_t i = 0; i < n; ++i) {
    Image& im = images[i];
    im.pred_boxes = read_boxes(fn, in.pred_bboxes[i], "pred_bboxes", i);
    im.pred_labels = read_labels(fn, in.pred_labels[i], "pred_labels", i, "pred_bboxes",
                                 in.pred_bboxes[i], n_classes);
    const Array& scores = in.pred_scores[i];
    check_vector(fn, scores, "pred_scores", i, in.pred_bboxes[i].dim(0), "pred_bboxes",
                 in.pred_bboxes[i]);
    KUSARI_CHECK(is_floating(scores.dtype()), DtypeError, fn, ": pred_scores[", i, "] has dtype ",
                 scores.dtype(), "; expected a floating dtype (float32 or float64)");
    im.pred_scores = scores.to_vector<double>();
    for (size_t r = 0; r < im.pred_scores.size(); ++r) {
      KUSARI_CHECK(!std::isnan(im.pred_scores[r]), ValueError, fn, ": pred_scores[", i,
                   "] holds NaN at ", r, "; expected scores that can be ranked");
    }
    im.gt_boxes = read_boxes(fn, in.gt_bboxes[i], "gt_bboxes", i);
    im.gt_labels =
        read_labels(fn, in.gt_labels[i], "gt_labels", i, "gt_bboxes", in.gt_bboxes[i], n_classes);
    im.gt_difficult.assign(im.gt_boxes.size(), false);
    if (!in.gt_difficults.empty()) {
      const Array& d = in.gt_difficults[i];
      check_vector(fn, d, "gt_difficults", i, in.gt_bboxes[i].dim(0), "gt_bboxes", in.gt_bboxes[i]);
      KUSARI_CHECK(is_integral(d.dtype()), DtypeError, fn, ": gt_difficults[", i, "] has dtype ",
                   d.dtype(), "; expected bool or an integer dtype (nonzero: difficult)");
      const std::vector<int64_t> v = d.to_vector<int64_t>();
      for (size_t g = 0; g < v.size(); ++g) im.gt_difficult[g] = v[g] != 0;
    }
  }
  return images;
}

/// The predictions and ground truth of one class in one image.
struct ClassImage {
  /// Scores of the class's predictions, highest first (ties in index order).
  std::vector<double> scores;
  /// Difficult flags of the class's ground-truth boxes.
  std::vector<bool> difficult;
  /// IoU of prediction p (in score order) with ground-truth box g: iou[p * n_gt + g].
  std::vector<double> iou;
  size_t n_gt() const { return difficult.size(); }
};

/// Everything eval_detection needs of one class, whatever the thresholds.
struct ClassData {
  /// The images that have a prediction of the class, in image order.
  std::vector<ClassImage> images;
  /// (index into images, position in its scores) of every prediction, highest score first.
  std::vector<std::pair<size_t, size_t>> ranking;
  /// Non-difficult ground-truth boxes.
  int64_t n_positives = 0;
};

/// Indices 0..n-1 grouped by label, ascending; within a label, by `before` (stable).
template <typename Before>
std::vector<size_t> group_by_label(const std::vector<int64_t>& labels, Before before) {
  std::vector<size_t> order(labels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (labels[a] != labels[b]) return labels[a] < labels[b];
    return before(a, b);
  });
  return order;
}

std::vector<ClassData> prepare(const std::vector<Image>& images, int64_t n_classes) {
  int64_t n = n_classes;
  if (n < 0) {
    int64_t largest = -1;
    for (const Image& im : images) {
      for (int64_t l : im.pred_labels) largest = std::max(largest, l);
      for (int64_t l : im.gt_labels) largest = std::max(largest, l);
    }
    n = largest + 1;
  }
  std::vector<ClassData> classes(static_cast<size_t>(n));
  for (const Image& im : images) {
    const std::vector<size_t> preds = group_by_label(
        im.pred_labels, [&](size_t a, size_t b) { return im.pred_scores[a] > im.pred_scores[b]; });
    const std::vector<size_t> gts =
        group_by_label(im.gt_labels, [](size_t, size_t) { return false; });
    for (size_t g : gts) {
      if (!im.gt_difficult[g]) ++classes[static_cast<size_t>(im.gt_labels[g])].n_positives;
    }
    size_t g_begin = 0;
    for (size_t p_begin = 0; p_begin < preds.size();) {
      const int64_t label = im.pred_labels[preds[p_begin]];
      size_t p_end = p_begin;
      while (p_end < preds.size() && im.pred_labels[preds[p_end]] == label) ++p_end;
      while (g_begin < gts.size() && im.gt_labels[gts[g_begin]] < label) ++g_begin;
      size_t g_end = g_begin;
      while (g_end < gts.size() && im.gt_labels[gts[g_end]] == label) ++g_end;
      ClassImage ci;
      for (size_t p = p_begin; p < p_end; ++p) ci.scores.push_back(im.pred_scores[preds[p]]);
      for (size_t g = g_begin; g < g_end; ++g) ci.difficult.push_back(im.gt_difficult[gts[g]]);
      ci.iou.reserve((p_end - p_begin) * (g_end - g_begin));
      for (size_t p = p_begin; p < p_end; ++p) {
        for (size_t g = g_begin; g < g_end; ++g) {
          ci.iou.push_back(box_iou(im.pred_boxes[preds[p]], im.gt_boxes[gts[g]]));
        }
      }
      classes[static_cast<size_t>(label)].images.push_back(std::move(ci));
      p_begin = p_end;
      g_begin = g_end;
    }
  }
  for (ClassData& c : classes) {
    for (size_t j = 0; j < c.images.size(); ++j) {
      for (size_t p = 0; p < c.images[j].scores.size(); ++p) c.ranking.emplace_back(j, p);
    }
    std::stable_sort(c.ranking.begin(), c.ranking.end(), [&](const auto& a, const auto& b) {
      return c.images[a.first].scores[a.second] > c.images[b.first].scores[b.second];
    });
  }
  return classes;
}

constexpr int8_t kFalsePositive = 0;
constexpr int8_t kTruePositive = 1;
constexpr int8_t kIgnored = -1;

/// The outcome of each prediction of `ci`, in score order (Note [Detection mAP]).
std::vector<int8_t> match(const ClassImage& ci, double thresh, bool coco_matching) {
  const size_t n_pred = ci.scores.size(), n_gt = ci.n_gt();
  std::vector<int8_t> out(n_pred, kFalsePositive);
  std::vector<bool> taken(n_gt, false);
  for (size_t p = 0; p < n_pred; ++p) {
    const double* iou = ci.iou.data() + p * n_gt;
    if (!coco_matching) {
      if (n_gt == 0) continue;
      const size_t g = static_cast<size_t>(std::max_element(iou, iou + n_gt) - iou);
      if (iou[g] < thresh) continue;
      if (ci.difficult[g]) {
        out[p] = kIgnored;
      } else if (!taken[g]) {
        out[p] = kTruePositive;
      }
      taken[g] = true;
    } else {
      // pycocotools' loop: non-difficult boxes first, a difficult one only when none fits; ties
      // go to the later box (its test is `iou < best`), and a threshold of 1 is 1 - 1e-10.
      std::ptrdiff_t m = -1;
      for (bool difficult_pass : {false, true}) {
        double best = std::min(thresh, 1 - 1e-10);
        for (size_t g = 0; g < n_gt; ++g) {
          if (ci.difficult[g] != difficult_pass || taken[g] || iou[g] < best) continue;
          best = iou[g];
          m = static_cast<std::ptrdiff_t>(g);
        }
        if (m >= 0) break;
      }
      if (m < 0) continue;
      taken[static_cast<size_t>(m)] = true;
      out[p] = ci.difficult[static_cast<size_t>(m)] ? kIgnored : kTruePositive;
    }
  }
  return out;
}

/// ChainerCV's calc_detection_voc_ap, use_07_metric = false.
double ap_area(const std::vector<double>& prec, const std::vector<double>& rec) {
  const size_t n = prec.size();
  std::vector<double> mpre(n + 2, 0.0), mrec(n + 2, 0.0);
  for (size_t k = 0; k < n; ++k) {
    mpre[k + 1] = std::isnan(prec[k]) ? 0.0 : prec[k];
    mrec[k + 1] = rec[k];
  }
  mrec[n + 1] = 1.0;
  for (size_t k = n + 1; k-- > 0;) mpre[k] = std::max(mpre[k], mpre[k + 1]);
  double ap = 0;
  for (size_t k = 0; k + 1 < mrec.size(); ++k) {
    if (mrec[k + 1] != mrec[k]) ap += (mrec[k + 1] - mrec[k]) * mpre[k + 1];
  }
  return ap;
}

/// ChainerCV's calc_detection_voc_ap, use_07_metric = true: recall levels as numpy's
/// arange(0, 1.1, 0.1) makes them (k * 0.1).
double ap_11_point(const std::vector<double>& prec, const std::vector<double>& rec) {
  double ap = 0;
  for (int k = 0; k <= 10; ++k) {
    const double t = k * 0.1;
    double p = 0;
    for (size_t i = 0; i < rec.size(); ++i) {
      if (rec[i] >= t) p = std::max(p, std::isnan(prec[i]) ? 0.0 : prec[i]);
    }
    ap += p / 11;
  }
  return ap;
}

/// pycocotools' accumulate: recall levels as numpy's linspace(0, 1, 101) makes them.
double ap_101_point(const std::vector<double>& prec, const std::vector<double>& rec) {
  std::vector<double> env(prec.size());
  for (size_t k = 0; k < prec.size(); ++k) env[k] = std::isnan(prec[k]) ? 0.0 : prec[k];
  for (size_t k = env.size(); k-- > 1;) env[k - 1] = std::max(env[k - 1], env[k]);
  double sum = 0;
  for (int k = 0; k <= 100; ++k) {
    const double r = k == 100 ? 1.0 : k * 0.01;
    const size_t at =
        static_cast<size_t>(std::lower_bound(rec.begin(), rec.end(), r) - rec.begin());
    if (at < env.size()) sum += env[at];
  }
  return sum / 101;
}

double nanmean(const std::vector<double>& v) {
  double sum = 0;
  int64_t count = 0;
  for (double x : v) {
    if (!std::isnan(x)) {
      sum += x;
      ++count;
    }
  }
  return count > 0 ? sum / static_cast<double>(count) : kNaN;
}

void check_options(const char* fn, const DetectionEvalOptions& options) {
  KUSARI_CHECK(!options.iou_thresholds.empty(), ValueError, fn,
               ": options.iou_thresholds is empty; expected at least one IoU threshold in (0, 1]");
  for (size_t k = 0; k < options.iou_thresholds.size(); ++k) {
    const double t = options.iou_thresholds[k];
    KUSARI_CHECK(t > 0 && t <= 1, ValueError, fn, ": options.iou_thresholds[", k, "] is ", t,
                 "; expected an IoU threshold in (0, 1]");
  }
  KUSARI_CHECK(!(options.use_07_metric && options.coco_interpolation), ValueError, fn,
               ": options.use_07_metric and options.coco_interpolation are both set; expected at "
               "most one AP form");
}

DetectionEvalResult evaluate(const std::vector<ClassData>& classes,
                             const DetectionEvalOptions& options) {
  const size_t n_classes = classes.size(), n_thresh = options.iou_thresholds.size();
  DetectionEvalResult result;
  result.ap.assign(n_thresh, std::vector<double>(n_classes, kNaN));
  result.map.assign(n_thresh, kNaN);
  result.precision.resize(n_classes);
  result.recall.resize(n_classes);
  result.n_positives.resize(n_classes);
  for (size_t c = 0; c < n_classes; ++c) {
    const ClassData& cd = classes[c];
    result.n_positives[c] = cd.n_positives;
    for (size_t t = 0; t < n_thresh; ++t) {
      std::vector<std::vector<int8_t>> outcomes(cd.images.size());
      for (size_t j = 0; j < cd.images.size(); ++j) {
        outcomes[j] = match(cd.images[j], options.iou_thresholds[t], options.coco_matching);
      }
      std::vector<double> prec(cd.ranking.size()), rec(cd.ranking.size());
      int64_t tp = 0, fp = 0;
      for (size_t k = 0; k < cd.ranking.size(); ++k) {
        const int8_t o = outcomes[cd.ranking[k].first][cd.ranking[k].second];
        tp += o == kTruePositive;
        fp += o == kFalsePositive;
        prec[k] = tp + fp > 0 ? static_cast<double>(tp) / static_cast<double>(tp + fp) : kNaN;
        rec[k] = cd.n_positives > 0 ? static_cast<double>(tp) / static_cast<double>(cd.n_positives)
                                    : kNaN;
      }
      if (cd.n_positives > 0) {
        result.ap[t][c] = options.coco_interpolation ? ap_101_point(prec, rec)
                          : options.use_07_metric    ? ap_11_point(prec, rec)
                                                     : ap_area(prec, rec);
      }
      if (t == 0) {
        result.precision[c] = std::move(prec);
        result.recall[c] = std::move(rec);
      }
    }
  }
  for (size_t t = 0; t < n_thresh; ++t) result.map[t] = nanmean(result.ap[t]);
  return result;
}

}  // namespace

DetectionEvalResult eval_detection(const std::vector<Array>& pred_bboxes,
                                   const std::vector<Array>& pred_labels,
                                   const std::vector<Array>& pred_scores,
                                   const std::vector<Array>& gt_bboxes,
                                   const std::vector<Array>& gt_labels,
                                   const std::vector<Array>& gt_difficults, int64_t n_classes,
                                   const DetectionEvalOptions& options) {
  constexpr const char* fn = "eval_detection";
  check_options(fn, options);
  const Inputs in{pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels, gt_difficults};
  return evaluate(prepare(read_inputs(fn, in, n_classes), n_classes), options);
}

DetectionScores detection_scores(const std::vector<Array>& pred_bboxes,
                                 const std::vector<Array>& pred_labels,
                                 const std::vector<Array>& pred_scores,
                                 const std::vector<Array>& gt_bboxes,
                                 const std::vector<Array>& gt_labels,
                                 const std::vector<Array>& gt_difficults, int64_t n_classes) {
  const Inputs in{pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels, gt_difficults};
  const std::vector<ClassData> classes =
      prepare(read_inputs("detection_scores", in, n_classes), n_classes);
  DetectionEvalOptions voc;
  DetectionEvalOptions coco;
  // pycocotools' thresholds, numpy's linspace(0.5, 0.95, 10): k * step + 0.5, the last exactly.
  coco.iou_thresholds.resize(10);
  const double step = (0.95 - 0.5) / 9;
  for (int k = 0; k < 10; ++k) coco.iou_thresholds[k] = k == 9 ? 0.95 : k * step + 0.5;
  coco.coco_interpolation = true;
  coco.coco_matching = true;
  const DetectionEvalResult coco_result = evaluate(classes, coco);
  double coco_map = 0;
  for (double m : coco_result.map) coco_map += m;
  return DetectionScores{evaluate(classes, voc).map[0], coco_map / 10};
}

}  // namespace kusari
