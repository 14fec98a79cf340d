// Multi-process tests of PowerSGD gradient compression (Note [PowerSGD]): exact where the rank
// suffices, the error feedback's invariant, the bytes it saves, training, and its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "kusari/core/random.h"
#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "kusari/models/resnet.h"
#include "kusari/optimizers/sgd.h"
#include "mn/reduce/powersgd.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using testing::ArraysClose;
using testing::ThrowsWith;

/// A gradient of `shape` that differs on every rank.
Array rank_gradient(const Shape& shape, int rank, double phase) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return sin(Array::arange(n, Dtype::kFloat32).reshape(shape) * (0.37 + 0.11 * rank) + phase);
}

TEST(PowerSgd, OrthonormalizesColumns) {
  Generator gen(5);
  Array p = Array::normal({6, 3}, 0.0, 1.0, float32, Device::cpu(), &gen);
  detail::orthonormalize_columns(p);
  Array eye = Array::zeros({3, 3}, float32);
  for (int64_t i = 0; i < 3; ++i) eye.at({i, i}).fill(1.0);
  EXPECT_TRUE(ArraysClose(matmul(p.transpose(), p), eye, 1e-5, 1e-5));
  // Columns that depend on earlier ones become zero instead of noise: sinusoids of one frequency
  // span 2 dimensions.
  Array q = rank_gradient({6, 3}, 0, 0.5);
  detail::orthonormalize_columns(q);
  EXPECT_TRUE(ArraysClose(q.at({Slice(), 2}), Array::zeros({6}, float32), 0, 1e-6));
  EXPECT_NEAR(sum(q.at({Slice(), 1}) * q.at({Slice(), 1})).item<float>(), 1.0, 1e-5);
}

TEST(PowerSgd, ARankAsLargeAsTheMatrixGivesTheExactMean) {
  auto comm = create_communicator("naive");
  links::Linear model(5, 4);  // W 4 x 5, b 4
  model.W.set_grad(rank_gradient({4, 5}, comm->rank(), 0.0));
  model.b.set_grad(rank_gradient({4}, comm->rank(), 1.0));
  const Array w_mean = comm->allreduce(model.W.grad(), ReduceOp::kMean);
  const Array b_mean = comm->allreduce(model.b.grad(), ReduceOp::kMean);
  detail::PowerSgdReducer reducer(comm, 4, /*min_ratio=*/0.0, /*start_step=*/0, /*seed=*/3);
  reducer.mean_grad(model);
  EXPECT_TRUE(ArraysClose(model.W.grad(), w_mean, 1e-4, 1e-5));
  EXPECT_TRUE(array_equal(model.b.grad(), b_mean));  // (a vector: averaged exactly)
  EXPECT_EQ(reducer.stats().compressed, 1);
  EXPECT_EQ(reducer.stats().exact, 1);
}

TEST(PowerSgd, ErrorFeedbackKeepsWhatTheApproximationsLeftOut) {
  // The same rank-3 gradient on every process and step, approximated with rank 1: without error
  // feedback the steps would only ever follow M's top direction; with it, what each step leaves
  // out comes back later, and the mean of the applied steps approaches M itself.
  auto comm = create_communicator("naive");
  links::Linear model(12, 10);
  Array m = matmul(rank_gradient({10, 3}, 0, 0.2), rank_gradient({3, 12}, 0, 0.9));
  detail::PowerSgdReducer reducer(comm, 1, 0.0, 0, 7);
  Array applied = Array::zeros({10, 12}, float32);
  const int steps = 200;
  for (int t = 0; t < steps; ++t) {
    model.W.set_grad(m.copy());
    model.b.set_grad(Array::zeros({10}, float32));
    reducer.mean_grad(model);
    applied = applied + model.W.grad();
  }
  const Array gap = m * static_cast<double>(steps) - applied;  // the error fed back after the last step
  const double gap_norm = std::sqrt(sum(gap * gap).item<float>());
  const double m_norm = std::sqrt(sum(m * m).item<float>());
  EXPECT_LT(gap_norm, 0.05 * steps * m_norm) << "the mean of the applied steps must approach M";
  // One step alone is M's best rank-1 approximation at most: far from M.
  model.W.set_grad(m.copy());
  detail::PowerSgdReducer fresh(comm, 1, 0.0, 0, 7);
  fresh.mean_grad(model);
  const Array one = m - model.W.grad();
  EXPECT_GT(std::sqrt(sum(one * one).item<float>()), 0.05 * m_norm);
}

TEST(PowerSgd, SendsAFractionOfTheBytes) {
  auto comm = create_communicator("naive");
  links::Linear model(256, 256);
  model.W.set_grad(rank_gradient({256, 256}, comm->rank(), 0.0));
  model.b.set_grad(rank_gradient({256}, comm->rank(), 0.0));
  detail::PowerSgdReducer reducer(comm, 4, 2.0, 0, 0);
  reducer.mean_grad(model);
  const CompressionStats s = reducer.stats();
  EXPECT_EQ(s.bytes_uncompressed, (256 * 256 + 256) * 4);
  EXPECT_EQ(s.bytes_sent, (2 * 256 * 4 + 256) * 4);  // P and Q of rank 4, and the bias
  EXPECT_GE(static_cast<double>(s.bytes_uncompressed) / s.bytes_sent, 20.0);
}

TEST(PowerSgd, RankFourCutsTheBytesOfResNet18TwentyFold) {
  auto comm = create_communicator("naive");
  auto model = models::resnet18();
  Generator gen(static_cast<uint64_t>(comm->rank()) + 11);
  for (Parameter& p : model->params()) p.set_grad(Array::normal(p.shape(), 0.0, 1.0, p.dtype(), p.device(), &gen));
  detail::PowerSgdReducer reducer(comm, 4, 2.0, 0, 0);
  reducer.mean_grad(*model);
  const CompressionStats s = reducer.stats();
  const double ratio = static_cast<double>(s.bytes_uncompressed) / static_cast<double>(s.bytes_sent);
  if (comm->rank() == 0) {
    std::printf("ResNet-18, PowerSGD rank 4: %lld of %lld bytes sent (%.1fx fewer), %lld matrices compressed, "
                "%lld gradients exact\n",
                static_cast<long long>(s.bytes_sent), static_cast<long long>(s.bytes_uncompressed), ratio,
                static_cast<long long>(s.compressed), static_cast<long long>(s.exact));
  }
  EXPECT_GE(ratio, 20.0);
  EXPECT_EQ(s.compressed, 21);  // 20 convolutions and the classifier
}

TEST(PowerSgd, TrainsAndKeepsTheProcessesEqual) {
  auto comm = create_communicator("flat");
  auto model = std::make_shared<links::Linear>(16, 8);
  MultiNodeOptimizerOptions o;
  o.powersgd_rank = 2;
  o.powersgd_start_step = 2;
  auto opt = create_multi_node_optimizer(std::make_shared<optimizers::MomentumSGD>(0.05), comm, o);
  opt->setup(model);
  const Array x = rank_gradient({32, 16}, comm->rank(), 0.3);
  const Array target = matmul(x, rank_gradient({16, 8}, 0, 1.1));  // a linear task every process shares
  auto loss = [&] { return F::mean_squared_error((*model)(Variable(x)), Variable(target)); };
  const double first = loss().array().item<float>();
  for (int t = 0; t < 60; ++t) opt->update(loss);
  const double last = loss().array().item<float>();
  EXPECT_LT(last, 0.3 * first);
  const auto stats = dynamic_cast<MultiNodeOptimizer&>(*opt).compression_stats();
  EXPECT_EQ(stats.compressed, 1);
  const std::vector<Array> all = comm->allgather(model->W.data());
  for (const Array& w : all) EXPECT_TRUE(array_equal(w, all[0]));
}

TEST(PowerSgd, RefusesWhatItCannotDo) {
  auto comm = create_communicator("naive");
  auto sgd = [] { return std::make_shared<optimizers::MomentumSGD>(); };
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { create_multi_node_optimizer(sgd(), comm, MultiNodeOptimizerOptions{.powersgd_rank = -1}); },
      {"powersgd_rank", "-1"}));
  EXPECT_TRUE(ThrowsWith<NotImplementedError>(
      [&] { create_multi_node_optimizer(sgd(), comm, MultiNodeOptimizerOptions{.zero_stage = 1, .powersgd_rank = 2}); },
      {"powersgd_rank", "zero_stage"}));
}

}  // namespace
}  // namespace kusari::mn
