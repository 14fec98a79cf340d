// BatchNormalization: parameters and persistents with Chainer's names, lazy sizes from axis,
// train mode (batch statistics, running averages after two updates against hand-computed
// values), test mode (the running statistics, nothing updated), fine-tuning (N, decay 1 - 1/N),
// mixed dtypes, gradients, npz round trips into lazy instances, to_device and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "link_test_util.h"

namespace kusari {
namespace {

namespace F = functions;
namespace L = links;
using testing::ArraysClose;
using StrVec = std::vector<std::string>;

class BatchNormalizationLinkTest : public testing::DeviceTest {
 protected:
  Array input(const Shape& s, Dtype d = float32) {
    return Array::uniform(s, -2, 2, d, device(), &gen_);
  }
  Array from(std::initializer_list<double> v, const Shape& s, Dtype d = float64) {
    return Array::from(v, s, d, device());
  }
  // A lazily sized batch normalization over `axis`.
  static std::shared_ptr<L::BatchNormalization> lazy(const Axes& axis, Dtype dtype = float32) {
    return std::make_shared<L::BatchNormalization>(std::nullopt, 0.9, 2e-5, dtype, true, true,
                                                   nullptr, nullptr, axis);
  }
  Generator gen_{5};
};

// Two batches of two features (columns), with their per-column statistics:
//   x1: means (4, 3), unbiased variances (20/3, 12), biased (5, 9);
//   x2: means (1, 7), unbiased variances (4/3, 20/3).
Array batch1(Device d) {
  return Array::from({1, 0, 3, 2, 5, 2, 7, 8}, Shape{4, 2}, float64, d);
}
Array batch2(Device d) {
  return Array::from({0, 10, 0, 6, 2, 8, 2, 4}, Shape{4, 2}, float64, d);
}

TEST_P(BatchNormalizationLinkTest, ParametersAndPersistents) {
  L::BatchNormalization bn(3);
  EXPECT_EQ(testing::param_paths(bn), (StrVec{"/gamma", "/beta"}));
  EXPECT_EQ(testing::persistent_paths(bn), (StrVec{"/N", "/avg_mean", "/avg_var"}));
  EXPECT_TRUE(ArraysClose(bn.gamma.data(), Array::ones({3}), 0, 0));
  EXPECT_TRUE(ArraysClose(bn.beta.data(), Array::zeros({3}), 0, 0));
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), Array::zeros({3}), 0, 0));
  EXPECT_TRUE(ArraysClose(bn.avg_var(), Array::ones({3}), 0, 0));
  EXPECT_EQ(bn.N(), 0);
  EXPECT_EQ(bn.persistent("N").dtype(), int64);
  EXPECT_EQ(bn.decay(), 0.9);
  EXPECT_EQ(bn.eps(), 2e-5);
  EXPECT_EQ(bn.count_params(), 6);

  // Without gamma; a shape; another dtype and given initial values.
  L::BatchNormalization no_gamma(3, 0.9, 2e-5, float32, false);
  EXPECT_EQ(testing::param_paths(no_gamma), (StrVec{"/beta"}));
  L::BatchNormalization shaped(Shape{2, 3}, 0.5, 1e-3, float64, true, false,
                               std::make_shared<initializers::Constant>(2.0), nullptr, std::nullopt,
                               std::make_shared<initializers::Constant>(0.5),
                               std::make_shared<initializers::Constant>(3.0));
  EXPECT_EQ(testing::param_paths(shaped), (StrVec{"/gamma"}));
  EXPECT_EQ(shaped.gamma.dtype(), float64);  // the link's dtype, whatever the initializer's
  EXPECT_TRUE(ArraysClose(shaped.gamma.data(), Array::full({2, 3}, 2.0, float64), 0, 0));
  EXPECT_TRUE(ArraysClose(shaped.avg_mean(), Array::full({2, 3}, 0.5, float64), 0, 0));
  EXPECT_TRUE(ArraysClose(shaped.avg_var(), Array::full({2, 3}, 3.0, float64), 0, 0));
}

TEST_P(BatchNormalizationLinkTest, LazySizeFromAxis) {
  auto bn = lazy({0, 2, 3});
  bn->to_device(device());
  EXPECT_FALSE(bn->gamma.is_initialized());
  EXPECT_FALSE(bn->avg_mean().defined());
  EXPECT_EQ(testing::param_paths(*bn, false), StrVec{});
  Array x = input({2, 3, 4, 5});
  Variable y = (*bn)(x);
  EXPECT_EQ(bn->gamma.shape(), (Shape{3}));
  EXPECT_EQ(bn->avg_mean().shape(), (Shape{3}));
  EXPECT_EQ(bn->avg_var().device(), device());
  // The same as a sized one.
  L::BatchNormalization sized(3);
  sized.to_device(device());
  EXPECT_TRUE(ArraysClose(y.data(), sized(x).data(), 0, 0));
  EXPECT_TRUE(ArraysClose(bn->avg_var(), sized.avg_var(), 0, 0));

  // Normalising over axis 0 only gives per-position parameters; negative axes count from the end.
  auto per_position = lazy({0});
  per_position->to_device(device());
  Array x3 = input({4, 3, 5});
  Variable y3 = (*per_position)(x3);
  EXPECT_EQ(per_position->gamma.shape(), (Shape{3, 5}));
  EXPECT_TRUE(ArraysClose(y3.data(),
                          F::batch_normalization(x3, per_position->gamma, per_position->beta, 2e-5,
                                                 nullptr, nullptr, 0.9, {0})
                              .data(),
                          0, 0));
  auto last = lazy({0, -1});
  last->to_device(device());
  (*last)(x3);
  EXPECT_EQ(last->avg_mean().shape(), (Shape{3}));
}

TEST_P(BatchNormalizationLinkTest, TrainModeUsesBatchStatisticsAndUpdatesRunningAverages) {
  ASSERT_TRUE(is_train_mode());
  L::BatchNormalization bn(2, 0.9, 2e-5, float64);
  bn.to_device(device());
  Array gamma = bn.gamma.data(), beta = bn.beta.data();  // handles to the parameters' memory
  gamma.assign(from({1.5, -0.5}, {2}));
  beta.assign(from({0.25, 1.0}, {2}));
  const double eps = 2e-5;

  Variable y1 = bn(batch1(device()));
  // y = gamma (x - mean) / sqrt(biased var + eps) + beta, column by column.
  const double m1[2] = {4, 3}, v1[2] = {5, 9}, g[2] = {1.5, -0.5}, b[2] = {0.25, 1.0};
  std::vector<double> x1 = batch1(Device::cpu()).to_vector<double>(), expected;
  for (int i = 0; i < 8; ++i)
    expected.push_back(g[i % 2] * (x1[i] - m1[i % 2]) / std::sqrt(v1[i % 2] + eps) + b[i % 2]);
  EXPECT_TRUE(
      ArraysClose(y1.data(), Array::from_vector(expected, Shape{4, 2}, device()), 1e-12, 1e-12));
  EXPECT_TRUE(ArraysClose(
      y1.data(), F::batch_normalization(batch1(device()), bn.gamma, bn.beta).data(), 0, 0));

  // avg = 0.9 avg + 0.1 statistic, starting from mean 0 and var 1; the variance is unbiased.
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({0.1 * 4, 0.1 * 3}, {2}), 1e-14));
  EXPECT_TRUE(ArraysClose(bn.avg_var(), from({0.9 + 0.1 * 20.0 / 3, 0.9 + 0.1 * 12}, {2}), 1e-14));
  bn(batch2(device()));
  const double mean2[2] = {0.9 * 0.4 + 0.1 * 1, 0.9 * 0.3 + 0.1 * 7};
  const double var2[2] = {0.9 * (0.9 + 0.1 * 20.0 / 3) + 0.1 * 4.0 / 3,
                          0.9 * (0.9 + 0.1 * 12) + 0.1 * 20.0 / 3};
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({mean2[0], mean2[1]}, {2}), 1e-14));
  EXPECT_TRUE(ArraysClose(bn.avg_var(), from({var2[0], var2[1]}, {2}), 1e-14));
  EXPECT_EQ(bn.N(), 0);  // only fine-tuning counts

  // Test mode normalises with the running statistics and updates nothing.
  TrainMode test_mode(false);
  Array x3 = from({1, 2, -3, 0.5, 10, -4}, {3, 2});
  Variable y3 = bn(x3);
  std::vector<double> xs = x3.to_vector<double>(), expected3;
  for (int i = 0; i < 6; ++i) {
    expected3.push_back(g[i % 2] * (xs[i] - mean2[i % 2]) / std::sqrt(var2[i % 2] + eps) +
                        b[i % 2]);
  }
  EXPECT_TRUE(
      ArraysClose(y3.data(), Array::from_vector(expected3, Shape{3, 2}, device()), 1e-12, 1e-12));
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({mean2[0], mean2[1]}, {2}), 1e-14));
  EXPECT_TRUE(ArraysClose(bn.avg_var(), from({var2[0], var2[1]}, {2}), 1e-14));
  EXPECT_TRUE(
      ArraysClose(y3.data(),
                  F::fixed_batch_normalization(x3, bn.gamma, bn.beta, Variable(bn.avg_mean()),
                                               Variable(bn.avg_var()))
                      .data(),
                  0, 0));
}

TEST_P(BatchNormalizationLinkTest, ChannelStatisticsOfImages) {
  L::BatchNormalization bn(3);
  bn.to_device(device());
  Array x = input({2, 3, 4, 5});
  Variable y = bn(x);
  EXPECT_TRUE(ArraysClose(y.data(), F::batch_normalization(x, bn.gamma, bn.beta).data(), 0, 0));
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), kusari::mean(x, {0, 2, 3}) * 0.1, 1e-5, 1e-6));
  EXPECT_TRUE(
      ArraysClose(bn.avg_var(), kusari::var(x, {0, 2, 3}, false, 1) * 0.1 + 0.9, 1e-5, 1e-6));
}

TEST_P(BatchNormalizationLinkTest, FinetuneAveragesOverCalls) {
  L::BatchNormalization bn(2, 0.9, 2e-5, float64);
  bn.to_device(device());
  bn.forward(batch1(device()), true);
  EXPECT_EQ(bn.N(), 1);
  // decay = 1 - 1/1 = 0: the first call's statistics replace the initial ones.
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({4, 3}, {2}), 1e-14));
  bn.forward(batch2(device()), true);
  EXPECT_EQ(bn.N(), 2);
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({2.5, 5}, {2}), 1e-14));
  EXPECT_TRUE(
      ArraysClose(bn.avg_var(), from({(20.0 / 3 + 4.0 / 3) / 2, (12 + 20.0 / 3) / 2}, {2}), 1e-14));
  {
    // Fine-tuning only happens in train mode.
    TrainMode test_mode(false);
    bn.forward(batch1(device()), true);
    EXPECT_EQ(bn.N(), 2);
  }
  bn.start_finetuning();
  EXPECT_EQ(bn.N(), 0);
  bn.forward(batch2(device()), true);
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({1, 7}, {2}), 1e-14));
}

TEST_P(BatchNormalizationLinkTest, CumulativeAverageModeAveragesEveryForward) {
  // Note [Batch normalization without moving averages]: after one moving-average update, the
  // switch restarts the average; forward(x) and forward_relu then keep the plain mean.
  L::BatchNormalization bn(2, 0.9, 2e-5, float64);
  bn.to_device(device());
  bn.forward(batch1(device()));
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({0.4, 0.3}, {2}), 1e-14));  // 0.9 * 0 + 0.1 * mean
  bn.set_running_statistics(L::RunningStatistics::kCumulativeAverage);
  EXPECT_EQ(bn.running_statistics(), L::RunningStatistics::kCumulativeAverage);
  EXPECT_EQ(bn.N(), 0);
  bn.forward(batch2(device()));
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({1, 7}, {2}), 1e-14));
  bn.forward_relu(batch1(device()));
  EXPECT_EQ(bn.N(), 2);
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({2.5, 5}, {2}), 1e-14));
  EXPECT_TRUE(
      ArraysClose(bn.avg_var(), from({(20.0 / 3 + 4.0 / 3) / 2, (12 + 20.0 / 3) / 2}, {2}), 1e-14));
  // Setting the same mode again does not restart the count.
  bn.set_running_statistics(L::RunningStatistics::kCumulativeAverage);
  EXPECT_EQ(bn.N(), 2);
  // A resumed run (a fresh link with the loaded N) goes on averaging without a restart.
  L::BatchNormalization resumed(2, 0.9, 2e-5, float64);
  resumed.to_device(device());
  resumed.persistent("avg_mean").assign(bn.avg_mean());
  resumed.persistent("N").fill(int64_t{2});
  resumed.set_running_statistics(L::RunningStatistics::kCumulativeAverage, /*restart=*/false);
  EXPECT_EQ(resumed.N(), 2);
  resumed.forward(batch2(device()));
  EXPECT_EQ(resumed.N(), 3);
  EXPECT_TRUE(ArraysClose(resumed.avg_mean(), from({(2 * 2.5 + 1) / 3, (2 * 5 + 7) / 3.0}, {2}), 1e-14));
  bn.set_running_statistics(L::RunningStatistics::kMovingAverage);
  bn.forward(batch2(device()));
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), from({0.9 * 2.5 + 0.1, 0.9 * 5 + 0.7}, {2}), 1e-14));
}

TEST_P(BatchNormalizationLinkTest, FrozenModeNormalisesWithTheBatchAndKeepsTheAverages) {
  L::BatchNormalization bn(2, 0.9, 2e-5, float64);
  bn.to_device(device());
  bn.forward(batch1(device()));
  const Array mean = bn.avg_mean().copy(), var = bn.avg_var().copy();
  bn.set_running_statistics(L::RunningStatistics::kFrozen);
  Variable y = bn.forward(batch2(device()));
  Variable yr = bn.forward_relu(batch2(device()));
  EXPECT_TRUE(ArraysClose(bn.avg_mean(), mean, 0, 0));
  EXPECT_TRUE(ArraysClose(bn.avg_var(), var, 0, 0));
  // Normalised with batch2's own statistics: column 0 has mean 1 and biased variance 1.
  const std::vector<double> yv = y.data().to_vector<double>();
  EXPECT_NEAR(yv[0], (0 - 1) / std::sqrt(1 + 2e-5), 1e-12);
  EXPECT_NEAR(yv[4], (2 - 1) / std::sqrt(1 + 2e-5), 1e-12);
  EXPECT_NEAR(yr.data().to_vector<double>()[0], 0.0, 0.0);  // relu of a negative value
}

TEST_P(BatchNormalizationLinkTest, SetRunningStatisticsReachesNestedLinks) {
  auto net = std::make_shared<Chain>();
  auto inner = net->add_link("block", std::make_shared<Chain>());
  auto bn1 = net->add_link("bn", std::make_shared<L::BatchNormalization>(2));
  auto bn2 = inner->add_link("bn", std::make_shared<L::BatchNormalization>(3));
  EXPECT_EQ(L::set_running_statistics(*net, L::RunningStatistics::kFrozen), 2);
  EXPECT_EQ(std::static_pointer_cast<L::BatchNormalization>(bn1)->running_statistics(),
            L::RunningStatistics::kFrozen);
  EXPECT_EQ(std::static_pointer_cast<L::BatchNormalization>(bn2)->running_statistics(),
            L::RunningStatistics::kFrozen);
}

TEST_P(BatchNormalizationLinkTest, ForwardReluIsReluOfForwardPlusResidual) {
  // Two links with the same state: one runs forward_relu, the other the composed functions.
  for (bool train : {true, false}) {
    for (bool channels_last : {false, true}) {
      SCOPED_TRACE(::testing::Message() << (train ? "train" : "test")
                                        << (channels_last ? " channels-last" : ""));
      TrainMode mode(train);
      L::BatchNormalization fused(4), composed(4);
      fused.to_device(device());
      composed.to_device(device());
      Array x = input({3, 4, 5, 2}), r = input({3, 4, 5, 2});
      if (channels_last) {
        x = x.to_memory_format(MemoryFormat::kChannelsLast);
        r = r.to_memory_format(MemoryFormat::kChannelsLast);
      }
      Variable y = fused.forward_relu(x, r);
      Variable ref = F::relu(F::add(composed(x), Variable(r)));
      EXPECT_TRUE(ArraysClose(y.data(), ref.data(), 1e-5, 1e-5));
      EXPECT_TRUE(ArraysClose(fused.avg_mean(), composed.avg_mean(), 1e-6, 1e-6));
      EXPECT_TRUE(ArraysClose(fused.avg_var(), composed.avg_var(), 1e-5, 1e-6));
      Variable y1 = fused.forward_relu(x);
      EXPECT_TRUE(ArraysClose(y1.data(), F::relu(composed(x)).data(), 1e-5, 1e-5));
      if (channels_last) EXPECT_TRUE(y.data().is_contiguous(MemoryFormat::kChannelsLast));
    }
  }
}

TEST_P(BatchNormalizationLinkTest, GradientsReachGammaAndBeta) {
  for (bool train : {true, false}) {
    SCOPED_TRACE(train);
    TrainMode mode(train);
    L::BatchNormalization bn(3);
    bn.to_device(device());
    Variable x(input({4, 3, 2}), true);
    testing::backward_random_weighted(bn(x), gen_);
    testing::expect_grads_on_every_param(bn);
    EXPECT_TRUE(x.grad().defined());
  }
}

TEST_P(BatchNormalizationLinkTest, InputsOfAnotherDtypeUseCastParameters) {
  L::BatchNormalization bn(2);  // float32 parameters and statistics
  bn.to_device(device());
  testing::randomize_params(bn, gen_);
  Variable y = bn(batch1(device()));  // float64 input
  EXPECT_EQ(y.dtype(), float64);
  EXPECT_EQ(bn.avg_mean().dtype(), float32);
  Variable expected =
      F::batch_normalization(batch1(device()), Variable(bn.gamma.data().astype(float64)),
                             Variable(bn.beta.data().astype(float64)));
  EXPECT_TRUE(ArraysClose(y.data(), expected.data(), 1e-12, 1e-12));
  EXPECT_TRUE(
      ArraysClose(bn.avg_mean(), Array::from({0.4, 0.3}, Shape{2}, float32, device()), 1e-6));
  testing::backward_random_weighted(y, gen_);
  EXPECT_EQ(bn.gamma.grad().dtype(), float32);
  TrainMode test_mode(false);
  EXPECT_EQ(bn(batch2(device())).dtype(), float64);
}

TEST_P(BatchNormalizationLinkTest, NpzRoundTripIntoLazyInstance) {
  L::BatchNormalization bn(3);
  bn.to_device(device());
  testing::randomize_params(bn, gen_);
  bn(input({4, 3, 2, 2}));
  bn.forward(input({4, 3, 2, 2}), true);
  bn.forward(input({4, 3, 2, 2}), true);
  const testing::TempFile file("bn.npz");
  const std::string& path = file.path;
  save_npz(path, bn);
  EXPECT_EQ(testing::npz_keys(path), (StrVec{"N", "avg_mean", "avg_var", "beta", "gamma"}));
  for (const auto& [key, a] : read_npz(path)) {
    if (key == "N") {
      EXPECT_EQ(a.dtype(), int64);  // a 0-d integer, like the Python int Chainer saves
      EXPECT_EQ(a.ndim(), 0);
      EXPECT_EQ(a.item<int64_t>(), 2);
    }
  }

  TrainMode test_mode(false);
  Array x = input({2, 3, 2, 2});
  for (bool lazy_fresh : {true, false}) {
    SCOPED_TRACE(lazy_fresh);
    auto fresh = lazy_fresh ? lazy({0, 2, 3}) : std::make_shared<L::BatchNormalization>(3);
    fresh->to_device(device());
    load_npz(path, *fresh);
    EXPECT_EQ(fresh->N(), 2);
    EXPECT_EQ(fresh->avg_mean().device(), device());
    EXPECT_EQ(fresh->gamma.device(), device());
    EXPECT_TRUE(ArraysClose(fresh->avg_mean(), bn.avg_mean(), 0, 0));
    EXPECT_TRUE(ArraysClose(fresh->avg_var(), bn.avg_var(), 0, 0));
    EXPECT_TRUE(ArraysClose((*fresh)(x).data(), bn(x).data(), 0, 0));
  }
}

TEST_P(BatchNormalizationLinkTest, ToDevice) {
  L::BatchNormalization bn(2);
  Array x = Array::uniform({3, 2}, -1, 1, float32, Device::cpu(), &gen_);
  bn(x);
  bn.to_device(Device::cpu());
  EXPECT_EQ(bn.avg_mean().device(), Device::cpu());
  bn.to_device(device());
  EXPECT_EQ(bn.avg_mean().device(), device());
  EXPECT_EQ(bn.persistent("N").device(), device());
  EXPECT_EQ(bn.gamma.device(), device());
  bn.forward(x.to_device(device()), true);
  EXPECT_EQ(bn.N(), 1);
}

TEST_P(BatchNormalizationLinkTest, Errors) {
  using L::BatchNormalization;
  KUSARI_EXPECT_THROW_WITH(BatchNormalization(0), ValueError, "BatchNormalization", "size", "(0,)");
  EXPECT_THROW(BatchNormalization(Shape{2, -1}), ValueError);
  KUSARI_EXPECT_THROW_WITH(BatchNormalization(std::nullopt), ValueError, "BatchNormalization",
                           "size or axis");
  EXPECT_THROW(BatchNormalization(3, 1.5), ValueError);
  EXPECT_THROW(BatchNormalization(3, 0.9, 0.0), ValueError);
  EXPECT_THROW(BatchNormalization(3, 0.9, 2e-5, int32), DtypeError);
  EXPECT_THROW(lazy(Axes{}), ValueError);

  BatchNormalization bn(3);
  bn.to_device(device());
  KUSARI_EXPECT_THROW_WITH(bn(input({2, 4})), ShapeError, "BatchNormalization", "(2, 4)", "(3,)");
  KUSARI_EXPECT_THROW_WITH(bn(input({3})), ShapeError, "BatchNormalization", "too few axes");
  KUSARI_EXPECT_THROW_WITH(bn(Array::zeros({2, 3}, int32, device())), DtypeError,
                           "BatchNormalization");
  auto bad_axis = lazy({0, 5});
  bad_axis->to_device(device());
  KUSARI_EXPECT_THROW_WITH((*bad_axis)(input({2, 3, 4, 4})), ValueError, "BatchNormalization");
  // A lazy link keeps its first size.
  auto fixed = lazy({0});
  fixed->to_device(device());
  (*fixed)(input({2, 3}));
  KUSARI_EXPECT_THROW_WITH((*fixed)(input({2, 4})), ShapeError, "BatchNormalization", "(4,)",
                           "(3,)");
}

KUSARI_INSTANTIATE_DEVICE_TEST(BatchNormalizationLinkTest);

}  // namespace
}  // namespace kusari
