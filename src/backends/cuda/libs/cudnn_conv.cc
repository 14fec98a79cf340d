// CUDA kernels: 2-d convolution (forward, gradient of the data, gradient of the filter) through
// cuDNN's convolution API.
//
// Note [cuDNN convolution plans]
// Describing a convolution to cuDNN and choosing its algorithm is slow next to running it, so
// each (direction, dtype, geometry, groups, math mode) gets a plan once: the tensor, filter and
// convolution descriptors, the algorithm, its math type and its workspace size. Plans live in a
// mutex-protected map per device and are shared (immutable) between threads; like the CPU's
// oneDNN cache the map starts over past kMaxCachedPlans entries.
//   - The algorithm comes from cuDNN's heuristics (cudnnGet*Algorithm_v7), or, when the
//     environment sets KUSARI_CUDNN_BENCHMARK=1, from timing the candidates (cudnnFind*Ex) on the
//     first call's own buffers (the outputs are fresh arrays, so the trial runs may write them).
//   - Candidates whose workspace exceeds kMaxCudnnWorkspaceBytes are skipped; the workspace is the
//     device's shared, growing buffer (Note [cuDNN workspace]), so it is allocated once per size
//     reached, not per call.
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
#include <cudnn.h>

#include <array>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/runtime/cuda_backend.h"
#include "kernels/nn.h"
#include "kusari/core/cuda.h"
#include "kusari/core/error.h"

namespace kusari::cuda {
namespace {

constexpr size_t kMaxCachedPlans = 1024;

enum class Direction : int64_t { kForward, kBackwardData, kBackwardFilter };

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == "1";
}

bool benchmark_mode() {
  static const bool on = env_flag("KUSARI_CUDNN_BENCHMARK");
  return on;
}

bool deterministic_mode() {
  static const bool on = env_flag("KUSARI_CUDNN_DETERMINISTIC");
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

/// The descriptors and algorithm of one convolution; see Note [cuDNN convolution plans].
struct ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t workspace = 0;

  ConvPlan() = default;
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;
  ~ConvPlan() {
    // Errors cannot be reported from a destructor; destroying a descriptor only frees host memory.
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

using PlanKey = std::array<int64_t, 22>;

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
  static void heuristics(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perf) {
    KUSARI_CUDNN_CHECK(
        cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, n, got, perf));
  }
  // a = x, b = w, out = y
  static void find(cudnnHandle_t h, const ConvPlan& p, const void* a, const void* b, void* out,
                   int n, int* got, Perf* perf, void* ws, size_t ws_bytes) {
    KUSARI_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, p.x, a, p.w, b, p.conv, p.y, out,
                                                              n, got, perf, ws, ws_bytes));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
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
  static void heuristics(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perf) {
    KUSARI_CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, n, got, perf));
  }
  // a = w, b = gy, out = gx
  static void find(cudnnHandle_t h, const ConvPlan& p, const void* a, const void* b, void* out,
                   int n, int* got, Perf* perf, void* ws, size_t ws_bytes) {
    KUSARI_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
        h, p.w, a, p.y, b, p.conv, p.x, out, n, got, perf, ws, ws_bytes));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
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
  static void heuristics(cudnnHandle_t h, const ConvPlan& p, int n, int* got, Perf* perf) {
    KUSARI_CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, n, got, perf));
  }
  // a = x, b = gy, out = gw
  static void find(cudnnHandle_t h, const ConvPlan& p, const void* a, const void* b, void* out,
                   int n, int* got, Perf* perf, void* ws, size_t ws_bytes) {
    KUSARI_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
        h, p.x, a, p.y, b, p.conv, p.w, out, n, got, perf, ws, ws_bytes));
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
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
std::shared_ptr<ConvPlan> describe(Dtype dtype, const ConvShape& s, const Conv2dParams& p,
                                   cudnnMathType_t math, bool nhwc) {
  const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  auto plan = std::make_shared<ConvPlan>();
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
void choose_algorithm(cudnnHandle_t handle, int device, ConvPlan& plan, bool fma_only,
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

struct PlanCache {
  std::mutex mutex;
  std::vector<std::map<PlanKey, std::shared_ptr<const ConvPlan>>> per_device;
};

PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache();  // never destroyed, see Note [Backend lifetime]
  return *cache;
}

/// The plan of a convolution, created on first use (a, b, out: the call's buffers, used only for
/// benchmarking); null when a 16-bit convolution must run in float32.
template <Direction D>
std::shared_ptr<const ConvPlan> get_plan(int device, Dtype dtype, const ConvShape& s,
                                         const Conv2dParams& p, bool nhwc, const void* a,
                                         const void* b, void* out) {
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
                    nhwc ? 1 : 0};
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
  cudnnHandle_t handle = cudnn_handle(device);
  std::shared_ptr<ConvPlan> plan;
  try {
    plan = describe(dtype, s, p, math, nhwc);
    choose_algorithm<D>(handle, device, *plan, fma_only, a, b, out);
  } catch (const Error&) {
    // A 16-bit convolution cuDNN cannot run is computed in float32 instead (a null plan, cached
    // like any other); for other dtypes the error stands.
    if (dtype != Dtype::kFloat16 && dtype != Dtype::kBFloat16) throw;
    plan = nullptr;
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

}  // namespace

void conv2d_forward(const Array& x_in, const Array& w_in, const Array& b, const Conv2dParams& p,
                    Array& y) {
  data_type(x_in.dtype());
  const bool nhwc = runs_nhwc(y, x_in);
  if (!nhwc && !y.is_contiguous()) {
    Array y_nchw = nchw_like(y);
    conv2d_forward(x_in, w_in, b, p, y_nchw);
    copy(y_nchw, y);
    return;
  }
  const Array x = in_layout(x_in, nhwc), w = in_layout(w_in, nhwc);
  const int device = y.device().index();
  set_device(device);
  const ConvShape s = conv_shape(x.shape(), w.shape(), y.shape());
  std::shared_ptr<const ConvPlan> plan;
  try {
    plan = get_plan<Direction::kForward>(device, x.dtype(), s, p, nhwc, x.raw_data(), w.raw_data(),
                                         y.raw_data());
  } catch (const Error&) {
    if (!nhwc) throw;
    // No NHWC algorithm for this geometry: run in NCHW.
    Array y_nchw = nchw_like(y);
    conv2d_forward(x_in, w_in, b, p, y_nchw);
    copy(y_nchw, y);
    return;
  }
  if (!plan) {
    Array y32 = Array::empty(y.shape(), Dtype::kFloat32, y.device(), y.memory_format());
    conv2d_forward(to_float32(x), to_float32(w), to_float32(b), p, y32);
    copy(y32, y);
    return;
  }
  const Scales scales;
  {
    WorkspaceLease ws = cudnn_workspace(device, plan->workspace);
    KUSARI_CUDNN_CHECK(cudnnConvolutionForward(
        cudnn_handle(device), scales.one(x.dtype()), plan->x, x.raw_data(), plan->w, w.raw_data(),
        plan->conv, static_cast<cudnnConvolutionFwdAlgo_t>(plan->algo), ws.ptr, ws.bytes,
        scales.zero(x.dtype()), plan->y, y.raw_data()));
  }
  if (b.defined()) {
    // y += b[None, :, None, None]
    const Array bias = b.reshape({1, b.shape()[0], 1, 1}).broadcast_to(y.shape());
    binary(BinaryOp::kAdd, y, bias, y);
  }
}

void conv2d_backward_data(const Array& w_in, const Array& gy_in, const Conv2dParams& p, Array& gx) {
  data_type(gy_in.dtype());
  const bool nhwc = runs_nhwc(gx, gy_in);
  if (!nhwc && !gx.is_contiguous()) {
    Array gx_nchw = nchw_like(gx);
    conv2d_backward_data(w_in, gy_in, p, gx_nchw);
    copy(gx_nchw, gx);
    return;
  }
  const Array w = in_layout(w_in, nhwc), gy = in_layout(gy_in, nhwc);
  const int device = gx.device().index();
  set_device(device);
  const ConvShape s = conv_shape(gx.shape(), w.shape(), gy.shape());
  std::shared_ptr<const ConvPlan> plan;
  try {
    plan = get_plan<Direction::kBackwardData>(device, gy.dtype(), s, p, nhwc, w.raw_data(),
                                              gy.raw_data(), gx.raw_data());
  } catch (const Error&) {
    if (!nhwc) throw;
    Array gx_nchw = nchw_like(gx);
    conv2d_backward_data(w_in, gy_in, p, gx_nchw);
    copy(gx_nchw, gx);
    return;
  }
  if (!plan) {
    Array gx32 = Array::empty(gx.shape(), Dtype::kFloat32, gx.device(), gx.memory_format());
    conv2d_backward_data(to_float32(w), to_float32(gy), p, gx32);
    copy(gx32, gx);
    return;
  }
  const Scales scales;
  WorkspaceLease ws = cudnn_workspace(device, plan->workspace);
  KUSARI_CUDNN_CHECK(cudnnConvolutionBackwardData(
      cudnn_handle(device), scales.one(gy.dtype()), plan->w, w.raw_data(), plan->y, gy.raw_data(),
      plan->conv, static_cast<cudnnConvolutionBwdDataAlgo_t>(plan->algo), ws.ptr, ws.bytes,
      scales.zero(gy.dtype()), plan->x, gx.raw_data()));
}

void conv2d_backward_filter(const Array& x_in, const Array& gy_in, const Conv2dParams& p,
                            Array& gw) {
  data_type(gy_in.dtype());
  const bool nhwc = runs_nhwc(gw, gy_in);
  if (!nhwc && !gw.is_contiguous()) {
    Array gw_nchw = nchw_like(gw);
    conv2d_backward_filter(x_in, gy_in, p, gw_nchw);
    copy(gw_nchw, gw);
    return;
  }
  const Array x = in_layout(x_in, nhwc), gy = in_layout(gy_in, nhwc);
  const int device = gw.device().index();
  set_device(device);
  const ConvShape s = conv_shape(x.shape(), gw.shape(), gy.shape());
  std::shared_ptr<const ConvPlan> plan;
  try {
    plan = get_plan<Direction::kBackwardFilter>(device, gy.dtype(), s, p, nhwc, x.raw_data(),
                                                gy.raw_data(), gw.raw_data());
  } catch (const Error&) {
    if (!nhwc) throw;
    Array gw_nchw = nchw_like(gw);
    conv2d_backward_filter(x_in, gy_in, p, gw_nchw);
    copy(gw_nchw, gw);
    return;
  }
  if (!plan) {
    Array gw32 = Array::empty(gw.shape(), Dtype::kFloat32, gw.device(), gw.memory_format());
    conv2d_backward_filter(to_float32(x), to_float32(gy), p, gw32);
    copy(gw32, gw);
    return;
  }
  const Scales scales;
  WorkspaceLease ws = cudnn_workspace(device, plan->workspace);
  KUSARI_CUDNN_CHECK(cudnnConvolutionBackwardFilter(
      cudnn_handle(device), scales.one(gy.dtype()), plan->x, x.raw_data(), plan->y, gy.raw_data(),
      plan->conv, static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan->algo), ws.ptr, ws.bytes,
      scales.zero(gy.dtype()), plan->w, gw.raw_data()));
}

void register_cuda_nn_kernels() {
  kernels::conv2d_forward.set(DeviceType::kCUDA, &conv2d_forward);
  kernels::conv2d_backward_data.set(DeviceType::kCUDA, &conv2d_backward_data);
  kernels::conv2d_backward_filter.set(DeviceType::kCUDA, &conv2d_backward_filter);
  kernels::pool2d_forward.set(DeviceType::kCUDA, &pool2d_forward);
  kernels::pool2d_backward.set(DeviceType::kCUDA, &pool2d_backward);
}

}  // namespace kusari::cuda
