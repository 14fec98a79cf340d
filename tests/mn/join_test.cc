// Multi-process tests of uneven inputs (mn::Join, Note [Uneven inputs]): processes with
// different numbers of steps finish without a hang, and each step averages over the processes
// that took it.
#include <gtest/gtest.h>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "kusari/optimizers/sgd.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using testing::ArraysClose;
using testing::ThrowsWith;

std::pair<Array, Array> batch(int rank, int step) {
  Array x = sin(Array::arange(int64_t{4 * 5}, Dtype::kFloat32).reshape({4, 5}) * (0.2 + 0.1 * rank) + step);
  Array t = cos(Array::arange(int64_t{4 * 2}, Dtype::kFloat32).reshape({4, 2}) * 0.3 + rank + step);
  return {x, t};
}

Variable loss_of(links::Linear& model, int rank, int step) {
  auto [x, t] = batch(rank, step);
  return F::mean_squared_error(model(Variable(x)), Variable(t));
}

/// Process r has `steps(r)` batches; the step after the broadcast (step 0) is taken by all.
int steps_of(int rank, int zero_for_rank0) { return rank == 0 ? zero_for_rank0 : 1 + 2 * rank; }

class JoinTest : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};  // zero_stage, rank 0's steps, overlap

TEST_P(JoinTest, EachStepAveragesOverTheProcessesThatTookIt) {
  const auto [zero, rank0_steps, overlap] = GetParam();
  auto comm = create_communicator("naive");
  const int r = comm->rank(), n = comm->size();
  auto model = std::make_shared<links::Linear>(5, 2);
  // The reference: one process computes every step from every process's batches.
  auto reference = std::make_shared<links::Linear>(5, 2);
  reference->copyparams(*model);
  comm->bcast_data(*reference);
  optimizers::MomentumSGD ref_opt(0.1);
  ref_opt.setup(reference);

  // (A loss scale, which every process must undo alike, finished ones included.)
  auto sgd = std::make_shared<optimizers::MomentumSGD>(0.1);
  sgd->set_loss_scale(8);
  MultiNodeOptimizerOptions o;
  o.zero_stage = zero;
  o.overlap = overlap;  // (zero_stage 2: the finished processes' zeros go out as the others' chunks)
  o.bucket_bytes = 16;
  auto opt = create_multi_node_optimizer(sgd, comm, o);
  opt->setup(model);
  int64_t shadow = 0;
  {
    Join join(opt);
    // Step 0 broadcasts (every process has it, but rank 0 when it has none: then its Join does).
    const int mine = steps_of(r, rank0_steps);
    for (int s = 0; s < mine; ++s) opt->update([&] { return loss_of(*model, r, s); });
    join.finish();
    shadow = join.shadow_steps();
  }
  int most = 0;
  for (int q = 0; q < n; ++q) most = std::max(most, steps_of(q, rank0_steps));
  EXPECT_EQ(shadow, most - steps_of(r, rank0_steps));
  for (int s = 1; s < most; ++s) {
    int active = 0;
    for (int q = 0; q < n; ++q) active += s < steps_of(q, rank0_steps) ? 1 : 0;
    reference->cleargrads();
    for (int q = 0; q < n; ++q) {
      if (s < steps_of(q, rank0_steps)) F::mul(loss_of(*reference, q, s), 1.0 / active).backward();
    }
    ref_opt.update();
  }
  EXPECT_TRUE(ArraysClose(model->W.data(), reference->W.data(), 1e-5, 1e-6)) << "zero " << zero;
  EXPECT_TRUE(ArraysClose(model->b.data(), reference->b.data(), 1e-5, 1e-6)) << "zero " << zero;
  EXPECT_EQ(opt->t(), most - 1);
  // The processes are even again: the communicator goes on.
  EXPECT_EQ(comm->allreduce_obj(int64_t{1}), n);
}

INSTANTIATE_TEST_SUITE_P(Stages, JoinTest,
                         ::testing::Values(std::tuple{0, 2, false}, std::tuple{0, 0, false}, std::tuple{1, 3, false},
                                           std::tuple{2, 1, false}, std::tuple{2, 3, true}),
                         [](const auto& info) {
                           return "zero" + std::to_string(std::get<0>(info.param)) + "_rank0_steps" +
                                  std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_overlap" : "");
                         });

TEST(Join, RefusesWhatItCannotDo) {
  auto comm = create_communicator("naive");
  auto plain = std::make_shared<optimizers::MomentumSGD>();
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { Join j(plain); }, {"Join", "multi-node optimizer", "MomentumSGD"}));
  auto model = std::make_shared<links::Linear>(5, 2);
  auto overlapped = create_multi_node_optimizer(std::make_shared<optimizers::MomentumSGD>(), comm,
                                                MultiNodeOptimizerOptions{.overlap = true});
  overlapped->setup(model);
  EXPECT_TRUE(ThrowsWith<NotImplementedError>([&] { Join j(overlapped); }, {"Join", "overlap"}));
}

}  // namespace
}  // namespace kusari::mn
