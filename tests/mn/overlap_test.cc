// Multi-process tests of the overlapped gradient reduction (create_multi_node_optimizer's
// overlap; Note [Overlapped gradient reduction] in src/mn/reduce/bucket_reducer.h): the same
// numbers as without overlap, bit for bit, for every CPU communicator kind; the order checked
// across ranks; accumulation; unused, shared and lazily created parameters.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "kusari/core/threads.h"
#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "mn/reduce/bucket_reducer.h"
#include "mn_test_util.h"
#include "test_util.h"

// The thread level the test executable initialised MPI with (mpi_test_main.cc).
#ifndef KUSARI_MN_TEST_THREAD_LEVEL
#define KUSARI_MN_TEST_THREAD_LEVEL MPI_THREAD_SERIALIZED
#endif

namespace kusari::mn {
namespace {

namespace F = functions;
using test::Plain;
using testing::ThrowsWith;

/// l1 -> l2 -> l2 (used twice) -> [l3, created lazily at the first step that uses it]; `side`
/// only in the steps that ask for it.
class OverlapModel : public Chain {
 public:
  OverlapModel() {
    l1 = add_link("l1", std::make_shared<links::Linear>(6, 8));
    l2 = add_link("l2", std::make_shared<links::Linear>(8, 8));
    l3 = add_link("l3", std::make_shared<links::Linear>(5));
    side = add_link("side", std::make_shared<links::Linear>(8, 3));
  }
  std::shared_ptr<links::Linear> l1, l2, l3, side;
};

/// What a step computes; `swap` feeds `side` from l1's output instead of the last one, so that
/// backward finishes its gradients after l2's instead of before (another order).
struct Step {
  bool use_l3 = true;
  bool use_side = true;
  bool swap = false;
};

Variable loss_of(OverlapModel& m, const Array& x, const Step& s) {
  const Variable h1 = F::tanh((*m.l1)(Variable(x)));
  Variable h = F::tanh((*m.l2)(h1));
  h = F::tanh((*m.l2)(h));
  Variable main = s.use_l3 ? F::sum(F::square((*m.l3)(h))) : F::sum(h * h);
  if (!s.use_side) return main;
  return main + F::sum((*m.side)(s.swap ? h1 : h));
}

/// The data of rank `rank` at step `step`.
Array data(int rank, int step) {
  manual_seed(7000 + 31 * static_cast<uint64_t>(step) + static_cast<uint64_t>(rank));
  return Array::normal({4, 6}, 0.0, 1.0, float32);
}

/// Checks that the parameters, and with `grads` the gradients, of `a` and `b` are equal. (After a
/// step that broadcast instead of reducing, the overlapped gradients may hold the sums of the
/// buckets sent during that backward: they are not compared then.)
/// `tolerance` > 0 compares within that relative tolerance instead of bit for bit.
void expect_same(OverlapModel& a, OverlapModel& b, const std::string& where, bool grads = true,
                 double tolerance = 0.0) {
  auto pa = a.namedparams(false), pb = b.namedparams(false);
  ASSERT_EQ(pa.size(), pb.size()) << where;
  for (size_t i = 0; i < pa.size(); ++i) {
    SCOPED_TRACE(where + " " + pa[i].first);
    ASSERT_EQ(pa[i].first, pb[i].first);
    if (tolerance > 0) {
      EXPECT_TRUE(testing::ArraysClose(pa[i].second.data(), pb[i].second.data(), tolerance)) << "parameter differs";
      if (grads && pa[i].second.grad().defined()) {
        EXPECT_TRUE(testing::ArraysClose(pa[i].second.grad(), pb[i].second.grad(), tolerance)) << "gradient differs";
      }
      continue;
    }
    EXPECT_TRUE(array_equal(pa[i].second.data(), pb[i].second.data())) << "parameter differs";
    if (!grads) continue;
    const Array ga = pa[i].second.grad(), gb = pb[i].second.grad();
    ASSERT_EQ(ga.defined(), gb.defined());
    if (ga.defined())
      EXPECT_TRUE(array_equal(ga, gb))
          << "gradient differs: " << ga.reshape({-1}).to_vector<float>()[0] << " vs "
          << gb.reshape({-1}).to_vector<float>()[0];
  }
}

/// Two copies of the model, one trained without overlap and one with, on communicators of
/// `kind` (each its own), through the same steps.
struct Pair {
  std::shared_ptr<Communicator> comm_a, comm_b;
  std::shared_ptr<OverlapModel> a, b;
  std::shared_ptr<Optimizer> opt_a, opt_b;
  MultiNodeOptimizer* overlapped = nullptr;
  /// 0: the two must agree bit for bit; else the relative tolerance of the comparison.
  double tolerance = 0.0;

  Pair(const std::string& kind, const CommunicatorOptions& copts, bool zero_fill = true,
       int64_t bucket_bytes = 400, int64_t first_bucket_bytes = 100) {
    comm_a = create_communicator(kind, copts);
    comm_b = create_communicator(kind, copts);
    manual_seed(40 + static_cast<uint64_t>(comm_a->rank()));  // different weights per rank
    a = std::make_shared<OverlapModel>();
    manual_seed(40 + static_cast<uint64_t>(comm_a->rank()));
    b = std::make_shared<OverlapModel>();
    opt_a = create_multi_node_optimizer(std::make_shared<Plain>(), comm_a, false, zero_fill);
    MultiNodeOptimizerOptions o;
    o.zero_fill = zero_fill;
    o.overlap = true;
    o.bucket_bytes = bucket_bytes;
    o.first_bucket_bytes = first_bucket_bytes;
    opt_b = create_multi_node_optimizer(std::make_shared<Plain>(), comm_b, o);
    opt_a->setup(a);
    opt_b->setup(b);
    overlapped = dynamic_cast<MultiNodeOptimizer*>(opt_b.get());
  }

  /// One update of each with `backwards` backward calls (gradient accumulation: the overlapped
  /// one runs all but the last inside no_sync), then the check that both have the same
  /// parameters and (unless the update broadcast) gradients.
  void step(int step, const Step& s, int backwards = 1) {
    const int64_t t0 = opt_a->t();
    const int rank = comm_a->rank();
    for (auto [model, opt, overlap] :
         {std::tuple{a.get(), opt_a.get(), false}, std::tuple{b.get(), opt_b.get(), true}}) {
      manual_seed(900 + static_cast<uint64_t>(step));  // (a lazily created layer's weights)
      model->cleargrads();
      for (int k = 0; k < backwards; ++k) {
        const Array x = data(rank, 100 * step + k);
        if (overlap && k + 1 < backwards) {
          auto hold = overlapped->no_sync();
          loss_of(*model, x, s).backward();
        } else {
          loss_of(*model, x, s).backward();
        }
      }
      opt->update();
    }
    expect_same(*a, *b, "step " + std::to_string(step), opt_a->t() > t0, tolerance);
  }
};

class OverlapTest : public ::testing::TestWithParam<std::string> {};

// Optimizer::update_accumulated: the overlapped optimizer holds back every backward but the
// last (as under no_sync()) and takes the step the plain multi-node optimizer takes.
TEST_P(OverlapTest, AccumulatedUpdatesEqualThoseWithoutOverlap) {
  Pair pair(GetParam(), {});
  const int rank = pair.comm_a->rank();
  for (int t = 0; t < 4; ++t) {
    Step s;
    const int64_t t0 = pair.opt_a->t();
    for (auto [model, opt] : {std::pair{pair.a.get(), pair.opt_a.get()}, std::pair{pair.b.get(), pair.opt_b.get()}}) {
      manual_seed(900 + static_cast<uint64_t>(t));
      opt->update_accumulated(3, [&, model = model](int64_t k) { return loss_of(*model, data(rank, 100 * t + k), s); });
    }
    expect_same(*pair.a, *pair.b, "accumulated step " + std::to_string(t), pair.opt_a->t() > t0);
  }
  EXPECT_EQ(pair.opt_b->t(), 3);  // (the first update broadcast instead of stepping)
}

TEST_P(OverlapTest, StepsEqualTheStepsWithoutOverlapBitForBit) {
  Pair pair(GetParam(), {});
  // Step 0 broadcasts and plans (without l3); step 2 creates l3 (broadcast, planned again);
  // `side` is unused in odd steps; l2 is used twice in every step.
  for (int t = 0; t < 7; ++t) {
    Step s;
    s.use_l3 = t >= 2;
    s.use_side = t % 2 == 0;
    pair.step(t, s);
    const OverlapStats stats = pair.overlapped->overlap_stats();
    if (t >= 3) {
      EXPECT_GE(stats.buckets, 3);
      // Every bucket goes out during backward; in the odd steps the one holding `side` (unused)
      // and those after it wait for the update.
      if (t % 2 == 0) EXPECT_EQ(stats.launched_in_backward, stats.buckets);
      if (t % 2 == 1) EXPECT_LT(stats.launched_in_backward, stats.buckets);
    }
  }
  EXPECT_EQ(pair.opt_a->t(), 5);
  EXPECT_EQ(pair.opt_b->t(), 5);
}

TEST_P(OverlapTest, BucketsAreSentDuringBackward) {
  Pair pair(GetParam(), {});
  for (int t = 0; t < 3; ++t) pair.step(t, Step{});
  const OverlapStats stats = pair.overlapped->overlap_stats();
  EXPECT_GE(stats.buckets, 3);
  // The last one too: the hook of the last gradient backward finishes launches it.
  EXPECT_EQ(stats.launched_in_backward, stats.buckets);
  // kusari keeps the thread level the program initialised MPI with (Note [Allreduce algorithm]:
  // initialising the tools interface must not lower it).
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  EXPECT_EQ(level, KUSARI_MN_TEST_THREAD_LEVEL);
  // No second thread may call MPI under MPI_THREAD_SERIALIZED: the hooks move the buckets on.
  if (level != MPI_THREAD_MULTIPLE) EXPECT_FALSE(stats.progress_thread);
  expect_same(*pair.a, *pair.b, "after three steps");
}

TEST_P(OverlapTest, TheProgressModeIsAsAskedOrAsTheCpusAllow) {
  // KUSARI_MN_PROGRESS chooses who moves the collectives on (Note [Progress thread]): a thread
  // that yields between tests, one that sleeps, or the hooks; unset, a thread that yields where
  // the process's share of the CPUs exceeds its compute threads, else the hooks. A thread only
  // where MPI allows one (and the kind sends anything). Whoever does it, the numbers are those
  // without overlap.
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  const bool allowed = GetParam() != "dummy" && level == MPI_THREAD_MULTIPLE;
  auto run = [&](const char* mode, bool thread, bool yields) {
    SCOPED_TRACE(std::string("KUSARI_MN_PROGRESS ") + (mode ? mode : "unset") + ", " +
                 std::to_string(get_num_threads()) + " compute threads");
    testing::ScopedEnv env("KUSARI_MN_PROGRESS", mode);
    Pair pair(GetParam(), {});
    for (int t = 0; t < 3; ++t) pair.step(t, Step{});
    const OverlapStats stats = pair.overlapped->overlap_stats();
    EXPECT_EQ(stats.progress_thread, thread);
    EXPECT_EQ(stats.progress_yields, yields);
    EXPECT_EQ(stats.launched_in_backward, stats.buckets);
  };
  run("yield", allowed, allowed);
  run("sleep", allowed, false);
  run("hooks", false, false);
  // The process's share of the CPUs: those it is bound to, or, unbound, the host's divided
  // among its ranks (here every rank pretends to be a host of its own, so that a 2-core machine
  // has a core to spare for one compute thread).
  cpu_set_t mask;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(mask), &mask), 0);
  const int cpus = CPU_COUNT(&mask);
  const int online = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  const int on_host = create_communicator("naive")->intra_size();
  EXPECT_EQ(detail::cpu_share(1), cpus);
  EXPECT_EQ(detail::cpu_share(on_host), cpus < online ? cpus : std::max(1, online / on_host));
  const int threads = get_num_threads();
  {
    testing::ScopedEnv hosts("KUSARI_MN_RANKS_PER_HOST", "1");
    set_num_threads(cpus);  // (no core to spare)
    run(nullptr, false, false);
    if (cpus >= 2) {
      set_num_threads(cpus - 1);
      run(nullptr, allowed, allowed);
    }
  }
  set_num_threads(threads);
  // Any other value is refused when the optimizer is made, on every rank alike.
  testing::ScopedEnv env("KUSARI_MN_PROGRESS", "spin");
  auto comm = create_communicator(GetParam());
  MultiNodeOptimizerOptions o;
  o.overlap = true;
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { create_multi_node_optimizer(std::make_shared<Plain>(), comm, o); },
      {"KUSARI_MN_PROGRESS is 'spin'; expected 'yield', 'sleep' or 'hooks'"}));
}

TEST_P(OverlapTest, UpdateWithALossFunctionFreesTheGraphAndStillOverlaps) {
  // update(lossfun) runs backward with retain_graph = false (Note [Freeing the graph during
  // backward]): the hooks must still see every gradient finished.
  Pair pair(GetParam(), {});
  const int rank = pair.comm_a->rank();
  for (int t = 0; t < 3; ++t) {
    const Array x = data(rank, t);
    auto lossfun = [&](OverlapModel& m) {
      return [&] {
        manual_seed(900 + static_cast<uint64_t>(t));  // (l3's weights, made at the first step)
        return loss_of(m, x, Step{});
      };
    };
    pair.opt_a->update(lossfun(*pair.a));
    pair.opt_b->update(lossfun(*pair.b));
    expect_same(*pair.a, *pair.b, "step " + std::to_string(t), t > 0);
  }
  const OverlapStats stats = pair.overlapped->overlap_stats();
  EXPECT_EQ(stats.launched_in_backward, stats.buckets);
}

TEST_P(OverlapTest, GradientAccumulationWithNoSyncEqualsAccumulationWithoutOverlap) {
  Pair pair(GetParam(), {});
  for (int t = 0; t < 4; ++t) {
    Step s;
    s.use_side = t != 2;
    pair.step(t, s, /*backwards=*/3);
  }
}

TEST_P(OverlapTest, AccumulationWithoutNoSyncIsAnErrorOnEveryRank) {
  Pair pair(GetParam(), {});
  pair.step(0, Step{});  // (plans)
  const Array x = data(pair.comm_b->rank(), 1);
  pair.b->cleargrads();
  loss_of(*pair.b, x, Step{}).backward();
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { loss_of(*pair.b, x, Step{}).backward(); },
                                            {"became ready again after its bucket was sent"}));
  // Still usable: the update finishes what was sent, and the next step is a normal one.
  pair.opt_b->update();
  pair.b->cleargrads();
  loss_of(*pair.b, x, Step{}).backward();
  pair.opt_b->update();
  pair.comm_b->barrier();
}

TEST_P(OverlapTest, ALaterChangeOfOrderOnOneRankKeepsTheResults) {
  Pair pair(GetParam(), {});
  for (int t = 0; t < 4; ++t) {
    Step s;
    s.swap = t >= 2 && pair.comm_a->rank() == 1;  // rank 1 finishes `side` later
    pair.step(t, s);
  }
}

TEST_P(OverlapTest, WithoutZeroFillAParameterNoRankUsedKeepsNoGradient) {
  Pair pair(GetParam(), {}, /*zero_fill=*/false);
  for (int t = 0; t < 4; ++t) {
    Step s;
    s.use_side = t % 2 == 0;
    pair.step(t, s);
    if (t % 2 == 1) EXPECT_FALSE(pair.b->side->W.grad().defined());
  }
}

TEST_P(OverlapTest, WithoutZeroFillAParameterSomeRanksUsedIsAnErrorOnEveryRank) {
  Pair pair(GetParam(), {}, /*zero_fill=*/false);
  pair.step(0, Step{});
  const int rank = pair.comm_b->rank();
  pair.b->cleargrads();
  Step s;
  s.use_side = rank != 0;
  loss_of(*pair.b, data(rank, 1), s).backward();
  const std::string count = "has a gradient on " + std::to_string(pair.comm_b->size() - 1) + " of ";
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { pair.opt_b->update(); }, {count}));
  pair.comm_b->barrier();
}

TEST_P(OverlapTest, ARankWhoseFirstBackwardOrderDiffersIsAnErrorOnEveryRank) {
  Pair pair(GetParam(), {}, true, /*bucket_bytes=*/64, /*first_bucket_bytes=*/16);
  Step s;
  s.swap = pair.comm_b->rank() == pair.comm_b->size() - 1;
  pair.b->cleargrads();
  loss_of(*pair.b, data(pair.comm_b->rank(), 0), s).backward();
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { pair.opt_b->update(); },
                                            {"the ranks' bucket plans differ"}));
  pair.comm_b->barrier();  // nobody hangs
}

TEST_P(OverlapTest, SixteenBitWireAndGradientsOutsideTheBuffer) {
  for (bool in_buffer : {true, false}) {
    CommunicatorOptions o;
    o.gradients_in_buffer = in_buffer;
    if (GetParam() == "flat") o.allreduce_grad_dtype = float16;
    SCOPED_TRACE(in_buffer ? "gradients in the buffer" : "gradients outside the buffer");
    Pair pair(GetParam(), o);
    for (int t = 0; t < 4; ++t) {
      Step s;
      s.use_side = t != 1;
      pair.step(t, s);
    }
  }
}

TEST_P(OverlapTest, BucketsLargerThanAnMpiMessageGoInPieces) {
  // Every collective in pieces of at most 7 elements, as allreduce_host cuts them too.
  // The results agree within rounding, not bit for bit: MPI chooses its allreduce algorithm by
  // the message's size (a piece shorter than the number of processes is reduced otherwise than a
  // long one), so an element's order of summation follows where the cuts fall, and the packed
  // buffer of the plain optimizer is cut elsewhere than the buckets. Uncut messages (the default
  // limit is 2^30 elements) keep the bit-for-bit equality the other tests check.
  setenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS", "7", 1);
  {
    Pair pair(GetParam(), {});
    pair.tolerance = 1e-5;
    for (int t = 0; t < 3; ++t) {
      Step s;
      s.use_side = t != 1;
      pair.step(t, s);
    }
  }
  unsetenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS");
}

INSTANTIATE_TEST_SUITE_P(Kinds, OverlapTest, ::testing::Values("naive", "flat", "dummy"));

TEST(OverlapOptionsTest, DoubleBufferingIsRefused) {
  auto comm = create_communicator("flat");
  MultiNodeOptimizerOptions o;
  o.overlap = true;
  o.double_buffering = true;
  EXPECT_TRUE(ThrowsWith<NotImplementedError>(
      [&] { create_multi_node_optimizer(std::make_shared<Plain>(), comm, o); },
      {"overlap and double_buffering cannot be combined"}));
  o.double_buffering = false;
  o.bucket_bytes = 0;
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { create_multi_node_optimizer(std::make_shared<Plain>(), comm, o); },
      {"must be positive"}));
}

TEST(BucketPlanTest, BucketsCloseAtTheirSizeAndAtADtypeChange) {
  using detail::plan_buckets;
  detail::BucketSettings s;
  s.first_bucket_bytes = 16;
  s.bucket_bytes = 64;
  // Sizes in elements (float32: 4 bytes each); the order given is kept.
  const std::vector<int64_t> sizes = {2, 3, 10, 10, 1, 20, 2};
  const std::vector<Dtype> grads = {float32, float32, float32, float32, float64, float32, float32};
  const std::vector<Dtype> wires = grads;
  const auto buckets = plan_buckets({6, 5, 4, 3, 2, 1, 0}, sizes, grads, wires, s);
  std::vector<std::vector<size_t>> got;
  for (const auto& b : buckets) got.push_back(b.params);
  // First bucket: 2 + 20 elements (88 bytes >= 16 after the second); then the float64 one alone;
  // then 10 + 10 (80 >= 64), then 3 + 2, whose tail is cut off into a last bucket of its own.
  EXPECT_EQ(got, (std::vector<std::vector<size_t>>{{6, 5}, {4}, {3, 2}, {1}, {0}}));
  EXPECT_EQ(buckets[1].wire_dtype, float64);
  EXPECT_EQ(buckets[0].bytes, 88);
  // A large last bucket keeps about first_bucket_bytes at its end for the final one.
  const auto tail = plan_buckets({0, 5, 6, 2}, sizes, grads, wires, s);
  got.clear();
  for (const auto& b : tail) got.push_back(b.params);
  EXPECT_EQ(got, (std::vector<std::vector<size_t>>{{0, 5}, {6}, {2}}));
}

}  // namespace
}  // namespace kusari::mn
