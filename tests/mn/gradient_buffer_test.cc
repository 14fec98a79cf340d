// Multi-process tests of the gradients kept in the communicator's reduction buffer (Note
// [Gradients in the reduction buffer]) through the MPI communicators "flat" and "dummy": the
// same means with the option on and off, gradients as views of one buffer that backward writes
// into, zero_fill, a changing parameter set, the fallbacks and the environment variable. The NCCL
// kinds are tested in nccl_test.cc.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "mn/reduce/gradient_buffer.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using test::Plain;
using test::TwoLazyLayers;
using testing::ArraysClose;
using testing::ThrowsWith;

CommunicatorOptions with_buffer(bool on) {
  CommunicatorOptions o;
  o.gradients_in_buffer = on;
  return o;
}

/// Parameters of sizes that are not multiples of the 64-byte segment alignment.
class Uneven : public Link {
 public:
  explicit Uneven(Dtype dtype = float32) {
    const std::vector<Shape> shapes = {{3}, {5, 7}, {1}, {2, 3, 4}, {40}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      add_param("p" + std::to_string(i), Parameter(Array::zeros(shapes[i], dtype)));
    }
  }
  const char* type_name() const override { return "Uneven"; }
};

/// Gradient of parameter `i` on `rank`: exact in float32, so every summation order agrees.
Array pattern(const Shape& shape, int i, int rank, Dtype dtype = float32) {
  const int64_t n = shape.numel();
  Array g = Array::arange(0.0, static_cast<double>(n), 1.0, float64) * 0.25 + static_cast<double>(rank + 10 * i);
  return g.reshape(shape).astype(dtype);
}

void set_patterns(Link& model, int rank) {
  int i = 0;
  for (auto& [path, p] : model.namedparams()) p.set_grad(pattern(p.shape(), i++, rank, p.dtype()));
}

/// True when every gradient of `model` is its bound buffer, all in one allocation.
bool gradients_in_one_buffer(Link& model) {
  auto params = model.namedparams();
  for (auto& [path, p] : params) {
    if (!p.grad_in_buffer() || p.grad().storage() != params.front().second.grad().storage()) return false;
  }
  return true;
}

/// The mean over the ranks of d loss / d param for each of `params`, computed without touching
/// any gradient (kusari::grad) and averaged with a plain array allreduce.
std::vector<Array> expected_means(Communicator& comm, const Variable& loss, const std::vector<Parameter>& params) {
  std::vector<Variable> inputs(params.begin(), params.end());
  std::vector<Variable> local = grad({loss}, inputs);
  std::vector<Array> out;
  for (const Variable& g : local) out.push_back(comm.allreduce(g.data(), ReduceOp::kMean));
  return out;
}

TEST(GradientBufferTest, PlanAlignsSegmentsAndPads) {
  std::vector<int64_t> offsets;
  EXPECT_EQ(detail::GradientBuffer::plan({3, 16, 1, 0, 5}, 16, 1, &offsets), 53);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 16, 32, 48, 48}));
  EXPECT_EQ(detail::GradientBuffer::plan({3, 16, 1, 0, 5}, 16, 8, &offsets), 56);
  EXPECT_EQ(detail::GradientBuffer::plan({}, 16, 8, &offsets), 8);
  EXPECT_TRUE(offsets.empty());
  EXPECT_EQ(detail::GradientBuffer::plan({7, 7}, 1, 1, &offsets), 14);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 7}));
}

TEST(GradientsInBufferTest, OnAndOffGiveTheSameMean) {
  auto on = create_communicator("flat", with_buffer(true));
  auto off = create_communicator("flat", with_buffer(false));
  const int r = on->rank(), s = on->size();
  Uneven a, b;
  for (int step = 0; step < 2; ++step) {
    set_patterns(a, r + step);
    set_patterns(b, r + step);
    on->multi_node_mean_grad(a);
    off->multi_node_mean_grad(b);
    auto pa = a.namedparams(), pb = b.namedparams();
    for (size_t i = 0; i < pa.size(); ++i) {
      const Array expected = pattern(pa[i].second.shape(), static_cast<int>(i), step) + (s - 1) / 2.0;
      EXPECT_TRUE(ArraysClose(pa[i].second.grad(), expected)) << pa[i].first << " step " << step;
      // Exact sums in both paths, scaled by the same factor: the same bits.
      EXPECT_TRUE(ArraysClose(pa[i].second.grad(), pb[i].second.grad(), 0, 0)) << pa[i].first;
      EXPECT_FALSE(pb[i].second.grad_buffer().defined()) << "the option off binds nothing";
    }
    EXPECT_TRUE(gradients_in_one_buffer(a)) << "step " << step;
    EXPECT_FALSE(pb[0].second.grad().shares_memory_with(pb[1].second.grad()));
  }
}

TEST(GradientsInBufferTest, GradientsReturnToTheSameBufferEveryStep) {
  auto comm = create_communicator("flat");  // on by default
  ASSERT_TRUE(comm->options().gradients_in_buffer);
  const int r = comm->rank();
  manual_seed(3);
  links::Linear model(3, 2);
  auto loss_of = [&](double factor) {
    Array x = Array::from({1, 2, 3, 4, 5, 6}, Shape{2, 3}, float32) * (factor * (r + 1));
    return F::sum(F::square(model(Variable(x))));
  };
  // Step 1 binds the gradients to the buffer.
  model.cleargrads();
  Variable loss = loss_of(1.0);
  std::vector<Array> expected = expected_means(*comm, loss, {model.W, model.b});
  loss.backward();
  comm->multi_node_mean_grad(model);
  ASSERT_TRUE(gradients_in_one_buffer(model));
  EXPECT_TRUE(ArraysClose(model.W.grad(), expected[0]));
  EXPECT_TRUE(ArraysClose(model.b.grad(), expected[1]));
  const auto storage = model.W.grad().storage();
  void* const w_at = model.W.grad().raw_data();
  void* const b_at = model.b.grad().raw_data();
  // Later steps: backward's new gradients are copied into the same memory (one batched copy in
  // the communicator), and the mean is right.
  for (double factor : {2.0, -0.5}) {
    model.cleargrads();
    loss = loss_of(factor);
    expected = expected_means(*comm, loss, {model.W, model.b});
    loss.backward();
    EXPECT_FALSE(model.W.grad_in_buffer()) << "backward adopts its gradient";
    comm->multi_node_mean_grad(model);
    EXPECT_TRUE(gradients_in_one_buffer(model));
    EXPECT_EQ(model.W.grad().storage(), storage) << "no new gradient memory";
    EXPECT_EQ(model.W.grad().raw_data(), w_at);
    EXPECT_EQ(model.b.grad().raw_data(), b_at);
    EXPECT_TRUE(ArraysClose(model.W.grad(), expected[0])) << "factor " << factor;
    EXPECT_TRUE(ArraysClose(model.b.grad(), expected[1])) << "factor " << factor;
  }
  // Gradients accumulated over two backward passes before the mean (no cleargrads between).
  model.cleargrads();
  Variable l1 = loss_of(1.0), l2 = loss_of(3.0);
  std::vector<Array> e1 = expected_means(*comm, l1, {model.W, model.b});
  std::vector<Array> e2 = expected_means(*comm, l2, {model.W, model.b});
  l1.backward();
  l2.backward();
  comm->multi_node_mean_grad(model);
  EXPECT_EQ(model.W.grad().storage(), storage);
  EXPECT_TRUE(ArraysClose(model.W.grad(), e1[0] + e2[0]));
  EXPECT_TRUE(ArraysClose(model.b.grad(), e1[1] + e2[1]));
  // Releasing the communicator unbinds the parameters; their gradients stay.
  comm.reset();
  EXPECT_FALSE(model.W.grad_buffer().defined());
  EXPECT_TRUE(model.W.grad().defined());
}

TEST(GradientsInBufferTest, ZeroFillAndParametersWithoutGradients) {
  auto comm = create_communicator("flat");
  const int r = comm->rank(), s = comm->size();
  links::Linear model(3, 2);
  model.W.set_grad(Array::full(model.W.shape(), r, float32));
  model.b.set_grad(Array::full({2}, r, float32));
  comm->multi_node_mean_grad(model);
  ASSERT_TRUE(gradients_in_one_buffer(model));
  // No rank has a gradient for b: it is skipped, keeps none, and leaves the buffer.
  model.cleargrads();
  model.W.set_grad(Array::full(model.W.shape(), 2.0 * r, float32));
  comm->multi_node_mean_grad(model, /*zero_fill=*/false);
  EXPECT_FALSE(model.b.grad().defined());
  EXPECT_FALSE(model.b.grad_buffer().defined());
  EXPECT_TRUE(model.W.grad_in_buffer());
  EXPECT_TRUE(ArraysClose(model.W.grad(), Array::full(model.W.shape(), s - 1.0, float32)));
  // With zero_fill, the ranks without a gradient for b send zeros from its segment.
  model.cleargrads();
  model.W.set_grad(Array::ones(model.W.shape(), float32));
  if (r == 0) model.b.set_grad(Array::full({2}, static_cast<double>(s), float32));
  comm->multi_node_mean_grad(model, /*zero_fill=*/true);
  EXPECT_TRUE(gradients_in_one_buffer(model));
  EXPECT_TRUE(ArraysClose(model.b.grad(), Array::ones({2}, float32)));
  EXPECT_TRUE(ArraysClose(model.W.grad(), Array::ones(model.W.shape(), float32)));
  // And again, once b is bound: zero_fill fills its segment in place.
  model.cleargrads();
  model.W.set_grad(Array::ones(model.W.shape(), float32));
  if (r == 1) model.b.set_grad(Array::full({2}, 2.0 * s, float32));
  comm->multi_node_mean_grad(model, /*zero_fill=*/true);
  EXPECT_TRUE(gradients_in_one_buffer(model));
  EXPECT_TRUE(ArraysClose(model.b.grad(), Array::full({2}, 2.0, float32)));
}

TEST(GradientsInBufferTest, ParameterSetChangeRebinds) {
  auto comm = create_communicator("flat");
  const int r = comm->rank();
  TwoLazyLayers model;
  Array x = Array::from({1, -2, 0.5, 3}, Shape{1, 4}, float32) * static_cast<double>(r + 1);
  // Step 1: only l1 exists (l2 is not initialized yet).
  model.cleargrads();
  Variable loss = F::sum(F::square((*model.l1)(Variable(x))));
  std::vector<Array> e = expected_means(*comm, loss, {model.l1->W, model.l1->b});
  loss.backward();
  comm->multi_node_mean_grad(model);
  EXPECT_TRUE(model.l1->W.grad_in_buffer());
  EXPECT_FALSE(model.l2->W.is_initialized());
  EXPECT_TRUE(ArraysClose(model.l1->W.grad(), e[0]));
  const auto first = model.l1->W.grad().storage();
  // Step 2: l2 is initialized in the forward pass: a new layout, every gradient moves into it.
  model.cleargrads();
  loss = F::sum(F::square((*model.l2)((*model.l1)(Variable(x)))));
  e = expected_means(*comm, loss, {model.l1->W, model.l1->b, model.l2->W, model.l2->b});
  loss.backward();
  EXPECT_FALSE(model.l2->W.grad_in_buffer()) << "not bound before the communicator saw it";
  comm->multi_node_mean_grad(model);
  EXPECT_TRUE(gradients_in_one_buffer(model));
  EXPECT_NE(model.l1->W.grad().storage(), first);
  EXPECT_TRUE(ArraysClose(model.l1->W.grad(), e[0]));
  EXPECT_TRUE(ArraysClose(model.l1->b.grad(), e[1]));
  EXPECT_TRUE(ArraysClose(model.l2->W.grad(), e[2]));
  EXPECT_TRUE(ArraysClose(model.l2->b.grad(), e[3]));
  // Step 3: the new layout is kept, and the gradients return to it.
  const auto second = model.l1->W.grad().storage();
  model.cleargrads();
  loss = F::sum(F::square((*model.l2)((*model.l1)(Variable(x * 2.0)))));
  e = expected_means(*comm, loss, {model.l1->W, model.l2->W});
  loss.backward();
  comm->multi_node_mean_grad(model);
  EXPECT_TRUE(gradients_in_one_buffer(model));
  EXPECT_EQ(model.l2->b.grad().storage(), second);
  EXPECT_TRUE(ArraysClose(model.l1->W.grad(), e[0]));
  EXPECT_TRUE(ArraysClose(model.l2->W.grad(), e[1]));
}

TEST(GradientsInBufferTest, MixedDtypesAndCastsFallBackToPacking) {
  auto comm = create_communicator("flat");
  const int r = comm->rank(), s = comm->size();
  Uneven model;
  set_patterns(model, r);
  comm->multi_node_mean_grad(model);
  ASSERT_TRUE(gradients_in_one_buffer(model));
  // p0 becomes float64 (set_data unbinds it): mixed dtypes travel packed, and the buffer is
  // released, so the others are unbound too.
  auto params = model.namedparams();
  params[0].second.set_data(params[0].second.data().astype(float64));
  EXPECT_FALSE(params[0].second.grad_buffer().defined());
  set_patterns(model, r);
  comm->multi_node_mean_grad(model);
  for (size_t i = 0; i < params.size(); ++i) {
    const Parameter& p = params[i].second;
    EXPECT_FALSE(p.grad_buffer().defined()) << params[i].first;
    EXPECT_TRUE(ArraysClose(p.grad().astype(float64),
                            pattern(p.shape(), static_cast<int>(i), 0, float64) + (s - 1) / 2.0))
        << params[i].first;
  }
  // A cast to another wire dtype packs too.
  CommunicatorOptions half;
  half.allreduce_grad_dtype = float16;
  auto cast = create_communicator("flat", half);
  Uneven plain;
  set_patterns(plain, r);
  cast->multi_node_mean_grad(plain);
  EXPECT_FALSE(plain.namedparams()[0].second.grad_buffer().defined());
  auto pp = plain.namedparams();
  for (size_t i = 0; i < pp.size(); ++i) {
    EXPECT_TRUE(ArraysClose(pp[i].second.grad(), pattern(pp[i].second.shape(), static_cast<int>(i), 0) + (s - 1) / 2.0,
                            1e-2, 1e-2));
  }
}

TEST(GradientsInBufferTest, EnvironmentVariableOverridesTheOption) {
  const int r = create_communicator("naive")->rank();  // (created before the variable is set)
  setenv("KUSARI_MN_GRADIENTS_IN_BUFFER", "0", 1);
  auto off = create_communicator("flat");
  setenv("KUSARI_MN_GRADIENTS_IN_BUFFER", "1", 1);
  auto on = create_communicator("flat", with_buffer(false));
  setenv("KUSARI_MN_GRADIENTS_IN_BUFFER", "sometimes", 1);
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { create_communicator("flat"); },
                                     {"KUSARI_MN_GRADIENTS_IN_BUFFER", "sometimes"}));
  unsetenv("KUSARI_MN_GRADIENTS_IN_BUFFER");
  EXPECT_FALSE(off->options().gradients_in_buffer);
  EXPECT_TRUE(on->options().gradients_in_buffer);
  Uneven a, b;
  set_patterns(a, r);
  set_patterns(b, r);
  off->multi_node_mean_grad(a);
  on->multi_node_mean_grad(b);
  EXPECT_FALSE(a.namedparams()[0].second.grad_buffer().defined());
  EXPECT_TRUE(gradients_in_one_buffer(b));
  // split() keeps the setting.
  auto sub = off->split(0, r);
  EXPECT_FALSE(sub->options().gradients_in_buffer);
}

TEST(GradientsInBufferTest, SameElementsInOtherShapesAreReported) {
  // The same number of gradients and elements on every rank, but shaped differently: the
  // buffers would be laid out differently, so every rank must refuse alike.
  auto comm = create_communicator("flat");
  class One : public Link {
   public:
    explicit One(Shape shape) { add_param("w", Parameter(Array::zeros(shape, float32))); }
    const char* type_name() const override { return "One"; }
  };
  One model(comm->rank() == 1 ? Shape{3, 2} : Shape{2, 3});
  model.zerograds();
  EXPECT_TRUE(
      ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model); }, {"/w (2, 3)"}));
}

// Ranks that lay the buffer out differently (the option on some ranks only) would reduce
// buffers of different lengths and hang; every rank raises an error naming the option instead.
TEST(GradientsInBufferTest, OptionDifferingAcrossRanksIsReportedNotHung) {
  CommunicatorOptions options;
  auto world = create_communicator("flat");
  options.gradients_in_buffer = world->rank() != 1;
  world.reset();
  auto comm = create_communicator("flat", options);
  class Two : public Link {
   public:
    Two() {
      add_param("a", Parameter(Array::zeros({3}, float32)));
      add_param("b", Parameter(Array::zeros({5}, float32)));
    }
    const char* type_name() const override { return "Two"; }
  };
  Two model;
  model.zerograds();
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model); },
                                            {"gradients_in_buffer off", "gradients_in_buffer on"}))
      << "rank " << comm->rank();
}

TEST(GradientsInBufferTest, WireDtypeDifferingAcrossRanksIsReportedNotHung) {
  // A float16 wire on one rank only: MPI would sum buffers of different types and lengths.
  CommunicatorOptions options;
  auto world = create_communicator("flat");
  const int r = world->rank();
  if (r == 1) options.allreduce_grad_dtype = float16;
  world.reset();
  auto comm = create_communicator("flat", options);
  Uneven model;
  set_patterns(model, r);
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second with the list and check cached
    EXPECT_TRUE(ThrowsWith<CommunicatorError>(
        [&] { comm->multi_node_mean_grad(model); },
        {"allreduce_grad_dtype float16", "allreduce_grad_dtype unset"}))
        << "rank " << r;
  }
  // The gradients were left alone.
  int i = 0;
  for (auto& [path, p] : model.namedparams()) {
    EXPECT_TRUE(ArraysClose(p.grad(), pattern(p.shape(), i++, r), 0, 0)) << path;
  }
}

TEST(GradientsInBufferTest, StepsInPlaceStillReduceAndCheckAcrossRanks) {
  // Note [Gradients in the reduction buffer], "Every step": gradients that are still their
  // segments skip the per-array checks, but are reduced, and a change on one rank is still caught.
  auto comm = create_communicator("flat");
  const int r = comm->rank(), s = comm->size();
  Uneven model;
  set_patterns(model, r);
  comm->multi_node_mean_grad(model);
  ASSERT_TRUE(gradients_in_one_buffer(model));
  for (int step = 1; step < 4; ++step) {
    // Written into the segments in place: the gradients stay the segments.
    int i = 0;
    for (auto& [path, p] : model.namedparams()) {
      Array g = p.grad();
      g.assign(pattern(p.shape(), i++, r + step));
    }
    comm->multi_node_mean_grad(model);
    EXPECT_TRUE(gradients_in_one_buffer(model));
    i = 0;
    for (auto& [path, p] : model.namedparams()) {
      Array expected = pattern(p.shape(), i++, 0) + (s - 1) / 2.0 + step;
      EXPECT_TRUE(ArraysClose(p.grad(), expected, 0, 0)) << "step " << step << " " << path;
    }
  }
  // Rank 1 adds a parameter; the others are in place and take the short path: all must raise.
  if (r == 1) {
    model.add_param("q", Parameter(Array::zeros({2}, float32)));
    model.namedparams().back().second.set_grad(Array::ones({2}, float32));
  }
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model); }, {"/q"}))
      << "rank " << r;
}

TEST(GradientsInBufferTest, DummyKeepsGradientsWithoutReducing) {
  auto comm = create_communicator("dummy");
  const int r = comm->rank();
  Uneven model;
  set_patterns(model, r);
  comm->multi_node_mean_grad(model);
  EXPECT_TRUE(gradients_in_one_buffer(model));
  int i = 0;
  for (auto& [path, p] : model.namedparams()) {
    EXPECT_TRUE(ArraysClose(p.grad(), pattern(p.shape(), i++, r), 0, 0)) << path;
  }
}

TEST(GradientsInBufferTest, MultiNodeOptimizerTrainsAlikeOnAndOff) {
  std::vector<std::shared_ptr<links::Linear>> models;
  int r = 0;
  for (bool on : {true, false}) {
    auto comm = create_communicator("flat", with_buffer(on));
    r = comm->rank();
    manual_seed(100 + static_cast<uint64_t>(r));  // different initial weights per rank
    auto model = std::make_shared<links::Linear>(3, 2);
    auto opt = create_multi_node_optimizer(std::make_shared<Plain>(), comm);
    opt->setup(model);
    for (int step = 0; step < 4; ++step) {
      Array x = Array::from({1, 2, -1, 0.5, 0, 3}, Shape{2, 3}, float32) * static_cast<double>(r + step + 1);
      opt->update([&] { return F::sum(F::square((*model)(Variable(x)))); });
    }
    EXPECT_EQ(gradients_in_one_buffer(*model), on);
    models.push_back(model);
  }
  EXPECT_TRUE(ArraysClose(models[0]->W.data(), models[1]->W.data(), 1e-6, 1e-6));
  EXPECT_TRUE(ArraysClose(models[0]->b.data(), models[1]->b.data(), 1e-6, 1e-6));
}

}  // namespace
}  // namespace kusari::mn
