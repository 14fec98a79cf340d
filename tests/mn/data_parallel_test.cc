// Multi-process tests of the data-parallel pieces: mean gradients, bcast_data, the multi-node
// optimizer, and scatter_dataset.
#include <gtest/gtest.h>
#include <mpi.h>

#include <set>

#include "kusari/datasets/tuple_dataset.h"
#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "kusari/optimizers/sgd.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using test::Plain;
using test::TwoLazyLayers;
using testing::ArraysClose;
using testing::ThrowsWith;

/// Gathers an array from every rank and checks they are all equal to rank 0's.
bool same_on_all_ranks(Communicator& comm, const Array& a) {
  std::vector<Array> all = comm.allgather(a);
  for (const Array& x : all) {
    if (!array_equal(x, all[0])) return false;
  }
  return true;
}

class MeanGradTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MeanGradTest, GradientOfEachRankIsItsRank) {
  auto comm = create_communicator(GetParam());
  const int r = comm->rank(), s = comm->size();
  links::Linear model(3, 2);
  for (Parameter& p : model.params()) p.set_grad(Array::full(p.shape(), r, float32));
  comm->multi_node_mean_grad(model);
  for (Parameter& p : model.params()) {
    const double expected = GetParam() == "dummy" ? r : (s - 1) / 2.0;
    EXPECT_TRUE(ArraysClose(p.grad(), Array::full(p.shape(), expected, float32))) << GetParam();
  }
}

TEST_P(MeanGradTest, ZeroFillGivesMissingGradientsZeros) {
  auto comm = create_communicator(GetParam());
  const int r = comm->rank(), s = comm->size();
  links::Linear model(3, 2);
  // Only rank 0 has a gradient for b; the others must send zeros for it.
  model.W.set_grad(Array::ones(model.W.shape(), float32));
  if (r == 0) model.b.set_grad(Array::full({2}, static_cast<double>(s), float32));
  comm->multi_node_mean_grad(model, true);
  ASSERT_TRUE(model.b.grad().defined());
  if (GetParam() != "dummy") EXPECT_TRUE(ArraysClose(model.b.grad(), Array::ones({2}, float32)));
  // Without zero_fill the ranks disagree: every rank gets the same clear error (none hangs).
  model.cleargrads();
  model.W.set_grad(Array::ones(model.W.shape(), float32));
  if (r == 0) model.b.set_grad(Array::ones({2}, float32));
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model, false); },
                                            {"zero_fill"}));
}

TEST_P(MeanGradTest, ShapeMismatchAcrossRanksIsReported) {
  auto comm = create_communicator(GetParam());
  links::Linear model(3, comm->rank() == 1 ? 3 : 2);
  model.zerograds();
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model); }, {"/W"}));
}

TEST_P(MeanGradTest, DebugModeReportsDivergence) {
  CommunicatorOptions o;
  o.debug = true;
  auto comm = create_communicator(GetParam(), o);
  if (GetParam() == "dummy") GTEST_SKIP() << "dummy does not reduce, so there is nothing to check";
  links::Linear model(3, 2);
  model.zerograds();
  if (comm->rank() == 0) model.W.set_grad(Array::full(model.W.shape(), std::numeric_limits<double>::infinity(), float32));
  EXPECT_TRUE(
      ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model); }, {"diverged"}));
}

TEST_P(MeanGradTest, SixteenBitGradientsAreReducedInTheirDtype) {
  // A model put in float16 / bfloat16 (train_mnist --dtype) is averaged in its own dtype.
  auto comm = create_communicator(GetParam());
  const int r = comm->rank(), s = comm->size();
  for (Dtype d : {float16, bfloat16}) {
    links::Linear model(3, 2);
    model.to_dtype(d);
    for (Parameter& p : model.params()) p.set_grad(Array::full(p.shape(), 0.25 * (r + 1), d));
    comm->multi_node_mean_grad(model);
    const double expected = GetParam() == "dummy" ? 0.25 * (r + 1) : 0.25 * (s + 1) / 2.0;
    for (Parameter& p : model.params()) {
      EXPECT_EQ(p.grad().dtype(), d) << GetParam();
      EXPECT_TRUE(ArraysClose(p.grad().astype(float32), Array::full(p.shape(), expected, float32), 0, 0))
          << GetParam() << " " << dtype_name(d);
    }
  }
}

/// Two children registered out of path order ("b" before "a"), so that the reduction's sorted
/// order differs from the traversal order.
class TwoChildren : public Chain {
 public:
  TwoChildren() {
    b = add_link("b", std::make_shared<links::Linear>(3, 2));
    a = add_link("a", std::make_shared<links::Linear>(2, 4));
  }
  std::shared_ptr<links::Linear> b, a;
};

TEST_P(MeanGradTest, ParameterListFollowsTheModel) {
  // The communicator keeps the sorted parameter list between calls (Note [Gradient sets]): a
  // replaced parameter, another model, and a parameter without a gradient must each be seen.
  auto comm = create_communicator(GetParam());
  const int r = comm->rank(), s = comm->size();
  const bool reduces = GetParam() != "dummy";
  // Gradient of rank r for the k-th parameter: r + k (mean (s - 1) / 2 + k).
  auto fill = [&](Link& model, double k0) {
    double k = k0;
    for (auto& [path, p] : model.namedparams()) p.set_grad(Array::full(p.shape(), r + k++, float32));
  };
  auto check = [&](Link& model, double k0, const char* step) {
    double k = k0;
    for (auto& [path, p] : model.namedparams()) {
      const double expected = (reduces ? (s - 1) / 2.0 : r) + k++;
      ASSERT_TRUE(p.grad().defined()) << step << " " << path;
      EXPECT_TRUE(ArraysClose(p.grad(), Array::full(p.shape(), expected, float32), 0, 0))
          << GetParam() << " " << step << " " << path;
    }
  };
  // Fills, reduces and checks one step of `model`.
  auto step = [&](Link& model, double k0, const char* what) {
    fill(model, k0);
    comm->multi_node_mean_grad(model);
    check(model, k0, what);
  };
  TwoChildren first, second;
  step(first, 0, "first model");
  step(first, 5, "the same model again");
  // A parameter replaced under the same path, with another shape.
  Parameter old_w = first.a->W;
  first.a->add_param("W", Parameter(Array::zeros({3, 3}, float32)));
  step(first, 10, "after replacing /a/W");
  EXPECT_EQ(old_w.grad().shape(), (Shape{4, 2})) << "the replaced parameter is left alone";
  // Another model through the same communicator, then the first again.
  step(second, 20, "second model");
  step(first, 30, "first model again");
  // /b/b without a gradient on every rank (zero_fill off): skipped, the others reduced.
  fill(first, 40);
  first.b->b.cleargrad();
  comm->multi_node_mean_grad(first, false);
  EXPECT_FALSE(first.b->b.grad().defined());
  const double mean = reduces ? (s - 1) / 2.0 : r;
  EXPECT_TRUE(ArraysClose(first.b->W.grad(), Array::full({2, 3}, mean + 40, float32), 0, 0)) << GetParam();
  const Parameter new_w = first.namedparams()[2].second;  // /a/W, replaced above
  EXPECT_TRUE(ArraysClose(new_w.grad(), Array::full({3, 3}, mean + 42, float32), 0, 0)) << GetParam();
  EXPECT_TRUE(ArraysClose(first.a->b.grad(), Array::full({4}, mean + 43, float32), 0, 0)) << GetParam();
  // And back to every gradient.
  step(first, 50, "every gradient again");
}

TEST_P(MeanGradTest, FailureOnOneRankIsRaisedOnEveryRank) {
  // Note [A failure on one rank]: rank 1 cannot make zero_fill's zeros for its /big (a broadcast
  // view of 2^46 float32 values: 256 TiB, more than an address space holds), so it fails while
  // the others are already in the check. They must raise too, quoting it, not wait for rank 1.
  auto comm = create_communicator(GetParam());
  const int r = comm->rank(), s = comm->size();
  Link model;
  Parameter a = model.add_param("a", Parameter(Array::zeros({3}, float32)));
  const int64_t big = r == 1 ? int64_t{1} << 46 : 4;
  model.add_param("big", Parameter(Array::zeros({1}, float32).broadcast_to({big})));
  a.set_grad(Array::full({3}, r, float32));
  auto reduce = [&] { comm->multi_node_mean_grad(model, /*zero_fill=*/true); };
  if (r == 1) {
    EXPECT_TRUE(ThrowsWith<Error>(reduce, {"cpu: out of memory"}));
  } else {
    EXPECT_TRUE(ThrowsWith<CommunicatorError>(
        reduce, {GetParam(), "multi_node_mean_grad: rank 1 failed while preparing its gradients",
                 "cpu: out of memory"}));
  }
  // Nothing was queued: with rank 1's model mended, the next reduction works everywhere.
  model.add_param("big", Parameter(Array::zeros({4}, float32)));
  a.set_grad(Array::full({3}, r, float32));
  reduce();
  const double mean = GetParam() == "dummy" ? r : (s - 1) / 2.0;
  EXPECT_TRUE(ArraysClose(a.grad(), Array::full({3}, mean, float32), 0, 0)) << GetParam();
  EXPECT_TRUE(ArraysClose(model.namedparams()[1].second.grad(), Array::zeros({4}, float32), 0, 0));
}

INSTANTIATE_TEST_SUITE_P(Kinds, MeanGradTest, ::testing::Values("naive", "flat", "dummy"));

TEST(DataParallelTest, BcastDataCopiesRankZerosParameters) {
  auto comm = create_communicator("naive");
  manual_seed(static_cast<uint64_t>(comm->rank()));
  links::Linear model(4, 3);
  EXPECT_EQ(same_on_all_ranks(*comm, model.W.data()), comm->size() == 1);
  comm->bcast_data(model);
  EXPECT_TRUE(same_on_all_ranks(*comm, model.W.data()));
  EXPECT_TRUE(same_on_all_ranks(*comm, model.b.data()));
}

TEST(DataParallelTest, BcastDataOfDifferentModelsIsReportedNotHung) {
  // Note [Same model]: a rank that built another model gets, on every rank, an error naming the
  // first parameter that differs, instead of mismatched broadcasts.
  for (const char* kind : {"naive", "flat"}) {
    auto comm = create_communicator(kind);
    const int r = comm->rank();
    links::Linear wider(4, r == 1 ? 5 : 3);  // a mistyped layer size on rank 1
    EXPECT_TRUE(ThrowsWith<CommunicatorError>(
        [&] { comm->bcast_data(wider); },
        {kind, "bcast_data: the ranks' models differ", "'/W (3, 4) float32' on rank 0",
         "'/W (5, 4) float32' on rank 1"}))
        << "rank " << r;
    Link more;  // an extra parameter on rank 1
    more.add_param("a", Parameter(Array::zeros({2}, float32)));
    if (r == 1) more.add_param("b", Parameter(Array::zeros({2}, float32)));
    EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->bcast_data(more); },
                                              {"'(nothing)' on rank 0 but '/b (2,) float32'"}))
        << "rank " << r;
    // Nothing was sent: the same model broadcasts as usual afterwards.
    manual_seed(static_cast<uint64_t>(r));
    links::Linear same(4, 3);
    comm->bcast_data(same);
    EXPECT_TRUE(same_on_all_ranks(*comm, same.W.data())) << kind;
  }
}

TEST(DataParallelTest, MultiNodeOptimizerBroadcastsFirstThenAverages) {
  auto comm = create_communicator("flat");
  const int r = comm->rank(), s = comm->size();
  manual_seed(100 + static_cast<uint64_t>(r));  // different initial weights per rank
  auto model = std::make_shared<links::Linear>(2, 1);
  auto actual = std::make_shared<Plain>();
  auto opt = create_multi_node_optimizer(actual, comm);
  opt->setup(model);
  // Each rank sees different data: x = (r + 1) * [1, 2], loss = sum(model(x)).
  Array x = Array::from({1, 2}, Shape{1, 2}, float32) * static_cast<double>(r + 1);
  auto lossfun = [&]() { return F::sum((*model)(Variable(x))); };
  opt->update(lossfun);
  EXPECT_EQ(opt->t(), 0) << "the first update only broadcasts";
  EXPECT_TRUE(same_on_all_ranks(*comm, model->W.data()));
  Array w0 = model->W.data().copy();
  opt->update(lossfun);
  EXPECT_EQ(opt->t(), 1);
  // dL/dW = x, averaged: mean(r + 1) * [1, 2] = (s + 1) / 2 * [1, 2].
  Array expected = w0 - Array::from({1, 2}, Shape{1, 2}, float32) * ((s + 1) / 2.0 * 0.1);
  EXPECT_TRUE(ArraysClose(model->W.data(), expected, 1e-5, 1e-6));
  EXPECT_TRUE(same_on_all_ranks(*comm, model->W.data()));
  // Hyperparameters pass through to the wrapped optimizer.
  opt->hyperparam("lr") = 0.5;
  EXPECT_DOUBLE_EQ(actual->hyperparam("lr"), 0.5);
}

TEST(DataParallelTest, MultiNodeOptimizerForwardsMultiTensorUpdates) {
  auto comm = create_communicator("flat");
  manual_seed(300 + static_cast<uint64_t>(comm->rank()));
  auto model = std::make_shared<links::Linear>(3, 2);
  auto actual = std::make_shared<optimizers::MomentumSGD>(0.1, 0.9);
  auto opt = create_multi_node_optimizer(actual, comm);
  opt->setup(model);
  Array x = Array::from({1, 2, 3}, Shape{1, 3}, float32) * static_cast<double>(comm->rank() + 1);
  auto lossfun = [&]() { return F::sum((*model)(Variable(x))); };
  opt->update(lossfun);  // (broadcasts)
  EXPECT_TRUE(opt->multi_tensor_update());
  opt->update(lossfun);
  EXPECT_EQ(opt->last_update_calls(), 1) << "W and b are one float32 group";
  opt->use_multi_tensor_update(false);
  EXPECT_FALSE(actual->multi_tensor_update());
  opt->update(lossfun);
  EXPECT_EQ(opt->last_update_calls(), 2) << "one call per parameter";
  EXPECT_EQ(actual->last_update_calls(), 2);
  EXPECT_TRUE(same_on_all_ranks(*comm, model->W.data()));
  EXPECT_TRUE(same_on_all_ranks(*comm, model->b.data()));
}

TEST(DataParallelTest, MixedPrecisionStepsAgreeAcrossRanks) {
  // bfloat16 and float16 (loss-scaled) parameters with float32 master weights: the lazily sized
  // weight is created in the dtype, broadcast, then every step averages 16-bit gradients and
  // leaves identical weights on every rank, close to the float32 step.
  for (Dtype d : {bfloat16, float16}) {
    SCOPED_TRACE(dtype_name(d));
    auto comm = create_communicator("flat");
    const int r = comm->rank(), s = comm->size();
    manual_seed(200 + static_cast<uint64_t>(r));
    auto model = std::make_shared<links::Linear>(1);
    model->to_dtype(d);
    auto opt = create_multi_node_optimizer(std::make_shared<optimizers::SGD>(0.1), comm);
    opt->setup(model);
    opt->use_fp32_update();
    if (d == float16) opt->loss_scaling(1000, 1024.0);
    Array x = (Array::from({1, 2}, Shape{1, 2}, float32) * static_cast<double>(r + 1)).astype(d);
    auto lossfun = [&]() { return F::sum(F::cast((*model)(Variable(x)), float32)); };
    opt->update(lossfun);  // W appears: broadcast
    EXPECT_EQ(model->W.dtype(), d);
    const Array w0 = model->W.data().astype(float32);
    opt->update(lossfun);
    EXPECT_EQ(opt->t(), 1);
    EXPECT_EQ(model->W.dtype(), d);
    EXPECT_TRUE(same_on_all_ranks(*comm, model->W.data()));
    const Array expected = w0 - Array::from({1, 2}, Shape{1, 2}, float32) * ((s + 1) / 2.0 * 0.1);
    EXPECT_TRUE(ArraysClose(model->W.data().astype(float32), expected, d == float16 ? 2e-3 : 1e-2, 1e-2));
  }
}

TEST(DataParallelTest, NewLazyParameterTriggersAnotherBroadcast) {
  auto comm = create_communicator("naive");
  manual_seed(7 + static_cast<uint64_t>(comm->rank()));
  auto model = std::make_shared<TwoLazyLayers>();
  auto opt = create_multi_node_optimizer(std::make_shared<Plain>(), comm);
  opt->setup(model);
  Array x = Array::ones({1, 4}, float32);
  bool use_l2 = false;
  auto lossfun = [&]() {
    Variable h = (*model->l1)(Variable(x));
    if (use_l2) h = (*model->l2)(h);
    return F::sum(h);
  };
  opt->update(lossfun);  // l1 appears: broadcast
  opt->update(lossfun);  // a real step
  EXPECT_EQ(opt->t(), 1);
  use_l2 = true;
  opt->update(lossfun);  // l2 appears: broadcast again, no step
  EXPECT_EQ(opt->t(), 1);
  EXPECT_TRUE(same_on_all_ranks(*comm, model->l2->W.data()));
  opt->update(lossfun);
  EXPECT_EQ(opt->t(), 2);
  EXPECT_TRUE(same_on_all_ranks(*comm, model->l1->W.data()));
  EXPECT_TRUE(same_on_all_ranks(*comm, model->l2->W.data()));
}

TEST(ScatterTest, WindowsCoverEveryExampleForEveryRoot) {
  auto comm = create_communicator("naive");
  const int s = comm->size();
  for (bool equal : {true, false}) {
    for (int64_t n = 0; n <= 23; ++n) {
      std::multiset<int64_t> covered;
      int64_t expected_len = (n + s - 1) / s;
      for (int r = 0; r < s; ++r) {
        auto [b, e] = scatter_index_of(n, r, s, equal);
        ASSERT_LE(0, b);
        ASSERT_LE(b, e);
        ASSERT_LE(e, n);
        if (equal && n > 0) EXPECT_EQ(e - b, expected_len) << "n " << n << " rank " << r;
        if (!equal) EXPECT_EQ(e - b, n / s + (r < n % s ? 1 : 0));
        for (int64_t i = b; i < e; ++i) covered.insert(i);
      }
      std::set<int64_t> distinct(covered.begin(), covered.end());
      EXPECT_EQ(static_cast<int64_t>(distinct.size()), n);
      if (!equal) EXPECT_EQ(static_cast<int64_t>(covered.size()), n) << "no overlap without force_equal_length";
    }
    for (int root = 0; root < s; ++root) {
      auto w = scatter_index(comm->rank() == root ? 17 : -1, *comm, root, equal);
      EXPECT_EQ(w, scatter_index_of(17, comm->rank(), s, equal));
    }
  }
}

TEST(ScatterTest, ScatterDatasetAgreesAcrossRanks) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), s = comm->size();
  const int64_t n = 11;
  Array xs = Array::arange(0.0, static_cast<double>(n), 1.0, float32).reshape({n, 1});
  auto full = std::make_shared<TupleDataset>(std::vector<Array>{xs});
  for (int root = 0; root < s; ++root) {
    for (bool shuffle : {false, true}) {
      for (bool equal : {true, false}) {
        auto part = scatter_dataset(full, *comm, root, shuffle, 42, equal);
        auto [b, e] = scatter_index_of(n, r, s, equal);
        ASSERT_EQ(part->size(), e - b);
        // Gather every rank's example values; together they cover all n.
        std::vector<double> mine;
        for (int64_t i = 0; i < part->size(); ++i) mine.push_back(part->get_example(i)[0].item<double>());
        Array local = Array::from_vector(mine.empty() ? std::vector<double>{-1} : mine);
        std::vector<Array> all = comm->allgather(local);
        std::set<double> seen;
        for (const Array& a : all) {
          for (double v : a.to_vector<double>()) {
            if (v >= 0) seen.insert(v);
          }
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), n) << "root " << root << " shuffle " << shuffle;
        if (!shuffle && !mine.empty()) EXPECT_DOUBLE_EQ(mine[0], static_cast<double>(b));
      }
    }
  }
  // A rank without the data receives its part from the root.
  auto part = scatter_dataset(r == 0 ? std::static_pointer_cast<Dataset>(full) : nullptr, *comm, 0, false);
  auto [b, e] = scatter_index_of(n, r, s, true);
  ASSERT_EQ(part->size(), e - b);
  EXPECT_DOUBLE_EQ(part->get_example(0)[0].item<double>(), static_cast<double>(b));
}

// Note [Communicator arguments]: the communicator as create_communicator returns it works where
// a Communicator& does, with the same result, and a null one is named in the error.
TEST(ScatterTest, SharedPointerFormsEqualTheReferenceForms) {
  std::shared_ptr<Communicator> comm = create_communicator("naive");
  const int64_t n = 7;
  auto full = std::make_shared<TupleDataset>(std::vector<Array>{Array::arange(0.0, 7.0, 1.0).reshape({n, 1})});
  auto by_pointer = scatter_dataset(full, comm, 0, true, 3);
  auto by_reference = scatter_dataset(full, *comm, 0, true, 3);
  ASSERT_EQ(by_pointer->size(), by_reference->size());
  for (int64_t i = 0; i < by_pointer->size(); ++i) {
    EXPECT_EQ(by_pointer->get_example(i)[0].item<double>(), by_reference->get_example(i)[0].item<double>());
  }
  EXPECT_EQ(scatter_index(n, comm), scatter_index(n, *comm));
  EXPECT_NO_THROW(check_same_settings(comm, {{"--batchsize", "1"}}, "test"));
  EXPECT_EQ(snapshot_file_of_rank("s", comm), snapshot_file_of_rank("s", *comm));
  std::shared_ptr<Communicator> none;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { scatter_dataset(full, none); },
                                     {"scatter_dataset", "communicator is null", "create_communicator"}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { check_same_settings(none, {}, "x"); }, {"check_same_settings"}));
}

}  // namespace
}  // namespace kusari::mn
