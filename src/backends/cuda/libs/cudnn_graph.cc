// cuDNN's graph API for convolutions: see cudnn_graph.h.
//
// Note [cuDNN graph API convolutions]
// cuDNN 9 has two ways in. The legacy API (cudnnConvolutionForward and its algorithm enums)
// reaches a fixed set of older kernels: on Hopper its NHWC choices include implicit_convolve_sgemm
// and wgrad_alg0_engine, which a profile of a ResNet-50 step found to take a quarter of the
// GPU time that PyTorch (which goes through the graph API) spends in sm90 implicit-GEMM kernels.
// The graph API describes the convolution as a one-node operation graph of tensors (dims,
// strides, dtype, a unique id, the pointer's alignment) and asks the engine heuristics
// (CUDNN_HEUR_MODE_A) for engine configurations, best first; each is finalized into an execution
// plan, which is what runs: cudnnBackendExecute with a variant pack that maps the ids to the
// call's pointers and gives the workspace.
//   - Filters, from the engines' numerical and behaviour notes: for float32 without TF32, no
//     engine noted TENSOR_CORE; never one noted DOWN_CONVERT_INPUTS (it would round float32
//     inputs to 16 bits, or 16-bit ones further); with KUSARI_CUDNN_DETERMINISTIC=1 none noted
//     NONDETERMINISTIC; and no engine that compiles kernels at run time (its first call can take
//     seconds and needs NVRTC at run time).
//   - A candidate whose plan does not finalize (the heuristics list engines that may not support
//     the exact problem) or that needs more than the workspace limit is skipped.
//   - The pointers' alignments are part of the problem (and of the caller's cache key): a plan
//     finalized for 16-byte aligned tensors may use vector loads that a view at an odd offset
//     would break.
// The caller (cudnn_conv.cc) keeps one chosen plan per problem, times the candidates when asked
// to (KUSARI_CUDNN_BENCHMARK=1), and falls back to the legacy API when the graph API offers no
// plan (float64 in NHWC, some exotic geometries), so every convolution still runs.
#include "backends/cuda/libs/cudnn_graph.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "backends/cuda/runtime/cuda_backend.h"
#include "kusari/core/error.h"

namespace kusari::cuda::cudnn_graph {

using ::kusari::detail::concat;

namespace {

void check(cudnnStatus_t status, const std::string& what) {
  if (status != CUDNN_STATUS_SUCCESS) check_cudnn(status, what.c_str(), __FILE__, __LINE__);
}

Descriptor make_tensor(int64_t uid, const std::vector<int64_t>& dims,
                       const std::vector<int64_t>& strides, cudnnDataType_t type, int64_t alignment,
                       bool is_virtual, bool by_value) {
  KUSARI_CHECK(dims.size() == strides.size() && !dims.empty(), DeviceError, "cuDNN graph: tensor ",
               uid, " has ", dims.size(), " dims and ", strides.size(), " strides");
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type)
      .set_int64s(CUDNN_ATTR_TENSOR_DIMENSIONS, dims.data(), static_cast<int64_t>(dims.size()))
      .set_int64s(CUDNN_ATTR_TENSOR_STRIDES, strides.data(), static_cast<int64_t>(strides.size()))
      .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid)
      .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, alignment);
  if (is_virtual) {
    const bool yes = true;
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  if (by_value) {
    const bool yes = true;
    t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  t.finalize(concat("the tensor descriptor of id ", uid).c_str());
  return t;
}

Descriptor tensor(const TensorSpec& spec, int64_t uid, cudnnDataType_t type) {
  return make_tensor(uid, {spec.dims.begin(), spec.dims.end()},
                     {spec.strides.begin(), spec.strides.end()}, type, spec.alignment, false,
                     false);
}

/// What a plan keeps alive of the graph it came from.
struct Keep {
  std::shared_ptr<std::map<int64_t, Descriptor>> tensors;
  std::shared_ptr<std::vector<Descriptor>> params;
  std::shared_ptr<std::vector<Descriptor>> ops;
};

// The unique ids of the three tensors in every variant pack.
constexpr int64_t kUidX = 'x', kUidW = 'w', kUidY = 'y';

Descriptor convolution(const ConvProblem& p) {
  Descriptor c(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const int64_t spatial = 2;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  c.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &p.compute_type)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, spatial)
      .set_int64s(CUDNN_ATTR_CONVOLUTION_DILATIONS, p.dilation.data(), 2)
      .set_int64s(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, p.stride.data(), 2)
      .set_int64s(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, p.pad.data(), 2)
      .set_int64s(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, p.pad.data(), 2);
  c.finalize("the convolution descriptor");
  return c;
}

/// The one operation of the graph; alpha = 1 and beta = 0 (1 to accumulate) in the compute
/// type's precision.
Descriptor operation(const ConvProblem& p, const Descriptor& x, const Descriptor& w,
                     const Descriptor& y, const Descriptor& conv) {
  struct Names {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  Names n{};
  switch (p.direction) {
    case ConvDirection::kForward:
      n = {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
      break;
    case ConvDirection::kBackwardData:
      n = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
      break;
    case ConvDirection::kBackwardFilter:
      n = {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
           CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
      break;
  }
  Descriptor op(n.type);
  op.set_descriptor(n.x, x).set_descriptor(n.w, w).set_descriptor(n.y, y).set_descriptor(n.conv,
                                                                                         conv);
  if (p.compute_type == CUDNN_DATA_DOUBLE) {
    const double one = 1.0, beta = p.accumulate ? 1.0 : 0.0;
    op.set(n.alpha, CUDNN_TYPE_DOUBLE, 1, &one).set(n.beta, CUDNN_TYPE_DOUBLE, 1, &beta);
  } else {
    const float one = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
    op.set(n.alpha, CUDNN_TYPE_FLOAT, 1, &one).set(n.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  }
  op.finalize("the convolution operation");
  return op;
}

template <typename Note>
std::vector<Note> notes(const Descriptor& engine, cudnnBackendAttributeName_t name,
                        cudnnBackendAttributeType_t type, int64_t max_count) {
  std::vector<Note> out(static_cast<size_t>(max_count));
  int64_t count = 0;
  if (cudnnBackendGetAttribute(engine.get(), name, type, max_count, &count, out.data()) !=
      CUDNN_STATUS_SUCCESS) {
    return {};
  }
  out.resize(static_cast<size_t>(std::clamp<int64_t>(count, 0, max_count)));
  return out;
}

/// Why an engine may not be used under `filter` (empty: it may), from its notes.
std::string rejection(const Descriptor& engine, const EngineFilter& filter,
                      std::string* description) {
  const auto numerical = notes<cudnnBackendNumericalNote_t>(
      engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
      CUDNN_NUMERICAL_NOTE_TYPE_COUNT);
  const auto behaviour = notes<cudnnBackendBehaviorNote_t>(
      engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
      CUDNN_BEHAVIOR_NOTE_TYPE_COUNT);
  const auto has = [](const auto& list, auto note) {
    return std::find(list.begin(), list.end(), note) != list.end();
  };
  int64_t index = -1, count = 0;
  cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                           &count, &index);
  *description = concat("engine ", index, has(numerical, CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
                                              ? " (tensor cores)"
                                              : "");
  if (!filter.allow_down_convert && has(numerical, CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) {
    return "rounds its inputs down";
  }
  if (filter.forbid_tf32 && has(numerical, CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) {
    return "uses TF32 tensor cores";
  }
  if (filter.deterministic && has(numerical, CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC)) {
    return "is not deterministic";
  }
  if (!filter.allow_runtime_compilation &&
      has(behaviour, CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)) {
    return "compiles at run time";
  }
  return "";
}

/// The engine configurations of heuristics mode `mode` for `graph` (empty when it has none).
std::vector<Descriptor> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_descriptor(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
      .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
  int64_t available = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      available <= 0) {
    return {};
  }
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < available; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                               CUDNN_TYPE_BACKEND_DESCRIPTOR, available, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS) {
    return {};
  }
  configs.erase(configs.begin() + std::clamp<int64_t>(got, 0, available), configs.end());
  return configs;
}

/// The plans of a finalized graph (Note [cuDNN graph API convolutions]): heuristics mode A's
/// engine configurations, or the fallback list's when A gives none usable, that pass `filter`,
/// finalize and fit `max_workspace`; at most `max_plans`.
std::vector<std::shared_ptr<const Plan>> finalize_plans(
    cudnnHandle_t handle, const Descriptor& graph, const EngineFilter& filter,
    int64_t max_workspace, int max_plans, const std::vector<int64_t>& uids,
    const std::shared_ptr<const void>& keep, std::string* why = nullptr) {
  std::vector<std::shared_ptr<const Plan>> plans;
  std::string refusals;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    for (Descriptor& config : engine_configs(graph, mode)) {
      if (static_cast<int>(plans.size()) >= max_plans) return plans;
      Descriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
      cudnnBackendDescriptor_t raw_engine = engine.get();
      int64_t got = 0;
      if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got,
                                   &raw_engine) != CUDNN_STATUS_SUCCESS) {
        continue;
      }
      std::string description;
      const std::string rejected = rejection(engine, filter, &description);
      if (!rejected.empty()) {
        refusals += concat("; ", description, " ", rejected);
        continue;
      }
      Descriptor plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
          .set_descriptor(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      if (const cudnnStatus_t st = plan.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
        refusals += concat("; ", description, " does not finalize (", cudnnGetErrorString(st), ")");
        continue;
      }
      int64_t workspace = 0;
      if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                   CUDNN_TYPE_INT64, 1, &got, &workspace) != CUDNN_STATUS_SUCCESS ||
          workspace < 0 || workspace > max_workspace) {
        refusals += concat("; ", description, " needs ", workspace, " bytes of workspace");
        continue;
      }
      plans.push_back(
          std::make_shared<const Plan>(std::move(plan), workspace, description, uids, keep));
    }
    // The fallback list is asked for only when the heuristics proposed nothing usable.
    if (!plans.empty()) break;
  }
  if (plans.empty() && why) {
    *why = refusals.empty() ? std::string("cuDNN's heuristics propose no engine")
                            : concat("no engine is usable", refusals);
  }
  return plans;
}

}  // namespace

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  check(cudnnBackendCreateDescriptor(type, &d_),
        concat("cudnnBackendCreateDescriptor(type ", static_cast<int>(type), ")"));
}

Descriptor::~Descriptor() {
  // Destroying a descriptor frees host memory only; a failure cannot be reported from here.
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

Descriptor& Descriptor::operator=(Descriptor&& other) noexcept {
  if (this != &other) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = other.d_;
    other.d_ = nullptr;
  }
  return *this;
}

Descriptor& Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                            int64_t count, const void* values) {
  check(cudnnBackendSetAttribute(d_, name, type, count, values),
        concat("cudnnBackendSetAttribute(attribute ", static_cast<int>(name), ")"));
  return *this;
}

Descriptor& Descriptor::set_int64(cudnnBackendAttributeName_t name, int64_t value) {
  return set(name, CUDNN_TYPE_INT64, 1, &value);
}

Descriptor& Descriptor::set_int64s(cudnnBackendAttributeName_t name, const int64_t* values,
                                   int64_t count) {
  return set(name, CUDNN_TYPE_INT64, count, values);
}

Descriptor& Descriptor::set_descriptor(cudnnBackendAttributeName_t name,
                                       const Descriptor& value) {
  cudnnBackendDescriptor_t raw = value.get();
  return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &raw);
}

void Descriptor::finalize(const char* what) {
  check(cudnnBackendFinalize(d_), concat("cudnnBackendFinalize(", what, ")"));
}

cudnnStatus_t Descriptor::try_finalize() { return cudnnBackendFinalize(d_); }

int64_t alignment(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  if (address == 0) return 16;
  return std::min<int64_t>(16, int64_t{1} << std::countr_zero(address));
}

bool deterministic_mode() {
  static const bool on = [] {
    const char* v = std::getenv("KUSARI_CUDNN_DETERMINISTIC");
    return v != nullptr && std::string_view(v) == "1";
  }();
  return on;
}

Plan::Plan(Descriptor plan, int64_t workspace, std::string engine, std::vector<int64_t> uids,
           std::shared_ptr<const void> keepalive)
    : plan_(std::move(plan)),
      workspace_(workspace),
      engine_(std::move(engine)),
      uids_(std::move(uids)),
      keepalive_(std::move(keepalive)) {
  std::sort(uids_.begin(), uids_.end());
}

void Plan::execute(cudnnHandle_t handle, const int64_t* uids, void* const* pointers, int64_t count,
                   void* workspace, const char* what) const {
  const std::string mismatch = variant_pack_mismatch(uids_, uids, count);
  KUSARI_CHECK(mismatch.empty(), DeviceError, "cuDNN graph '", what,
               "': the variant pack does not name the graph's tensors: ", mismatch);
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set_int64s(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids, count)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count, pointers)
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize("a variant pack");
  check(cudnnBackendExecute(handle, plan_.get(), pack.get()),
        concat("cudnnBackendExecute(", what, ", ", engine_, ")"));
}

void ConvPlan::execute(cudnnHandle_t handle, void* x, void* w, void* y, void* workspace) const {
  const int64_t uids[3] = {kUidX, kUidW, kUidY};
  void* const pointers[3] = {x, w, y};
  plan_->execute(handle, uids, pointers, 3, workspace, "convolution");
}

std::vector<std::shared_ptr<const ConvPlan>> conv_plans(cudnnHandle_t handle,
                                                        const ConvProblem& problem,
                                                        int64_t max_workspace, int max_plans) {
  auto keep = std::make_shared<std::vector<Descriptor>>();
  keep->push_back(tensor(problem.x, kUidX, problem.data_type));
  keep->push_back(tensor(problem.w, kUidW, problem.data_type));
  keep->push_back(tensor(problem.y, kUidY, problem.data_type));
  keep->push_back(convolution(problem));
  keep->push_back(operation(problem, (*keep)[0], (*keep)[1], (*keep)[2], (*keep)[3]));
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendDescriptor_t ops[1] = {keep->back().get()};
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops);
  if (graph.try_finalize() != CUDNN_STATUS_SUCCESS) return {};
  EngineFilter filter;
  filter.forbid_tf32 = problem.data_type == CUDNN_DATA_FLOAT && !problem.allow_tf32;
  filter.deterministic = problem.deterministic;
  std::vector<std::shared_ptr<const ConvPlan>> out;
  for (auto& plan : finalize_plans(handle, graph, filter, max_workspace, max_plans,
                                   {kUidX, kUidW, kUidY}, keep)) {
    out.push_back(std::make_shared<const ConvPlan>(std::move(plan)));
  }
  return out;
}

void GraphBuilder::tensor(int64_t uid, const std::vector<int64_t>& dims,
                          const std::vector<int64_t>& strides, cudnnDataType_t type,
                          int64_t alignment) {
  (*tensors_).insert_or_assign(uid, make_tensor(uid, dims, strides, type, alignment, false, false));
  external_.insert(uid);
}

void GraphBuilder::virtual_tensor(int64_t uid, const std::vector<int64_t>& dims,
                                  const std::vector<int64_t>& strides, cudnnDataType_t type) {
  (*tensors_).insert_or_assign(uid, make_tensor(uid, dims, strides, type, 16, true, false));
  external_.erase(uid);
}

void GraphBuilder::scalar(int64_t uid, cudnnDataType_t type) {
  (*tensors_).insert_or_assign(uid,
                               make_tensor(uid, {1, 1, 1, 1}, {1, 1, 1, 1}, type, 16, false, true));
  external_.insert(uid);
}

const Descriptor& GraphBuilder::at(int64_t uid) const {
  auto it = tensors_->find(uid);
  KUSARI_CHECK(it != tensors_->end(), DeviceError, "cuDNN graph: tensor ", uid,
               " is used before it is described");
  return it->second;
}

void GraphBuilder::pointwise(cudnnPointwiseMode_t mode, int64_t y, int64_t x, int64_t b, int64_t t,
                             cudnnDataType_t compute, int64_t axis) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  if (axis >= 0) pw.set_int64(CUDNN_ATTR_POINTWISE_AXIS, axis);
  pw.finalize("a pointwise descriptor");
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
      .set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, at(x))
      .set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, at(y));
  if (b >= 0) op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, at(b));
  if (t >= 0) op.set_descriptor(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, at(t));
  op.finalize("a pointwise operation");
  params_->push_back(std::move(pw));
  ops_->push_back(std::move(op));
}

void GraphBuilder::matmul(int64_t c, int64_t a, int64_t b) {
  Descriptor mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  mm.finalize("a matmul descriptor");
  Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  op.set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_ADESC, at(a))
      .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_BDESC, at(b))
      .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_CDESC, at(c))
      .set_descriptor(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
  op.finalize("a matmul operation");
  params_->push_back(std::move(mm));
  ops_->push_back(std::move(op));
}

void GraphBuilder::reduction(cudnnReduceTensorOp_t reduce, int64_t y, int64_t x) {
  Descriptor red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce)
      .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  red.finalize("a reduction descriptor");
  Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  op.set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red)
      .set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, at(x))
      .set_descriptor(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, at(y));
  op.finalize("a reduction operation");
  params_->push_back(std::move(red));
  ops_->push_back(std::move(op));
}

void GraphBuilder::reshape(int64_t y, int64_t x) {
  Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  op.set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, at(x))
      .set_descriptor(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, at(y));
  op.finalize("a reshape operation");
  ops_->push_back(std::move(op));
}

std::vector<std::shared_ptr<const Plan>> GraphBuilder::plans(cudnnHandle_t handle,
                                                             const EngineFilter& filter,
                                                             int64_t max_workspace, int max_plans,
                                                             std::string* why) {
  std::vector<cudnnBackendDescriptor_t> ops;
  for (const Descriptor& d : *ops_) ops.push_back(d.get());
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
      .set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
           static_cast<int64_t>(ops.size()), ops.data());
  const cudnnStatus_t status = graph.try_finalize();
  if (status != CUDNN_STATUS_SUCCESS) {
    if (why)
      *why = concat("cuDNN does not take the operation graph (", cudnnGetErrorString(status), ")");
    return {};
  }
  auto keep = std::make_shared<Keep>(Keep{tensors_, params_, ops_});
  auto out = finalize_plans(handle, graph, filter, max_workspace, max_plans,
                            {external_.begin(), external_.end()}, keep, why);
  return out;
}

}  // namespace kusari::cuda::cudnn_graph
