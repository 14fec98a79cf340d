// Multi-tensor optimizer updates (Note [Grouped optimizer updates]): for every built-in
// optimizer, steps taken in groups through kusari::update_parameters give the same bits as steps
// taken one parameter at a time, in few routine calls; the routine itself against
// update_parameter; on a GPU, CPU/CUDA parity and an update captured in a CUDA graph.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kusari/core/cuda.h"
#include "kusari/optimizers/adagrad.h"
#include "kusari/optimizers/adam.h"
#include "kusari/optimizers/hooks.h"
#include "kusari/optimizers/rmsprop.h"
#include "kusari/optimizers/sgd.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace O = optimizers;

struct ParamSpec {
  Shape shape;
  Dtype dtype;
};

// Odd sizes, a size of one, and sizes above one chunk (4096 elements) of the multi-tensor
// kernels, in float32 with a float64 and a bfloat16 parameter between them.
std::vector<ParamSpec> mixed_specs() {
  return {{{7, 5}, float32}, {{3}, float32},    {{4097}, float32}, {{2, 3, 5, 5}, float64},
          {{1}, float32},    {{9001}, float32}, {{33}, bfloat16},  {{65, 130}, float32},
          {{5, 5}, float64}, {{4096}, bfloat16}};
}

std::vector<ParamSpec> float32_specs() {
  return {{{7, 5}, float32}, {{3}, float32},    {{4097}, float32},
          {{1}, float32},    {{9001}, float32}, {{65, 130}, float32}};
}

/// A link with one parameter per spec, "p00", "p01", ..., drawn from a normal distribution.
class Params : public Link {
 public:
  Params(const std::vector<ParamSpec>& specs, Device device) {
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::string name = std::string("p") + (i < 10 ? "0" : "") + std::to_string(i);
      params.push_back(add_param(
          name, Parameter(Array::normal(specs[i].shape, 0.0, 1.0, specs[i].dtype, device))));
    }
  }
  /// A link with the same parameters' values (copies) on `device`.
  std::shared_ptr<Params> clone(Device device) const {
    auto other = std::make_shared<Params>(std::vector<ParamSpec>{}, device);
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string name = std::string("p") + (i < 10 ? "0" : "") + std::to_string(i);
      other->params.push_back(
          other->add_param(name, Parameter(params[i].data().to_device(device).copy())));
    }
    return other;
  }
  std::vector<Parameter> params;
};

struct OptimizerCase {
  std::string name;
  std::function<std::unique_ptr<Optimizer>()> make;
};

std::vector<OptimizerCase> optimizer_cases() {
  return {
      {"SGD", [] { return std::make_unique<O::SGD>(0.1); }},
      {"MomentumSGD", [] { return std::make_unique<O::MomentumSGD>(0.05, 0.9); }},
      {"NesterovAG", [] { return std::make_unique<O::NesterovAG>(0.05, 0.8); }},
      {"Adam", [] { return std::make_unique<O::Adam>(0.01); }},
      {"AdamW", [] { return std::make_unique<O::AdamW>(0.01, 0.9, 0.999, 1e-8, 0.5, 0.01); }},
      {"AdamAmsgrad",
       [] { return std::make_unique<O::Adam>(O::AdamOptions{.alpha = 0.01, .amsgrad = true}); }},
      {"RMSprop", [] { return std::make_unique<O::RMSprop>(0.01); }},
      {"RMSpropEpsInsideSqrt", [] { return std::make_unique<O::RMSprop>(0.01, 0.9, 1e-6, true); }},
      {"AdaGrad", [] { return std::make_unique<O::AdaGrad>(0.05); }},
  };
}

/// Success when a and b have the same dtype, shape and bytes.
::testing::AssertionResult SameBits(const Array& a, const Array& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    return ::testing::AssertionFailure() << dtype_name(a.dtype()) << " " << a.shape() << " vs "
                                         << dtype_name(b.dtype()) << " " << b.shape();
  }
  const Array x = a.to_device(Device::cpu()).contiguous();
  const Array y = b.to_device(Device::cpu()).contiguous();
  if (std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.nbytes())) != 0) {
    return ::testing::AssertionFailure() << "the bytes differ: " << x << " vs " << y;
  }
  return ::testing::AssertionSuccess();
}

/// Expects the parameters and every state array of `a` and `b` to be the same bits.
void expect_same_params_and_states(Optimizer& a, Optimizer& b, const std::string& what) {
  auto& sa = a.param_states();
  auto& sb = b.param_states();
  ASSERT_EQ(sa.size(), sb.size()) << what;
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_TRUE(SameBits(sa[i].param.data(), sb[i].param.data()))
        << what << ": parameter " << sa[i].path;
    EXPECT_EQ(sa[i].t, sb[i].t) << what << ": " << sa[i].path;
    ASSERT_EQ(sa[i].arrays.size(), sb[i].arrays.size()) << what << ": " << sa[i].path;
    for (size_t k = 0; k < sa[i].arrays.size(); ++k) {
      EXPECT_EQ(sa[i].arrays[k].first, sb[i].arrays[k].first);
      EXPECT_TRUE(SameBits(sa[i].arrays[k].second, sb[i].arrays[k].second))
          << what << ": state " << sa[i].path << "/" << sa[i].arrays[k].first;
    }
  }
}

/// Gives both links the same random gradients (in their parameters' dtypes; `skip` leaves that
/// parameter without one).
void set_same_grads(Params& a, Params& b, int skip = -1) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    if (static_cast<int>(i) == skip) {
      a.params[i].cleargrad();
      b.params[i].cleargrad();
      continue;
    }
    const Array& d = a.params[i].data();
    const Array g = Array::normal(d.shape(), 0.0, 1.0, d.dtype(), d.device());
    a.params[i].set_grad(g.copy());
    b.params[i].set_grad(g.to_device(b.params[i].data().device()).copy());
  }
}

class MultiTensorUpdateTest : public testing::DeviceTest {};

TEST_P(MultiTensorUpdateTest, EveryOptimizerMatchesPerParameterStepsBitForBit) {
  for (const OptimizerCase& c : optimizer_cases()) {
    auto grouped_link = std::make_shared<Params>(mixed_specs(), device());
    auto single_link = grouped_link->clone(device());
    std::unique_ptr<Optimizer> grouped = c.make();
    std::unique_ptr<Optimizer> single = c.make();
    grouped->setup(grouped_link);
    single->setup(single_link);
    EXPECT_TRUE(grouped->multi_tensor_update()) << "multi-tensor updates are on by default";
    single->use_multi_tensor_update(false);
    for (int step = 0; step < 4; ++step) {
      set_same_grads(*grouped_link, *single_link);
      grouped->update();
      single->update();
      // float32, float64 and bfloat16: three groups; per parameter: one call each.
      EXPECT_EQ(grouped->last_update_calls(), 3) << c.name << " step " << step;
      EXPECT_EQ(single->last_update_calls(), static_cast<int64_t>(mixed_specs().size())) << c.name;
    }
    expect_same_params_and_states(*grouped, *single, c.name);
  }
}

TEST_P(MultiTensorUpdateTest, OneGroupTakesOneCallPerStep) {
  for (const OptimizerCase& c : optimizer_cases()) {
    auto link = std::make_shared<Params>(float32_specs(), device());
    auto other = link->clone(device());
    std::unique_ptr<Optimizer> opt = c.make();
    opt->setup(link);
    for (int step = 0; step < 2; ++step) {
      set_same_grads(*link, *other);
      opt->update();
      EXPECT_EQ(opt->last_update_calls(), 1) << c.name << " step " << step;
    }
  }
}

TEST_P(MultiTensorUpdateTest, HooksApplyAsBeforeTheGroupedSteps) {
  for (const OptimizerCase& c : optimizer_cases()) {
    auto grouped_link = std::make_shared<Params>(mixed_specs(), device());
    auto single_link = grouped_link->clone(device());
    std::unique_ptr<Optimizer> grouped = c.make();
    std::unique_ptr<Optimizer> single = c.make();
    for (Optimizer* opt : {grouped.get(), single.get()}) {
      opt->setup(opt == grouped.get() ? grouped_link : single_link);
      opt->add_hook(std::make_shared<O::WeightDecay>(1e-3));
      opt->add_hook(std::make_shared<O::Lasso>(1e-4));
      opt->add_hook(std::make_shared<O::GradientClipping>(2.0));
      opt->add_hook(std::make_shared<O::GradientHardClipping>(-0.05, 0.05));
    }
    single->use_multi_tensor_update(false);
    for (int step = 0; step < 3; ++step) {
      set_same_grads(*grouped_link, *single_link);
      grouped->update();
      single->update();
      EXPECT_EQ(grouped->last_update_calls(), 3) << c.name;
    }
    expect_same_params_and_states(*grouped, *single, c.name + " with hooks");
  }
}

TEST_P(MultiTensorUpdateTest, ParametersWithDifferentStepCountsFormSeparateGroups) {
  // A parameter without a gradient in one step falls behind in its step count; Adam's alpha_t
  // then differs, so it is stepped in a group of its own and still matches.
  for (const OptimizerCase& c : optimizer_cases()) {
    auto grouped_link = std::make_shared<Params>(float32_specs(), device());
    auto single_link = grouped_link->clone(device());
    std::unique_ptr<Optimizer> grouped = c.make();
    std::unique_ptr<Optimizer> single = c.make();
    grouped->setup(grouped_link);
    single->setup(single_link);
    single->use_multi_tensor_update(false);
    set_same_grads(*grouped_link, *single_link, /*skip=*/2);
    grouped->update();
    single->update();
    EXPECT_EQ(grouped->last_update_calls(), 1);
    EXPECT_EQ(single->last_update_calls(), static_cast<int64_t>(float32_specs().size()) - 1);
    for (int step = 0; step < 2; ++step) {
      set_same_grads(*grouped_link, *single_link);
      grouped->update();
      single->update();
      const bool by_t = c.name.rfind("Adam", 0) == 0;
      EXPECT_EQ(grouped->last_update_calls(), by_t ? 2 : 1) << c.name;
    }
    expect_same_params_and_states(*grouped, *single, c.name);
  }
}

TEST_P(MultiTensorUpdateTest, Float32MasterWeightsMatchPerParameterSteps) {
  const std::vector<ParamSpec> specs{
      {{7, 5}, float16}, {{4097}, float16}, {{3}, bfloat16}, {{9}, float32}};
  for (const OptimizerCase& c : optimizer_cases()) {
    auto grouped_link = std::make_shared<Params>(specs, device());
    auto single_link = grouped_link->clone(device());
    std::unique_ptr<Optimizer> grouped = c.make();
    std::unique_ptr<Optimizer> single = c.make();
    grouped->setup(grouped_link);
    single->setup(single_link);
    grouped->use_fp32_update();
    single->use_fp32_update();
    single->use_multi_tensor_update(false);
    for (int step = 0; step < 3; ++step) {
      set_same_grads(*grouped_link, *single_link);
      grouped->update();
      single->update();
      // Every step runs on float32 (master copies and the float32 parameter): one group.
      EXPECT_EQ(grouped->last_update_calls(), 1) << c.name;
    }
    expect_same_params_and_states(*grouped, *single, c.name + " with master weights");
    for (const Parameter& p : grouped_link->params) EXPECT_EQ(p.grad().dtype(), p.dtype());
  }
}

TEST_P(MultiTensorUpdateTest, DynamicLossScalingSkipsAGroupedStepLikeASingleOne) {
  for (const OptimizerCase& c : optimizer_cases()) {
    const std::vector<ParamSpec> specs{{{5}, float16}, {{4100}, float16}};
    auto grouped_link = std::make_shared<Params>(specs, device());
    auto single_link = grouped_link->clone(device());
    std::unique_ptr<Optimizer> grouped = c.make();
    std::unique_ptr<Optimizer> single = c.make();
    grouped->setup(grouped_link);
    single->setup(single_link);
    single->use_multi_tensor_update(false);
    for (Optimizer* opt : {grouped.get(), single.get()}) opt->loss_scaling(1000, std::nullopt);
    for (int step = 0; step < 3; ++step) {
      set_same_grads(*grouped_link, *single_link);
      if (step == 1) {
        // An overflow in the second parameter: the whole step is skipped on the device.
        Array inf = Array::full({4100}, std::numeric_limits<double>::infinity(), float16, device());
        grouped_link->params[1].set_grad(inf.copy());
        single_link->params[1].set_grad(inf.copy());
      }
      grouped->update();
      single->update();
    }
    EXPECT_EQ(grouped->t(), 2) << c.name;
    EXPECT_DOUBLE_EQ(grouped->loss_scale(), single->loss_scale()) << c.name;
    expect_same_params_and_states(*grouped, *single, c.name + " with a skipped step");
  }
}

TEST_P(MultiTensorUpdateTest, RoutineMatchesUpdateParameterForEveryRule) {
  struct Rule {
    UpdateRule rule;
    std::vector<double> hyper;
    int n_state;
  };
  const std::vector<Rule> rules{
      {UpdateRule::kSgd, {0.1}, 0},
      {UpdateRule::kMomentumSgd, {0.1, 0.9}, 1},
      {UpdateRule::kNesterov, {0.1, 0.9}, 1},
      {UpdateRule::kAdam, {0.01, 0.9, 0.999, 1e-8, 1.0, 0.01, 0.0}, 2},
      {UpdateRule::kAdam, {0.01, 0.9, 0.999, 1e-8, 1.0, 0.0, 1.0}, 3},
      {UpdateRule::kRmsprop, {0.01, 0.99, 1e-8, 0.0}, 1},
      {UpdateRule::kRmsprop, {0.01, 0.99, 1e-8, 1.0}, 1},
      {UpdateRule::kAdaGrad, {0.01, 1e-8}, 1},
      {UpdateRule::kRmspropWarmup, {0.05, 0.002, 0.9, 0.99, 1e-8}, 2},
  };
  const std::vector<Shape> shapes{{3}, {4097}, {2, 4, 3, 3}, {1}, {8193}};
  for (Dtype dtype : {float16, bfloat16, float32, float64}) {
    for (const Rule& r : rules) {
      std::vector<Array> pa, pb, grads;
      std::vector<std::vector<Array>> sa, sb;
      for (const Shape& shape : shapes) {
        pa.push_back(Array::normal(shape, 0.0, 1.0, dtype, device()));
        pb.push_back(pa.back().copy());
        grads.push_back(Array::normal(shape, 0.0, 1.0, dtype, device()));
        sa.emplace_back();
        sb.emplace_back();
        for (int k = 0; k < r.n_state; ++k) {
          // (states must stay non-negative where they are second moments)
          sa.back().push_back(Array::uniform(shape, 0.0, 1.0, dtype, device()));
          sb.back().push_back(sa.back().back().copy());
        }
      }
      for (int step = 0; step < 2; ++step) {
        std::vector<Array*> params;
        std::vector<std::vector<Array*>> states;
        for (size_t i = 0; i < shapes.size(); ++i) {
          std::vector<Array*> single_state, grouped_state;
          for (Array& s : sa[i]) single_state.push_back(&s);
          for (Array& s : sb[i]) grouped_state.push_back(&s);
          update_parameter(r.rule, pa[i], grads[i], single_state, r.hyper);
          params.push_back(&pb[i]);
          states.push_back(grouped_state);
        }
        update_parameters(r.rule, params, grads, states, r.hyper);
      }
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_TRUE(SameBits(pa[i], pb[i]))
            << update_rule_name(r.rule) << " " << dtype_name(dtype) << " " << shapes[i];
        for (int k = 0; k < r.n_state; ++k) EXPECT_TRUE(SameBits(sa[i][k], sb[i][k]));
      }
    }
  }
}

TEST_P(MultiTensorUpdateTest, RoutineRefusesMixedTensorsNamingTheTensor) {
  Array p0 = Array::zeros({3}, float32, device());
  Array p1 = Array::zeros({3}, float64, device());
  Array g0 = Array::ones({3}, float32, device());
  Array g1 = Array::ones({3}, float64, device());
  EXPECT_TRUE(testing::ThrowsWith<DtypeError>(
      [&] {
        update_parameters(UpdateRule::kSgd, {&p0, &p1}, {g0, g1}, {{}, {}}, {0.1});
      },
      {"update_parameters (SGD), tensor 1", "float64", "float32"}));
  Array g_short = Array::ones({2}, float32, device());
  EXPECT_TRUE(testing::ThrowsWith<ShapeError>(
      [&] {
        update_parameters(UpdateRule::kSgd, {&p0, &p0}, {g0, g_short}, {{}, {}}, {0.1});
      },
      {"tensor 1", "gradient has shape"}));
  EXPECT_TRUE(testing::ThrowsWith<ValueError>(
      [&] {
        update_parameters(UpdateRule::kSgd, {&p0}, {g0, g0}, {{}}, {0.1});
      },
      {"update_parameters (SGD)", "1 parameters, 2 gradients"}));
  Array v0 = Array::zeros({3}, float32, device());
  EXPECT_TRUE(testing::ThrowsWith<ValueError>(
      [&] {
        update_parameters(UpdateRule::kMomentumSgd, {&p0, &p0}, {g0, g0}, {{&v0}, {}}, {0.1, 0.9});
      },
      {"tensor 1", "expected 1 state arrays like tensor 0, got 0"}));
  // Nothing was written by the refused calls.
  EXPECT_EQ(p0.to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

INSTANTIATE_TEST_SUITE_P(Devices, MultiTensorUpdateTest,
                         ::testing::ValuesIn(testing::test_devices()), testing::device_name);

TEST(MultiTensorUpdateGpuTest, CudaMatchesCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device is available on this machine";
  const Device gpu = Device::cuda(0);
  for (const OptimizerCase& c : optimizer_cases()) {
    auto cpu_link = std::make_shared<Params>(mixed_specs(), Device::cpu());
    auto gpu_link = cpu_link->clone(gpu);
    std::unique_ptr<Optimizer> on_cpu = c.make();
    std::unique_ptr<Optimizer> on_gpu = c.make();
    on_cpu->setup(cpu_link);
    on_gpu->setup(gpu_link);
    for (int step = 0; step < 3; ++step) {
      set_same_grads(*cpu_link, *gpu_link);
      on_cpu->update();
      on_gpu->update();
      EXPECT_EQ(on_gpu->last_update_calls(), 3) << c.name;
    }
    auto& sc = on_cpu->param_states();
    auto& sg = on_gpu->param_states();
    ASSERT_EQ(sc.size(), sg.size());
    for (size_t i = 0; i < sc.size(); ++i) {
      // The GPU contracts multiply-adds: close, not the same bits; 16-bit values within a few ulps.
      const Dtype dtype = sc[i].param.dtype();
      const double tol = dtype == bfloat16 ? 2e-2 : dtype == float32 ? 1e-5 : 1e-12;
      const Array want = sc[i].param.data().astype(float64);
      const Array got = sg[i].param.data().to_device(Device::cpu()).astype(float64);
      EXPECT_TRUE(allclose(got, want, tol, tol))
          << c.name << " " << sc[i].path << ": " << got << " vs " << want;
    }
  }
}

TEST(MultiTensorUpdateGpuTest, UpdateCapturedInACudaGraphReplaysTheEagerResult) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device is available on this machine";
  const Device gpu = Device::cuda(0);
  for (const char* name : {"MomentumSGD", "Adam"}) {
    OptimizerCase c;
    for (const OptimizerCase& o : optimizer_cases()) {
      if (o.name == name) c = o;
    }
    auto eager_link = std::make_shared<Params>(float32_specs(), gpu);
    auto graph_link = eager_link->clone(gpu);
    std::unique_ptr<Optimizer> eager = c.make();
    std::unique_ptr<Optimizer> graphed = c.make();
    eager->setup(eager_link);
    graphed->setup(graph_link);
    // A first eager step on both makes the states (allocation does not belong in the graph).
    set_same_grads(*eager_link, *graph_link);
    eager->update();
    graphed->update();
    // The gradients stay in place; the captured update reads them at every replay.
    set_same_grads(*eager_link, *graph_link);
    cuda::Graph graph;
    graph.capture(gpu, [&] { graphed->update(); });
    EXPECT_EQ(graphed->last_update_calls(), 1);
    EXPECT_GE(graph.num_nodes(), 1);
    graph.replay();
    eager->update();
    if (std::string(name) == "MomentumSGD") {
      // Its hyperparameters do not depend on t: a second replay is the second eager step.
      graph.replay();
      eager->update();
    }
    gpu.synchronize();
    auto& se = eager->param_states();
    auto& sg = graphed->param_states();
    for (size_t i = 0; i < se.size(); ++i) {
      EXPECT_TRUE(SameBits(se[i].param.data(), sg[i].param.data())) << name << " " << se[i].path;
      for (size_t k = 0; k < se[i].arrays.size(); ++k) {
        EXPECT_TRUE(SameBits(se[i].arrays[k].second, sg[i].arrays[k].second))
            << name << " " << se[i].path;
      }
    }
  }
}

}  // namespace
}  // namespace kusari
