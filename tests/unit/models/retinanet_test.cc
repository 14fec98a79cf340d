// RetinaNet (Note [RetinaNet layout], Note [RetinaNet anchors and targets]): the anchors'
// geometry and order, the matching rules (positives, ignored, background, low-quality matches,
// offsets equal to bbox_to_loc), the heads' shapes and the classification prior, a loss whose
// gradient reaches every parameter, a few training steps on one image after which predict()
// finds its objects, the anchors made once per input size, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
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

// A RetinaNet small enough for a unit test: a width-8 ResNet-18-style backbone, levels 3-5.
M::RetinaNetOptions tiny(int64_t classes) {
  M::RetinaNetOptions o;
  o.num_classes = classes;
  o.block = M::ResNetBlock::kBasic;
  o.blocks_per_stage = {1, 1, 1, 1};
  o.width = 8;
  o.fpn_channels = 16;
  o.head_convs = 1;
  o.min_level = 3;
  o.max_level = 5;
  o.anchor_scale = 2.0;
  return o;
}

Array boxes(const std::vector<float>& v) {
  return Array::from_vector(v, Shape{static_cast<int64_t>(v.size() / 4), 4});
}

TEST(RetinaNetAnchors, GeometryAndOrder) {
  const std::vector<double> ratios = {0.5, 2.0}, scales = {1.0, 2.0};
  const Array a = M::generate_anchors(2, 3, 8.0, 16.0, ratios, scales);
  ASSERT_EQ(a.shape(), (Shape{2 * 3 * 4, 4}));
  const std::vector<float> v = a.to_vector<float>();
  // Position (1, 2): centre (12, 20); the fourth anchor there is ratio 2, scale 2: height
  // 32 sqrt(2), width 32 / sqrt(2).
  const size_t i = (1 * 3 + 2) * 4 + 3;
  const double h = 32 * std::sqrt(2.0), w = 32 / std::sqrt(2.0);
  EXPECT_NEAR(v[4 * i + 0], 12 - h / 2, 1e-4);
  EXPECT_NEAR(v[4 * i + 1], 20 - w / 2, 1e-4);
  EXPECT_NEAR(v[4 * i + 2], 12 + h / 2, 1e-4);
  EXPECT_NEAR(v[4 * i + 3], 20 + w / 2, 1e-4);
  // The first anchor: position (0, 0), ratio 0.5, scale 1: height 16 sqrt(.5), width 16 / sqrt(.5).
  EXPECT_NEAR(v[2] - v[0], 16 * std::sqrt(0.5), 1e-4);
  EXPECT_NEAR(v[3] - v[1], 16 / std::sqrt(0.5), 1e-4);
  EXPECT_NEAR((v[0] + v[2]) / 2, 4.0, 1e-5);
  EXPECT_EQ(M::generate_anchors(0, 5, 8.0, 16.0, ratios, scales).shape(), (Shape{0, 4}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { M::generate_anchors(2, 2, 0.0, 16.0, ratios, scales); },
                                     {"generate_anchors", "stride", "0"}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { M::generate_anchors(2, 2, 8.0, 16.0, {}, scales); },
                                     {"generate_anchors", "ratio"}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { M::generate_anchors(2, 2, 8.0, 16.0, {-1.0}, scales); },
                                     {"generate_anchors", "-1"}));
}

TEST(RetinaNetAnchors, MatchingRules) {
  // Ground truth: box 0 (class 2) [0, 0, 10, 10], box 1 (class 0) [20, 20, 30, 40].
  const Array gt = boxes({0, 0, 10, 10, 20, 20, 30, 40});
  const Array label = Array::from_vector(std::vector<int32_t>{2, 0}, Shape{2});
  const Array anchors = boxes({
      0,  0,  10, 12,  // IoU 100/120 = 0.83 with box 0: positive, class 2
      0,  0,  10, 22,  // IoU 100/220 = 0.45: ignored
      50, 50, 60, 60,  // no overlap: background
      20, 20, 30, 60,  // IoU 200/400 = 0.5 with box 1: positive (>= 0.5), class 0
      0,  5,  10, 25,  // IoU 50/250 = 0.2 with box 0: background
  });
  const M::AnchorTargets t = M::match_anchors(anchors, gt, label, 0.5, 0.4);
  EXPECT_EQ(t.labels.to_vector<int32_t>(), (std::vector<int32_t>{2, -2, -1, 0, -1}));
  EXPECT_EQ(t.matched.to_vector<int32_t>(), (std::vector<int32_t>{0, -1, -1, 1, -1}));
  const std::vector<float> locs = t.locs.to_vector<float>();
  const std::vector<float> want0 =
      F::bbox_to_loc(Variable(anchors.at({Slice(0, 1)})), Variable(gt.at({Slice(0, 1)})))
          .data()
          .to_vector<float>();
  const std::vector<float> want3 =
      F::bbox_to_loc(Variable(anchors.at({Slice(3, 4)})), Variable(gt.at({Slice(1, 2)})))
          .data()
          .to_vector<float>();
  for (size_t d = 0; d < 4; ++d) {
    EXPECT_NEAR(locs[d], want0[d], 1e-6);
    EXPECT_NEAR(locs[12 + d], want3[d], 1e-6);
    EXPECT_EQ(locs[4 + d], 0.0f);  // not a positive
  }
}

TEST(RetinaNetAnchors, LowQualityMatchesGiveEveryBoxAnAnchor) {
  // A small box whose best anchor only reaches IoU 0.25: with low-quality matches that anchor
  // (and any tied with it) becomes a positive; without, it stays background.
  const Array gt = boxes({0, 0, 10, 10});
  const Array label = Array::from_vector(std::vector<int32_t>{1}, Shape{1});
  const Array anchors = boxes({0, 0, 20, 20, 0, 0, 20, 20, 30, 30, 40, 40});
  const M::AnchorTargets with = M::match_anchors(anchors, gt, label, 0.5, 0.4, true);
  EXPECT_EQ(with.labels.to_vector<int32_t>(), (std::vector<int32_t>{1, 1, -1}));
  const M::AnchorTargets without = M::match_anchors(anchors, gt, label, 0.5, 0.4, false);
  EXPECT_EQ(without.labels.to_vector<int32_t>(), (std::vector<int32_t>{-1, -1, -1}));
  // No boxes at all: every anchor is background.
  const M::AnchorTargets none =
      M::match_anchors(anchors, Array::zeros({0, 4}), Array::zeros({0}, int32), 0.5, 0.4);
  EXPECT_EQ(none.labels.to_vector<int32_t>(), (std::vector<int32_t>{-1, -1, -1}));
}

TEST(RetinaNetAnchors, MatchingErrors) {
  const Array a = boxes({0, 0, 1, 1});
  const Array l = Array::from_vector(std::vector<int32_t>{0}, Shape{1});
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { M::match_anchors(a, a, l, 0.4, 0.5); },
                                     {"match_anchors", "negative_iou 0.5", "positive_iou 0.4"}));
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        M::match_anchors(a, Array::zeros({1, 3}), l);
      },
      {"match_anchors", "bbox", "(1, 3)"}));
  EXPECT_TRUE(ThrowsWith<ShapeError>([&] { M::match_anchors(a, a, Array::zeros({2}, int32)); },
                                     {"match_anchors", "label", "G = 1"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { M::match_anchors(a, a, Array::from_vector(std::vector<int32_t>{-3}, Shape{1})); },
      {"match_anchors", "label[0] is -3"}));
}

TEST(RetinaNet, OutputsHaveOneRowPerAnchorAndStartAtThePrior) {
  manual_seed(0);
  M::RetinaNet model(tiny(3));
  const Array x = Array::uniform({2, 3, 64, 64}, -1, 1);
  const M::RetinaNetOutputs out = model.outputs(Variable(x));
  // Levels 3, 4, 5 of a 64 x 64 image: 8 x 8, 4 x 4 and 2 x 2 positions, 9 anchors each.
  EXPECT_EQ(out.anchors_per_level, (std::vector<int64_t>{8 * 8 * 9, 4 * 4 * 9, 2 * 2 * 9}));
  const int64_t n = (64 + 16 + 4) * 9;
  EXPECT_EQ(out.scores.shape(), (Shape{2, n, 3}));
  EXPECT_EQ(out.locs.shape(), (Shape{2, n, 4}));
  EXPECT_EQ(out.anchors.shape(), (Shape{n, 4}));
  // Every anchor starts near the prior probability 0.01 (the heads' last filters are small).
  const double mean_p = mean(sigmoid(out.scores.data())).item<double>();
  EXPECT_NEAR(mean_p, 0.01, 0.005);
  // An odd size: 72 x 40 gives levels of 9 x 5, 5 x 3 and 3 x 2 (the upsampled level is cropped).
  const M::RetinaNetOutputs odd = model.outputs(Variable(Array::uniform({1, 3, 72, 40}, -1, 1)));
  EXPECT_EQ(odd.anchors_per_level, (std::vector<int64_t>{9 * 5 * 9, 5 * 3 * 9, 3 * 2 * 9}));
  // Levels 6 and 7 add two convolutions.
  M::RetinaNetOptions o = tiny(3);
  o.max_level = 7;
  M::RetinaNet deep(o);
  EXPECT_EQ(deep.outputs(Variable(x)).anchors_per_level.size(), 5u);
}

// Note [Anchor cache]: the anchors of an input size are made once and then shared by every call
// at that size, whatever the batch; another size has its own.
TEST(RetinaNet, AnchorsAreMadeOncePerInputSize) {
  manual_seed(0);
  M::RetinaNet model(tiny(3));
  const Variable x(Array::uniform({1, 3, 64, 64}, -1, 1));
  const M::RetinaNetOutputs first = model.outputs(x);
  const M::RetinaNetOutputs again = model.outputs(Variable(Array::uniform({2, 3, 64, 64}, -1, 1)));
  EXPECT_TRUE(again.anchors.shares_memory_with(first.anchors));
  EXPECT_TRUE(again.host_anchors.shares_memory_with(first.host_anchors));
  EXPECT_EQ(again.anchors_per_level, first.anchors_per_level);
  // On the CPU the outputs' anchors are the host copy itself.
  EXPECT_EQ(first.host_anchors.device(), Device::cpu());
  EXPECT_TRUE(first.anchors.shares_memory_with(first.host_anchors));
  // They are each level's generate_anchors, concatenated.
  const M::RetinaNetOptions& o = model.options();
  std::vector<Array> levels;
  for (int l = 3; l <= 5; ++l) {
    const int64_t side = 64 >> l;
    const double stride = std::ldexp(1.0, l);
    levels.push_back(
        M::generate_anchors(side, side, stride, o.anchor_scale * stride, o.ratios, o.scales));
  }
  EXPECT_EQ(first.anchors.to_vector<float>(), concatenate(levels, 0).to_vector<float>());
  // Another size: other anchors, as many as its levels' positions times 9.
  const M::RetinaNetOutputs odd = model.outputs(Variable(Array::uniform({1, 3, 72, 40}, -1, 1)));
  EXPECT_FALSE(odd.anchors.shares_memory_with(first.anchors));
  EXPECT_EQ(odd.anchors.shape(), (Shape{(9 * 5 + 5 * 3 + 3 * 2) * 9, 4}));
  EXPECT_EQ(odd.anchors_per_level, (std::vector<int64_t>{9 * 5 * 9, 5 * 3 * 9, 3 * 2 * 9}));
  // The first size is still cached.
  EXPECT_TRUE(model.outputs(x).anchors.shares_memory_with(first.anchors));
  // Outputs without the host copy (put together by a caller) read the same detections.
  M::RetinaNetOutputs bare = first;
  bare.host_anchors = Array();
  const M::Detections want = model.detections(first, 64, 64);
  const M::Detections got = model.detections(bare, 64, 64);
  ASSERT_EQ(got.bboxes.size(), want.bboxes.size());
  EXPECT_EQ(got.bboxes[0].to_vector<float>(), want.bboxes[0].to_vector<float>());
  EXPECT_EQ(got.labels[0].to_vector<int32_t>(), want.labels[0].to_vector<int32_t>());
}

TEST(RetinaNet, LossReachesEveryParameterAndTrainingFindsTheObjects) {
  manual_seed(1);
  auto model = std::make_shared<M::RetinaNet>(tiny(2));
  // One image: a bright square (class 0) and a dark bar (class 1) on grey.
  std::vector<float> pixels(3 * 64 * 64, 0.0f);
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 64; ++y) {
      for (int x = 0; x < 64; ++x) {
        float v = 0.0f;
        if (y >= 8 && y < 24 && x >= 8 && x < 24) v = 1.0f;
        if (y >= 36 && y < 60 && x >= 30 && x < 42) v = -1.0f;
        pixels[static_cast<size_t>((c * 64 + y) * 64 + x)] = v;
      }
    }
  }
  const Array image = Array::from_vector(pixels, Shape{1, 3, 64, 64});
  const std::vector<Array> gt = {boxes({8, 8, 24, 24, 36, 30, 60, 42})};
  const std::vector<Array> label = {Array::from_vector(std::vector<int32_t>{0, 1}, Shape{2})};

  M::RetinaNetLoss first = model->loss(Variable(image), gt, label);
  EXPECT_GT(first.positives, 0);
  EXPECT_TRUE(std::isfinite(first.total.data().item<double>()));
  first.total.backward();
  for (const auto& [name, p] : model->namedparams()) {
    ASSERT_TRUE(p.grad().defined()) << name;
  }
  EXPECT_TRUE(model->params().size() > 0);

  optimizers::Adam opt(3e-3);
  opt.setup(model);
  double last = first.total.data().item<double>();
  for (int step = 0; step < 60; ++step) {
    model->cleargrads();
    M::RetinaNetLoss l = model->loss(Variable(image), gt, label);
    l.total.backward();
    opt.update();
    last = l.total.data().item<double>();
  }
  EXPECT_LT(last, first.total.data().item<double>() * 0.3);
  // Batch normalization in evaluation mode uses the running statistics, which a few steps have
  // not settled: read the detections of the trained heads in training mode's statistics.
  M::Detections d = [&] {
    NoBackpropMode no_graph;
    return model->detections(model->outputs(Variable(image)), 64, 64);
  }();
  ASSERT_EQ(d.bboxes.size(), 1u);
  const std::vector<int32_t> found = d.labels[0].to_vector<int32_t>();
  ASSERT_GE(found.size(), 2u);
  // The two best detections are the two objects, each with its class.
  const Array iou = F::bbox_iou(Variable(d.bboxes[0].at({Slice(0, 2)})), Variable(gt[0])).data();
  const std::vector<float> v = iou.to_vector<float>();
  const int32_t first_class = found[0], second_class = found[1];
  EXPECT_NE(first_class, second_class);
  EXPECT_GT(v[0 * 2 + static_cast<size_t>(first_class)], 0.5) << "iou " << v[0] << " " << v[1];
  EXPECT_GT(v[1 * 2 + static_cast<size_t>(second_class)], 0.5) << "iou " << v[2] << " " << v[3];
  const std::vector<float> scores = d.scores[0].to_vector<float>();
  for (size_t i = 1; i < scores.size(); ++i) EXPECT_GE(scores[i - 1], scores[i]);
}

TEST(RetinaNet, PredictKeepsAtMostMaxDetectionsInsideTheImage) {
  manual_seed(2);
  M::RetinaNetOptions o = tiny(2);
  o.score_threshold = 0.0;  // every anchor is a candidate
  o.max_detections = 7;
  M::RetinaNet model(o);
  const M::Detections d = model.predict(Variable(Array::uniform({3, 3, 64, 48}, -1, 1)));
  ASSERT_EQ(d.bboxes.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d.bboxes[i].shape(), (Shape{7, 4}));
    EXPECT_EQ(d.labels[i].shape(), (Shape{7}));
    const std::vector<float> b = d.bboxes[i].to_vector<float>();
    for (size_t j = 0; j < b.size(); j += 4) {
      EXPECT_GE(b[j], 0.0f);
      EXPECT_GE(b[j + 1], 0.0f);
      EXPECT_LE(b[j + 2], 64.0f);
      EXPECT_LE(b[j + 3], 48.0f);
    }
  }
}

TEST(RetinaNet, Errors) {
  M::RetinaNetOptions o = tiny(2);
  o.min_level = 1;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { M::RetinaNet m(o); }, {"RetinaNet", "min_level 1"}));
  o = tiny(0);
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { M::RetinaNet m(o); }, {"RetinaNet", "num_classes", "0"}));
  o = tiny(2);
  o.positive_iou = 0.3;
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { M::RetinaNet m(o); }, {"match_anchors", "positive_iou 0.3"}));
  M::RetinaNet model(tiny(2));
  const Variable x(Array::zeros({2, 3, 64, 64}));
  const Array one = boxes({0, 0, 20, 20});
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { model.loss(x, {one}, {Array::zeros({1}, int32)}); },
                                     {"RetinaNet::loss", "2 images", "1 boxes"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        model.loss(
            x, {one, one},
            {Array::zeros({1}, int32), Array::from_vector(std::vector<int32_t>{5}, Shape{1})});
      },
      {"RetinaNet::loss", "image 1", "class 5", "2 classes"}));
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        model.outputs(Variable(Array::zeros({2, 1, 64, 64})));
      },
      {"RetinaNet", "(2, 1, 64, 64)"}));
}

// --- GPU ---------------------------------------------------------------------------------------

class RetinaNetCuda : public testing::CudaTest {};

// The loss, its two parts, every parameter's gradient and the detections of a tiny RetinaNet
// agree between the CPU and the GPU (the matching and the read-out run on the host for both).
TEST_F(RetinaNetCuda, LossGradientsAndDetectionsMatchTheCpu) {
  manual_seed(6);
  M::RetinaNetOptions o = tiny(3);
  o.score_threshold = 0.0;
  o.max_detections = 20;
  auto cpu = std::make_shared<M::RetinaNet>(o);
  auto gpu = std::make_shared<M::RetinaNet>(o);
  gpu->copyparams(*cpu);
  gpu->to_device(Device::cuda(0));
  // Batch 8: the backbone's last batch norms see 8 x 2 x 2 values per channel.
  const Array x = Array::uniform({8, 3, 64, 64}, -1, 1);
  std::vector<Array> gt, label;
  for (int i = 0; i < 8; ++i) {
    const float o1 = static_cast<float>(4 * i);
    gt.push_back(boxes({o1, o1, o1 + 20, o1 + 16, 30, 8, 50, 40}));
    label.push_back(Array::from_vector(std::vector<int32_t>{i % 3, (i + 1) % 3}, Shape{2}));
  }
  M::RetinaNetLoss lc = cpu->loss(Variable(x), gt, label);
  lc.total.backward();
  M::RetinaNetLoss lg = gpu->loss(Variable(x.to_device(Device::cuda(0))), gt, label);
  lg.total.backward();
  EXPECT_EQ(lg.positives, lc.positives);
  EXPECT_NEAR(lg.classification.data().item<double>(), lc.classification.data().item<double>(),
              1e-4);
  EXPECT_NEAR(lg.regression.data().item<double>(), lc.regression.data().item<double>(), 1e-4);
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
  const M::Detections dc = cpu->predict(Variable(x));
  const M::Detections dg = gpu->predict(Variable(x.to_device(Device::cuda(0))));
  // The anchors on the GPU are one cached copy of the host's (Note [Anchor cache]).
  {
    NoBackpropMode no_graph;
    const Variable xg(x.to_device(Device::cuda(0)));
    const M::RetinaNetOutputs first = gpu->outputs(xg), again = gpu->outputs(xg);
    EXPECT_EQ(first.anchors.device(), Device::cuda(0));
    EXPECT_EQ(first.host_anchors.device(), Device::cpu());
    EXPECT_TRUE(again.anchors.shares_memory_with(first.anchors));
    EXPECT_TRUE(again.host_anchors.shares_memory_with(first.host_anchors));
    EXPECT_EQ(first.anchors.to_device(Device::cpu()).to_vector<float>(),
              first.host_anchors.to_vector<float>());
  }
  ASSERT_EQ(dg.bboxes.size(), dc.bboxes.size());
  for (size_t i = 0; i < dc.bboxes.size(); ++i) {
    EXPECT_EQ(dg.bboxes[i].device(), Device::cpu());
    EXPECT_EQ(dg.bboxes[i].shape(), dc.bboxes[i].shape());
    // The best detection of each image: the same box and class, a score within rounding.
    EXPECT_EQ(dg.labels[i].to_vector<int32_t>().at(0), dc.labels[i].to_vector<int32_t>().at(0));
    EXPECT_NEAR(dg.scores[i].to_vector<float>().at(0), dc.scores[i].to_vector<float>().at(0), 1e-4);
    const std::vector<float> bg = dg.bboxes[i].to_vector<float>(),
                             bc = dc.bboxes[i].to_vector<float>();
    for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(bg[k], bc[k], 1e-2);
  }
}

}  // namespace
}  // namespace kusari
