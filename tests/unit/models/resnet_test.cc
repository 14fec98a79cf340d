// The ResNet model zoo: torchvision's parameter counts and names, output shapes, the
// initialisation, zero_init_residual, the depth check, a CPU training step that learns,
// channels-last equal to NCHW, CPU/CUDA parity, and a whole training step replayed from a CUDA
// graph equal bit for bit to the eager step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kusari/autograd/mode.h"
#include "kusari/core/cuda.h"
#include "kusari/core/random.h"
#include "kusari/functions.h"
#include "kusari/models.h"
#include "kusari/optimizers/sgd.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = kusari::functions;
using models::ResNet;
using models::ResNetOptions;
using testing::ThrowsWith;

// A whole training step replayed from a CUDA graph is compared bit for bit with the eager step,
// so the GPU convolutions of this program take only cuDNN's deterministic algorithms (some
// gradient algorithms add with atomics). The switch is read at the first GPU convolution; an
// explicit setting in the environment is kept.
const bool kDeterministicCudnn = [] {
  return ::setenv("KUSARI_CUDNN_DETERMINISTIC", "1", 0) == 0;
}();

ResNetOptions classes(int64_t n) {
  ResNetOptions o;
  o.num_classes = n;
  return o;
}

/// Labels 0, 1, 2, ... modulo `classes` for a batch of n.
Array labels(int64_t n, int64_t num_classes, Device device = Device::cpu()) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7 + 3) % num_classes);
  return Array::from_vector(t, std::nullopt, device);
}

/// Largest |a - b| relative to the largest |b| (at least 1e-30), with the shapes checked.
double relative_max_diff(const Array& a, const Array& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return diff / scale;
}

int64_t count_param_arrays(const Link& link) {
  return static_cast<int64_t>(link.params(false).size());
}

TEST(ResNet, ParameterCountsEqualTorchvision) {
  // torchvision.models.resnetNN(): sum(p.numel() for p in m.parameters()), len(list(...)).
  auto r18 = models::resnet18();
  EXPECT_EQ(r18->count_params(), 11689512);
  EXPECT_EQ(count_param_arrays(*r18), 62);
  auto r34 = models::resnet34();
  EXPECT_EQ(r34->count_params(), 21797672);
  EXPECT_EQ(count_param_arrays(*r34), 110);
  auto r50 = models::resnet50();
  EXPECT_EQ(r50->count_params(), 25557032);
  EXPECT_EQ(count_param_arrays(*r50), 161);
}

TEST(ResNet, DeepParameterCountsEqualTorchvision) {
  EXPECT_EQ(models::resnet101()->count_params(), 44549160);
  auto r152 = models::resnet152();
  EXPECT_EQ(r152->count_params(), 60192808);
  EXPECT_EQ(count_param_arrays(*r152), 467);
}

TEST(ResNet, NumClassesSizesTheLinearLayer) {
  auto r50 = models::resnet50(classes(10));
  // 2048 features: 990 fewer classes remove 990 rows of W and 990 biases.
  EXPECT_EQ(r50->count_params(), 25557032 - 990 * 2048 - 990);
  EXPECT_EQ(r50->fc->W.shape(), (Shape{10, 2048}));
  EXPECT_EQ(models::resnet18(classes(7))->fc->W.shape(), (Shape{7, 512}));
}

TEST(ResNet, WidthScalesEveryStage) {
  // ResNet-18 with 16 channels in the stem and stages of 16, 32, 64 and 128, 10 classes, counted
  // by hand: stem 3*16*49 + 32; stage 1: 2 x (2 x 16*16*9 + 64); stage 2: 16*32*9 + 32*32*9 +
  // 128 + (16*32 + 64) and 2 x 32*32*9 + 128; stage 3 and 4 alike; fc 128*10 + 10.
  models::ResNetOptions o = classes(10);
  o.width = 16;
  auto narrow = models::resnet18(o);
  EXPECT_EQ(narrow->count_params(), 703386);
  EXPECT_EQ(narrow->fc->W.shape(), (Shape{10, 128}));
  EXPECT_EQ(narrow->conv1->W.shape(), (Shape{16, 3, 7, 7}));
  o.width = 64;
  EXPECT_EQ(models::resnet18(o)->count_params(), models::resnet18(classes(10))->count_params());
  o.width = 0;
  EXPECT_THROW(models::resnet18(o), ValueError);
}

TEST(ResNet, ParametersAreNamedAsTorchvisionModules) {
  auto r50 = models::resnet50();
  std::vector<std::string> paths;
  for (const auto& [path, p] : r50->namedparams()) paths.push_back(path);
  for (const char* expected :
       {"/conv1/W", "/bn1/gamma", "/bn1/beta", "/layer1/0/conv1/W", "/layer1/0/downsample/0/W",
        "/layer1/0/downsample/1/gamma", "/layer2/3/conv3/W", "/layer3/5/bn2/beta",
        "/layer4/2/bn3/gamma", "/fc/W", "/fc/b"}) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), expected), paths.end()) << expected;
  }
  // No convolution has a bias, and only the first block of a stage has a shortcut projection.
  for (const std::string& p : paths) {
    EXPECT_EQ(p.find("conv1/b"), std::string::npos) << p;
    EXPECT_EQ(p.find("/1/downsample"), std::string::npos) << p;
  }
  EXPECT_EQ(r50->conv1->W.shape(), (Shape{64, 3, 7, 7}));
  EXPECT_EQ(r50->conv1->stride(), (functions::IntPair{2, 2}));
  // v1.5: the stride of a stage's first bottleneck is on its 3x3 convolution.
  auto& first = dynamic_cast<models::Bottleneck&>((*r50->layer2)[0]);
  EXPECT_EQ(first.conv1->stride(), (functions::IntPair{1, 1}));
  EXPECT_EQ(first.conv2->stride(), (functions::IntPair{2, 2}));
  EXPECT_EQ(first.bn1->eps(), 1e-5);
  EXPECT_EQ(first.bn1->decay(), 0.9);
}

TEST(ResNet, OutputShapeAt224) {
  manual_seed(0);
  auto r50 = models::resnet50();
  NoBackpropMode no_grad;
  Variable y = (*r50)(Variable(Array::uniform({1, 3, 224, 224}, -1, 1, float32, Device::cpu())));
  EXPECT_EQ(y.shape(), (Shape{1, 1000}));
  EXPECT_EQ(r50->features(Variable(Array::uniform({1, 3, 224, 224}, -1, 1))).shape(),
            (Shape{1, 2048}));
}

TEST(ResNet, OutputShapeForSmallInputs) {
  manual_seed(0);
  auto r18 = models::resnet18(classes(10));
  NoBackpropMode no_grad;
  EXPECT_EQ((*r18)(Variable(Array::uniform({2, 3, 64, 64}, -1, 1))).shape(), (Shape{2, 10}));
  EXPECT_EQ((*r18)(Variable(Array::uniform({3, 3, 32, 48}, -1, 1))).shape(), (Shape{3, 10}));
  auto r50 = models::resnet50(classes(10));
  EXPECT_EQ((*r50)(Variable(Array::uniform({2, 3, 64, 64}, -1, 1))).shape(), (Shape{2, 10}));
}

TEST(ResNet, RefusesInputsThatAreNotImages) {
  auto r18 = models::resnet18(classes(10));
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        (*r18)(Variable(Array::zeros({2, 1, 32, 32})));
      },
      {"ResNet", "(N, 3, H, W)", "(2, 1, 32, 32)"}));
}

TEST(ResNet, InitialisationIsTorchvisions) {
  manual_seed(1);
  auto r18 = models::resnet18();
  // Kaiming normal, fan_out: std sqrt(2 / (512 * 3 * 3)) for layer4's 3x3 convolutions.
  auto& block = dynamic_cast<models::BasicBlock&>((*r18->layer4)[1]);
  const std::vector<double> w = block.conv2->W.data().to_vector<double>();
  double sq = 0, sum = 0;
  for (double v : w) {
    sum += v;
    sq += v * v;
  }
  const double n = static_cast<double>(w.size());
  const double std = std::sqrt(sq / n - (sum / n) * (sum / n));
  EXPECT_NEAR(std, std::sqrt(2.0 / (512 * 9)), 0.01 * std::sqrt(2.0 / (512 * 9)));
  // Batch normalization: gamma 1, beta 0.
  EXPECT_EQ(block.bn2->gamma.data().to_vector<float>(), std::vector<float>(512, 1.0f));
  EXPECT_EQ(block.bn2->beta.data().to_vector<float>(), std::vector<float>(512, 0.0f));
  // fc as nn.Linear: U(-1/sqrt(512), 1/sqrt(512)) for W and b.
  const double bound = 1.0 / std::sqrt(512.0);
  const std::vector<double> fw = r18->fc->W.data().to_vector<double>();
  const auto [lo, hi] = std::minmax_element(fw.begin(), fw.end());
  EXPECT_GE(*lo, -bound);
  EXPECT_LE(*hi, bound);
  EXPECT_LT(*lo, -0.99 * bound);
  EXPECT_GT(*hi, 0.99 * bound);
  const std::vector<double> fb = r18->fc->b.data().to_vector<double>();
  EXPECT_LE(*std::max_element(fb.begin(), fb.end()), bound);
  EXPECT_GT(*std::max_element(fb.begin(), fb.end()), 0.9 * bound);
}

TEST(ResNet, ZeroInitResidualZeroesTheLastGammaOfEveryBlock) {
  ResNetOptions o;
  o.zero_init_residual = true;
  auto r50 = models::resnet50(o);
  int blocks = 0;
  for (const auto& [path, link] : r50->namedlinks(true)) {
    auto* bn = dynamic_cast<links::BatchNormalization*>(link);
    if (!bn) continue;
    const std::vector<float> g = bn->gamma.data().to_vector<float>();
    const bool last = path.size() >= 4 && path.substr(path.size() - 4) == "/bn3";
    blocks += last ? 1 : 0;
    EXPECT_EQ(g, std::vector<float>(g.size(), last ? 0.0f : 1.0f)) << path;
  }
  EXPECT_EQ(blocks, 16);
  auto r18 = models::resnet18(o);
  auto& b = dynamic_cast<models::BasicBlock&>((*r18->layer3)[1]);
  EXPECT_EQ(b.bn2->gamma.data().to_vector<float>(), std::vector<float>(256, 0.0f));
  EXPECT_EQ(b.bn1->gamma.data().to_vector<float>(), std::vector<float>(256, 1.0f));
}

TEST(ResNet, ZeroInitResidualBlocksStartAsTheIdentity) {
  manual_seed(2);
  Array x = relu(Array::uniform({2, 64, 8, 8}, -1, 1));  // a block's input is a ReLU's output
  models::BasicBlock basic(64, 64, 1, true);
  EXPECT_EQ((basic)(Variable(x)).data().to_vector<float>(), x.to_vector<float>());
  Array x4 = relu(Array::uniform({2, 256, 4, 4}, -1, 1));
  models::Bottleneck bottleneck(256, 64, 1, true);
  EXPECT_EQ((bottleneck)(Variable(x4)).data().to_vector<float>(), x4.to_vector<float>());
  // Without it the residual branch adds something.
  models::BasicBlock plain(64, 64, 1, false);
  EXPECT_NE((plain)(Variable(x)).data().to_vector<float>(), x.to_vector<float>());
}

TEST(ResNet, InvalidDepthIsRefused) {
  EXPECT_TRUE(ThrowsWith<ValueError>([] { models::resnet(20); },
                                     {"models::resnet", "depth 20", "18, 34, 50, 101 and 152"}));
  EXPECT_TRUE(ThrowsWith<ValueError>([] { models::resnet(0); }, {"models::resnet", "depth 0"}));
  EXPECT_EQ(models::resnet(34)->count_params(), 21797672);
  EXPECT_TRUE(
      ThrowsWith<ValueError>([] { models::resnet18(classes(0)); }, {"ResNet", "num_classes", "0"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [] {
        ResNet(models::ResNetBlock::kBasic, {2, 2, 2});
      },
      {"ResNet", "blocks_per_stage", "3"}));
}

TEST(ResNet, TrainingStepsOnCpuLowerTheLoss) {
  manual_seed(3);
  auto model = models::resnet18(classes(10));
  optimizers::MomentumSGD opt(0.05, 0.9);
  opt.setup(model);
  const Array x = Array::uniform({4, 3, 32, 32}, -1, 1);
  const Array t = labels(4, 10);
  std::vector<double> losses;
  for (int step = 0; step < 6; ++step) {
    model->cleargrads();
    Variable loss = F::softmax_cross_entropy((*model)(Variable(x)), t);
    loss.backward();
    // Every parameter got a finite gradient.
    for (const Parameter& p : model->params()) {
      ASSERT_TRUE(p.grad().defined());
      ASSERT_TRUE(std::isfinite(sum(square(p.grad())).item<double>()));
    }
    opt.update();
    losses.push_back(loss.data().item<double>());
  }
  EXPECT_LT(losses.back(), losses.front() * 0.8)
      << "losses " << losses.front() << " ... " << losses.back();
  // The running statistics moved from their initial values.
  EXPECT_NE(model->bn1->avg_mean().to_vector<float>(), std::vector<float>(64, 0.0f));
}

/// The model's layers one by one, checking that every activation of a channels-last input is
/// channels-last; returns the logits.
Variable forward_checking_layout(ResNet& m, const Variable& x, MemoryFormat expected) {
  auto check = [&](const Variable& h, const char* where) {
    EXPECT_EQ(h.data().memory_format(), expected) << where;
    return h;
  };
  Variable h = check((*m.conv1)(x), "conv1");
  h = check((*m.bn1)(h), "bn1");
  h = check(F::relu(h), "relu");
  h = check(F::max_pooling_2d(h, 3, 2, 1, false), "max pool");
  h = check((*m.layer1)(h), "layer1");
  h = check((*m.layer2)(h), "layer2");
  h = check((*m.layer3)(h), "layer3");
  h = check((*m.layer4)(h), "layer4");
  return (*m.fc)(F::mean(h, Axes{2, 3}));
}

TEST(ResNet, ChannelsLastForwardEqualsNchwOnCpu) {
  manual_seed(4);
  auto nchw = models::resnet18(classes(10));
  ResNetOptions cl_options = classes(10);
  cl_options.memory_format = MemoryFormat::kChannelsLast;
  auto cl = models::resnet18(cl_options);
  cl->copyparams(*nchw);
  EXPECT_EQ(cl->conv1->W.data().memory_format(), MemoryFormat::kChannelsLast);
  const Array x = Array::uniform({2, 3, 40, 40}, -1, 1);
  const Array xcl = x.to_memory_format(MemoryFormat::kChannelsLast);
  ASSERT_EQ(xcl.memory_format(), MemoryFormat::kChannelsLast);
  Variable vx(xcl, true);
  Variable y_cl = forward_checking_layout(*cl, vx, MemoryFormat::kChannelsLast);
  Variable y = (*nchw)(Variable(x));
  EXPECT_LT(relative_max_diff(y_cl.data(), y.data()), 1e-4);
  // And the whole forward through operator() gives the same logits.
  EXPECT_LT(relative_max_diff((*cl)(Variable(xcl)).data(), y.data()), 1e-4);
  // Backward of the channels-last model: the input's gradient is channels-last too.
  F::sum(y_cl).backward();
  EXPECT_EQ(vx.grad().memory_format(), MemoryFormat::kChannelsLast);
}

// --- GPU ---------------------------------------------------------------------------------------

// The GPU fixture skips without a GPU and turns TF32 off: the parity tests compare float32 at
// float32 tolerances.
class ResNetCuda : public testing::CudaTest {};

/// Forward and backward of a ResNet-18 on the CPU (NCHW) and on the GPU (in `format`): the
/// logits, the loss and every parameter's gradient agree.
void expect_cpu_cuda_parity(MemoryFormat format) {
  ASSERT_TRUE(kDeterministicCudnn);
  manual_seed(5);
  auto cpu = models::resnet18(classes(10));
  auto cuda = models::resnet18(classes(10));
  cuda->copyparams(*cpu);
  cuda->to_device(Device::cuda(0));
  cuda->to_memory_format(format);
  // Batch 8 at 64 x 64: the last stage's batch norms still see 8 x 2 x 2 values per channel (at
  // batch 2 and 32 x 32 they would see 2, where the normalisation amplifies rounding differences
  // without bound).
  const Array x = Array::uniform({8, 3, 64, 64}, -1, 1);
  const Array t = labels(8, 10);
  Variable y_cpu = (*cpu)(Variable(x));
  Variable loss_cpu = F::softmax_cross_entropy(y_cpu, t);
  loss_cpu.backward();
  Variable y_cuda = (*cuda)(Variable(x.to_device(Device::cuda(0)).to_memory_format(format)));
  Variable loss_cuda = F::softmax_cross_entropy(y_cuda, t.to_device(Device::cuda(0)));
  loss_cuda.backward();
  EXPECT_LT(relative_max_diff(y_cuda.data().to_device(Device::cpu()), y_cpu.data()), 1e-4);
  EXPECT_NEAR(loss_cuda.data().item<double>(), loss_cpu.data().item<double>(), 1e-4);
  auto a = cuda->namedparams();
  auto b = cpu->namedparams();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].second.grad().defined()) << a[i].first;
    // Eighteen layers of float32 backward in two summation orders (cuDNN's, oneDNN's), where an
    // activation within rounding of 0 may take the other side of a relu on one device and move
    // a gradient sum by one term: within a few percent of the largest gradient (a layout or
    // indexing error is off by its whole size).
    EXPECT_LT(relative_max_diff(a[i].second.grad().to_device(Device::cpu()), b[i].second.grad()),
              5e-2)
        << a[i].first;
  }
  auto pa = cuda->namedpersistents();
  auto pb = cpu->namedpersistents();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!is_floating(pb[i].second->dtype())) continue;
    EXPECT_LT(relative_max_diff(pa[i].second->to_device(Device::cpu()), *pb[i].second), 1e-4)
        << pa[i].first;
  }
}

TEST_F(ResNetCuda, ForwardBackwardMatchesTheCpu) {
  expect_cpu_cuda_parity(MemoryFormat::kContiguous);
}

TEST_F(ResNetCuda, ChannelsLastForwardBackwardMatchesTheCpu) {
  expect_cpu_cuda_parity(MemoryFormat::kChannelsLast);
}

/// The bytes of every parameter and persistent of two models are the same.
void expect_bitwise_equal(Link& a, Link& b, const std::string& when) {
  auto pa = a.namedparams();
  auto pb = b.namedparams();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::vector<float> va = pa[i].second.data().to_vector<float>();
    const std::vector<float> vb = pb[i].second.data().to_vector<float>();
    ASSERT_EQ(va.size(), vb.size());
    EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0)
        << pa[i].first << " " << when;
  }
  auto sa = a.namedpersistents();
  auto sb = b.namedpersistents();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    if (sa[i].second->dtype() != float32) continue;
    const std::vector<float> va = sa[i].second->to_vector<float>();
    const std::vector<float> vb = sb[i].second->to_vector<float>();
    EXPECT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0)
        << sa[i].first << " " << when;
  }
}

// A whole training step (forward, backward and the MomentumSGD update) recorded once and
// replayed on new batches gives the parameters, running statistics and loss of the eager step,
// to the bit: same kernels, same algorithms, same order.
void expect_graph_step_equals_eager(MemoryFormat format) {
  ASSERT_TRUE(kDeterministicCudnn);
  const Device gpu = Device::cuda(0);
  manual_seed(6);
  auto eager = models::resnet18(classes(10));
  auto graphed = models::resnet18(classes(10));
  graphed->copyparams(*eager);
  for (auto* m : {eager.get(), graphed.get()}) {
    m->to_device(gpu);
    m->to_memory_format(format);
  }
  optimizers::MomentumSGD eager_opt(0.0, 0.9), graph_opt(0.0, 0.9);
  eager_opt.setup(eager);
  graph_opt.setup(graphed);
  auto batch = [&](int k) {
    Generator gen(100 + static_cast<uint64_t>(k));
    Array x = Array::uniform({4, 3, 32, 32}, -1, 1, float32, Device::cpu(), &gen);
    return std::make_pair(x.to_device(gpu).to_memory_format(format), labels(4, 10, gpu));
  };
  auto eager_step = [&](std::shared_ptr<ResNet>& m, optimizers::MomentumSGD& opt, const Array& x,
                        const Array& t) {
    m->cleargrads();
    Variable loss = F::softmax_cross_entropy((*m)(Variable(x)), t);
    loss.backward();
    opt.update();
    return loss;
  };
  // Warm-up: one eager step of each model with lr 0 sizes the momentum buffers (zeros), sets up
  // cuDNN's plans and workspace and fills the memory pool, and changes no parameter; the running
  // statistics move alike in both.
  auto [x0, t0] = batch(0);
  eager_step(eager, eager_opt, x0, t0);
  eager_step(graphed, graph_opt, x0, t0);
  graphed->copyparams(*eager);  // (bitwise the same from here on)
  eager_opt.lr() = 0.05;
  graph_opt.lr() = 0.05;  // frozen into the recording
  const std::vector<float> w_before = eager->fc->W.data().to_vector<float>();

  // The graph's inputs: arrays made before the capture, refilled before each replay.
  Array x = Array::zeros({4, 3, 32, 32}, float32, gpu).to_memory_format(format);
  Array t = Array::zeros({4}, int32, gpu);
  Variable graph_loss;
  cuda::Graph graph;
  graph.capture(gpu, [&] { graph_loss = eager_step(graphed, graph_opt, x, t); });
  ASSERT_TRUE(graph.captured());
  EXPECT_GT(graph.num_nodes(), 100);
  // Nothing ran while recording.
  expect_bitwise_equal(*graphed, *eager, "after the capture");

  for (int k = 1; k <= 3; ++k) {
    auto [bx, bt] = batch(k);
    x.assign(bx);
    t.assign(bt);
    graph.replay();
    Variable loss = eager_step(eager, eager_opt, bx, bt);
    const float a = graph_loss.data().item<float>(), b = loss.data().item<float>();
    EXPECT_EQ(std::memcmp(&a, &b, sizeof(float)), 0)
        << "loss " << a << " vs eager " << b << " at step " << k;
    expect_bitwise_equal(*graphed, *eager, "after step " + std::to_string(k));
  }
  // The steps trained: the parameters left their values of before the capture.
  EXPECT_NE(graphed->fc->W.data().to_vector<float>(), w_before);
}

TEST_F(ResNetCuda, GraphTrainingStepEqualsTheEagerStepBitForBit) {
  expect_graph_step_equals_eager(MemoryFormat::kContiguous);
}

TEST_F(ResNetCuda, ChannelsLastGraphTrainingStepEqualsTheEagerStepBitForBit) {
  expect_graph_step_equals_eager(MemoryFormat::kChannelsLast);
}

}  // namespace
}  // namespace kusari
