// Multi-process tests of the NCCL communicators (pure_nccl, non_cuda_aware, hierarchical,
// two_dimensional, single_node): each kind's mean gradients, bcast_data and allreduce against the
// MPI ("flat") result, with real and pretend hosts, 16-bit wire dtypes, double buffering's one
// step of staleness, the gradient pipeline cut into many chunks, the refusals, and the timeout.
// GPU tests skip with a message when the machine has no GPU or fewer GPUs than ranks on it; the
// rest (the chunk planning among them) run everywhere.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <tuple>

#include "kusari/core/build.h"
#include "kusari/core/cuda.h"
#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "kusari/mn/benchmark.h"
#include "kusari/optimizers/sgd.h"
#include "mn/comm/nccl_wait.h"
#include "mn/reduce/chunk_plan.h"
#include "mn/reduce/mean_grad_pipeline.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using test::world_rank;
using test::world_size;
using testing::ArraysClose;
using testing::ThrowsWith;

const bool kHaveNccl = kusari::build_info().cuda && kusari::build_info().nccl;

/// This process's rank among the processes of its (real) machine, and their number. Found by a
/// collective the first time (gpu_skip_reason, on every rank), then remembered, so that a test
/// may call my_gpu() on one rank only: a collective there would wait for ranks that never join.
std::pair<int, int> machine_rank_and_size() {
  static const std::pair<int, int> rank_and_size = [] {
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &local);
    int r = 0, s = 1;
    MPI_Comm_rank(local, &r);
    MPI_Comm_size(local, &s);
    MPI_Comm_free(&local);
    return std::pair{r, s};
  }();
  return rank_and_size;
}

/// Why the GPU tests cannot run here (empty when they can). Decided together by all ranks, so
/// that either every rank skips or none does.
std::string gpu_skip_reason() {
  std::string why;
  if (!kHaveNccl) {
    why = "this kusari was built without CUDA and NCCL";
  } else {
    const auto [local_rank, local_size] = machine_rank_and_size();
    const int gpus = cuda_device_count();
    if (gpus == 0) {
      why = "no CUDA device can be used on this machine; the NCCL tests need one GPU per rank";
    } else if (gpus < local_size) {
      why = "this machine runs " + std::to_string(local_size) + " ranks but has " +
            std::to_string(gpus) +
            " GPU(s); the NCCL tests need one GPU per rank (run them with mpiexec -n " +
            std::to_string(gpus) + ")";
    }
  }
  int skip = why.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&skip, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && why.empty()) why = "another rank cannot run the NCCL tests (see its reason)";
  return why;
}

#define KUSARI_REQUIRE_GPUS()                                             \
  do {                                                                    \
    const std::string why_ = gpu_skip_reason();                           \
    if (!why_.empty()) GTEST_SKIP() << "NCCL GPU test skipped: " << why_; \
  } while (0)

/// The GPU of this process: one per process of a machine, whatever the pretend hosts are.
Device my_gpu() {
  return Device::cuda(machine_rank_and_size().first);
}

/// Creates `name` with pretend hosts of `ranks_per_host` ranks (0: the real hosts) and, unless
/// empty, KUSARI_MN_CHUNK_BYTES=`chunk_bytes`.
std::shared_ptr<Communicator> make_comm(const std::string& name, int ranks_per_host,
                                        CommunicatorOptions o = {},
                                        const std::string& chunk_bytes = "") {
  if (ranks_per_host > 0)
    setenv("KUSARI_MN_RANKS_PER_HOST", std::to_string(ranks_per_host).c_str(), 1);
  if (!chunk_bytes.empty()) setenv("KUSARI_MN_CHUNK_BYTES", chunk_bytes.c_str(), 1);
  std::shared_ptr<Communicator> c;
  try {
    c = create_communicator(name, o);
  } catch (...) {
    unsetenv("KUSARI_MN_RANKS_PER_HOST");
    unsetenv("KUSARI_MN_CHUNK_BYTES");
    throw;
  }
  unsetenv("KUSARI_MN_RANKS_PER_HOST");
  unsetenv("KUSARI_MN_CHUNK_BYTES");
  return c;
}

/// NCCL communicators are kept for the whole run, one per (kind, pretend host size, wire
/// dtype, chunk setting): setting NCCL up takes a good part of a second, and reusing a communicator
/// across models of different layouts also exercises the packer's table rebuilds. They are released
/// before MPI is finalized.
std::map<std::string, std::shared_ptr<Communicator>>& comm_cache() {
  static std::map<std::string, std::shared_ptr<Communicator>> cache;
  return cache;
}

class ReleaseCachedCommunicators : public ::testing::Environment {
 public:
  void TearDown() override { comm_cache().clear(); }
};
[[maybe_unused]] ::testing::Environment* const release_env =
    ::testing::AddGlobalTestEnvironment(new ReleaseCachedCommunicators);

std::shared_ptr<Communicator> cached_comm(const std::string& name, int ranks_per_host,
                                          CommunicatorOptions o = {},
                                          const std::string& chunk_bytes = "") {
  const std::string key = name + "/" + std::to_string(ranks_per_host) + "/" +
                          (o.allreduce_grad_dtype ? dtype_name(*o.allreduce_grad_dtype) : "same") +
                          "/" + chunk_bytes + (o.gradients_in_buffer ? "" : "/packed");
  auto& c = comm_cache()[key];
  if (!c) c = make_comm(name, ranks_per_host, o, chunk_bytes);
  return c;
}

/// A model of parameters of uneven sizes: tiny ones, and ones larger than a pack chunk (16384).
class Uneven : public Link {
 public:
  explicit Uneven(Dtype dtype = float32) {
    const std::vector<Shape> shapes = {{3}, {5, 7}, {130, 150}, {1}, {64, 300}, {17}, {2, 3, 4}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      add_param("p" + std::to_string(i), Parameter(Array::zeros(shapes[i], dtype)));
    }
  }
  const char* type_name() const override { return "Uneven"; }
};

/// A model whose parameters, packed as float32, end exactly on, start exactly on, fill exactly,
/// and straddle the boundaries of 4 KiB (1024-element) pipeline chunks: offsets 0, 1021, 1024,
/// 2048, 4096, 4097, 9097 (end 9137).
class Straddling : public Link {
 public:
  Straddling() {
    const std::vector<Shape> shapes = {{1021}, {3}, {32, 32}, {2, 1024}, {1}, {50, 100}, {40}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      add_param("q" + std::to_string(i), Parameter(Array::zeros(shapes[i], float32)));
    }
  }
  const char* type_name() const override { return "Straddling"; }
};

/// Chunks of 4 KiB: the Uneven model in float32 (38,780 values) travels in 38 chunks.
constexpr const char* kSmallChunks = "4K";

/// Gradient of parameter `i` on `rank`: rank + a pattern exact in 16-bit floats.
Array gradient_pattern(const Shape& shape, int i, int rank, Dtype dtype) {
  const int64_t n = shape.numel();
  Array pattern = Array::arange(0.0, static_cast<double>(n), 1.0, float64);
  Array g = pattern - floor(pattern * (1.0 / 7)) * 7.0;  // i % 7
  g = g * 0.25 + static_cast<double>(rank + i);
  return g.reshape(shape).astype(dtype);
}

void set_gradients(Link& model, int rank, Dtype dtype, Device device) {
  int i = 0;
  for (auto& [path, p] : model.namedparams()) {
    p.set_grad(gradient_pattern(p.shape(), i++, rank, dtype).to_device(device));
  }
}

/// Checks that each gradient of `model` but `skip` is the mean over `size` ranks of the patterns
/// set_gradients(model, rank + step, ...) gave each rank: the pattern of `step` plus
/// (size - 1) / 2. `what` labels the failures.
void expect_mean_of_patterns(Link& model, int step, int size, const std::string& what,
                             const std::string& skip = "") {
  int i = 0;
  for (auto& [path, p] : model.namedparams()) {
    if (path == skip) continue;
    const Array expected = gradient_pattern(p.shape(), i++, step, float64) + (size - 1) / 2.0;
    EXPECT_TRUE(
        ArraysClose(p.grad().to_device(Device::cpu()).astype(float64), expected, 1e-6, 1e-6))
        << what << " " << path;
  }
}

/// The parameter kinds, and the pretend host sizes they run with.
using KindAndHosts = std::tuple<std::string, int>;

class NcclKindTest : public ::testing::TestWithParam<KindAndHosts> {
 protected:
  void SetUp() override {
    KUSARI_REQUIRE_GPUS();
    const auto& [kind, per_host] = GetParam();
    const int s = world_size();
    if (kind == "single_node" && per_host > 0 && per_host < s) {
      GTEST_SKIP()
          << "single_node refuses more than one host (tested by SingleNodeRefusesPretendHosts)";
    }
    if (kind == "two_dimensional" && per_host > 0 && s % per_host != 0) {
      GTEST_SKIP()
          << "two_dimensional refuses uneven hosts (tested by TwoDimensionalRefusesUnevenHosts)";
    }
  }
  std::shared_ptr<Communicator> make_kind(CommunicatorOptions o = {},
                                          const std::string& chunk_bytes = "") {
    return cached_comm(std::get<0>(GetParam()), std::get<1>(GetParam()), o, chunk_bytes);
  }
};

TEST_P(NcclKindTest, MeanGradEqualsFlat) {
  auto comm = make_kind();
  auto flat = create_communicator("flat");
  const int r = comm->rank();
  Uneven gpu_model, cpu_model;
  gpu_model.to_device(my_gpu());
  set_gradients(gpu_model, r, float32, my_gpu());
  set_gradients(cpu_model, r, float32, Device::cpu());
  comm->multi_node_mean_grad(gpu_model);
  flat->multi_node_mean_grad(cpu_model);
  auto g = gpu_model.namedparams(), c = cpu_model.namedparams();
  ASSERT_EQ(g.size(), c.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].second.grad().device(), my_gpu());
    EXPECT_TRUE(
        ArraysClose(g[i].second.grad().to_device(Device::cpu()), c[i].second.grad(), 1e-6, 1e-6))
        << comm->name() << " " << g[i].first;
  }
  // A second step with new gradient arrays (the tables are reused, the pointers may move).
  set_gradients(gpu_model, r + 1, float32, my_gpu());
  set_gradients(cpu_model, r + 1, float32, Device::cpu());
  comm->multi_node_mean_grad(gpu_model);
  flat->multi_node_mean_grad(cpu_model);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_TRUE(
        ArraysClose(g[i].second.grad().to_device(Device::cpu()), c[i].second.grad(), 1e-6, 1e-6))
        << comm->name() << " step 2 " << g[i].first;
  }
}

/// Mean gradients of `comm` for float64, float16 and float32 gradients together (one float64
/// wire buffer), with a parameter that only zero_fill gives a gradient.
void check_zero_fill_and_mixed_dtypes(Communicator* comm) {
  const int r = comm->rank(), s = comm->size();
  Uneven model;
  model.to_device(my_gpu());
  auto params = model.namedparams();
  // p0 as float64 and p1 as float16 next to float32 ones: one float64 wire buffer.
  params[0].second.set_data(params[0].second.data().astype(float64));
  params[1].second.set_data(params[1].second.data().astype(float16));
  set_gradients(model, r, float32, my_gpu());
  params[0].second.set_grad(params[0].second.grad().astype(float64));
  params[1].second.set_grad(params[1].second.grad().astype(float16));
  params[3].second.cleargrad();  // only zero_fill gives it a gradient
  comm->multi_node_mean_grad(model, /*zero_fill=*/true);
  int i = 0;
  for (auto& [path, p] : params) {
    ASSERT_TRUE(p.grad().defined()) << path;
    Array expected = i == 3 ? Array::zeros(p.shape(), float64)
                            : (gradient_pattern(p.shape(), i, 0, float64) + (s - 1) / 2.0);
    EXPECT_EQ(p.grad().dtype(), i == 0 ? float64 : i == 1 ? float16 : float32) << path;
    EXPECT_TRUE(
        ArraysClose(p.grad().to_device(Device::cpu()).astype(float64), expected, 1e-3, 1e-6))
        << path;
    ++i;
  }
}

TEST_P(NcclKindTest, ZeroFillAndMixedDtypes) {
  check_zero_fill_and_mixed_dtypes(make_kind().get());
}

TEST_P(NcclKindTest, WireDtypes) {
  for (Dtype wire : {float16, bfloat16}) {
    CommunicatorOptions o;
    o.allreduce_grad_dtype = wire;
    auto comm = make_kind(o);
    auto flat = create_communicator("flat", o);
    const int r = comm->rank();
    Uneven gpu_model, cpu_model;
    gpu_model.to_device(my_gpu());
    set_gradients(gpu_model, r, float32, my_gpu());
    set_gradients(cpu_model, r, float32, Device::cpu());
    comm->multi_node_mean_grad(gpu_model);
    flat->multi_node_mean_grad(cpu_model);
    auto g = gpu_model.namedparams(), c = cpu_model.namedparams();
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_EQ(g[i].second.grad().dtype(), float32);
      EXPECT_TRUE(
          ArraysClose(g[i].second.grad().to_device(Device::cpu()), c[i].second.grad(), 1e-2, 1e-2))
          << comm->name() << " wire " << dtype_name(wire) << " " << g[i].first;
    }
  }
}

TEST_P(NcclKindTest, BcastDataEqualsRankZeros) {
  auto comm = make_kind();
  auto flat = create_communicator("flat");
  manual_seed(11 + static_cast<uint64_t>(comm->rank()));
  Uneven gpu_model, cpu_model;
  for (auto& [path, p] : cpu_model.namedparams()) {
    Array d = Array::uniform(p.shape(), -1.0, 1.0, float32);
    p.set_data(d);
  }
  gpu_model.copyparams(cpu_model);
  gpu_model.to_device(my_gpu());
  comm->bcast_data(gpu_model);
  flat->bcast_data(cpu_model);
  auto g = gpu_model.namedparams(), c = cpu_model.namedparams();
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].second.data().device(), my_gpu());
    EXPECT_TRUE(array_equal(g[i].second.data().to_device(Device::cpu()), c[i].second.data()))
        << comm->name() << " " << g[i].first;
  }
}

TEST_P(NcclKindTest, AllreduceOnTheGpu) {
  auto comm = make_kind();
  const int r = comm->rank(), s = comm->size();
  // 1000 elements: not a multiple of two_dimensional's padding.
  Array base = Array::arange(0.0, 1000.0, 1.0, float32);
  Array x = (base + static_cast<double>(r)).to_device(my_gpu());
  Array sum = comm->allreduce(x, ReduceOp::kSum);
  EXPECT_EQ(sum.device(), my_gpu());
  EXPECT_TRUE(
      ArraysClose(sum.to_device(Device::cpu()), base * static_cast<double>(s) + s * (s - 1) / 2.0));
  EXPECT_TRUE(
      ArraysClose(comm->allreduce(x, ReduceOp::kMax).to_device(Device::cpu()), base + (s - 1.0)));
  EXPECT_TRUE(ArraysClose(comm->allreduce(x, ReduceOp::kMin).to_device(Device::cpu()), base));
  EXPECT_TRUE(ArraysClose(comm->allreduce(x, ReduceOp::kMean).to_device(Device::cpu()),
                          base + (s - 1) / 2.0));
  Array ints = Array::full({5, 3}, r + 1, int64).to_device(my_gpu());
  EXPECT_TRUE(array_equal(comm->allreduce(ints).to_device(Device::cpu()),
                          Array::full({5, 3}, s * (s + 1) / 2, int64)));
  // A CPU array still goes through MPI.
  EXPECT_TRUE(ArraysClose(comm->allreduce(base + static_cast<double>(r)),
                          base * static_cast<double>(s) + s * (s - 1) / 2.0));
}

/// Double buffering through `comm`: each update applies the previous step's mean.
void check_double_buffering(const std::shared_ptr<Communicator>& comm) {
  const int r = comm->rank(), s = comm->size();
  auto model = std::make_shared<Uneven>();
  model->to_device(my_gpu());
  class Sgd : public Optimizer {
   public:
    Sgd() { declare_hyperparam("lr", 1.0); }
    const char* type_name() const override { return "Sgd"; }

   protected:
    void update_one(ParamState& st) override {
      st.param.set_data(st.param.data() - st.param.grad());
    }
  };
  auto opt = create_multi_node_optimizer(std::make_shared<Sgd>(), comm, /*double_buffering=*/true);
  opt->setup(model);
  auto p0 = model->namedparams()[2].second;  // 130x150: several pack chunks
  // The gradient of step t on rank r is 10 t + r everywhere; its mean is 10 t + (s - 1) / 2.
  auto step = [&](int t) {
    model->cleargrads();
    for (auto& [path, p] : model->namedparams())
      p.set_grad(Array::full(p.shape(), 10.0 * t + r, float32, my_gpu()));
    opt->update();
  };
  auto value = [&] { return p0.data().to_device(Device::cpu()); };
  step(1);  // the first update broadcasts rank 0's parameters (zeros) and takes no step
  EXPECT_TRUE(ArraysClose(value(), Array::zeros(p0.shape(), float32)));
  auto& pipeline = dynamic_cast<detail::MeanGradPipeline&>(*comm);
  step(2);  // starts the pipeline: no update yet
  EXPECT_EQ(opt->t(), 0);
  EXPECT_EQ(pipeline.mean_grads_in_flight(), 1);
  EXPECT_TRUE(ArraysClose(value(), Array::zeros(p0.shape(), float32)));
  step(3);  // applies the mean of step 2
  EXPECT_EQ(opt->t(), 1);
  const double m2 = 20 + (s - 1) / 2.0, m3 = 30 + (s - 1) / 2.0, m4 = 40 + (s - 1) / 2.0;
  EXPECT_TRUE(
      ArraysClose(p0.grad().to_device(Device::cpu()), Array::full(p0.shape(), m2, float32)));
  EXPECT_TRUE(ArraysClose(value(), Array::full(p0.shape(), -m2, float32)));
  step(4);  // applies the mean of step 3
  EXPECT_TRUE(ArraysClose(value(), Array::full(p0.shape(), -(m2 + m3), float32)));
  step(5);
  EXPECT_EQ(opt->t(), 3);
  EXPECT_EQ(pipeline.mean_grads_in_flight(), 1);
  EXPECT_TRUE(ArraysClose(value(), Array::full(p0.shape(), -(m2 + m3 + m4), float32)));
  // Another setup drops the sum in flight.
  opt->setup(model);
  EXPECT_EQ(pipeline.mean_grads_in_flight(), 0);
}

/// True when every gradient of `model` is its bound buffer, all in one allocation.
bool gradients_in_one_buffer(Link& model) {
  auto params = model.namedparams();
  for (auto& [path, p] : params) {
    if (!p.grad_in_buffer() || p.grad().storage() != params.front().second.grad().storage())
      return false;
  }
  return true;
}

// Note [Gradients in the reduction buffer]: the same means as the packed path; gradients that
// live in one buffer, which backward writes into; a new parameter makes a new layout.
TEST_P(NcclKindTest, GradientsInTheBufferEqualPacked) {
  CommunicatorOptions packed;
  packed.gradients_in_buffer = false;
  auto on = make_kind();
  auto off = make_kind(packed);
  const int r = on->rank(), s = on->size();
  Uneven a, b;
  a.to_device(my_gpu());
  b.to_device(my_gpu());
  // Gradients set as arrays: copied into their segments by one kernel. Step 1 keeps the layout
  // and zero-fills a parameter without a gradient.
  for (int step = 0; step < 2; ++step) {
    set_gradients(a, r + step, float32, my_gpu());
    set_gradients(b, r + step, float32, my_gpu());
    if (step == 1) {
      a.namedparams()[3].second.cleargrad();
      b.namedparams()[3].second.cleargrad();
    }
    on->multi_node_mean_grad(a, /*zero_fill=*/true);
    off->multi_node_mean_grad(b, /*zero_fill=*/true);
    EXPECT_EQ(gradient_chunks(*on), 1);
    EXPECT_TRUE(gradients_in_one_buffer(a)) << on->name() << " step " << step;
    auto pa = a.namedparams(), pb = b.namedparams();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_FALSE(pb[i].second.grad_buffer().defined());
      EXPECT_TRUE(ArraysClose(pa[i].second.grad().to_device(Device::cpu()),
                              pb[i].second.grad().to_device(Device::cpu()), 1e-6, 1e-6))
          << on->name() << " step " << step << " " << pa[i].first;
    }
  }
  // Backward through a loss that touches every parameter, sum_i sum(p_i * c_i): d/dp_i = c_i,
  // adopted by the leaves, then copied back into the same buffer by the reduction.
  const auto storage = a.namedparams().front().second.grad().storage();
  for (int step = 2; step < 4; ++step) {
    a.cleargrads();
    Variable loss;
    int i = 0;
    for (auto& [path, p] : a.namedparams()) {
      Variable c(gradient_pattern(p.shape(), i++, r + step, float32).to_device(my_gpu()));
      Variable term = functions::sum(p * c);
      loss = loss.defined() ? loss + term : term;
    }
    loss.backward();
    EXPECT_FALSE(a.namedparams().front().second.grad_in_buffer())
        << "backward adopts its gradients";
    on->multi_node_mean_grad(a);
    EXPECT_TRUE(gradients_in_one_buffer(a)) << on->name() << " step " << step;
    for (auto& [path, p] : a.namedparams()) EXPECT_EQ(p.grad().storage(), storage) << path;
    expect_mean_of_patterns(a, step, s, std::string(on->name()) + " step " + std::to_string(step));
  }
  // A new parameter: a new layout, every gradient moves into the new buffer.
  a.add_param("p9", Parameter(Array::zeros({33}, float32, my_gpu())));
  set_gradients(a, r, float32, my_gpu());
  on->multi_node_mean_grad(a);
  EXPECT_TRUE(gradients_in_one_buffer(a));
  EXPECT_NE(a.namedparams().front().second.grad().storage(), storage);
  expect_mean_of_patterns(a, 0, s, std::string(on->name()) + " new layout");
  // Mixed dtypes fall back to packing and release the buffer (the parameters are unbound).
  a.namedparams()[0].second.set_data(a.namedparams()[0].second.data().astype(float64));
  set_gradients(a, r, float32, my_gpu());
  a.namedparams()[0].second.set_grad(a.namedparams()[0].second.grad().astype(float64));
  on->multi_node_mean_grad(a);
  for (auto& [path, p] : a.namedparams()) EXPECT_FALSE(p.grad_buffer().defined()) << path;
}

// Note [Gradients in the reduction buffer], "Every step": gradients that are still their
// segments take the short path, which still reduces, and a change on one rank is still caught
// before any collective is queued (the communicator stays usable).
TEST_P(NcclKindTest, StepsInPlaceStillReduceAndCheckAcrossRanks) {
  auto comm = make_kind();
  const int r = comm->rank(), s = comm->size();
  Uneven model;
  model.to_device(my_gpu());
  Parameter extra(Array::ones({2}, float32, my_gpu()));
  const Array extra_grad = Array::ones({2}, float32, my_gpu());
  set_gradients(model, r, float32, my_gpu());
  comm->multi_node_mean_grad(model);
  ASSERT_TRUE(gradients_in_one_buffer(model));
  for (int step = 1; step < 4; ++step) {
    int i = 0;
    for (auto& [path, p] : model.namedparams()) {
      Array g = p.grad();  // written into its segment: the gradient stays the segment
      g.assign(gradient_pattern(p.shape(), i++, r + step, float32).to_device(my_gpu()));
    }
    comm->multi_node_mean_grad(model);
    EXPECT_TRUE(gradients_in_one_buffer(model)) << comm->name() << " step " << step;
    expect_mean_of_patterns(model, step, s,
                            std::string(comm->name()) + " step " + std::to_string(step));
  }
  // Rank 1 adds a parameter while the others are in place: every rank raises, none hangs. (Its
  // arrays were made on every rank before the steps, so that only the registration differs.)
  if (r == 1) {
    model.add_param("q", extra);
    extra.set_grad(extra_grad);
  }
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model); }, {"/q"}))
      << "rank " << r;
  // Nothing was queued, so the communicator still works once the models agree again.
  set_gradients(model, r, float32, my_gpu());
  if (r == 1) model.namedparams().back().second.cleargrad();
  comm->multi_node_mean_grad(model, /*zero_fill=*/false);
  expect_mean_of_patterns(model, 0, s, std::string(comm->name()) + " after the error", "/q");
}

// Note [A failure on one rank]: rank 1's model is still on the CPU. It raises before any
// collective, and so must the others, quoting it, instead of waiting for rank 1 in NCCL.
TEST_P(NcclKindTest, ModelOffTheGpuOnOneRankIsRaisedOnEveryRank) {
  auto comm = make_kind();
  const int r = comm->rank(), s = comm->size();
  Uneven model;
  const Device mine = r == 1 ? Device::cpu() : my_gpu();
  model.to_device(mine);
  set_gradients(model, r, float32, mine);
  auto reduce = [&] { comm->multi_node_mean_grad(model); };
  if (r == 1) {
    EXPECT_TRUE(ThrowsWith<CommunicatorError>(reduce, {"needs the model on a GPU"}));
  } else {
    EXPECT_TRUE(ThrowsWith<CommunicatorError>(
        reduce, {"rank 1 failed while preparing its gradients", "needs the model on a GPU"}));
  }
  model.to_device(my_gpu());
  set_gradients(model, r, float32, my_gpu());
  reduce();
  expect_mean_of_patterns(model, 0, s, comm->name());
}

// Note [Same model]: rank 1's model is on the CPU, so it would broadcast through MPI while the
// others use NCCL; every rank raises instead, naming the difference.
TEST_P(NcclKindTest, BcastDataOfAModelOffTheGpuOnOneRankIsReported) {
  auto comm = make_kind();
  const int r = comm->rank();
  Uneven model;
  model.to_device(r == 1 ? Device::cpu() : my_gpu());
  EXPECT_TRUE(ThrowsWith<CommunicatorError>(
      [&] { comm->bcast_data(model); },
      {"bcast_data: the ranks' models differ", "on a GPU' on rank 0", "on the CPU' on rank 1"}))
      << "rank " << r;
  model.to_device(my_gpu());
  for (auto& [path, p] : model.namedparams()) {
    Array data = p.data();
    data.fill(r);
  }
  comm->bcast_data(model);
  for (auto& [path, p] : model.namedparams()) {
    EXPECT_TRUE(
        ArraysClose(p.data().to_device(Device::cpu()), Array::zeros(p.shape(), p.dtype()), 0, 0))
        << comm->name() << " " << path;
  }
}

TEST_P(NcclKindTest, DoubleBufferingIsOneStepStale) {
  check_double_buffering(make_kind());
}

// --- the gradient pipeline (Note [Gradient pipeline]) ----------------------------------------

/// Compares `comm`'s mean gradients of `gpu_model` with flat's of `cpu_model` (same layout) over
/// two steps; with `zero_fill`, parameter 3 has no gradient on any rank.
void check_against_flat(Communicator& comm, Communicator& flat, Link& gpu_model, Link& cpu_model,
                        bool zero_fill, double tolerance) {
  const int r = comm.rank();
  gpu_model.to_device(my_gpu());
  for (int step = 0; step < 2; ++step) {
    set_gradients(gpu_model, r + step, float32, my_gpu());
    set_gradients(cpu_model, r + step, float32, Device::cpu());
    if (zero_fill) {
      gpu_model.namedparams()[3].second.cleargrad();
      cpu_model.namedparams()[3].second.cleargrad();
    }
    comm.multi_node_mean_grad(gpu_model, zero_fill);
    flat.multi_node_mean_grad(cpu_model, zero_fill);
    auto g = gpu_model.namedparams(), c = cpu_model.namedparams();
    ASSERT_EQ(g.size(), c.size());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_TRUE(g[i].second.grad().defined()) << g[i].first;
      EXPECT_EQ(g[i].second.grad().device(), my_gpu());
      EXPECT_EQ(g[i].second.grad().dtype(), float32);
      EXPECT_TRUE(ArraysClose(g[i].second.grad().to_device(Device::cpu()), c[i].second.grad(),
                              tolerance, tolerance))
          << comm.name() << " step " << step << " " << g[i].first << " (" << gradient_chunks(comm)
          << " chunks)";
    }
  }
}

TEST_P(NcclKindTest, PipelinedMeanGradEqualsFlat) {
  auto comm = make_kind({}, kSmallChunks);
  auto flat = create_communicator("flat");
  {
    Uneven gpu_model, cpu_model;
    check_against_flat(*comm, *flat, gpu_model, cpu_model, false, 1e-6);
    EXPECT_GE(gradient_chunks(*comm), 30) << comm->name();
  }
  {
    Straddling gpu_model, cpu_model;  // another layout: the tables are rebuilt
    check_against_flat(*comm, *flat, gpu_model, cpu_model, false, 1e-6);
    EXPECT_GE(gradient_chunks(*comm), 8) << comm->name();
  }
  EXPECT_EQ(gradient_chunk_setting(*comm), "4KiB");
}

TEST_P(NcclKindTest, PipelinedWireDtypesWithZeroFill) {
  for (Dtype wire : {float16, bfloat16}) {
    CommunicatorOptions o;
    o.allreduce_grad_dtype = wire;
    // 1 KiB chunks would make 76 of the 77.5 KB buffer: the plan caps them at 64 (61 chunks of
    // 640 elements, rounded to whole 256-byte units).
    auto comm = make_kind(o, "1K");
    auto flat = create_communicator("flat", o);
    Uneven gpu_model, cpu_model;
    check_against_flat(*comm, *flat, gpu_model, cpu_model, true, 1e-2);
    EXPECT_GE(gradient_chunks(*comm), 50) << dtype_name(wire);
    EXPECT_LE(gradient_chunks(*comm), detail::kMaxChunks) << dtype_name(wire);
    Array filled = gpu_model.namedparams()[3].second.grad();
    EXPECT_TRUE(
        array_equal(filled.to_device(Device::cpu()), Array::zeros(filled.shape(), float32)));
  }
}

TEST_P(NcclKindTest, PipelinedZeroFillAndMixedDtypes) {
  auto comm = make_kind({}, kSmallChunks);
  check_zero_fill_and_mixed_dtypes(comm.get());
  EXPECT_GE(gradient_chunks(*comm), 30) << comm->name();  // a float64 wire: 310 KB
}

TEST_P(NcclKindTest, PipelinedDoubleBuffering) {
  auto comm = make_kind({}, kSmallChunks);
  check_double_buffering(comm);
  EXPECT_GE(gradient_chunks(*comm), 30) << comm->name();
}

// --- overlap (Note [Overlapped gradient reduction] in src/mn/reduce/bucket_reducer.h)
// -------------

/// l1 -> l2 (used twice) -> l3 (created lazily); `side` only in the steps that ask for it.
class GpuOverlapModel : public Chain {
 public:
  GpuOverlapModel() {
    l1 = add_link("l1", std::make_shared<links::Linear>(6, 300));
    l2 = add_link("l2", std::make_shared<links::Linear>(300, 300));
    l3 = add_link("l3", std::make_shared<links::Linear>(5));
    side = add_link("side", std::make_shared<links::Linear>(300, 3));
  }
  Variable loss(const Array& x, bool use_side) {
    Variable h = F::tanh((*l1)(Variable(x)));
    h = F::tanh((*l2)(h));
    h = F::tanh((*l2)(h));
    Variable main = F::sum(F::square((*l3)(h)));
    return use_side ? main + F::sum((*side)(h)) : main;
  }
  std::shared_ptr<links::Linear> l1, l2, l3, side;
};

/// Trains two copies of GpuOverlapModel on this rank's GPU, one without overlap and one with
/// (buckets of 64 KiB, so that there are several), through `steps` steps in which `side` is used
/// in even steps only, and checks after each that parameters and gradients agree within
/// `tolerance`. With `graph`, the overlapped copy's forward and backward of steps 2 and later are
/// recorded in CUDA graphs (one with `side`, one without) and replayed. With `loss_scaled`, both
/// use dynamic loss scaling and rank 0's input of step 3 overflows.
void check_overlap_against_plain(const std::shared_ptr<Communicator>& comm, double tolerance,
                                 bool graph = false, bool loss_scaled = false) {
  const int r = comm->rank();
  auto a = std::make_shared<GpuOverlapModel>(), b = std::make_shared<GpuOverlapModel>();
  a->to_device(my_gpu());
  b->to_device(my_gpu());
  auto opt_a = create_multi_node_optimizer(std::make_shared<test::Plain>(), comm);
  MultiNodeOptimizerOptions o;
  o.overlap = true;
  o.bucket_bytes = 64 << 10;
  o.first_bucket_bytes = 8 << 10;
  auto opt_b = create_multi_node_optimizer(std::make_shared<test::Plain>(), comm, o);
  opt_a->setup(a);
  opt_b->setup(b);
  if (loss_scaled) {
    opt_a->loss_scaling(2);  // (dynamic)
    opt_b->loss_scaling(2);
  }
  cuda::Graph recordings[2];  // (without and with `side`), and the gradients each leaves
  std::vector<std::pair<Parameter, Variable>> recorded_grads[2];
  Array x = Array::zeros({4, 6}, float32, my_gpu());  // (the recording's input)
  for (int step = 0; step < 6; ++step) {
    const bool use_side = step % 2 == 0;
    manual_seed(500 + 10 * static_cast<uint64_t>(step) + static_cast<uint64_t>(r));
    Array input = Array::normal({4, 6}, 0.0, 1.0, float32);
    // With loss scaling, rank 0's input of step 3 overflows: every rank skips that update.
    if (loss_scaled && step == 3 && r == 0) input = input * 1e30 * 1e30;
    x.assign(input.to_device(my_gpu()));
    const int64_t t0 = opt_a->t();
    for (auto [model, opt, overlapped] :
         {std::tuple{a.get(), opt_a.get(), false}, std::tuple{b.get(), opt_b.get(), true}}) {
      manual_seed(900 + static_cast<uint64_t>(step));  // (l3's weights, made at the first step)
      BackwardOptions bo;
      if (opt->loss_scale() != 1.0) bo.loss_scale = opt->loss_scale();
      auto forward_backward = [&, model = model] {
        model->cleargrads();
        model->loss(x, use_side).backward(bo);
      };
      if (overlapped && graph && step >= 2) {
        // As the updater's graph steps: record once, replay, put the recorded gradients back
        // on the parameters (the update made the buckets' segments their gradients).
        const int k = use_side ? 1 : 0;
        if (!recordings[k].captured()) {
          recordings[k].capture(my_gpu(), forward_backward);
          for (auto& [path, p] : model->namedparams(false)) {
            recorded_grads[k].emplace_back(p, p.grad_var());
          }
        }
        recordings[k].replay();
        for (auto& [p, g] : recorded_grads[k]) p.set_grad_var(g);
      } else {
        forward_backward();
      }
      opt->update();
    }
    const bool reduced = opt_a->t() > t0 || (loss_scaled && step == 3);
    auto pa = a->namedparams(false), pb = b->namedparams(false);
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(ArraysClose(pa[i].second.data().to_device(Device::cpu()),
                              pb[i].second.data().to_device(Device::cpu()), tolerance, tolerance))
          << comm->name() << " step " << step << " " << pa[i].first;
      if (!reduced || (loss_scaled && step == 3)) continue;
      ASSERT_TRUE(pb[i].second.grad().defined()) << pa[i].first;
      EXPECT_TRUE(ArraysClose(pa[i].second.grad().to_device(Device::cpu()),
                              pb[i].second.grad().to_device(Device::cpu()), tolerance, tolerance))
          << comm->name() << " step " << step << " gradient of " << pa[i].first;
    }
    if (loss_scaled) EXPECT_EQ(opt_a->loss_scale(), opt_b->loss_scale()) << "step " << step;
  }
  auto& overlapped = dynamic_cast<MultiNodeOptimizer&>(*opt_b);
  EXPECT_GE(overlapped.overlap_stats().buckets, 3);
  if (!graph) {
    EXPECT_GT(overlapped.overlap_stats().launched_in_backward, 0) << comm->name();
  } else {
    // The replayed backward ran no hooks: the update sent every bucket.
    EXPECT_EQ(overlapped.overlap_stats().launched_in_backward, 0) << comm->name();
  }
}

TEST_P(NcclKindTest, OverlapEqualsTheStepWithoutIt) {
  check_overlap_against_plain(make_kind(), 1e-6);
}

TEST_P(NcclKindTest, OverlapWithGradientsOutsideTheBuffer) {
  CommunicatorOptions o;
  o.gradients_in_buffer = false;
  check_overlap_against_plain(make_kind(o), 1e-6);
}

TEST_P(NcclKindTest, OverlapWithSixteenBitWires) {
  for (Dtype wire : {float16, bfloat16}) {
    CommunicatorOptions o;
    o.allreduce_grad_dtype = wire;
    check_overlap_against_plain(make_kind(o), wire == float16 ? 2e-3 : 2e-2);
  }
}

TEST_P(NcclKindTest, OverlapWithDynamicLossScaling) {
  // Step 3 overflows on rank 0: both optimizers see the overflow in the averaged gradients after
  // the last bucket, skip that update and halve the scale alike.
  check_overlap_against_plain(make_kind(), 1e-5, /*graph=*/false, /*loss_scaled=*/true);
}

TEST_P(NcclKindTest, OverlapAfterAReplayedCudaGraph) {
  check_overlap_against_plain(make_kind(), 1e-6, /*graph=*/true);
}

TEST_P(NcclKindTest, OverlapRefusesARecordedUpdate) {
  auto comm = make_kind();
  auto model = std::make_shared<GpuOverlapModel>();
  model->to_device(my_gpu());
  MultiNodeOptimizerOptions o;
  o.overlap = true;
  auto opt = create_multi_node_optimizer(std::make_shared<test::Plain>(), comm, o);
  opt->setup(model);
  const Array x = Array::ones({4, 6}, float32, my_gpu());
  for (int step = 0; step < 2; ++step) {
    model->cleargrads();
    model->loss(x, true).backward();
    opt->update();
  }
  model->cleargrads();
  model->loss(x, true).backward();
  cuda::Graph graph;
  EXPECT_TRUE(ThrowsWith<DeviceError>([&] { graph.capture(my_gpu(), [&] { opt->update(); }); },
                                      {"cannot be recorded in a CUDA graph"}));
  opt->update();  // (eagerly, on every rank: the buckets sent in backward are finished)
}

TEST_P(NcclKindTest, OverlapOfAModelOnTheCpuIsRefusedOnEveryRank) {
  auto comm = make_kind();
  auto model = std::make_shared<GpuOverlapModel>();  // (left on the CPU)
  MultiNodeOptimizerOptions o;
  o.overlap = true;
  auto opt = create_multi_node_optimizer(std::make_shared<test::Plain>(), comm, o);
  opt->setup(model);
  model->loss(Array::ones({4, 6}, float32), true).backward();
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { opt->update(); }, {"needs the model on a GPU"}));
}

std::vector<KindAndHosts> kinds_and_hosts() {
  std::vector<KindAndHosts> v;
  for (const char* kind :
       {"pure_nccl", "non_cuda_aware", "hierarchical", "two_dimensional", "single_node"}) {
    for (int per_host : {0, 1, 2}) v.emplace_back(kind, per_host);
  }
  return v;
}

std::string kind_name(const ::testing::TestParamInfo<KindAndHosts>& info) {
  const int per_host = std::get<1>(info.param);
  return std::get<0>(info.param) +
         (per_host == 0 ? std::string("_real_hosts") : "_hosts_of_" + std::to_string(per_host));
}

INSTANTIATE_TEST_SUITE_P(Kinds, NcclKindTest, ::testing::ValuesIn(kinds_and_hosts()), kind_name);

// --- tests that need no GPU ----------------------------------------------------------------------

TEST(NcclTest, SingleNodeRefusesPretendHosts) {
  try {
    make_comm("single_node", 1);
    ADD_FAILURE() << "expected CommunicatorError";
  } catch (const CommunicatorError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("single_node"), std::string::npos) << what;
    if (kHaveNccl) {
      EXPECT_NE(what.find("hosts"), std::string::npos) << what;
    }
  }
  if (kHaveNccl) {
    auto comm = create_communicator("single_node");  // one real host: accepted
    EXPECT_STREQ(comm->name(), "single_node");
  }
}

TEST(NcclTest, TwoDimensionalRefusesUnevenHosts) {
  if (!kHaveNccl) GTEST_SKIP() << "this kusari was built without CUDA and NCCL";
  if (world_size() % 2 == 0) {
    auto comm = make_comm("two_dimensional", 2);
    EXPECT_EQ(comm->intra_size(), 2);
    return;
  }
  try {
    make_comm("two_dimensional", 2);
    ADD_FAILURE() << "expected CommunicatorError";
  } catch (const CommunicatorError& e) {
    EXPECT_NE(std::string(e.what()).find("same number of processes"), std::string::npos)
        << e.what();
  }
}

TEST(NcclTest, DoubleBufferingNeedsAnNcclCommunicator) {
  auto flat = create_communicator("flat");
  try {
    create_multi_node_optimizer(std::make_shared<optimizers::SGD>(), flat,
                                /*double_buffering=*/true);
    ADD_FAILURE() << "expected NotImplementedError";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("flat"), std::string::npos) << e.what();
  }
  if (kHaveNccl) {
    auto opt = create_multi_node_optimizer(std::make_shared<optimizers::SGD>(),
                                           create_communicator("pure_nccl"), true);
    EXPECT_TRUE(dynamic_cast<MultiNodeOptimizer&>(*opt).double_buffering());
  }
}

TEST(NcclTest, CpuModelsGoThroughMpiOrAreRefused) {
  if (!kHaveNccl) GTEST_SKIP() << "this kusari was built without CUDA and NCCL";
  // No NCCL is set up for CPU arrays, so this runs on machines without a GPU.
  auto comm = create_communicator("pure_nccl");
  const int r = comm->rank(), s = comm->size();
  manual_seed(3 + static_cast<uint64_t>(r));
  Uneven model;
  for (auto& [path, p] : model.namedparams()) p.set_data(Array::full(p.shape(), r, float32));
  comm->bcast_data(model);
  for (auto& [path, p] : model.namedparams())
    EXPECT_TRUE(ArraysClose(p.data(), Array::zeros(p.shape(), float32)));
  Array x = Array::full({4}, r, float32);
  EXPECT_TRUE(ArraysClose(comm->allreduce(x), Array::full({4}, s * (s - 1) / 2.0, float32)));
  set_gradients(model, r, float32, Device::cpu());
  EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model); }, {"GPU"}));
}

TEST(NcclTest, RejectsAnIntegerWireDtype) {
  if (!kHaveNccl) GTEST_SKIP() << "this kusari was built without CUDA and NCCL";
  CommunicatorOptions o;
  o.allreduce_grad_dtype = int32;
  EXPECT_THROW(create_communicator("pure_nccl", o), DtypeError);
}

TEST(NcclTest, RejectsABadChunkSetting) {
  if (!kHaveNccl) GTEST_SKIP() << "this kusari was built without CUDA and NCCL";
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { make_comm("pure_nccl", 0, {}, "lots"); },
                                     {"KUSARI_MN_CHUNK_BYTES"}));
  auto comm = make_comm("pure_nccl", 0, {}, "8M");  // no GPU needed until the first operation
  EXPECT_EQ(gradient_chunk_setting(*comm), "8MiB");
  EXPECT_EQ(gradient_chunks(*comm), 0);
}

// Ranks with different chunk settings would choose different paths (the buffer or the pipeline)
// and queue collectives of different lengths: the check before any collective reports it (so no
// GPU is needed: the model stays on the CPU, and the check comes before the device's).
TEST(NcclTest, ChunkSettingDifferingAcrossRanksIsReportedBeforeAnyCollective) {
  if (!kHaveNccl) GTEST_SKIP() << "this kusari was built without CUDA and NCCL";
  auto world = create_communicator("flat");
  const int r = world->rank();
  auto comm = make_comm("pure_nccl", 0, {}, r == 1 ? "8M" : "off");
  Uneven model;
  set_gradients(model, r, float32, Device::cpu());
  EXPECT_TRUE(
      ThrowsWith<CommunicatorError>([&] { comm->multi_node_mean_grad(model); },
                                    {"KUSARI_MN_CHUNK_BYTES 8MiB", "KUSARI_MN_CHUNK_BYTES off"}))
      << "rank " << r;
}

// --- chunk planning (no GPU needed) --------------------------------------------------------------

TEST(GradientChunksTest, ParsesSettings) {
  using detail::parse_chunk_bytes;
  EXPECT_EQ(parse_chunk_bytes("auto"), detail::kChunkBytesAuto);
  EXPECT_EQ(parse_chunk_bytes(""), detail::kChunkBytesAuto);
  EXPECT_EQ(parse_chunk_bytes(" AUTO "), detail::kChunkBytesAuto);
  EXPECT_EQ(parse_chunk_bytes("off"), detail::kChunkBytesOff);
  EXPECT_EQ(parse_chunk_bytes("0"), detail::kChunkBytesOff);
  EXPECT_EQ(parse_chunk_bytes("4096"), 4096);
  EXPECT_EQ(parse_chunk_bytes("4K"), 4096);
  EXPECT_EQ(parse_chunk_bytes("8M"), int64_t{8} << 20);
  EXPECT_EQ(parse_chunk_bytes("8MiB"), int64_t{8} << 20);
  EXPECT_EQ(parse_chunk_bytes("8mb"), int64_t{8} << 20);
  EXPECT_EQ(parse_chunk_bytes("1G"), int64_t{1} << 30);
  for (const char* bad : {"lots", "-5", "8X", "8.5M", "M", "99999999999999999999"}) {
    EXPECT_THROW(parse_chunk_bytes(bad), ValueError) << bad;
  }
  EXPECT_EQ(detail::chunk_bytes_name(detail::kChunkBytesAuto), "auto");
  EXPECT_EQ(detail::chunk_bytes_name(detail::kChunkBytesOff), "off");
  EXPECT_EQ(detail::chunk_bytes_name(int64_t{16} << 20), "16MiB");
  EXPECT_EQ(detail::chunk_bytes_name(1536), "1536B");
}

/// The invariants of every plan.
void expect_valid_plan(const detail::ChunkPlan& p, int64_t elements, int64_t item,
                       int64_t multiple) {
  ASSERT_GE(p.count, 1);
  EXPECT_LE(p.count, detail::kMaxChunks);
  EXPECT_EQ(p.elements, elements);
  int64_t sum = 0;
  for (int k = 0; k < p.count; ++k) {
    EXPECT_EQ(p.begin(k), sum);
    EXPECT_GT(p.size(k), 0);
    if (k + 1 < p.count) EXPECT_EQ(p.size(k), p.chunk);
    sum += p.size(k);
  }
  EXPECT_EQ(sum, elements);
  if (p.count > 1) {
    EXPECT_EQ(p.chunk % multiple, 0);
    EXPECT_EQ(p.chunk * item % detail::kChunkAlignBytes, 0);
  }
}

TEST(GradientChunksTest, PlansChunks) {
  using detail::plan_chunks;
  // Off, and automatic for a small buffer: one chunk.
  auto p = plan_chunks(1 << 20, 4, 1, detail::kChunkBytesOff);
  EXPECT_EQ(p.count, 1);
  expect_valid_plan(p, 1 << 20, 4, 1);
  p = plan_chunks(1 << 20, 4, 1, detail::kChunkBytesAuto);
  EXPECT_EQ(p.count, 1);
  // Automatic for ResNet-50 (97.5 MiB of float32): one chunk (see kAutoChunkBytes); a gradient
  // of 4 GiB gets about 4 chunks of a GiB.
  const int64_t resnet = 25557032;
  p = plan_chunks(resnet, 4, 1, detail::kChunkBytesAuto);
  EXPECT_EQ(p.count, 1);
  expect_valid_plan(p, resnet, 4, 1);
  p = plan_chunks(int64_t{1} << 30, 4, 1, detail::kChunkBytesAuto);
  EXPECT_EQ(p.count, 4);
  expect_valid_plan(p, int64_t{1} << 30, 4, 1);
  // A given size: 8 MiB chunks, the last one shorter.
  p = plan_chunks(resnet, 4, 1, int64_t{8} << 20);
  EXPECT_EQ(p.chunk, int64_t{2} << 20);
  EXPECT_EQ(p.count, 13);
  expect_valid_plan(p, resnet, 4, 1);
  // Too small a size is raised to keep at most kMaxChunks.
  p = plan_chunks(int64_t{1} << 20, 4, 1, 4096);
  EXPECT_EQ(p.count, detail::kMaxChunks);
  expect_valid_plan(p, int64_t{1} << 20, 4, 1);
  // two_dimensional's padding (3 processes a host: multiples of 192 elements), a float16 wire.
  p = plan_chunks(192 * 1000, 2, 192, 10000);
  EXPECT_GT(p.count, 1);
  expect_valid_plan(p, 192 * 1000, 2, 192);
  // A chunk at least the buffer: one chunk.
  p = plan_chunks(1000, 8, 1, 1 << 20);
  EXPECT_EQ(p.count, 1);
  expect_valid_plan(p, 1000, 8, 1);
  for (int64_t elements : {1, 63, 64, 1000, 38780, 1 << 22}) {
    for (int64_t bytes : {int64_t{1}, int64_t{300}, int64_t{4096}, int64_t{1} << 20}) {
      expect_valid_plan(plan_chunks(elements, 4, 1, bytes), elements, 4, 1);
    }
  }
}

TEST(GradientChunksTest, BlocksNeverStraddleChunks) {
  // Arrays ending on, starting on, filling and straddling chunk boundaries of 1024 elements,
  // one longer than a block, and an empty one.
  const std::vector<int64_t> sizes = {1021, 3, 1024, 2048, 1, 5000, 40000, 0, 7};
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t n : sizes) {
    offsets.push_back(total);
    total += n;
  }
  for (int64_t chunk : {int64_t{0}, int64_t{1024}, int64_t{4096}, int64_t{100000}}) {
    std::vector<int64_t> first;
    const auto blocks = detail::build_pack_blocks(sizes, chunk, &first);
    const int64_t chunks = chunk > 0 ? (total + chunk - 1) / chunk : 1;
    ASSERT_EQ(static_cast<int64_t>(first.size()), chunks + 1) << chunk;
    EXPECT_EQ(first.front(), 0);
    EXPECT_EQ(first.back(), static_cast<int64_t>(blocks.size()));
    // The blocks tile every array in order.
    int64_t at = 0;
    for (const detail::PackBlock& b : blocks) {
      const int64_t start = offsets[static_cast<size_t>(b.entry)] + b.begin;
      EXPECT_EQ(start, at) << chunk;
      EXPECT_GT(b.end, b.begin);
      EXPECT_LE(b.end - b.begin, detail::kPackBlockElements);
      EXPECT_LE(b.end, sizes[static_cast<size_t>(b.entry)]);
      at = offsets[static_cast<size_t>(b.entry)] + b.end;
    }
    EXPECT_EQ(at, total) << chunk;
    // Chunk k's blocks lie within [k * chunk, (k + 1) * chunk).
    for (int64_t k = 0; k < chunks; ++k) {
      for (int64_t j = first[static_cast<size_t>(k)]; j < first[static_cast<size_t>(k) + 1]; ++j) {
        const detail::PackBlock& b = blocks[static_cast<size_t>(j)];
        const int64_t start = offsets[static_cast<size_t>(b.entry)] + b.begin;
        const int64_t end = offsets[static_cast<size_t>(b.entry)] + b.end;
        if (chunk > 0) {
          EXPECT_GE(start, k * chunk) << "chunk " << k;
          EXPECT_LE(end, (k + 1) * chunk) << "chunk " << k;
        }
      }
    }
  }
}

// --- the timeout ---------------------------------------------------------------------------------

TEST(NcclWaitTest, DoneAfterSomePolls) {
  int polls = 0;
  detail::WaitProbes p;
  p.done = [&] { return ++polls >= 100; };
  const detail::WaitResult w = detail::poll_until(p, 5.0);
  EXPECT_EQ(w.outcome, detail::WaitOutcome::kDone);
  EXPECT_EQ(polls, 100);
}

TEST(NcclWaitTest, FailureIsReportedAtOnce) {
  int polls = 0;
  detail::WaitProbes p;
  p.done = [&] { return false; };
  p.failed = [&] { return ++polls >= 3 ? std::string("remote error") : std::string(); };
  const detail::WaitResult w = detail::poll_until(p, 0);  // no deadline: only the failure ends it
  EXPECT_EQ(w.outcome, detail::WaitOutcome::kFailed);
  EXPECT_EQ(w.error, "remote error");
}

TEST(NcclWaitTest, TimesOutAfterTheDeadline) {
  detail::WaitProbes p;
  p.done = [] { return false; };
  const auto t0 = std::chrono::steady_clock::now();
  const detail::WaitResult w = detail::poll_until(p, 0.2);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(w.outcome, detail::WaitOutcome::kTimedOut);
  EXPECT_GE(elapsed, 0.2);
  EXPECT_LT(elapsed, 2.0);
  EXPECT_GE(w.waited_seconds, 0.2);
}

TEST(NcclWaitTest, TheClockStartsWhenTheOperationStarts) {
  // Queued for 0.3 s behind other work, then running 0.1 s: a 0.25 s deadline is not exceeded.
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  detail::WaitProbes p;
  p.started = [&] { return since() >= 0.3; };
  p.done = [&] { return since() >= 0.4; };
  const detail::WaitResult w = detail::poll_until(p, 0.25);
  EXPECT_EQ(w.outcome, detail::WaitOutcome::kDone);
  EXPECT_LT(w.waited_seconds, 0.25);
  // Never finishing after starting times out, measured from the start.
  p.done = [] { return false; };
  const detail::WaitResult late = detail::poll_until(p, 0.1);
  EXPECT_EQ(late.outcome, detail::WaitOutcome::kTimedOut);
}

TEST(NcclWaitTest, AWaitThatMovesTheOperationYieldsInsteadOfSleeping) {
  // Note [Waits that move the operation]: an MPI transfer advances only inside the polls, so
  // those are not spaced by sleeps during the first second: a wait of 100 ms past the initial
  // spin yields between its polls and never sleeps; any other wait sleeps and never yields.
  auto wait_100_ms = [](bool moved_by_polls) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    detail::WaitProbes p;
    p.done = [&] { return Clock::now() - t0 >= std::chrono::milliseconds(100); };
    p.moved_by_polls = moved_by_polls;
    const detail::WaitResult w = detail::poll_until(p, 30.0);
    EXPECT_EQ(w.outcome, detail::WaitOutcome::kDone);
    return w;
  };
  const detail::WaitResult moved = wait_100_ms(true);
  EXPECT_GT(moved.yields, 0);
  EXPECT_EQ(moved.sleeps, 0);
  const detail::WaitResult other = wait_100_ms(false);
  EXPECT_EQ(other.yields, 0);
  EXPECT_GT(other.sleeps, 0);
}

TEST(NcclTest, PipelinedReductionWithATimeout) {
  // Every chunk is waited for on the host, each with its own deadline.
  KUSARI_REQUIRE_GPUS();
  CommunicatorOptions o;
  o.timeout_seconds = 30;
  auto comm = make_comm("pure_nccl", 0, o, kSmallChunks);
  auto flat = create_communicator("flat");
  Uneven gpu_model, cpu_model;
  check_against_flat(*comm, *flat, gpu_model, cpu_model, false, 1e-6);
  EXPECT_GE(gradient_chunks(*comm), 30);
}

TEST(NcclTest, AllreduceInPieces) {
  // The benchmark's reference for the pipeline: a sum in back-to-back pieces.
  KUSARI_REQUIRE_GPUS();
  auto comm = cached_comm("pure_nccl", 0);
  const int r = comm->rank(), s = comm->size();
  Array base = Array::arange(0.0, 1000.0, 1.0, float32);
  Array x = (base + static_cast<double>(r)).to_device(my_gpu());
  allreduce_in_pieces(*comm, x, 7);
  EXPECT_TRUE(
      ArraysClose(x.to_device(Device::cpu()), base * static_cast<double>(s) + s * (s - 1) / 2.0));
  auto flat = create_communicator("flat");
  EXPECT_THROW(allreduce_in_pieces(*flat, x, 2), CommunicatorError);
}

TEST(NcclTest, TimeoutAbortsAndNamesTheOperation) {
  KUSARI_REQUIRE_GPUS();
  CommunicatorOptions o;
  o.timeout_seconds = 2;
  auto comm = create_communicator("pure_nccl", o);
  const int r = comm->rank();
  Array x = Array::ones({1024}, float32, my_gpu());
  comm->allreduce_inplace(x);  // every rank: sets NCCL up and connects
  EXPECT_TRUE(ArraysClose(x.to_device(Device::cpu()), Array::full({1024}, comm->size(), float32)));
  if (r == 0) {
    // The other ranks never join this one: it must fail after about 2 s, not hang.
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm->allreduce_inplace(x);
      ADD_FAILURE() << "expected CommunicatorError";
    } catch (const CommunicatorError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("allreduce"), std::string::npos) << what;
      EXPECT_NE(what.find("timeout"), std::string::npos) << what;
      EXPECT_NE(what.find("aborted"), std::string::npos) << what;
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(elapsed, 30.0);
    // The communicator refuses further NCCL work, naming the first failure.
    EXPECT_TRUE(ThrowsWith<CommunicatorError>([&] { comm->allreduce_inplace(x); }, {"aborted"}));
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(5));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  comm.reset();  // rank 0's is aborted; the others finalize theirs within the deadline
  MPI_Barrier(MPI_COMM_WORLD);
  // A new communicator works.
  auto fresh = create_communicator("pure_nccl");
  Array y = Array::ones({8}, float32, my_gpu());
  fresh->allreduce_inplace(y);
  EXPECT_TRUE(ArraysClose(y.to_device(Device::cpu()), Array::full({8}, fresh->size(), float32)));
}

}  // namespace
}  // namespace kusari::mn
