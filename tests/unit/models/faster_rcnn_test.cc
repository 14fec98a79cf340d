// Faster R-CNN (Note [Faster R-CNN layout], Note [FPN level of a RoI]): the RPN's outputs and
// anchors, proposals inside the image and within the top-k, the RoI sampler's foreground and
// background counts and targets, the level of a RoI, a loss whose gradient reaches every
// parameter, a tiny model that learns two pictures and then finds their objects, the anchors made
// once per input size, the errors, and the same numbers on the GPU as on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kusari/autograd/mode.h"
#include "kusari/core/random.h"
#include "kusari/functions.h"
#include "kusari/models.h"
#include "kusari/optimizers/adam.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = kusari::functions;
namespace M = kusari::models;
using testing::ThrowsWith;

// A Faster R-CNN small enough for a unit test: a width-8 ResNet-18-style backbone, levels 2-5,
// anchors of 16 ... 128 pixels, a few hundred proposals and a 64-unit box head.
M::FasterRCNNOptions tiny(int64_t classes) {
  M::FasterRCNNOptions o;
  o.num_classes = classes;
  o.block = M::ResNetBlock::kBasic;
  o.blocks_per_stage = {1, 1, 1, 1};
  o.width = 8;
  o.fpn_channels = 16;
  o.min_level = 2;
  o.max_level = 5;
  o.anchor_sizes = {16, 32, 64, 128};
  o.rpn_pre_nms_top_n_train = o.rpn_pre_nms_top_n_test = 200;
  o.rpn_post_nms_top_n_train = o.rpn_post_nms_top_n_test = 100;
  o.rpn_batch_size_per_image = 64;
  o.roi_batch_size_per_image = 64;
  o.representation_size = 64;
  return o;
}

Array boxes(const std::vector<float>& v) {
  return Array::from_vector(v, Shape{static_cast<int64_t>(v.size() / 4), 4});
}

Array classes(const std::vector<int32_t>& v) {
  return Array::from_vector(v, Shape{static_cast<int64_t>(v.size())});
}

TEST(FasterRCNN, RPNOutputsHaveOneRowPerAnchor) {
  manual_seed(0);
  M::FasterRCNNOptions o = tiny(3);
  o.max_level = 6;  // P6: P5 subsampled, for the RPN alone
  o.anchor_sizes = {16, 32, 64, 128, 256};
  M::FasterRCNN model(o);
  const Variable x(Array::uniform({2, 3, 64, 64}, -1, 1));
  const std::vector<Variable> feats = model.features(x);
  ASSERT_EQ(feats.size(), 5u);
  const std::vector<int64_t> sides = {16, 8, 4, 2, 1};
  for (size_t i = 0; i < feats.size(); ++i)
    EXPECT_EQ(feats[i].shape(), (Shape{2, 16, sides[i], sides[i]})) << "level " << i + 2;
  const M::RPNOutputs rpn = model.rpn_outputs(feats);
  EXPECT_EQ(rpn.anchors_per_level,
            (std::vector<int64_t>{16 * 16 * 3, 8 * 8 * 3, 4 * 4 * 3, 2 * 2 * 3, 1 * 3}));
  const int64_t n = (256 + 64 + 16 + 4 + 1) * 3;
  EXPECT_EQ(rpn.objectness.shape(), (Shape{2, n}));
  EXPECT_EQ(rpn.locs.shape(), (Shape{2, n, 4}));
  EXPECT_EQ(rpn.anchors.shape(), (Shape{n, 4}));
  // The first anchors are level 2's (stride 4, size 16), the last level 6's (stride 64, 256).
  const std::vector<float> a = rpn.anchors.to_vector<float>();
  EXPECT_NEAR((a[0] + a[2]) / 2, 2.0, 1e-5);
  EXPECT_NEAR(a[6] - a[4], 16.0, 1e-4);  // ratio 1: a 16 x 16 square
  EXPECT_NEAR(a[4 * (n - 2) + 2] - a[4 * (n - 2)], 256.0, 1e-3);
  // The RPN and box head are children with the documented names.
  std::set<std::string> names;
  for (const auto& [name, p] : model.namedparams()) names.insert(name);
  for (const char* want :
       {"/rpn/conv/W", "/rpn/objectness/W", "/rpn/loc/W", "/box_head/fc6/W", "/box_head/fc7/W",
        "/box_head/cls/W", "/box_head/loc/W", "/fpn/lateral2/W", "/backbone/conv1/W"})
    EXPECT_TRUE(names.count(want)) << want;
}

// Note [Anchor cache]: the anchors of an input size are made once and then shared by every call
// at that size, whatever the batch; another size has its own.
TEST(FasterRCNN, AnchorsAreMadeOncePerInputSize) {
  manual_seed(0);
  M::FasterRCNN model(tiny(3));
  const Variable x(Array::uniform({1, 3, 64, 64}, -1, 1));
  const M::RPNOutputs first = model.rpn_outputs(model.features(x));
  const M::RPNOutputs again =
      model.rpn_outputs(model.features(Variable(Array::uniform({2, 3, 64, 64}, -1, 1))));
  EXPECT_TRUE(again.anchors.shares_memory_with(first.anchors));
  EXPECT_TRUE(again.host_anchors.shares_memory_with(first.host_anchors));
  EXPECT_EQ(again.anchors_per_level, first.anchors_per_level);
  // On the CPU the outputs' anchors are the host copy itself.
  EXPECT_EQ(first.host_anchors.device(), Device::cpu());
  EXPECT_TRUE(first.anchors.shares_memory_with(first.host_anchors));
  // They are each level's generate_anchors (one size per level, each ratio), concatenated.
  const M::FasterRCNNOptions& o = model.options();
  std::vector<Array> levels;
  for (int l = 2; l <= 5; ++l) {
    const int64_t side = 64 >> l;
    levels.push_back(M::generate_anchors(side, side, std::ldexp(1.0, l),
                                         o.anchor_sizes[static_cast<size_t>(l - 2)], o.ratios,
                                         {1.0}));
  }
  EXPECT_EQ(first.anchors.to_vector<float>(), concatenate(levels, 0).to_vector<float>());
  // Another size: other anchors, as many as its levels' positions times 3.
  const M::RPNOutputs odd =
      model.rpn_outputs(model.features(Variable(Array::uniform({1, 3, 96, 32}, -1, 1))));
  EXPECT_FALSE(odd.anchors.shares_memory_with(first.anchors));
  EXPECT_EQ(odd.anchors_per_level,
            (std::vector<int64_t>{24 * 8 * 3, 12 * 4 * 3, 6 * 2 * 3, 3 * 3}));
  EXPECT_EQ(odd.anchors.shape(), (Shape{(192 + 48 + 12 + 3) * 3, 4}));
  // The first size is still cached.
  EXPECT_TRUE(model.rpn_outputs(model.features(x)).anchors.shares_memory_with(first.anchors));
  // Outputs without the host copy (put together by a caller) give the same proposals.
  M::RPNOutputs bare = first;
  bare.host_anchors = Array();
  const std::vector<Array> want = model.proposals(first, 64, 64, false);
  const std::vector<Array> got = model.proposals(bare, 64, 64, false);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got[0].to_vector<float>(), want[0].to_vector<float>());
}

TEST(FasterRCNN, ProposalsAreInsideTheImageAndAtMostTheTopK) {
  manual_seed(1);
  M::FasterRCNNOptions o = tiny(2);
  o.rpn_post_nms_top_n_train = 30;
  o.rpn_post_nms_top_n_test = 10;
  M::FasterRCNN model(o);
  const Variable x(Array::uniform({3, 3, 64, 48}, -1, 1));
  const M::RPNOutputs rpn = model.rpn_outputs(model.features(x));
  for (bool training : {true, false}) {
    const std::vector<Array> p = model.proposals(rpn, 64, 48, training);
    ASSERT_EQ(p.size(), 3u);
    for (const Array& b : p) {
      EXPECT_EQ(b.device(), Device::cpu());
      ASSERT_EQ(b.ndim(), 2);
      EXPECT_EQ(b.shape()[1], 4);
      EXPECT_GT(b.shape()[0], 0);
      EXPECT_LE(b.shape()[0], training ? 30 : 10);
      const std::vector<float> v = b.to_vector<float>();
      for (size_t j = 0; j < v.size(); j += 4) {
        EXPECT_GE(v[j], 0.0f);
        EXPECT_GE(v[j + 1], 0.0f);
        EXPECT_LE(v[j + 2], 64.0f);
        EXPECT_LE(v[j + 3], 48.0f);
        EXPECT_GT(v[j + 2] - v[j], 0.0f);  // no empty box survives rpn_min_size
        EXPECT_GT(v[j + 3] - v[j + 1], 0.0f);
      }
      // After NMS at 0.7 (per level) no two boxes of a level overlap that much; at least the
      // best box is not repeated.
      if (b.shape()[0] > 1) {
        const std::vector<float> iou =
            F::bbox_iou(Variable(b.at({Slice(0, 1)})), Variable(b.at({Slice(1, 2)})))
                .data()
                .to_vector<float>();
        EXPECT_LT(iou[0], 1.0f);
      }
    }
  }
}

TEST(FasterRCNN, SamplerDrawsForegroundAndBackgroundWithTheGroundTruth) {
  manual_seed(2);
  M::FasterRCNNOptions o = tiny(3);
  o.roi_batch_size_per_image = 16;
  o.roi_positive_fraction = 0.25;  // at most 4 foreground RoIs per image
  M::FasterRCNN model(o);
  // Image 0: boxes [0, 0, 20, 20] (class 2) and [30, 30, 60, 50] (class 0); two proposals on
  // the first box (IoU 0.9 and 0.8) and 30 far from both. Its 4 foreground candidates (two
  // proposals, two boxes) fill the quota exactly, so both boxes are drawn; 12 background.
  std::vector<float> p0 = {0, 0, 20, 18, 0, 0, 20, 16};
  for (int j = 0; j < 30; ++j) p0.insert(p0.end(), {40, 0, 50, 10 + 0.5f * j});
  // Image 1: one box [10, 10, 40, 40] (class 1) and 5 background proposals: 1 + 5 RoIs.
  std::vector<float> p1;
  for (int j = 0; j < 5; ++j) p1.insert(p1.end(), {50, 50, 60, 60 + 0.5f * j});
  const std::vector<Array> gt = {boxes({0, 0, 20, 20, 30, 30, 60, 50}), boxes({10, 10, 40, 40})};
  const std::vector<Array> label = {classes({2, 0}), classes({1})};
  const M::RoISamples s = model.sample_rois({boxes(p0), boxes(p1)}, gt, label);
  ASSERT_EQ(s.rois.shape(), (Shape{16 + 6, 4}));
  EXPECT_EQ(s.positives, 5);
  const std::vector<int32_t> img = s.roi_indices.to_vector<int32_t>();
  const std::vector<int32_t> cls = s.labels.to_vector<int32_t>();
  const std::vector<float> r = s.rois.to_vector<float>();
  const std::vector<float> l = s.locs.to_vector<float>();
  int fg0 = 0, bg0 = 0, fg1 = 0, bg1 = 0;
  bool gt00 = false, gt01 = false, gt10 = false;
  for (size_t j = 0; j < img.size(); ++j) {
    const std::vector<float> box(r.begin() + 4 * j, r.begin() + 4 * j + 4);
    const bool fg = cls[j] > 0;
    (img[j] == 0 ? (fg ? fg0 : bg0) : (fg ? fg1 : bg1)) += 1;
    if (img[j] == 0 && box == std::vector<float>{0, 0, 20, 20}) gt00 = true;
    if (img[j] == 0 && box == std::vector<float>{30, 30, 60, 50}) gt01 = true;
    if (img[j] == 1 && box == std::vector<float>{10, 10, 40, 40}) gt10 = true;
    if (fg) {
      // Classes shift by one: 0 is background.
      if (img[j] == 0 && box[0] == 0) {
        EXPECT_EQ(cls[j], 3);
      } else if (img[j] == 0) {
        EXPECT_EQ(cls[j], 1);
      } else {
        EXPECT_EQ(cls[j], 2);
      }
    } else {
      for (size_t d = 0; d < 4; ++d) EXPECT_EQ(l[4 * j + d], 0.0f);
    }
  }
  EXPECT_EQ(fg0, 4);
  EXPECT_EQ(bg0, 12);
  EXPECT_EQ(fg1, 1);
  EXPECT_EQ(bg1, 5);
  EXPECT_TRUE(gt00 && gt01 && gt10);
  // Foreground first within each image; the targets are bbox_to_loc times (10, 10, 5, 5): the
  // proposal [0, 0, 20, 18] onto [0, 0, 20, 20] is (0, 1/18, 0, log(20/18)) weighted.
  EXPECT_GT(cls[0], 0);
  for (size_t j = 0; j < 4; ++j) {
    if (std::vector<float>(r.begin() + 4 * j, r.begin() + 4 * j + 4) ==
        std::vector<float>{0, 0, 20, 18}) {
      EXPECT_NEAR(l[4 * j + 0], 0.0, 1e-6);
      EXPECT_NEAR(l[4 * j + 1], 10.0 / 18, 1e-5);
      EXPECT_NEAR(l[4 * j + 2], 0.0, 1e-6);
      EXPECT_NEAR(l[4 * j + 3], 5 * std::log(20.0 / 18), 1e-5);
    }
  }
  // Drawn from the default generator: the same seed draws the same RoIs.
  manual_seed(2);
  M::FasterRCNN again(o);
  const M::RoISamples s2 = again.sample_rois({boxes(p0), boxes(p1)}, gt, label);
  EXPECT_EQ(s2.rois.to_vector<float>(), r);
  // A model's own generator: independent of the default one.
  Generator g1(7), g2(7);
  M::FasterRCNN a(o, &g1), b(o, &g2);
  manual_seed(99);
  const M::RoISamples sa = a.sample_rois({boxes(p0), boxes(p1)}, gt, label);
  manual_seed(100);
  const M::RoISamples sb = b.sample_rois({boxes(p0), boxes(p1)}, gt, label);
  EXPECT_EQ(sa.rois.to_vector<float>(), sb.rois.to_vector<float>());
}

TEST(FasterRCNN, LevelOfARoIFollowsTheCanonicalRule) {
  // Squares of side s: k = floor(4 + log2(s / 224)), clamped to 2 ... 5.
  const Array rois = boxes({
      0, 0, 20,   20,    // s 20: below level 2, clamped
      0, 0, 56,   56,    // 2
      0, 0, 111,  111,   // 2
      0, 0, 112,  112,   // 3
      0, 0, 223,  223,   // 3
      0, 0, 224,  224,   // 4
      0, 0, 56,   224,   // sqrt(56 * 224) = 112: 3
      0, 0, 448,  448,   // 5
      0, 0, 2000, 2000,  // above 5, clamped
      5, 5, 5,    5,     // empty: the lowest level
  });
  EXPECT_EQ(M::fpn_roi_levels(rois, 2, 5), (std::vector<int64_t>{2, 2, 2, 3, 3, 4, 3, 5, 5, 2}));
  // Other bounds and another canonical scale.
  EXPECT_EQ(M::fpn_roi_levels(rois.at({Slice(0, 3)}), 3, 4), (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(M::fpn_roi_levels(boxes({0, 0, 100, 100}), 2, 6, 100.0, 4), (std::vector<int64_t>{4}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { M::fpn_roi_levels(rois, 5, 2); },
                                     {"fpn_roi_levels", "min_level 5", "max_level 2"}));
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        M::fpn_roi_levels(Array::zeros({2, 3}), 2, 5);
      },
      {"fpn_roi_levels", "rois", "(2, 3)"}));
}

// Two 64 x 64 pictures: bright squares (class 0) and dark bars (class 1) on grey.
struct Pictures {
  Array images;
  std::vector<Array> bboxes, labels;
};

Pictures pictures() {
  struct Object {
    int y0, x0, y1, x1;
    int32_t label;
  };
  const std::vector<std::vector<Object>> objects = {
      {{8, 8, 24, 24, 0}, {36, 30, 60, 42, 1}},
      {{30, 10, 46, 26, 0}, {6, 40, 30, 52, 1}, {44, 44, 60, 60, 0}},
  };
  std::vector<float> pixels(2 * 3 * 64 * 64, 0.0f);
  Pictures p;
  for (size_t i = 0; i < objects.size(); ++i) {
    std::vector<float> b;
    std::vector<int32_t> l;
    for (const Object& o : objects[i]) {
      for (int c = 0; c < 3; ++c) {
        for (int y = o.y0; y < o.y1; ++y) {
          for (int x = o.x0; x < o.x1; ++x)
            pixels[((i * 3 + c) * 64 + y) * 64 + x] = o.label == 0 ? 1.0f : -1.0f;
        }
      }
      b.insert(b.end(), {static_cast<float>(o.y0), static_cast<float>(o.x0),
                         static_cast<float>(o.y1), static_cast<float>(o.x1)});
      l.push_back(o.label);
    }
    p.bboxes.push_back(boxes(b));
    p.labels.push_back(classes(l));
  }
  p.images = Array::from_vector(pixels, Shape{2, 3, 64, 64});
  return p;
}

TEST(FasterRCNN, LossReachesEveryParameterAndTrainingFindsTheObjects) {
  manual_seed(3);
  auto model = std::make_shared<M::FasterRCNN>(tiny(2));
  const Pictures p = pictures();
  M::FasterRCNNLoss first = model->loss(Variable(p.images), p.bboxes, p.labels);
  for (const Variable* v :
       {&first.total, &first.rpn_objectness, &first.rpn_loc, &first.roi_cls, &first.roi_loc}) {
    EXPECT_EQ(v->ndim(), 0);
    EXPECT_TRUE(std::isfinite(v->data().item<double>()));
  }
  EXPECT_GT(first.rpn_loc.data().item<double>(), 0.0);  // the RPN has positives
  EXPECT_GT(first.roi_loc.data().item<double>(), 0.0);  // the ground truth is foreground
  first.total.backward();
  for (const auto& [name, param] : model->namedparams()) {
    ASSERT_TRUE(param.grad().defined()) << name;
  }
  // A few gradients that are not zero: the backbone's, the RPN's and the box head's.
  for (const char* name : {"/backbone/conv1/W", "/rpn/objectness/W", "/rpn/loc/W",
                           "/box_head/fc6/W", "/box_head/cls/W", "/box_head/loc/W"}) {
    for (const auto& [n, param] : model->namedparams()) {
      if (n == name) EXPECT_GT(amax(abs(param.grad())).item<double>(), 0.0) << name;
    }
  }

  optimizers::Adam opt(3e-3);
  opt.setup(model);
  double last = first.total.data().item<double>();
  for (int step = 0; step < 60; ++step) {
    model->cleargrads();
    M::FasterRCNNLoss l = model->loss(Variable(p.images), p.bboxes, p.labels);
    l.total.backward();
    opt.update();
    last = l.total.data().item<double>();
  }
  EXPECT_LT(last, first.total.data().item<double>() * 0.25);
  // Batch normalization's running statistics have not settled in a few steps: read the trained
  // model out in training mode's statistics (as RetinaNet's test does).
  const M::Detections d = model->detections(Variable(p.images));
  ASSERT_EQ(d.bboxes.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const std::vector<float> scores = d.scores[i].to_vector<float>();
    for (size_t j = 1; j < scores.size(); ++j) EXPECT_GE(scores[j - 1], scores[j]);
    // Every object is found: some detection of its class overlaps it with IoU > 0.5.
    const int64_t g = p.bboxes[i].shape()[0];
    ASSERT_GT(d.bboxes[i].shape()[0], 0) << "image " << i;
    const std::vector<float> iou =
        F::bbox_iou(Variable(d.bboxes[i]), Variable(p.bboxes[i])).data().to_vector<float>();
    const std::vector<int32_t> found = d.labels[i].to_vector<int32_t>();
    const std::vector<int32_t> want = p.labels[i].to_vector<int32_t>();
    for (int64_t k = 0; k < g; ++k) {
      double best = 0;
      for (size_t j = 0; j < found.size(); ++j) {
        if (found[j] == want[static_cast<size_t>(k)])
          best = std::max<double>(best, iou[j * static_cast<size_t>(g) + static_cast<size_t>(k)]);
      }
      EXPECT_GT(best, 0.5) << "image " << i << " box " << k;
    }
  }
}

TEST(FasterRCNN, AnImageWithoutObjectsIsAllBackground) {
  manual_seed(5);
  M::FasterRCNN model(tiny(2));
  const Variable x(Array::uniform({2, 3, 64, 64}, -1, 1));
  const std::vector<Array> gt = {Array::zeros({0, 4}), boxes({8, 8, 30, 30})};
  const std::vector<Array> label = {Array::zeros({0}, int32), classes({1})};
  const M::FasterRCNNLoss l = model.loss(x, gt, label);
  EXPECT_TRUE(std::isfinite(l.total.data().item<double>()));
  // Image 0's RoIs are all background, drawn up to the batch size from its proposals.
  const M::RPNOutputs rpn = model.rpn_outputs(model.features(x));
  const M::RoISamples s = model.sample_rois(model.proposals(rpn, 64, 64, true), gt, label);
  const std::vector<int32_t> img = s.roi_indices.to_vector<int32_t>();
  const std::vector<int32_t> cls = s.labels.to_vector<int32_t>();
  int64_t image0 = 0;
  for (size_t j = 0; j < img.size(); ++j) {
    if (img[j] != 0) continue;
    ++image0;
    EXPECT_EQ(cls[j], 0);
  }
  EXPECT_EQ(image0, 64);
  EXPECT_GE(s.positives, 1);  // image 1's box, at least
}

TEST(FasterRCNN, PredictKeepsAtMostMaxDetectionsInsideTheImage) {
  manual_seed(4);
  M::FasterRCNNOptions o = tiny(2);
  o.score_threshold = 0.0;  // every RoI and class is a candidate
  o.max_detections = 7;
  M::FasterRCNN model(o);
  const M::Detections d = model.predict(Variable(Array::uniform({3, 3, 64, 48}, -1, 1)));
  ASSERT_EQ(d.bboxes.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d.bboxes[i].shape(), (Shape{7, 4}));
    EXPECT_EQ(d.labels[i].shape(), (Shape{7}));
    EXPECT_EQ(d.scores[i].shape(), (Shape{7}));
    for (int32_t c : d.labels[i].to_vector<int32_t>()) EXPECT_TRUE(c == 0 || c == 1) << c;
    const std::vector<float> b = d.bboxes[i].to_vector<float>();
    for (size_t j = 0; j < b.size(); j += 4) {
      EXPECT_GE(b[j], 0.0f);
      EXPECT_GE(b[j + 1], 0.0f);
      EXPECT_LE(b[j + 2], 64.0f);
      EXPECT_LE(b[j + 3], 48.0f);
    }
  }
}

TEST(FasterRCNN, Errors) {
  M::FasterRCNNOptions o = tiny(0);
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { M::FasterRCNN m(o); }, {"FasterRCNN", "num_classes", "0"}));
  o = tiny(2);
  o.anchor_sizes = {16, 32};
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { M::FasterRCNN m(o); },
                                     {"FasterRCNN", "one anchor size per level", "4", "got 2"}));
  o = tiny(2);
  o.min_level = 1;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { M::FasterRCNN m(o); }, {"FasterRCNN", "min_level 1"}));
  o = tiny(2);
  o.box_coder_weights = {10, 10, 5};
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { M::FasterRCNN m(o); }, {"FasterRCNN", "box_coder_weights"}));
  o = tiny(2);
  o.rpn_positive_iou = 0.2;
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { M::FasterRCNN m(o); }, {"match_anchors", "positive_iou 0.2"}));

  M::FasterRCNN model(tiny(2));
  const Variable x(Array::zeros({2, 3, 64, 64}));
  const Array one = boxes({0, 0, 20, 20});
  // Batch size mismatch.
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { model.loss(x, {one}, {classes({0})}); },
                                     {"FasterRCNN::loss", "2 images", "1 boxes", "1 labels"}));
  // A label outside 0 ... num_classes - 1.
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        model.loss(x, {one, one}, {classes({0}), classes({5})});
      },
      {"FasterRCNN::loss", "image 1", "class 5", "2 classes"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        model.loss(x, {one, one}, {classes({-1}), classes({0})});
      },
      {"FasterRCNN::loss", "image 0", "class -1"}));
  // Boxes of the wrong shape, labels that do not match them.
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        model.loss(x, {one, Array::zeros({1, 3})}, {classes({0}), classes({0})});
      },
      {"FasterRCNN::loss", "bboxes[1]", "(1, 3)"}));
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        model.loss(x, {one, one}, {classes({0}), classes({0, 1})});
      },
      {"FasterRCNN::loss", "labels[1]", "G = 1", "(2,)"}));
  // Images of the wrong shape.
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        model.loss(Variable(Array::zeros({2, 1, 64, 64})), {one, one},
                   {classes({0}), classes({0})});
      },
      {"FasterRCNN", "(2, 1, 64, 64)"}));
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        model.predict(Variable(Array::zeros({64, 64})));
      },
      {"FasterRCNN", "(N, 3, H, W)", "(64, 64)"}));
}

// --- GPU ---------------------------------------------------------------------------------------

class FasterRCNNCuda : public testing::CudaTest {};

// The loss, its four parts, every parameter's gradient, the RoI head's outputs and the
// detections of a tiny Faster R-CNN agree between the CPU and the GPU (matching, sampling and
// proposals run on the host for both; each model draws from a generator of the same seed).
TEST_F(FasterRCNNCuda, LossGradientsAndDetectionsMatchTheCpu) {
  manual_seed(6);
  M::FasterRCNNOptions o = tiny(3);
  // Every anchor a proposal and every RoI drawn: no top-k, suppression or draw whose outcome
  // hangs on the last bits of near-equal scores of an untrained RPN, which the two devices may
  // round differently (NMS at IoU 1 removes exact duplicates alone).
  o.rpn_pre_nms_top_n_train = o.rpn_pre_nms_top_n_test = 100000;
  o.rpn_post_nms_top_n_train = o.rpn_post_nms_top_n_test = 100000;
  o.rpn_nms_threshold = 1.0;
  o.roi_batch_size_per_image = 100000;
  o.roi_positive_fraction = 1.0;
  o.score_threshold = 0.0;
  o.max_detections = 20;
  Generator gen_cpu(11), gen_gpu(11);
  auto cpu = std::make_shared<M::FasterRCNN>(o, &gen_cpu);
  auto gpu = std::make_shared<M::FasterRCNN>(o, &gen_gpu);
  gpu->copyparams(*cpu);
  gpu->to_device(Device::cuda(0));
  // Batch 8: the backbone's last batch norms see 8 x 2 x 2 values per channel.
  const Array x = Array::uniform({8, 3, 64, 64}, -1, 1);
  const Array xg = x.to_device(Device::cuda(0));
  std::vector<Array> gt, label;
  for (int i = 0; i < 8; ++i) {
    const float o1 = static_cast<float>(4 * i);
    gt.push_back(boxes({o1, o1, o1 + 20, o1 + 16, 30, 8, 50, 40}));
    label.push_back(classes({i % 3, (i + 1) % 3}));
  }
  M::FasterRCNNLoss lc = cpu->loss(Variable(x), gt, label);
  lc.total.backward();
  M::FasterRCNNLoss lg = gpu->loss(Variable(xg), gt, label);
  lg.total.backward();
  // The anchors on the GPU are one cached copy of the host's (Note [Anchor cache]).
  {
    NoBackpropMode no_graph;
    const M::RPNOutputs first = gpu->rpn_outputs(gpu->features(Variable(xg)));
    const M::RPNOutputs again = gpu->rpn_outputs(gpu->features(Variable(xg)));
    EXPECT_EQ(first.anchors.device(), Device::cuda(0));
    EXPECT_EQ(first.host_anchors.device(), Device::cpu());
    EXPECT_TRUE(again.anchors.shares_memory_with(first.anchors));
    EXPECT_TRUE(again.host_anchors.shares_memory_with(first.host_anchors));
    EXPECT_EQ(first.anchors.to_device(Device::cpu()).to_vector<float>(),
              first.host_anchors.to_vector<float>());
  }
  EXPECT_NEAR(lg.rpn_objectness.data().item<double>(), lc.rpn_objectness.data().item<double>(),
              1e-4);
  EXPECT_NEAR(lg.rpn_loc.data().item<double>(), lc.rpn_loc.data().item<double>(), 1e-4);
  // The RoI head's losses come through a few more layers: a looser bound.
  EXPECT_NEAR(lg.roi_cls.data().item<double>(), lc.roi_cls.data().item<double>(), 1e-3);
  EXPECT_NEAR(lg.roi_loc.data().item<double>(), lc.roi_loc.data().item<double>(), 1e-3);
  auto a = gpu->namedparams();
  auto b = cpu->namedparams();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].second.grad().defined()) << a[i].first;
    // Within a few percent of the largest gradient: two summation orders (cuDNN's, oneDNN's).
    const Array want = b[i].second.grad();
    double largest = 1e-30;
    for (double v : want.to_vector<double>()) largest = std::max(largest, std::abs(v));
    EXPECT_TRUE(testing::ArraysClose(a[i].second.grad().to_device(Device::cpu()), want, 0.0,
                                     5e-2 * largest))
        << a[i].first;
  }
  // The RoI head on the same RoIs (RoI Align on the GPU, the level of each RoI, the order put
  // back after pooling by level).
  {
    NoBackpropMode no_graph;
    const Array rois = boxes({0, 0, 20, 20, 4, 4, 60, 60, 10, 0, 64, 64, 2, 30, 40, 62});
    const Array images = classes({3, 0, 5, 3});
    const M::RoIHeadOutputs hc = cpu->roi_head(cpu->features(Variable(x)), rois, images);
    const M::RoIHeadOutputs hg = gpu->roi_head(gpu->features(Variable(xg)), rois, images);
    EXPECT_TRUE(testing::ArraysClose(hg.scores.data().to_device(Device::cpu()), hc.scores.data(),
                                     1e-3, 1e-3));
    EXPECT_TRUE(
        testing::ArraysClose(hg.locs.data().to_device(Device::cpu()), hc.locs.data(), 1e-3, 1e-3));
  }
  // The read-out: as many detections, the same best score. (Which box is best may differ where
  // an untrained head scores many RoIs alike.)
  const M::Detections dc = cpu->predict(Variable(x));
  const M::Detections dg = gpu->predict(Variable(xg));
  ASSERT_EQ(dg.bboxes.size(), dc.bboxes.size());
  for (size_t i = 0; i < dc.bboxes.size(); ++i) {
    EXPECT_EQ(dg.bboxes[i].device(), Device::cpu());
    EXPECT_EQ(dg.bboxes[i].shape(), dc.bboxes[i].shape());
    EXPECT_NEAR(dg.scores[i].to_vector<float>().at(0), dc.scores[i].to_vector<float>().at(0), 1e-4);
  }
}

}  // namespace
}  // namespace kusari
