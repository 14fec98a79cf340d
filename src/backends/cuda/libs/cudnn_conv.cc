// CUDA kernels: 2-d convolution (forward, gradient of the data, gradient of the filter) through
// cuDNN: its graph API first (cudnn_graph.h, Note [cuDNN graph API convolutions]), its legacy
// convolution API where the graph API has no plan.
//
// Note [cuDNN convolution plans]
// Describing a convolution to cuDNN and choosing its algorithm is slow next to running it, so
// each (direction, dtype, geometry, groups, math mode, layout, pointer alignments) gets a plan
// once: a graph-API execution plan (Note [cuDNN graph API convolutions]), or, when the graph API
// offers none or KUSARI_CUDNN_API=legacy asks for it, the legacy API's tensor, filter and
// convolution descriptors, the algorithm, its math type and its workspace size. Plans live in a
// mutex-protected map per device and are shared (immutable) between threads; like the CPU's
// oneDNN cache the map starts over past kMaxCachedPlans entries.
//   - The plan comes from cuDNN's heuristics (the graph API's first usable engine configuration;
//     cudnnGet*Algorithm_v7 for the legacy API), or, when the environment sets
//     KUSARI_CUDNN_BENCHMARK=1, from timing the candidates on the first call's own buffers (the
//     outputs are fresh arrays, so the trial runs may write them): each graph-API candidate runs
//     once to warm up and twice timed with events on the compute stream (at most
//     kMaxTimedCandidates of them), the legacy API's through cudnnFind*Ex. Timing synchronises
//     the device, so it is refused while a CUDA graph records: run one eager step first.
//   - Candidates whose workspace exceeds kMaxCudnnWorkspaceBytes are skipped; the workspace is the
//     pool's, taken for each call and given back once it is queued (Note [cuDNN workspace]), so
//     it counts in the memory statistics only while a call runs, however large a candidate
//     timed once needed.
//   - KUSARI_CUDNN_DETERMINISTIC=1 keeps only algorithms cuDNN marks deterministic (some
//     gradient algorithms add with atomics).
//   - float32 uses TF32 tensor cores only when allow_tf32_convolution() (the default;
//   CUDNN_DEFAULT_MATH on Ampere and
//     later); otherwise the descriptor says CUDNN_FMA_MATH and only FMA algorithms are taken.
//     float16 and bfloat16 use tensor cores with float32 accumulation; float64 computes in
//     float64. The math mode is part of the key, so switching TF32 at run time gets new plans.
// The layout (Note [Memory formats]) is part of the key: a convolution whose output is
// channels-last (or both layouts at once, as a 1x1 filter's gradient, with a channels-last input
// or gy) runs in NHWC (x, y and the filter described as CUDNN_TENSOR_NHWC, operands
// brought to channels-last when they are not), any other in NCHW (operands made contiguous,
// NCHW and OIHW). float64 always runs in NCHW (cuDNN has next to no NHWC double algorithms), and
// a geometry cuDNN cannot run in NHWC falls back to NCHW; a channels-last output is then
// computed into an NCHW buffer and copied. The bias is added afterwards with the elementwise
// add kernel, so a 16-bit output is rounded twice (after the convolution and after the bias)
// where the CPU rounds once. A 16-bit convolution for which cuDNN offers no algorithm (some
// bfloat16 geometries of the legacy API) runs in float32 and is rounded once, like the CPU.
//
// Note [Accumulating convolution gradients]
// The gradient of x may be added into an existing gradient (conv2d_backward_data with
// `accumulate`, used by the backward engine: Note [Accumulating into an input's gradient] in
// src/autograd/backward.cc). cuDNN's graph API takes beta = 1: the engine reads the old dx in
// its epilogue and writes alpha * conv + beta * dx in one pass, summing in float32 and rounding a
// 16-bit result once. Such plans are keyed apart (beta is part of the operation) and come only
// from the graph API; when it has none (or KUSARI_CUDNN_API=legacy, an NCHW-run output that is
// not contiguous, an output pointer aligned to less than 16 bytes) the convolution is computed
// into a new array and added with the elementwise kernel, which is what the engine did. Timing
// candidates (KUSARI_CUDNN_BENCHMARK=1) would add into the output on every trial, so they run on
// a zeroed scratch array of the output's layout.
#include <cudnn.h>

#include <array>
#include <bit>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/libs/cudnn_graph.h"
#include "backends/cuda/runtime/cuda_backend.h"
#include "kernels/nn.h"
#include "kusari/core/cuda.h"
#include "kusari/core/error.h"

namespace kusari::cuda {
namespace {

using cudnn_graph::alignment;
using cudnn_graph::deterministic_mode;

constexpr size_t kMaxCachedPlans = 1024;
/// Graph-API candidates timed per convolution with KUSARI_CUDNN_BENCHMARK=1.
constexpr int kMaxTimedCandidates = 12;

enum class Direction : int64_t { kForward, kBackwardData, kBackwardFilter };

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == "1";
}

bool benchmark_mode() {
  static const bool on = env_flag("KUSARI_CUDNN_BENCHMARK");
  return on;
}

/// KUSARI_CUDNN_API=legacy keeps every convolution on the legacy API (to compare the two).
bool legacy_api_only() {
  static const bool on = [] {
    const char* v = std::getenv("KUSARI_CUDNN_API");
    if (v == nullptr || std::string_view(v).empty() || std::string_view(v) == "graph") return false;
    KUSARI_CHECK(std::string_view(v) == "legacy", ValueError, "KUSARI_CUDNN_API='", v,
                 "': expected 'graph' (the default) or 'legacy'");
    return true;
  }();
  return on;
}

/// x (n, c, h, w), w (o, c / groups, kh, kw), y (n, o, oh, ow) and the parameters.
struct ConvShape {
  int64_t n, c, h, w, o, kh, kw, oh, ow;
};

cudnnDataType_t data_type(Dtype d) {
  switch (d) {
    case Dtype::kFloat16:
      return CUDNN_DATA_HALF;
    case Dtype::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    case Dtype::kFloat32:
      return CUDNN_DATA_FLOAT;
    case Dtype::kFloat64:
      return CUDNN_DATA_DOUBLE;
    default:
      KUSARI_THROW(DtypeError, "convolution_2d: not supported for dtype ", dtype_name(d));
  }
}

/// The legacy API's descriptors and algorithm of one convolution; see Note [cuDNN convolution
/// plans].
struct LegacyPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t workspace = 0;

  LegacyPlan() = default;
  LegacyPlan(const LegacyPlan&) = delete;
  LegacyPlan& operator=(const LegacyPlan&) = delete;
  ~LegacyPlan() {
    // Errors cannot be reported from a destructor; destroying a descriptor only frees host memory.
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

using PlanKey = std::array<int64_t, 27>;

int to_int(int64_t v, const char* what) {
  KUSARI_CHECK(v <= std::numeric_limits<int>::max(), NotImplementedError,
               "convolution_2d on CUDA: ", what, " = ", v, " exceeds cuDNN's int range");
  return static_cast<int>(v);
}

/// The three cuDNN entry points of one direction behind one interface.
template <Direction D>
struct Api;

template <>
struct Api<Direction::kForward> {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    KUSARI_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &n));
    return n;
  }
  static void heuristics(cudnnHandle_t h, const LegacyPlan& p, int n, int* got, Perf* perf) {
    KUSARI_CUDNN_CHECK(
        cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, n, got, perf));
  }
  // a = x, b = w, out = y
  static void find(cudnnHandle_t h, const LegacyPlan& p, const void* a, const void* b, void* out,
                   int n, int* got, Perf* perf, void* ws, size_t ws_bytes) {
    KUSARI_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, p.x, a, p.w, b, p.conv, p.y, out,
                                                              n, got, perf, ws, ws_bytes));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const LegacyPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(
        h, p.x, p.w, p.conv, p.y, static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
  }
};

template <>
struct Api<Direction::kBackwardData> {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    KUSARI_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &n));
    return n;
  }
  static void heuristics(cudnnHandle_t h, const LegacyPlan& p, int n, int* got, Perf* perf) {
    KUSARI_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, n, got, perf));
  }
  // a = w, b = gy, out = gx
  static void find(cudnnHandle_t h, const LegacyPlan& p, const void* a, const void* b, void* out,
                   int n, int* got, Perf* perf, void* ws, size_t ws_bytes) {
    KUSARI_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
        h, p.w, a, p.y, b, p.conv, p.x, out, n, got, perf, ws, ws_bytes));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const LegacyPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, p.w, p.y, p.conv, p.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
  }
};

template <>
struct Api<Direction::kBackwardFilter> {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static int max_count(cudnnHandle_t h) {
    int n = 0;
    KUSARI_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &n));
    return n;
  }
  static void heuristics(cudnnHandle_t h, const LegacyPlan& p, int n, int* got, Perf* perf) {
    KUSARI_CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, n, got, perf));
  }
  // a = x, b = gy, out = gw
  static void find(cudnnHandle_t h, const LegacyPlan& p, const void* a, const void* b, void* out,
                   int n, int* got, Perf* perf, void* ws, size_t ws_bytes) {
    KUSARI_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        h, p.x, a, p.y, b, p.conv, p.w, out, n, got, perf, ws, ws_bytes));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const LegacyPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p.x, p.y, p.conv, p.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
  }
};

/// Whether a candidate may be used: it ran, fits the workspace limit, is deterministic when
/// asked, and uses FMA math when TF32 is not allowed for float32.
template <typename Perf>
bool acceptable(const Perf& perf, bool fma_only) {
  if (perf.status != CUDNN_STATUS_SUCCESS) return false;
  if (perf.memory > kMaxCudnnWorkspaceBytes) return false;
  if (deterministic_mode() && perf.determinism != CUDNN_DETERMINISTIC) return false;
  if (fma_only && perf.mathType != CUDNN_FMA_MATH) return false;
  return true;
}

/// Creates the descriptors of a plan (the algorithm is chosen by choose_algorithm).
std::unique_ptr<LegacyPlan> describe(Dtype dtype, const ConvShape& s, const Conv2dParams& p,
                                     cudnnMathType_t math, bool nhwc) {
  const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  auto plan = std::make_unique<LegacyPlan>();
  const cudnnDataType_t dt = data_type(dtype);
  const cudnnDataType_t compute = dtype == Dtype::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  KUSARI_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  KUSARI_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  KUSARI_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  KUSARI_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv));
  KUSARI_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
      plan->x, format, dt, to_int(s.n, "N"), to_int(s.c, "C"), to_int(s.h, "H"), to_int(s.w, "W")));
  KUSARI_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->y, format, dt, to_int(s.n, "N"),
                                                to_int(s.o, "out channels"), to_int(s.oh, "out H"),
                                                to_int(s.ow, "out W")));
  KUSARI_CUDNN_CHECK(cudnnSetFilter4dDescriptor(plan->w, dt, format, to_int(s.o, "O"),
                                                to_int(s.c / p.groups, "C / groups"),
                                                to_int(s.kh, "kH"), to_int(s.kw, "kW")));
  KUSARI_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
      plan->conv, to_int(p.pad[0], "pad"), to_int(p.pad[1], "pad"), to_int(p.stride[0], "stride"),
      to_int(p.stride[1], "stride"), to_int(p.dilation[0], "dilation"),
      to_int(p.dilation[1], "dilation"), CUDNN_CROSS_CORRELATION, compute));
  KUSARI_CUDNN_CHECK(cudnnSetConvolutionGroupCount(plan->conv, to_int(p.groups, "groups")));
  KUSARI_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, math));
  return plan;
}

template <Direction D>
void choose_algorithm(cudnnHandle_t handle, int device, LegacyPlan& plan, bool fma_only,
                      const void* a, const void* b, void* out) {
  using Perf = typename Api<D>::Perf;
  // Every use of the handle holds the device's cuDNN lock (a workspace lease).
  int max_count = 0, got = 0;
  std::vector<Perf> perf;
  {
    WorkspaceLease guard = cudnn_workspace(device, 0);
    max_count = Api<D>::max_count(handle);
    perf.resize(static_cast<size_t>(std::max(max_count, 1)));
    Api<D>::heuristics(handle, plan, max_count, &got, perf.data());
  }
  if (benchmark_mode()) {
    // Time the candidates with as much workspace as the largest acceptable one needs.
    size_t ws_bytes = 0;
    for (int i = 0; i < got; ++i) {
      if (acceptable(perf[i], fma_only)) ws_bytes = std::max(ws_bytes, perf[i].memory);
    }
    WorkspaceLease ws = cudnn_workspace(device, std::max<size_t>(ws_bytes, 1));
    Api<D>::find(handle, plan, a, b, out, max_count, &got, perf.data(), ws.ptr, ws.bytes);
  }
  // cuDNN's order, except that without TF32 the candidates reporting FMA math come first.
  std::vector<const Perf*> order;
  for (int i = 0; i < got; ++i) {
    if (acceptable(perf[i], fma_only)) order.push_back(&perf[i]);
  }
  if (fma_only) {
    for (int i = 0; i < got; ++i) {
      if (acceptable(perf[i], false) && perf[i].mathType != CUDNN_FMA_MATH)
        order.push_back(&perf[i]);
    }
  }
  // The first candidate that accepts the math mode and states a workspace within the limit.
  WorkspaceLease guard = cudnn_workspace(device, 0);
  for (const Perf* c : order) {
    const cudnnMathType_t math = fma_only ? CUDNN_FMA_MATH : c->mathType;
    if (cudnnSetConvolutionMathType(plan.conv, math) != CUDNN_STATUS_SUCCESS) continue;
    size_t bytes = 0;
    const int algo = static_cast<int>(c->algo);
    if (Api<D>::workspace(handle, plan, algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
    if (bytes > kMaxCudnnWorkspaceBytes) continue;
    plan.algo = algo;
    plan.workspace = bytes;
    return;
  }
  KUSARI_THROW(
      NotImplementedError,
      "convolution_2d on CUDA: cuDNN offers no usable algorithm for this geometry (within a "
      "workspace of ",
      kMaxCudnnWorkspaceBytes >> 20, " MiB", fma_only ? ", without TF32" : "",
      deterministic_mode() ? ", deterministic only" : "", ")");
}

/// How one convolution runs: a graph-API plan, else a legacy one; neither for a 16-bit
/// convolution that must run in float32.
struct Plan {
  std::shared_ptr<const cudnn_graph::ConvPlan> graph;
  std::unique_ptr<LegacyPlan> legacy;
  bool in_float32() const { return !graph && !legacy; }
};

struct PlanCache {
  std::mutex mutex;
  std::vector<std::map<PlanKey, std::shared_ptr<const Plan>>> per_device;
};

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache();  // never destroyed, see Note [Backend lifetime]
  return *cache;
}

/// The three buffers of a convolution in the forward pass's names: x (dx for the gradient of the
/// data), w (dw for the gradient of the filter) and y (dy for both gradients).
struct Buffers {
  void* x;
  void* w;
  void* y;
};

/// Element strides of an (n, c, h, w)-indexed tensor in NCHW or NHWC.
std::array<int64_t, 4> layout_strides(const std::array<int64_t, 4>& d, bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

cudnn_graph::TensorSpec tensor_spec(std::array<int64_t, 4> dims, bool nhwc, const void* data) {
  return cudnn_graph::TensorSpec{dims, layout_strides(dims, nhwc), alignment(data)};
}

constexpr cudnn_graph::ConvDirection graph_direction(Direction d) {
  switch (d) {
    case Direction::kForward:
      return cudnn_graph::ConvDirection::kForward;
    case Direction::kBackwardData:
      return cudnn_graph::ConvDirection::kBackwardData;
    case Direction::kBackwardFilter:
      return cudnn_graph::ConvDirection::kBackwardFilter;
  }
  return cudnn_graph::ConvDirection::kForward;
}

/// The fastest of `candidates` on the call's own buffers; see Note [cuDNN convolution plans].
std::shared_ptr<const cudnn_graph::ConvPlan> fastest(
    int device, const std::vector<std::shared_ptr<const cudnn_graph::ConvPlan>>& candidates,
    const Buffers& buf) {
  check_not_capturing(device, "choosing a cuDNN convolution algorithm by timing",
                      "timing waits for the device; run one step eagerly before capturing");
  int64_t ws_bytes = 1;
  for (const auto& c : candidates) ws_bytes = std::max(ws_bytes, c->workspace());
  WorkspaceLease lease = cudnn_workspace(device, static_cast<size_t>(ws_bytes));
  void* const ws = lease.ptr;
  cudnnHandle_t handle = cudnn_handle(device);
  cudaStream_t stream = compute_stream(device);
  cudaEvent_t start = nullptr, stop = nullptr;
  KUSARI_CUDA_CHECK(cudaEventCreate(&start));
  KUSARI_CUDA_CHECK(cudaEventCreate(&stop));
  std::shared_ptr<const cudnn_graph::ConvPlan> best;
  float best_ms = std::numeric_limits<float>::infinity();
  for (const auto& c : candidates) {
    try {
      c->execute(handle, buf.x, buf.w, buf.y, ws);  // warm-up
      KUSARI_CUDA_CHECK(cudaEventRecord(start, stream));
      for (int r = 0; r < 2; ++r) c->execute(handle, buf.x, buf.w, buf.y, ws);
      KUSARI_CUDA_CHECK(cudaEventRecord(stop, stream));
      KUSARI_CUDA_CHECK(cudaEventSynchronize(stop));
    } catch (const Error&) {
      continue;  // a candidate that fails to run is not chosen
    }
    float ms = 0;
    KUSARI_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (ms < best_ms) {
      best_ms = ms;
      best = c;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

/// The graph-API plan of a convolution, or null when the graph API has none. The tensors'
/// alignments come from `buf` (the call's pointers); candidates are timed on `trial` (the same
/// pointers, or a scratch output for an accumulating plan).
template <Direction D>
std::shared_ptr<const cudnn_graph::ConvPlan> graph_plan(int device, Dtype dtype,
                                                        const ConvShape& s, const Conv2dParams& p,
                                                        bool nhwc, bool tf32, bool accumulate,
                                                        const Buffers& buf, const Buffers& trial) {
  cudnn_graph::ConvProblem problem;
  problem.direction = graph_direction(D);
  problem.data_type = data_type(dtype);
  problem.compute_type = dtype == Dtype::kFloat64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  problem.x = tensor_spec({s.n, s.c, s.h, s.w}, nhwc, buf.x);
  problem.w = tensor_spec({s.o, s.c / p.groups, s.kh, s.kw}, nhwc, buf.w);
  problem.y = tensor_spec({s.n, s.o, s.oh, s.ow}, nhwc, buf.y);
  problem.pad = {p.pad[0], p.pad[1]};
  problem.stride = {p.stride[0], p.stride[1]};
  problem.dilation = {p.dilation[0], p.dilation[1]};
  problem.allow_tf32 = tf32;
  problem.deterministic = deterministic_mode();
  problem.accumulate = accumulate;
  std::vector<std::shared_ptr<const cudnn_graph::ConvPlan>> candidates;
  {
    WorkspaceLease guard = cudnn_workspace(device, 0);  // the handle's lock
    candidates = cudnn_graph::conv_plans(cudnn_handle(device), problem,
                                         static_cast<int64_t>(kMaxCudnnWorkspaceBytes),
                                         benchmark_mode() ? kMaxTimedCandidates : 1);
  }
  if (candidates.empty()) return nullptr;
  if (candidates.size() == 1) return candidates.front();
  return fastest(device, candidates, trial);
}

/// The legacy API's arguments of a direction (a, b, out) from the forward's names.
template <Direction D>
std::array<void*, 3> legacy_operands(const Buffers& buf) {
  if constexpr (D == Direction::kForward) return {buf.x, buf.w, buf.y};
  if constexpr (D == Direction::kBackwardData) return {buf.w, buf.y, buf.x};
  return {buf.x, buf.y, buf.w};
}

/// The output buffer of direction D in Buffers (y, dx or dw).
template <Direction D>
void*& output_of(Buffers& buf) {
  if constexpr (D == Direction::kForward) return buf.y;
  if constexpr (D == Direction::kBackwardData) return buf.x;
  return buf.w;
}

/// The plan of a convolution, created on first use (the call's buffers are used for the
/// pointers' alignments and for timing candidates). A plan that accumulates into its output
/// (beta = 1, Note [Accumulating convolution gradients]) is a graph-API plan or none: its
/// candidates are timed on a zeroed scratch output like `out`, never on `out` itself.
template <Direction D>
std::shared_ptr<const Plan> get_plan(int device, Dtype dtype, const ConvShape& s,
                                     const Conv2dParams& p, bool nhwc, bool accumulate,
                                     const Buffers& buf, const Array& out) {
  const bool tf32 = dtype == Dtype::kFloat32 && allow_tf32_convolution();
  const bool fma_only = dtype == Dtype::kFloat32 && !tf32;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  if (fma_only) math = CUDNN_FMA_MATH;
  if (is_half_precision(dtype)) math = CUDNN_TENSOR_OP_MATH;
  const PlanKey key{static_cast<int64_t>(D),
                    static_cast<int64_t>(dtype),
                    tf32 ? 1 : 0,
                    s.n,
                    s.c,
                    s.h,
                    s.w,
                    s.o,
                    s.kh,
                    s.kw,
                    s.oh,
                    s.ow,
                    p.stride[0],
                    p.stride[1],
                    p.pad[0],
                    p.pad[1],
                    p.dilation[0],
                    p.dilation[1],
                    p.groups,
                    deterministic_mode() ? 1 : 0,
                    benchmark_mode() ? 1 : 0,
                    nhwc ? 1 : 0,
                    legacy_api_only() ? 1 : 0,
                    alignment(buf.x),
                    alignment(buf.w),
                    alignment(buf.y),
                    accumulate ? 1 : 0};
  PlanCache& cache = plan_cache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    if (cache.per_device.size() <= static_cast<size_t>(device)) {
      cache.per_device.resize(static_cast<size_t>(device) + 1);
    }
    auto& plans = cache.per_device[static_cast<size_t>(device)];
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
  }
  // Created outside the lock (benchmarking runs kernels); a concurrent duplicate is harmless.
  auto plan = std::make_shared<Plan>();
  if (accumulate) {
    // Only benchmark mode runs candidates; the scratch is freed in stream order after the
    // trials, like any array. Its alignment (the pool's) is not the plan's: that is `out`'s.
    Array scratch;
    Buffers trial = buf;
    if (benchmark_mode()) {
      scratch = Array::zeros_like(out);
      output_of<D>(trial) = scratch.raw_data();
    }
    plan->graph = graph_plan<D>(device, dtype, s, p, nhwc, tf32, true, buf, trial);
  } else if (!legacy_api_only()) {
    plan->graph = graph_plan<D>(device, dtype, s, p, nhwc, tf32, false, buf, buf);
  }
  if (!plan->graph && !accumulate) {
    cudnnHandle_t handle = cudnn_handle(device);
    try {
      plan->legacy = describe(dtype, s, p, math, nhwc);
      const std::array<void*, 3> ops = legacy_operands<D>(buf);
      choose_algorithm<D>(handle, device, *plan->legacy, fma_only, ops[0], ops[1], ops[2]);
    } catch (const Error&) {
      // A 16-bit convolution cuDNN cannot run is computed in float32 instead (a plan with
      // neither, cached like any other); for other dtypes the error stands.
      if (dtype != Dtype::kFloat16 && dtype != Dtype::kBFloat16) throw;
      plan->legacy.reset();
    }
  }
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto& plans = cache.per_device[static_cast<size_t>(device)];
  if (plans.size() >= kMaxCachedPlans) plans.clear();
  plans[key] = plan;
  return plan;
}

ConvShape conv_shape(const Shape& x, const Shape& w, const Shape& y) {
  return ConvShape{x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3]};
}

/// A float32 copy of `a` (undefined stays undefined).
Array to_float32(const Array& a) {
  return a.defined() ? a.astype(Dtype::kFloat32) : Array();
}

/// True when a convolution writing `out` from the activation `in` runs in NHWC: see Note [cuDNN
/// convolution plans]. An output that is both layouts at once (a 1x1 filter's gradient, an
/// output of 1x1 pixels) follows `in`: otherwise a channels-last model's 1x1 filter gradients
/// would copy x and gy to NCHW.
bool runs_nhwc(const Array& out, const Array& in) {
  return out.dtype() != Dtype::kFloat64 && out.is_contiguous(MemoryFormat::kChannelsLast) &&
         (!out.is_contiguous() || in.memory_format() == MemoryFormat::kChannelsLast);
}

/// `a` in the convolution's layout (a view when it already is).
Array in_layout(const Array& a, bool nhwc) {
  return a.to_memory_format(nhwc ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous);
}

/// An NCHW buffer for an output that is not contiguous.
Array nchw_like(const Array& out) {
  return Array::empty(out.shape(), out.dtype(), out.device());
}

/// alpha = 1 and beta = 0 in the type cuDNN scales with (double for float64, else float).
struct Scales {
  float f1 = 1.0f, f0 = 0.0f;
  double d1 = 1.0, d0 = 0.0;
  const void* one(Dtype d) const {
    return d == Dtype::kFloat64 ? static_cast<const void*>(&d1) : &f1;
  }
  const void* zero(Dtype d) const {
    return d == Dtype::kFloat64 ? static_cast<const void*>(&d0) : &f0;
  }
};

/// The legacy API's call of one direction (a, b, out as in Api<D>::find).
template <Direction D>
void run_legacy(int device, const LegacyPlan& plan, Dtype dtype, const void* a, const void* b,
                void* out) {
  const Scales scales;
  WorkspaceLease ws = cudnn_workspace(device, plan.workspace);
  cudnnHandle_t h = cudnn_handle(device);
  if constexpr (D == Direction::kForward) {
    KUSARI_CUDNN_CHECK(cudnnConvolutionForward(
        h, scales.one(dtype), plan.x, a, plan.w, b, plan.conv,
        static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo), ws.ptr, ws.bytes, scales.zero(dtype),
        plan.y, out));
  } else if constexpr (D == Direction::kBackwardData) {
    KUSARI_CUDNN_CHECK(cudnnConvolutionBackwardData(
        h, scales.one(dtype), plan.w, a, plan.y, b, plan.conv,
        static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo), ws.ptr, ws.bytes,
        scales.zero(dtype), plan.x, out));
  } else {
    KUSARI_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h, scales.one(dtype), plan.x, a, plan.y, b, plan.conv,
        static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo), ws.ptr, ws.bytes,
        scales.zero(dtype), plan.w, out));
  }
}

/// One direction of a convolution into `out` (y, gx or gw), from the two operands in the
/// forward's roles (Buffers), in the layout Note [cuDNN convolution plans] picks: an output
/// that cannot be written in place is computed into an NCHW buffer and copied; a 16-bit
/// convolution without a cuDNN plan runs in float32.
template <Direction D>
void convolve(const Array& in0, const Array& in1, const Conv2dParams& p, Array& out,
              const Array& layout_source, bool accumulate = false) {
  data_type(out.dtype());
  const bool nhwc = runs_nhwc(out, layout_source);
  // Note [Accumulating convolution gradients]: out += the convolution, in one pass through a
  // graph-API plan with beta = 1 where there is one, else computed apart and added.
  const auto apart = [&] {
    Array part = Array::empty(out.shape(), out.dtype(), out.device(), out.memory_format());
    convolve<D>(in0, in1, p, part, layout_source);
    binary(BinaryOp::kAdd, out, part, out);
  };
  if (accumulate && (legacy_api_only() || (!nhwc && !out.is_contiguous()) ||
                     alignment(out.raw_data()) < 16)) {
    return apart();
  }
  const auto rerun_nchw = [&] {
    Array out_nchw = nchw_like(out);
    convolve<D>(in0, in1, p, out_nchw, layout_source);
    copy(out_nchw, out);
  };
  if (!nhwc && !out.is_contiguous()) return rerun_nchw();
  const Array a = in_layout(in0, nhwc), b = in_layout(in1, nhwc);
  const int device = out.device().index();
  set_device(device);
  // The operands and the output in the forward's roles.
  Buffers buf{};
  ConvShape s{};
  if constexpr (D == Direction::kForward) {  // in0 = x, in1 = w, out = y
    buf = {a.raw_data(), b.raw_data(), out.raw_data()};
    s = conv_shape(a.shape(), b.shape(), out.shape());
  } else if constexpr (D == Direction::kBackwardData) {  // in0 = w, in1 = gy, out = gx
    buf = {out.raw_data(), a.raw_data(), b.raw_data()};
    s = conv_shape(out.shape(), a.shape(), b.shape());
  } else {  // in0 = x, in1 = gy, out = gw
    buf = {a.raw_data(), out.raw_data(), b.raw_data()};
    s = conv_shape(a.shape(), out.shape(), b.shape());
  }
  std::shared_ptr<const Plan> plan;
  try {
    plan = get_plan<D>(device, out.dtype(), s, p, nhwc, accumulate, buf, out);
  } catch (const Error&) {
    if (accumulate) return apart();
    if (!nhwc) throw;
    return rerun_nchw();  // no NHWC algorithm for this geometry
  }
  if (accumulate && !plan->graph) return apart();
  if (plan->in_float32()) {
    Array out32 = Array::empty(out.shape(), Dtype::kFloat32, out.device(), out.memory_format());
    convolve<D>(to_float32(a), to_float32(b), p, out32, layout_source);
    copy(out32, out);
    return;
  }
  if (plan->graph) {
    WorkspaceLease ws = cudnn_workspace(device, static_cast<size_t>(plan->graph->workspace()));
    plan->graph->execute(cudnn_handle(device), buf.x, buf.w, buf.y, ws.ptr);
    return;
  }
  run_legacy<D>(device, *plan->legacy, out.dtype(), a.raw_data(), b.raw_data(), out.raw_data());
}

}  // namespace

void conv2d_forward(const Array& x, const Array& w, const Array& b, const Conv2dParams& p,
                    Array& y) {
  convolve<Direction::kForward>(x, w, p, y, x);
  if (b.defined()) {
    // y += b[None, :, None, None]
    const Array bias = b.reshape({1, b.shape()[0], 1, 1}).broadcast_to(y.shape());
    binary(BinaryOp::kAdd, y, bias, y);
  }
}

void conv2d_backward_data(const Array& w, const Array& gy, const Conv2dParams& p, Array& gx,
                          bool accumulate) {
  convolve<Direction::kBackwardData>(w, gy, p, gx, gy, accumulate);
}

void conv2d_backward_filter(const Array& x, const Array& gy, const Conv2dParams& p, Array& gw) {
  convolve<Direction::kBackwardFilter>(x, gy, p, gw, gy);
}

void register_cuda_nn_kernels() {
  kernels::conv2d_forward.set(DeviceType::kCUDA, &conv2d_forward);
  kernels::conv2d_backward_data.set(DeviceType::kCUDA, &conv2d_backward_data);
  kernels::conv2d_backward_filter.set(DeviceType::kCUDA, &conv2d_backward_filter);
  kernels::pool2d_forward.set(DeviceType::kCUDA, &pool2d_forward);
  kernels::pool2d_backward.set(DeviceType::kCUDA, &pool2d_backward);
}

}  // namespace kusari::cuda
