// Evaluating an object detector: the average precision (AP) of each class and their mean (mAP),
// as ChainerCV's eval_detection_voc computes them for PASCAL VOC and as COCO's evaluation does
// (docs/detection.md). Boxes follow ChainerCV's order (y_min, x_min, y_max, x_max), as in
// kusari/functions/detection.h.
//
//   kusari::DetectionEvalResult r = kusari::eval_detection(pred_bboxes, pred_labels, pred_scores,
//                                                          gt_bboxes, gt_labels, gt_difficults);
//   double map50 = r.map[0];
//
// Note [Detection mAP]
// Each class is evaluated on its own. Its predictions over all images are ranked by score,
// highest first; equal scores keep the order of the images and, within an image, the order of
// the predictions (a stable sort; ChainerCV's numpy argsort leaves ties in no promised order).
// Walking down the ranking, each prediction is matched against the ground-truth boxes of the
// same image and class at an IoU threshold t:
//   - VOC's rule (the default, ChainerCV's calc_detection_voc_prec_rec and the VOC devkit): the
//     prediction looks at the ground truth with the highest IoU (the first on ties). If that IoU
//     is below t, or the image has no ground truth of the class, it is a false positive. If that
//     box is difficult, the prediction is ignored: neither true nor false positive. Otherwise it
//     is a true positive when the box is still unmatched and a false positive (a duplicate) when
//     an earlier prediction took it; the duplicate does not move on to the second-best box.
//   - COCO's rule (DetectionEvalOptions::coco_matching, pycocotools' evaluateImg with difficult
//     boxes as its "ignore" boxes): the prediction takes the still unmatched non-difficult box
//     with the highest IoU >= t (the last on ties, as pycocotools), else the unmatched difficult
//     one with the highest IoU >= t (then it is ignored), else it is a false positive (a
//     threshold of 1 counts as 1 - 1e-10, as there).
// The IoU uses continuous coordinates, as COCO does: a box's area is
// (y_max - y_min) * (x_max - x_min). ChainerCV's VOC evaluation adds 1 to the heights and widths
// (pixel-inclusive integer boxes); kusari does not, so boxes of a few pixels score differently
// from ChainerCV and the same as from COCO. Extents below zero count as zero, and two boxes whose
// union has no area have IoU 0.
// With tp(k) and fp(k) the true and false positives among the first k ranked predictions and P
// the number of non-difficult ground-truth boxes of the class, precision(k) = tp / (tp + fp)
// (0 / 0, where only ignored predictions are among the first k, counts as 0) and recall(k) =
// tp / P. The envelope p*(k) is the largest precision at rank k or any later rank (precision
// made monotone from the right). AP is:
//   - by default, the area under the envelope: sum over the ranks where recall rises of
//     (recall(k) - recall(k - 1)) * p*(k) (ChainerCV's calc_detection_voc_ap, VOC2010 on);
//   - use_07_metric: the mean over recall levels r = 0, 0.1, ..., 1 of the largest precision at a
//     recall >= r, 0 where recall never reaches r (VOC2007's 11 points);
//   - coco_interpolation: the mean over r = 0, 0.01, ..., 1 of p* at the first rank whose recall
//     is >= r, 0 where recall never reaches r (COCO's 101 points).
// A class without non-difficult ground truth has AP NaN (ChainerCV's) and is left out of the mean
// (numpy's nanmean); when every class is NaN, so is mAP. COCO's headline number is mAP averaged
// over t = 0.50, 0.55, ..., 0.95. Unlike pycocotools, there is no cap on the predictions per image
// (its maxDets = 100) and no area ranges: keep the top 100 per image first to match it exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "kusari/core/array.h"

namespace kusari {

/// How eval_detection matches and integrates (Note [Detection mAP]).
struct DetectionEvalOptions {
  /// A prediction matches a ground-truth box when their IoU is >= t; one AP per threshold, each
  /// in (0, 1].
  std::vector<double> iou_thresholds = {0.5};
  /// VOC2007's 11-point AP instead of the area under the precision envelope.
  bool use_07_metric = false;
  /// COCO's 101-point interpolated AP (not together with use_07_metric).
  bool coco_interpolation = false;
  /// COCO's matching: a prediction takes the best still unmatched box, instead of VOC's rule that
  /// makes a prediction whose best box is already taken a false positive.
  bool coco_matching = false;
};

/// The output of eval_detection.
struct DetectionEvalResult {
  /// AP of every class at every threshold, [threshold][class]; NaN for a class without
  /// non-difficult ground truth.
  std::vector<std::vector<double>> ap;
  /// The mean AP at every threshold over the classes whose AP is not NaN (NaN when none is).
  std::vector<double> map;
  /// At the first threshold, for each class, the precision after each of its ranked predictions
  /// (NaN where only ignored predictions precede, as ChainerCV's prec).
  std::vector<std::vector<double>> precision;
  /// At the first threshold, for each class, the recall after each of its ranked predictions
  /// (all NaN for a class without non-difficult ground truth, where ChainerCV's rec is None).
  std::vector<std::vector<double>> recall;
  /// The number of non-difficult ground-truth boxes of each class.
  std::vector<int64_t> n_positives;
};

/// The AP of every class and the mAP of a detector's predictions against the ground truth (Note
/// [Detection mAP]). One entry per image in each vector: pred_bboxes[i] (R, 4) floating boxes
/// (y_min, x_min, y_max, x_max), pred_labels[i] (R,) integer classes, pred_scores[i] (R,)
/// floating confidences; gt_bboxes[i] (G, 4), gt_labels[i] (G,), and gt_difficults[i] (G,) bool or
/// integer (nonzero: difficult), or gt_difficults empty when no box is difficult. Arrays on any
/// device and of any floating (or integer) dtype are copied to the host as float64 (int64).
/// n_classes = -1 takes one more than the largest label seen; a given n_classes bounds the
/// labels. Throws ValueError, ShapeError or DtypeError naming the image and array at fault.
DetectionEvalResult eval_detection(
    const std::vector<Array>& pred_bboxes, const std::vector<Array>& pred_labels,
    const std::vector<Array>& pred_scores, const std::vector<Array>& gt_bboxes,
    const std::vector<Array>& gt_labels, const std::vector<Array>& gt_difficults = {},
    int64_t n_classes = -1, const DetectionEvalOptions& options = {});

/// The two numbers detectors are reported by.
struct DetectionScores {
  /// mAP at IoU 0.5, AP as the area under the precision envelope with VOC's matching
  /// (ChainerCV's eval_detection_voc with use_07_metric = false).
  double map50;
  /// COCO's mAP: the mean of the mAPs at IoU 0.50, 0.55, ..., 0.95, each with COCO's matching and
  /// 101-point AP.
  double coco_map;
};

/// mAP@0.5 (VOC, area under the curve) and COCO's mAP averaged over IoU 0.50:0.05:0.95 with
/// 101-point interpolation, from the inputs of eval_detection (the boxes' IoUs computed once).
DetectionScores detection_scores(const std::vector<Array>& pred_bboxes,
                                 const std::vector<Array>& pred_labels,
                                 const std::vector<Array>& pred_scores,
                                 const std::vector<Array>& gt_bboxes,
                                 const std::vector<Array>& gt_labels,
                                 const std::vector<Array>& gt_difficults = {},
                                 int64_t n_classes = -1);

}  // namespace kusari
