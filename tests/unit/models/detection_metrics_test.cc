// Detection evaluation (Note [Detection mAP]): hand-computed AP for the three interpolations and
// both matching rules, difficult boxes, classes without ground truth, the IoU threshold's
// boundary, ties in score, COCO's mean over ten thresholds, a randomized comparison with a
// brute-force evaluation written here, and the error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/core/error.h"
#include "kusari/models/detection_metrics.h"
#include "test_util.h"

namespace kusari {
namespace {

using testing::ThrowsWith;

/// The per-image arrays eval_detection takes.
struct Detections {
  std::vector<Array> pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels, gt_difficults;

  /// Adds an image: boxes as flat (y_min, x_min, y_max, x_max) lists.
  void add(const std::vector<double>& pb, const std::vector<int32_t>& pl,
           const std::vector<double>& ps, const std::vector<double>& gb,
           const std::vector<int32_t>& gl, const std::vector<bool>& gd = {}) {
    pred_bboxes.push_back(boxes(pb));
    pred_labels.push_back(Array::from_vector(pl, Shape{static_cast<int64_t>(pl.size())}));
    pred_scores.push_back(Array::from_vector(std::vector<float>(ps.begin(), ps.end()),
                                             Shape{static_cast<int64_t>(ps.size())}));
    gt_bboxes.push_back(boxes(gb));
    gt_labels.push_back(Array::from_vector(gl, Shape{static_cast<int64_t>(gl.size())}));
    std::vector<bool> d = gd.empty() ? std::vector<bool>(gl.size(), false) : gd;
    gt_difficults.push_back(Array::from_vector(d, Shape{static_cast<int64_t>(d.size())}));
  }

  static Array boxes(const std::vector<double>& v) {
    if (v.empty()) return Array::zeros({0, 4}, float32);
    return Array::from_vector(std::vector<float>(v.begin(), v.end()),
                              Shape{static_cast<int64_t>(v.size() / 4), 4});
  }

  DetectionEvalResult eval(const DetectionEvalOptions& options = {}, int64_t n_classes = -1) const {
    return eval_detection(pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels,
                          gt_difficults, n_classes, options);
  }
};

DetectionEvalOptions voc07() {
  DetectionEvalOptions o;
  o.use_07_metric = true;
  return o;
}

DetectionEvalOptions coco101(bool coco_matching = false) {
  DetectionEvalOptions o;
  o.coco_interpolation = true;
  o.coco_matching = coco_matching;
  return o;
}

TEST(DetectionMetrics, PerfectDetectorHasAPOne) {
  Detections d;
  d.add({0, 0, 10, 10, 5, 5, 20, 30}, {0, 2}, {0.9, 0.3}, {0, 0, 10, 10, 5, 5, 20, 30}, {0, 2});
  d.add({1, 2, 3, 4}, {1}, {0.5}, {1, 2, 3, 4}, {1});
  for (const DetectionEvalOptions& o :
       {DetectionEvalOptions{}, voc07(), coco101(), coco101(true)}) {
    const DetectionEvalResult r = d.eval(o);
    ASSERT_EQ(r.ap.size(), 1u);
    ASSERT_EQ(r.ap[0].size(), 3u);
    for (double ap : r.ap[0]) EXPECT_DOUBLE_EQ(ap, 1.0);
    EXPECT_DOUBLE_EQ(r.map[0], 1.0);
  }
  const DetectionScores s = detection_scores(d.pred_bboxes, d.pred_labels, d.pred_scores,
                                             d.gt_bboxes, d.gt_labels, d.gt_difficults);
  EXPECT_DOUBLE_EQ(s.map50, 1.0);
  EXPECT_DOUBLE_EQ(s.coco_map, 1.0);
}

// Two ground-truth boxes, three predictions ranked: a false positive far from both (0.9), a true
// positive on the first box (0.8) and a duplicate on it (0.7); the second box is missed. Precision
// 0, 1/2, 1/3 at recall 0, 1/2, 1/2.
TEST(DetectionMetrics, OneImageByHand) {
  Detections d;
  d.add({50, 50, 60, 60, 0, 0, 10, 10, 1, 0, 10, 10}, {0, 0, 0}, {0.9, 0.8, 0.7},
        {0, 0, 10, 10, 20, 20, 30, 30}, {0, 0});
  const DetectionEvalResult area = d.eval();
  // The envelope is 1/2 up to recall 1/2 and 0 after it.
  EXPECT_DOUBLE_EQ(area.ap[0][0], 0.25);
  EXPECT_DOUBLE_EQ(area.map[0], 0.25);
  // Recall levels 0, 0.1, ..., 0.5 see precision 1/2; 0.6 ... 1 none.
  EXPECT_NEAR(d.eval(voc07()).ap[0][0], 6 * 0.5 / 11, 1e-12);
  // Recall levels 0, 0.01, ..., 0.5 (51 of 101) see precision 1/2.
  EXPECT_NEAR(d.eval(coco101()).ap[0][0], 51 * 0.5 / 101, 1e-12);
  // COCO's matching finds nothing else for the duplicate (the other box does not overlap).
  EXPECT_NEAR(d.eval(coco101(true)).ap[0][0], 51 * 0.5 / 101, 1e-12);

  ASSERT_EQ(area.precision.size(), 1u);
  ASSERT_EQ(area.precision[0].size(), 3u);
  EXPECT_DOUBLE_EQ(area.precision[0][0], 0.0);
  EXPECT_DOUBLE_EQ(area.precision[0][1], 0.5);
  EXPECT_DOUBLE_EQ(area.precision[0][2], 1.0 / 3);
  EXPECT_EQ(area.recall[0], (std::vector<double>{0.0, 0.5, 0.5}));
  EXPECT_EQ(area.n_positives, (std::vector<int64_t>{2}));
}

// The second prediction's best box is taken: VOC makes it a false positive, COCO moves it on to
// the next best unmatched box when that one overlaps enough.
TEST(DetectionMetrics, DuplicateUnderBothMatchingRules) {
  Detections d;
  // Boxes A (0, 0, 10, 10) and B (0, 5, 10, 15); the first prediction is A itself, the second
  // (0, 1, 10, 11) has IoU 90/110 with A (its best) and 60/140 = 0.43 with B.
  d.add({0, 0, 10, 10, 0, 1, 10, 11}, {0, 0}, {0.9, 0.8}, {0, 0, 10, 10, 0, 5, 10, 15}, {0, 0});
  // VOC: TP, FP: precision 1, 1/2 at recall 1/2, 1/2.
  EXPECT_DOUBLE_EQ(d.eval().ap[0][0], 0.5);
  // COCO at 0.4: the duplicate takes B (IoU 60/140 = 0.43): recall 1.
  DetectionEvalOptions o;
  o.iou_thresholds = {0.4};
  EXPECT_DOUBLE_EQ(d.eval(o).ap[0][0], 0.5);
  o.coco_matching = true;
  EXPECT_DOUBLE_EQ(d.eval(o).ap[0][0], 1.0);
  // At 0.5, B is too far for it either way.
  o.iou_thresholds = {0.5};
  EXPECT_DOUBLE_EQ(d.eval(o).ap[0][0], 0.5);
}

// A difficult box: predictions on it are neither true nor false positives (VOC) and it does not
// count towards recall.
TEST(DetectionMetrics, DifficultBoxIsIgnored) {
  Detections d;
  // Ranked: on the difficult box (0.9), again on it (0.85), on the other box (0.8).
  d.add({20, 20, 30, 30, 20, 21, 30, 31, 0, 0, 10, 10}, {0, 0, 0}, {0.9, 0.85, 0.8},
        {0, 0, 10, 10, 20, 20, 30, 30}, {0, 0}, {false, true});
  const DetectionEvalResult r = d.eval();
  EXPECT_EQ(r.n_positives, (std::vector<int64_t>{1}));
  EXPECT_DOUBLE_EQ(r.ap[0][0], 1.0);
  EXPECT_DOUBLE_EQ(d.eval(voc07()).ap[0][0], 1.0);
  EXPECT_DOUBLE_EQ(d.eval(coco101()).ap[0][0], 1.0);
  ASSERT_EQ(r.precision[0].size(), 3u);
  EXPECT_TRUE(std::isnan(r.precision[0][0]));
  EXPECT_TRUE(std::isnan(r.precision[0][1]));
  EXPECT_DOUBLE_EQ(r.precision[0][2], 1.0);
  EXPECT_EQ(r.recall[0], (std::vector<double>{0.0, 0.0, 1.0}));
  // COCO's matching takes a difficult box once: the second prediction on it is a false
  // positive, so precision is 1/2 at recall 1.
  EXPECT_DOUBLE_EQ(d.eval(coco101(true)).ap[0][0], 0.5);
  DetectionEvalOptions area_coco_matching;
  area_coco_matching.coco_matching = true;
  EXPECT_DOUBLE_EQ(d.eval(area_coco_matching).ap[0][0], 0.5);

  // Without the difficult flags both boxes count, and the ranking is TP, FP, TP.
  Detections plain = d;
  plain.gt_difficults.clear();
  const DetectionEvalResult p = plain.eval();
  EXPECT_EQ(p.n_positives, (std::vector<int64_t>{2}));
  // Precision 1, 1/2, 2/3 at recall 1/2, 1/2, 1: 1/2 * 1 + 1/2 * 2/3.
  EXPECT_DOUBLE_EQ(p.ap[0][0], 0.5 + 1.0 / 3);
}

TEST(DetectionMetrics, ClassWithoutGroundTruthIsNaNAndLeftOutOfTheMean) {
  Detections d;
  // Class 0: found. Class 1: only predicted. Class 2: only a difficult box. Class 3: unseen.
  d.add({0, 0, 10, 10, 0, 0, 5, 5, 20, 20, 30, 30}, {0, 1, 2}, {0.9, 0.8, 0.7},
        {0, 0, 10, 10, 20, 20, 30, 30}, {0, 2}, {false, true});
  const DetectionEvalResult r = d.eval({}, 4);
  ASSERT_EQ(r.ap[0].size(), 4u);
  EXPECT_DOUBLE_EQ(r.ap[0][0], 1.0);
  EXPECT_TRUE(std::isnan(r.ap[0][1]));
  EXPECT_TRUE(std::isnan(r.ap[0][2]));
  EXPECT_TRUE(std::isnan(r.ap[0][3]));
  EXPECT_DOUBLE_EQ(r.map[0], 1.0);
  ASSERT_EQ(r.recall[1].size(), 1u);
  EXPECT_TRUE(std::isnan(r.recall[1][0]));
  EXPECT_DOUBLE_EQ(r.precision[1][0], 0.0);
  // Without n_classes: one more than the largest label seen.
  EXPECT_EQ(d.eval().ap[0].size(), 3u);

  // A class with ground truth and no prediction has AP 0 and lowers the mean.
  Detections missed;
  missed.add({0, 0, 10, 10}, {0}, {0.9}, {0, 0, 10, 10, 0, 0, 10, 10}, {0, 1});
  const DetectionEvalResult m = missed.eval();
  EXPECT_DOUBLE_EQ(m.ap[0][1], 0.0);
  EXPECT_DOUBLE_EQ(m.map[0], 0.5);
}

TEST(DetectionMetrics, NoGroundTruthOrNoImages) {
  Detections only_preds;
  only_preds.add({0, 0, 10, 10}, {1}, {0.9}, {}, {});
  const DetectionEvalResult r = only_preds.eval();
  ASSERT_EQ(r.ap[0].size(), 2u);
  EXPECT_TRUE(std::isnan(r.ap[0][0]));
  EXPECT_TRUE(std::isnan(r.ap[0][1]));
  EXPECT_TRUE(std::isnan(r.map[0]));

  const DetectionEvalResult none = Detections{}.eval();
  EXPECT_TRUE(none.ap[0].empty());
  EXPECT_TRUE(std::isnan(none.map[0]));

  Detections empty_images;
  empty_images.add({}, {}, {}, {}, {});
  empty_images.add({}, {}, {}, {}, {});
  EXPECT_TRUE(empty_images.eval().ap[0].empty());
  const DetectionEvalResult three = empty_images.eval({}, 3);
  ASSERT_EQ(three.ap[0].size(), 3u);
  EXPECT_TRUE(std::isnan(three.map[0]));
  const DetectionScores s =
      detection_scores(empty_images.pred_bboxes, empty_images.pred_labels, empty_images.pred_scores,
                       empty_images.gt_bboxes, empty_images.gt_labels);
  EXPECT_TRUE(std::isnan(s.map50));
  EXPECT_TRUE(std::isnan(s.coco_map));
}

TEST(DetectionMetrics, IoUThresholdBoundary) {
  Detections d;
  // Intersection 50, union 100: IoU exactly 0.5.
  d.add({0, 0, 10, 5}, {0}, {0.9}, {0, 0, 10, 10}, {0});
  DetectionEvalOptions o;
  o.iou_thresholds = {0.5, 0.55};
  for (bool coco_matching : {false, true}) {
    o.coco_matching = coco_matching;
    const DetectionEvalResult r = d.eval(o);
    ASSERT_EQ(r.ap.size(), 2u);
    EXPECT_DOUBLE_EQ(r.ap[0][0], 1.0);
    EXPECT_DOUBLE_EQ(r.ap[1][0], 0.0);
    EXPECT_EQ(r.map, (std::vector<double>{1.0, 0.0}));
  }
  // Continuous coordinates: ChainerCV's +1 would make the IoU 66/121 = 0.545, a match at 0.51.
  o.iou_thresholds = {0.51};
  EXPECT_DOUBLE_EQ(d.eval(o).ap[0][0], 0.0);
}

// Equal scores keep the order of the images, then of the predictions within an image.
TEST(DetectionMetrics, TiesInScoreAreStable) {
  // A false positive first, then the true positive: precision 0, 1/2 at recall 0, 1.
  Detections fp_first;
  fp_first.add({50, 50, 60, 60, 0, 0, 10, 10}, {0, 0}, {0.5, 0.5}, {0, 0, 10, 10}, {0});
  EXPECT_DOUBLE_EQ(fp_first.eval().ap[0][0], 0.5);
  Detections tp_first;
  tp_first.add({0, 0, 10, 10, 50, 50, 60, 60}, {0, 0}, {0.5, 0.5}, {0, 0, 10, 10}, {0});
  EXPECT_DOUBLE_EQ(tp_first.eval().ap[0][0], 1.0);

  Detections images_fp_first;
  images_fp_first.add({50, 50, 60, 60}, {0}, {0.5}, {}, {});
  images_fp_first.add({0, 0, 10, 10}, {0}, {0.5}, {0, 0, 10, 10}, {0});
  EXPECT_DOUBLE_EQ(images_fp_first.eval().ap[0][0], 0.5);
  EXPECT_NEAR(images_fp_first.eval(coco101()).ap[0][0], 0.5, 1e-12);
  Detections images_tp_first;
  images_tp_first.add({0, 0, 10, 10}, {0}, {0.5}, {0, 0, 10, 10}, {0});
  images_tp_first.add({50, 50, 60, 60}, {0}, {0.5}, {}, {});
  EXPECT_DOUBLE_EQ(images_tp_first.eval().ap[0][0], 1.0);

  // Two equal predictions on one box: the first in index order takes it.
  Detections same_box;
  same_box.add({0, 0, 10, 10, 0, 0, 10, 10}, {0, 0}, {0.5, 0.5}, {0, 0, 10, 10}, {0});
  const DetectionEvalResult r = same_box.eval();
  EXPECT_EQ(r.precision[0], (std::vector<double>{1.0, 0.5}));
  EXPECT_DOUBLE_EQ(r.ap[0][0], 1.0);
}

// One class found at IoU 0.72 (5 of COCO's 10 thresholds), another at IoU 0.92 (9 of them).
TEST(DetectionMetrics, CocoMeanOverTenThresholds) {
  Detections d;
  d.add({0, 0, 10, 7.2, 0, 0, 10, 9.2}, {0, 1}, {0.9, 0.8}, {0, 0, 10, 10, 0, 0, 10, 10}, {0, 1});
  const DetectionScores s = detection_scores(d.pred_bboxes, d.pred_labels, d.pred_scores,
                                             d.gt_bboxes, d.gt_labels, d.gt_difficults);
  EXPECT_DOUBLE_EQ(s.map50, 1.0);
  EXPECT_NEAR(s.coco_map, (0.5 + 0.9) / 2, 1e-12);

  DetectionEvalOptions o = coco101(true);
  o.iou_thresholds = {0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95};
  const DetectionEvalResult r = d.eval(o);
  ASSERT_EQ(r.ap.size(), 10u);
  for (size_t t = 0; t < 10; ++t) {
    EXPECT_DOUBLE_EQ(r.ap[t][0], t < 5 ? 1.0 : 0.0) << "threshold " << t;
    EXPECT_DOUBLE_EQ(r.ap[t][1], t < 9 ? 1.0 : 0.0) << "threshold " << t;
  }
}

TEST(DetectionMetrics, OtherDtypes) {
  // float64 boxes and scores, int64 labels, int32 difficult flags, and float16 boxes.
  const std::vector<Array> pb{Array::from_vector(std::vector<double>{0, 0, 10, 10}, Shape{1, 4})};
  const std::vector<Array> pl{Array::from_vector(std::vector<int64_t>{0}, Shape{1})};
  const std::vector<Array> ps{Array::from_vector(std::vector<double>{0.5}, Shape{1})};
  const std::vector<Array> gb{
      Array::from_vector(std::vector<double>{0, 0, 10, 10, 0, 0, 5, 5}, Shape{2, 4})
          .astype(float16)};
  const std::vector<Array> gl{Array::from_vector(std::vector<int64_t>{0, 0}, Shape{2})};
  const std::vector<Array> gd{Array::from_vector(std::vector<int32_t>{0, 7}, Shape{2})};
  const DetectionEvalResult r = eval_detection(pb, pl, ps, gb, gl, gd);
  EXPECT_EQ(r.n_positives, (std::vector<int64_t>{1}));
  EXPECT_DOUBLE_EQ(r.ap[0][0], 1.0);
}

// ---- brute force -------------------------------------------------------------------------------

struct RefBox {
  double y0, x0, y1, x1;
};

double ref_iou(const RefBox& a, const RefBox& b) {
  const double ih = std::max(0.0, std::min(a.y1, b.y1) - std::max(a.y0, b.y0));
  const double iw = std::max(0.0, std::min(a.x1, b.x1) - std::max(a.x0, b.x0));
  const double u = (a.y1 - a.y0) * (a.x1 - a.x0) + (b.y1 - b.y0) * (b.x1 - b.x0) - ih * iw;
  return u > 0 ? ih * iw / u : 0.0;
}

struct RefImage {
  std::vector<RefBox> pb, gb;
  std::vector<int32_t> pl, gl;
  std::vector<double> ps;
  std::vector<bool> gd;
};

/// AP of class c straight from the definitions: rank all predictions (a stable sort on
/// (score, image, index)), match them in that order, then integrate.
double ref_ap(const std::vector<RefImage>& images, int c, double thresh, int form,
              bool coco_matching) {
  struct Pred {
    double score;
    size_t image, index;
  };
  std::vector<Pred> preds;
  int64_t positives = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    for (size_t k = 0; k < images[i].pl.size(); ++k) {
      if (images[i].pl[k] == c) preds.push_back({images[i].ps[k], i, k});
    }
    for (size_t g = 0; g < images[i].gl.size(); ++g) {
      positives += images[i].gl[g] == c && !images[i].gd[g];
    }
  }
  if (positives == 0) return std::numeric_limits<double>::quiet_NaN();
  std::sort(preds.begin(), preds.end(), [](const Pred& a, const Pred& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.image != b.image ? a.image < b.image : a.index < b.index;
  });
  std::vector<std::vector<bool>> taken(images.size());
  for (size_t i = 0; i < images.size(); ++i) taken[i].assign(images[i].gl.size(), false);
  std::vector<double> prec, rec;
  int64_t tp = 0, fp = 0;
  for (const Pred& p : preds) {
    const RefImage& im = images[p.image];
    int outcome = 0;  // 1 TP, 0 FP, -1 ignored
    if (!coco_matching) {
      int best = -1;
      double best_iou = -1;
      for (size_t g = 0; g < im.gl.size(); ++g) {
        if (im.gl[g] != c) continue;
        const double v = ref_iou(im.pb[p.index], im.gb[g]);
        if (v > best_iou) best_iou = v, best = static_cast<int>(g);
      }
      if (best >= 0 && best_iou >= thresh) {
        outcome = im.gd[best] ? -1 : (taken[p.image][best] ? 0 : 1);
        taken[p.image][best] = true;
      }
    } else {
      int best = -1;
      double best_iou = -1;
      for (int want_difficult = 0; want_difficult < 2 && best < 0; ++want_difficult) {
        for (size_t g = 0; g < im.gl.size(); ++g) {
          if (im.gl[g] != c || im.gd[g] != (want_difficult == 1) || taken[p.image][g]) continue;
          const double v = ref_iou(im.pb[p.index], im.gb[g]);
          if (v >= thresh && v >= best_iou) best_iou = v, best = static_cast<int>(g);
        }
      }
      if (best >= 0) {
        outcome = im.gd[best] ? -1 : 1;
        taken[p.image][best] = true;
      }
    }
    tp += outcome == 1;
    fp += outcome == 0;
    prec.push_back(tp + fp > 0 ? static_cast<double>(tp) / static_cast<double>(tp + fp) : 0.0);
    rec.push_back(static_cast<double>(tp) / static_cast<double>(positives));
  }
  auto best_precision_from = [&](size_t k) {
    double m = 0;
    for (size_t j = k; j < prec.size(); ++j) m = std::max(m, prec[j]);
    return m;
  };
  double ap = 0;
  if (form == 0) {
    double previous = 0;
    for (size_t k = 0; k < rec.size(); ++k) {
      if (rec[k] > previous) ap += (rec[k] - previous) * best_precision_from(k);
      previous = rec[k];
    }
  } else if (form == 1) {
    for (int t = 0; t <= 10; ++t) {
      double m = 0;
      for (size_t k = 0; k < rec.size(); ++k) {
        if (rec[k] >= t * 0.1) m = std::max(m, prec[k]);
      }
      ap += m / 11;
    }
  } else {
    for (int t = 0; t <= 100; ++t) {
      const double r = t == 100 ? 1.0 : t * 0.01;
      for (size_t k = 0; k < rec.size(); ++k) {
        if (rec[k] >= r) {
          ap += best_precision_from(k);
          break;
        }
      }
    }
    ap /= 101;
  }
  return ap;
}

TEST(DetectionMetrics, RandomImagesEqualBruteForce) {
  std::mt19937 rng(37);
  std::uniform_real_distribution<double> pos(0, 80), size(5, 30), jitter(-2, 2), unit(0, 1);
  constexpr int kClasses = 4;
  int strictly_between = 0;  // APs neither 0 nor 1: the data exercise the curves
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<RefImage> images(20);
    std::vector<Array> pb, pl, ps, gb, gl, gd;
    for (RefImage& im : images) {
      const int n_gt = static_cast<int>(rng() % 5);
      for (int g = 0; g < n_gt; ++g) {
        const double y = pos(rng), x = pos(rng);
        im.gb.push_back({y, x, y + size(rng), x + size(rng)});
        im.gl.push_back(static_cast<int32_t>(rng() % kClasses));
        im.gd.push_back(unit(rng) < 0.15);
      }
      const int n_pred = static_cast<int>(rng() % 7);
      for (int p = 0; p < n_pred; ++p) {
        RefBox b;
        if (n_gt > 0 && unit(rng) < 0.7) {
          const RefBox& g = im.gb[rng() % im.gb.size()];
          b = {g.y0 + jitter(rng), g.x0 + jitter(rng), g.y1 + jitter(rng), g.x1 + jitter(rng)};
        } else {
          const double y = pos(rng), x = pos(rng);
          b = {y, x, y + size(rng), x + size(rng)};
        }
        im.pb.push_back(b);
        im.pl.push_back(static_cast<int32_t>(rng() % kClasses));
        im.ps.push_back(static_cast<double>(rng() % 8) / 8);  // many ties
      }
      std::vector<double> flat_p, flat_g;
      for (const RefBox& b : im.pb) flat_p.insert(flat_p.end(), {b.y0, b.x0, b.y1, b.x1});
      for (const RefBox& b : im.gb) flat_g.insert(flat_g.end(), {b.y0, b.x0, b.y1, b.x1});
      const int64_t np = static_cast<int64_t>(im.pb.size()),
                    ng = static_cast<int64_t>(im.gb.size());
      pb.push_back(np ? Array::from_vector(flat_p, Shape{np, 4}) : Array::zeros({0, 4}, float64));
      pl.push_back(Array::from_vector(im.pl, Shape{np}));
      ps.push_back(Array::from_vector(im.ps, Shape{np}));
      gb.push_back(ng ? Array::from_vector(flat_g, Shape{ng, 4}) : Array::zeros({0, 4}, float64));
      gl.push_back(Array::from_vector(im.gl, Shape{ng}));
      gd.push_back(Array::from_vector(im.gd, Shape{ng}));
    }
    for (int form = 0; form < 3; ++form) {
      for (bool coco_matching : {false, true}) {
        DetectionEvalOptions o;
        o.iou_thresholds = {0.3, 0.5, 0.7};
        o.use_07_metric = form == 1;
        o.coco_interpolation = form == 2;
        o.coco_matching = coco_matching;
        const DetectionEvalResult r = eval_detection(pb, pl, ps, gb, gl, gd, kClasses, o);
        for (size_t t = 0; t < o.iou_thresholds.size(); ++t) {
          double sum = 0;
          int count = 0;
          for (int c = 0; c < kClasses; ++c) {
            const double want = ref_ap(images, c, o.iou_thresholds[t], form, coco_matching);
            SCOPED_TRACE(::testing::Message() << "trial " << trial << " form " << form
                                              << " coco_matching " << coco_matching << " threshold "
                                              << o.iou_thresholds[t] << " class " << c);
            if (std::isnan(want)) {
              EXPECT_TRUE(std::isnan(r.ap[t][static_cast<size_t>(c)]));
            } else {
              EXPECT_NEAR(r.ap[t][static_cast<size_t>(c)], want, 1e-12);
              strictly_between += want > 0 && want < 1;
              sum += want;
              ++count;
            }
          }
          EXPECT_NEAR(r.map[t], sum / count, 1e-12);
        }
      }
    }
    // detection_scores: VOC's AP at 0.5 and COCO's mean over ten thresholds.
    const DetectionScores s = detection_scores(pb, pl, ps, gb, gl, gd, kClasses);
    double map50 = 0, coco = 0;
    int count = 0;
    for (int c = 0; c < kClasses; ++c) {
      const double a = ref_ap(images, c, 0.5, 0, false);
      if (std::isnan(a)) continue;
      map50 += a;
      ++count;
      for (int k = 0; k < 10; ++k) coco += ref_ap(images, c, 0.5 + 0.05 * k, 2, true) / 10;
    }
    EXPECT_NEAR(s.map50, map50 / count, 1e-12);
    EXPECT_NEAR(s.coco_map, coco / count, 1e-12);
  }
  EXPECT_GT(strictly_between, 100);
}

// ---- errors ------------------------------------------------------------------------------------

TEST(DetectionMetrics, ErrorsNameTheInputAndWhatWasExpected) {
  Detections d;
  d.add({0, 0, 10, 10}, {0}, {0.9}, {0, 0, 10, 10}, {0});
  d.add({0, 0, 10, 10, 1, 1, 5, 5}, {0, 1}, {0.9, 0.8}, {0, 0, 10, 10}, {2});
  auto eval = [](const Detections& x, int64_t n_classes = -1, DetectionEvalOptions o = {}) {
    return [x, n_classes, o] { x.eval(o, n_classes); };
  };
  EXPECT_NO_THROW(eval(d)());

  Detections fewer = d;
  fewer.pred_scores.pop_back();
  EXPECT_TRUE(ThrowsWith<ValueError>(
      eval(fewer), {"eval_detection:", "different numbers of images", "pred_bboxes 2",
                    "pred_scores 1", "gt_difficults 2", "one array per image"}));
  Detections few_difficults = d;
  few_difficults.gt_difficults.pop_back();
  EXPECT_TRUE(ThrowsWith<ValueError>(eval(few_difficults), {"gt_difficults 1", "may be empty"}));

  EXPECT_TRUE(ThrowsWith<ValueError>(eval(d, -2), {"eval_detection: n_classes is -2", "-1"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      eval(d, 2), {"eval_detection: gt_labels[1] holds the label 2", "[0, 2)", "n_classes = 2"}));
  Detections negative = d;
  negative.pred_labels[1] = Array::from_vector(std::vector<int32_t>{0, -1}, Shape{2});
  EXPECT_TRUE(ThrowsWith<ValueError>(
      eval(negative), {"eval_detection: pred_labels[1] holds the label -1 at 1", ">= 0"}));

  Detections wide = d;
  wide.pred_bboxes[1] = Array::zeros({2, 5});
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      eval(wide), {"eval_detection: pred_bboxes[1] has shape (2, 5)", "expected (R, 4)"}));
  Detections flat = d;
  flat.gt_bboxes[0] = Array::zeros({4});
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      eval(flat), {"eval_detection: gt_bboxes[0] has shape (4,)", "expected (R, 4)"}));
  Detections short_labels = d;
  short_labels.pred_labels[1] = Array::from_vector(std::vector<int32_t>{0}, Shape{1});
  EXPECT_TRUE(ThrowsWith<ShapeError>(eval(short_labels),
                                     {"eval_detection: pred_labels[1] has shape (1,)",
                                      "pred_bboxes[1] has shape (2, 4)", "expected (2,)"}));
  Detections short_scores = d;
  short_scores.pred_scores[0] = Array::zeros({1, 1});
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      eval(short_scores), {"eval_detection: pred_scores[0] has shape (1, 1)", "expected (1,)"}));
  Detections short_gt_labels = d;
  short_gt_labels.gt_labels[1] = Array::zeros({0}, int32);
  EXPECT_TRUE(ThrowsWith<ShapeError>(eval(short_gt_labels),
                                     {"eval_detection: gt_labels[1] has shape (0,)",
                                      "gt_bboxes[1] has shape (1, 4)", "expected (1,)"}));
  Detections long_difficults = d;
  long_difficults.gt_difficults[0] = Array::zeros({3}, bool_);
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      eval(long_difficults), {"eval_detection: gt_difficults[0] has shape (3,)", "expected (1,)"}));
  Detections undefined = d;
  undefined.gt_bboxes[1] = Array();
  EXPECT_TRUE(ThrowsWith<ValueError>(
      eval(undefined), {"eval_detection: gt_bboxes[1] is an undefined Array", "(R, 4)"}));

  Detections float_labels = d;
  float_labels.gt_labels[0] = Array::zeros({1}, float32);
  EXPECT_TRUE(ThrowsWith<DtypeError>(
      eval(float_labels), {"eval_detection: gt_labels[0] has dtype float32", "integer"}));
  Detections int_boxes = d;
  int_boxes.pred_bboxes[0] = Array::zeros({1, 4}, int32);
  EXPECT_TRUE(ThrowsWith<DtypeError>(
      eval(int_boxes), {"eval_detection: pred_bboxes[0] has dtype int32", "floating"}));
  Detections int_scores = d;
  int_scores.pred_scores[0] = Array::zeros({1}, int64);
  EXPECT_TRUE(ThrowsWith<DtypeError>(
      eval(int_scores), {"eval_detection: pred_scores[0] has dtype int64", "floating"}));
  Detections float_difficults = d;
  float_difficults.gt_difficults[0] = Array::zeros({1}, float32);
  EXPECT_TRUE(ThrowsWith<DtypeError>(
      eval(float_difficults), {"eval_detection: gt_difficults[0] has dtype float32", "bool"}));

  Detections nan_score = d;
  nan_score.pred_scores[1] = Array::from_vector(
      std::vector<float>{0.5f, std::numeric_limits<float>::quiet_NaN()}, Shape{2});
  EXPECT_TRUE(
      ThrowsWith<ValueError>(eval(nan_score), {"eval_detection: pred_scores[1] holds NaN at 1"}));
  Detections inf_box = d;
  inf_box.gt_bboxes[0] = Array::from_vector(
      std::vector<float>{0, 0, std::numeric_limits<float>::infinity(), 10}, Shape{1, 4});
  EXPECT_TRUE(ThrowsWith<ValueError>(
      eval(inf_box), {"eval_detection: gt_bboxes[0] box 0 has the coordinate inf", "finite"}));

  DetectionEvalOptions o;
  o.iou_thresholds = {};
  EXPECT_TRUE(ThrowsWith<ValueError>(
      eval(d, -1, o), {"eval_detection: options.iou_thresholds is empty", "(0, 1]"}));
  for (double bad : {0.0, 1.5, -0.5, std::numeric_limits<double>::quiet_NaN()}) {
    o.iou_thresholds = {0.5, bad};
    EXPECT_TRUE(ThrowsWith<ValueError>(
        eval(d, -1, o), {"eval_detection: options.iou_thresholds[1] is ", "(0, 1]"}));
  }
  o.iou_thresholds = {1.0};
  EXPECT_NO_THROW(eval(d, -1, o)());
  o.use_07_metric = true;
  o.coco_interpolation = true;
  EXPECT_TRUE(ThrowsWith<ValueError>(
      eval(d, -1, o), {"eval_detection: options.use_07_metric and options.coco_interpolation"}));

  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        detection_scores(fewer.pred_bboxes, fewer.pred_labels, fewer.pred_scores, fewer.gt_bboxes,
                         fewer.gt_labels);
      },
      {"detection_scores: the inputs hold different numbers of images"}));
}

}  // namespace
}  // namespace kusari
