// CUDA kernels: scaled dot-product attention, forward and backward, as cuDNN's fused attention
// (FlashAttention-2's schedule) for float16 and bfloat16.
//
// Note [cuDNN fused attention]
// cuDNN runs attention as one fused kernel (the softmax online, no (q_len, kv_len) matrix in
// memory) when it is described in its graph API as the graph of the computation it fuses: its
// engine recognises the pattern and compiles a kernel for the problem at run time (NVRTC, when
// the plan is made). Plans are cached per geometry, so training compiles once per sequence
// length. The forward graph, s being a virtual float32 (batch, heads, q_len, kv_len) tensor:
//   s = q @ k^T (k described with its last two axes swapped); s = s * scale (a scalar passed
//   by value); causal: row = index(s, axis 2), col = index(s, axis 3),
//   s = select(s, -inf, row >= col);
//   m = max(s, axis 3); e = exp(s - m); l = sum(e, axis 3); lse = m + log(l) (written, float32);
//   p = e / l (virtual, in the data's dtype); out = p @ v.
// The backward graph recomputes p from lse, masked the same way, and with D = rowsum(gout * out)
// (a float32 tensor in memory, which the kernel fills):
//   p = exp(s * scale - lse); gv = p^T @ gout; gs = p * (gout @ v^T - D) * scale;
//   gk = gs^T @ q; gq = gs @ k, gq through a float32 accumulator in memory (cuDNN zeroes it).
// These are Note [Blocked attention]'s formulas; the pattern (operations, their order, the
// dtypes of the virtual tensors) is the one cuDNN's own front end emits for this case.
// Declined, for the composed path (Note [Attention paths]): float32 and float64, a mask, dropout
// (cuDNN's random numbers are not kusari's, Note [Blocked attention]), v_dim != head_dim,
// head_dim above 128 or not a multiple of 8, causal with q_len != kv_len (the bottom-right
// alignment), fewer than kMinQueries queries (a decoding step: every KV length would compile a
// plan), KUSARI_CUDNN_DETERMINISTIC=1 for the backward (its gq accumulates with atomics), and a
// problem cuDNN has no plan for (said once per process, with cuDNN's reason). An operand whose
// last axis is not contiguous, whose other strides are not multiples of 8 elements or whose
// data is not 16-byte aligned is copied contiguous first. KUSARI_CUDNN_ATTENTION=0 turns the
// kernel off (to compare with the composed path).
#include <cudnn.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/libs/cudnn_graph.h"
#include "backends/cuda/runtime/cuda_backend.h"
#include "kernels/attention.h"
#include "kusari/core/error.h"

namespace kusari::cuda {
namespace {

using ::kusari::detail::concat;
using Dims = std::vector<int64_t>;

/// Decoding steps (fewer queries) run composed: see Note [cuDNN fused attention].
constexpr int64_t kMinQueries = 16;
constexpr size_t kMaxCachedPlans = 256;

// The unique ids of the tensors in the variant packs; virtual tensors count up from kVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kScale,
  kNegInf,
  kGradO,
  kGradQ,
  kGradK,
  kGradV,
  kOne,
  kRowDot,
  kGradQAccum,
  kVirtual = 100
};

bool enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KUSARI_CUDNN_ATTENTION");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return on;
}

/// `a` itself when cuDNN can read it in place, else a contiguous copy.
Array usable(const Array& a) {
  const Strides& s = a.strides();
  bool ok = s[3] == 1 && cudnn_graph::alignment(a.raw_data()) >= 16;
  for (int i = 0; ok && i < 3; ++i) ok = s[i] % 8 == 0 || a.shape()[i] == 1;
  return ok ? a : a.to_memory_format(MemoryFormat::kContiguous);
}

std::array<int64_t, 4> strides4(const Array& a) {
  return {a.strides()[0], a.strides()[1], a.strides()[2], a.strides()[3]};
}

struct Key {
  bool backward = false;
  Dtype dtype = Dtype::kBFloat16;
  int64_t batch = 0, heads = 0, q_len = 0, kv_len = 0, dim = 0;
  bool causal = false;
  std::array<int64_t, 4> q{}, k{}, v{};
  auto operator<=>(const Key&) const = default;
};

struct Entry {
  std::shared_ptr<const cudnn_graph::Plan> plan;  // null: cuDNN has none
};

struct Cache {
  std::mutex mutex;
  std::map<std::pair<int, Key>, Entry> plans;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed, see Note [Backend lifetime]
  return *c;
}

Dims contiguous_strides(const Dims& d) {
  Dims s(d.size(), 1);
  for (int i = static_cast<int>(d.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * d[i + 1];
  return s;
}

/// The row statistics' (batch, heads, q_len, 1) dims and strides.
Dims row_dims(const Key& k) {
  return {k.batch, k.heads, k.q_len, 1};
}
Dims row_strides(const Key& k) {
  return {k.heads * k.q_len, k.q_len, 1, 1};
}

/// q's (batch, heads, q_len, dim) tensor, and k or v with their last two axes swapped when
/// `transposed` (dims (batch, heads, dim, kv_len)).
void operand(cudnn_graph::GraphBuilder& g, int64_t uid, const Key& key,
             const std::array<int64_t, 4>& st, int64_t len, bool transposed, cudnnDataType_t type) {
  if (transposed) {
    g.tensor(uid, {key.batch, key.heads, key.dim, len}, {st[0], st[1], st[3], st[2]}, type);
  } else {
    g.tensor(uid, {key.batch, key.heads, len, key.dim}, {st[0], st[1], st[2], st[3]}, type);
  }
}

/// The causal mask of Note [cuDNN fused attention] applied to the virtual scores `s`; returns
/// the masked scores' id. `next` hands out virtual ids.
int64_t causal_mask(cudnn_graph::GraphBuilder& g, int64_t s, const Dims& sd, const Dims& ss,
                    int64_t& next) {
  const int64_t row = next++, col = next++, keep = next++, out = next++;
  g.virtual_tensor(row, sd, ss, CUDNN_DATA_INT32);
  g.virtual_tensor(col, sd, ss, CUDNN_DATA_INT32);
  g.virtual_tensor(keep, sd, ss, CUDNN_DATA_BOOLEAN);
  g.virtual_tensor(out, sd, ss, CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, row, s, -1, -1, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, col, s, -1, -1, CUDNN_DATA_FLOAT, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, keep, row, col, -1, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, out, s, kNegInf, keep);
  return out;
}

void forward_graph(cudnn_graph::GraphBuilder& g, const Key& key, cudnnDataType_t type) {
  const Dims sd{key.batch, key.heads, key.q_len, key.kv_len}, ss = contiguous_strides(sd);
  const Dims od{key.batch, key.heads, key.q_len, key.dim};
  operand(g, kQ, key, key.q, key.q_len, false, type);
  operand(g, kK, key, key.k, key.kv_len, true, type);
  operand(g, kV, key, key.v, key.kv_len, false, type);
  g.tensor(kO, od, contiguous_strides(od), type);
  g.tensor(kStats, row_dims(key), row_strides(key), CUDNN_DATA_FLOAT);
  g.scalar(kScale, CUDNN_DATA_FLOAT);
  if (key.causal) g.scalar(kNegInf, CUDNN_DATA_FLOAT);
  int64_t next = kVirtual;
  const int64_t s0 = next++, s1 = next++;
  g.virtual_tensor(s0, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(s1, sd, ss, CUDNN_DATA_FLOAT);
  g.matmul(s0, kQ, kK);
  g.pointwise(CUDNN_POINTWISE_MUL, s1, s0, kScale);
  const int64_t s = key.causal ? causal_mask(g, s1, sd, ss, next) : s1;
  const int64_t m = next++, centered = next++, e = next++, l = next++, log_l = next++, p = next++;
  g.virtual_tensor(m, row_dims(key), row_strides(key), CUDNN_DATA_FLOAT);
  g.virtual_tensor(centered, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(e, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(l, row_dims(key), row_strides(key), CUDNN_DATA_FLOAT);
  g.virtual_tensor(log_l, row_dims(key), row_strides(key), CUDNN_DATA_FLOAT);
  g.virtual_tensor(p, sd, ss, type);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, m, s);
  g.pointwise(CUDNN_POINTWISE_SUB, centered, s, m);
  g.pointwise(CUDNN_POINTWISE_EXP, e, centered);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, l, e);
  g.pointwise(CUDNN_POINTWISE_LOG, log_l, l);
  g.pointwise(CUDNN_POINTWISE_ADD, kStats, m, log_l);
  g.pointwise(CUDNN_POINTWISE_DIV, p, e, l);
  g.matmul(kO, p, kV);
}

void backward_graph(cudnn_graph::GraphBuilder& g, const Key& key, cudnnDataType_t type) {
  const Dims sd{key.batch, key.heads, key.q_len, key.kv_len}, ss = contiguous_strides(sd);
  // The transposed (batch, heads, kv_len, q_len) view of a scores-shaped tensor.
  const Dims td{key.batch, key.heads, key.kv_len, key.q_len};
  const Dims ts{key.heads * key.q_len * key.kv_len, key.q_len * key.kv_len, 1, key.kv_len};
  const Dims qd{key.batch, key.heads, key.q_len, key.dim},
      kd{key.batch, key.heads, key.kv_len, key.dim};
  operand(g, kQ, key, key.q, key.q_len, false, type);
  operand(g, kK, key, key.k, key.kv_len, true, type);
  operand(g, kV, key, key.v, key.kv_len, true, type);
  g.tensor(kO, qd, contiguous_strides(qd), type);
  g.tensor(kGradO, qd, contiguous_strides(qd), type);
  g.tensor(kStats, row_dims(key), row_strides(key), CUDNN_DATA_FLOAT);
  g.tensor(kGradQ, qd, contiguous_strides(qd), type);
  g.tensor(kGradK, kd, contiguous_strides(kd), type);
  g.tensor(kGradV, kd, contiguous_strides(kd), type);
  g.tensor(kRowDot, row_dims(key), row_strides(key), CUDNN_DATA_FLOAT);
  g.tensor(kGradQAccum, qd, contiguous_strides(qd), CUDNN_DATA_FLOAT);
  g.scalar(kScale, CUDNN_DATA_FLOAT);
  g.scalar(kOne, CUDNN_DATA_FLOAT);
  if (key.causal) g.scalar(kNegInf, CUDNN_DATA_FLOAT);
  int64_t next = kVirtual;
  // D = rowsum(gout * out)
  const int64_t go_o = next++, dot = next++;
  g.virtual_tensor(go_o, qd, contiguous_strides(qd), CUDNN_DATA_FLOAT);
  g.virtual_tensor(dot, row_dims(key), row_strides(key), CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_MUL, go_o, kGradO, kO);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dot, go_o);
  g.pointwise(CUDNN_POINTWISE_MUL, kRowDot, dot, kOne);
  // p = exp(q k^T * scale - lse), masked; gv = p^T gout
  const int64_t s0 = next++, s1 = next++, s2 = next++;
  g.virtual_tensor(s0, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(s1, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(s2, sd, ss, CUDNN_DATA_FLOAT);
  g.matmul(s0, kQ, kK);
  g.pointwise(CUDNN_POINTWISE_MUL, s1, s0, kScale);
  g.pointwise(CUDNN_POINTWISE_SUB, s2, s1, kStats);
  const int64_t s = key.causal ? causal_mask(g, s2, sd, ss, next) : s2;
  const int64_t p = next++, p_t = next++;
  g.virtual_tensor(p, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(p_t, td, ts, type);
  g.pointwise(CUDNN_POINTWISE_EXP, p, s);
  g.reshape(p_t, p);
  g.matmul(kGradV, p_t, kGradO);
  // gs = p * (gout v^T - D) * scale; gk = gs^T q
  const int64_t gp = next++, centered = next++, gs0 = next++, gs = next++, gs_t = next++;
  g.virtual_tensor(gp, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(centered, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(gs0, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(gs, sd, ss, CUDNN_DATA_FLOAT);
  g.virtual_tensor(gs_t, td, ts, type);
  g.matmul(gp, kGradO, kV);
  g.pointwise(CUDNN_POINTWISE_SUB, centered, gp, kRowDot);
  g.pointwise(CUDNN_POINTWISE_MUL, gs0, centered, p);
  g.pointwise(CUDNN_POINTWISE_MUL, gs, gs0, kScale);
  g.reshape(gs_t, gs);
  g.matmul(kGradK, gs_t, kQ);
  // gq = gs k, through the float32 accumulator
  const int64_t k_rows = next++;
  g.virtual_tensor(k_rows, kd, {key.k[0], key.k[1], key.k[2], key.k[3]}, type);
  g.reshape(k_rows, kK);
  g.matmul(kGradQAccum, gs, k_rows);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, kGradQ, kGradQAccum);
}

/// The plan of `key` on `device` (null when cuDNN has none, said once).
std::shared_ptr<const cudnn_graph::Plan> plan_for(int device, const Key& key) {
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.plans.find({device, key});
    if (it != c.plans.end()) return it->second.plan;
  }
  const cudnnDataType_t type = key.dtype == Dtype::kFloat16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
  std::shared_ptr<const cudnn_graph::Plan> plan;
  std::string why;
  try {
    cudnn_graph::GraphBuilder g;
    if (key.backward) {
      backward_graph(g, key, type);
    } else {
      forward_graph(g, key, type);
    }
    cudnn_graph::EngineFilter filter;
    filter.allow_runtime_compilation = true;
    filter.allow_down_convert =
        true;  // p and gs are rounded to the data's dtype for their products
    filter.deterministic = key.backward && cudnn_graph::deterministic_mode();
    WorkspaceLease guard = cudnn_workspace(device, 0);  // the handle's lock
    auto plans = g.plans(cudnn_handle(device), filter,
                         static_cast<int64_t>(kMaxCudnnWorkspaceBytes), 1, &why);
    if (!plans.empty()) plan = plans.front();
  } catch (const Error& e) {
    why = e.what();
  }
  if (!plan) {
    static std::once_flag once;
    std::call_once(once, [&] {
      std::fprintf(stderr,
                   "kusari: cuDNN has no fused attention plan for the %s of %s (batch %lld, heads "
                   "%lld, q_len %lld, "
                   "kv_len %lld, head dim %lld%s): %s; such calls run composed (said once)\n",
                   key.backward ? "backward" : "forward", dtype_name(key.dtype),
                   static_cast<long long>(key.batch), static_cast<long long>(key.heads),
                   static_cast<long long>(key.q_len), static_cast<long long>(key.kv_len),
                   static_cast<long long>(key.dim), key.causal ? ", causal" : "", why.c_str());
    });
  }
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.plans.size() >= kMaxCachedPlans) c.plans.clear();
  c.plans.insert_or_assign({device, key}, Entry{plan});
  return plan;
}

/// Whether the fused kernel takes the call (Note [cuDNN fused attention]).
bool takes(const Array& q, const Array* mask, const kernels::AttentionParams& p) {
  return enabled() && (q.dtype() == Dtype::kFloat16 || q.dtype() == Dtype::kBFloat16) &&
         mask == nullptr && p.dropout == 0.0 && p.v_dim == p.head_dim && p.head_dim % 8 == 0 &&
         p.head_dim <= 128 && (!p.causal || p.q_len == p.kv_len) && p.q_len >= kMinQueries;
}

Key key_of(bool backward, const Array& q, const Array& k, const Array& v,
           const kernels::AttentionParams& p) {
  Key key;
  key.backward = backward;
  key.dtype = q.dtype();
  key.batch = p.batch;
  key.heads = p.heads;
  key.q_len = p.q_len;
  key.kv_len = p.kv_len;
  key.dim = p.head_dim;
  key.causal = p.causal;
  key.q = strides4(q);
  key.k = strides4(k);
  key.v = strides4(v);
  return key;
}

/// Runs `plan` with the variant pack `uids` -> `pointers`, plus the -inf scalar where the causal
/// mask uses it (the pack names exactly the graph's tensors), on a workspace of the device's.
void run_plan(const cudnn_graph::Plan& plan, int device, bool causal, std::vector<int64_t> uids,
              std::vector<void*> pointers, const char* what) {
  float neg_inf = -std::numeric_limits<float>::infinity();
  if (causal) {
    uids.push_back(kNegInf);
    pointers.push_back(&neg_inf);
  }
  WorkspaceLease ws =
      cudnn_workspace(device, static_cast<size_t>(std::max<int64_t>(plan.workspace(), 256)));
  plan.execute(cudnn_handle(device), uids.data(), pointers.data(),
               static_cast<int64_t>(uids.size()), ws.ptr, what);
}

bool attention_forward(const Array& q_in, const Array& k_in, const Array& v_in, const Array* mask,
                       const kernels::AttentionParams& p, Array& out, Array& lse) {
  if (!takes(q_in, mask, p)) return false;
  const Array q = usable(q_in), k = usable(k_in), v = usable(v_in);
  const int device = q.device().index();
  set_device(device);
  const Key key = key_of(false, q, k, v, p);
  const auto plan = plan_for(device, key);
  if (!plan) return false;
  float scale = static_cast<float>(p.scale);
  std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> pointers = {q.raw_data(),   k.raw_data(),   v.raw_data(),
                                 out.raw_data(), lse.raw_data(), &scale};
  run_plan(*plan, device, p.causal, uids, pointers, "fused attention forward");
  return true;
}

bool attention_backward(const Array& q_in, const Array& k_in, const Array& v_in, const Array* mask,
                        const Array& out, const Array& gout, const Array& lse,
                        const kernels::AttentionParams& p, Array& gq, Array& gk, Array& gv) {
  if (!takes(q_in, mask, p)) return false;
  const Array q = usable(q_in), k = usable(k_in), v = usable(v_in);
  const int device = q.device().index();
  set_device(device);
  const Key key = key_of(true, q, k, v, p);
  const auto plan = plan_for(device, key);
  if (!plan) return false;
  Array row_dot = Array::empty({p.batch, p.heads, p.q_len}, Dtype::kFloat32, q.device());
  Array gq_accum =
      Array::empty({p.batch, p.heads, p.q_len, p.head_dim}, Dtype::kFloat32, q.device());
  float scale = static_cast<float>(p.scale), one = 1.0f;
  std::vector<int64_t> uids = {kQ,     kK,     kV,      kO,          kGradO, kStats, kGradQ,
                               kGradK, kGradV, kRowDot, kGradQAccum, kScale, kOne};
  std::vector<void*> pointers = {
      q.raw_data(),        k.raw_data(),  v.raw_data(),  out.raw_data(), gout.raw_data(),
      lse.raw_data(),      gq.raw_data(), gk.raw_data(), gv.raw_data(),  row_dot.raw_data(),
      gq_accum.raw_data(), &scale,        &one};
  run_plan(*plan, device, p.causal, uids, pointers, "fused attention backward");
  return true;
}

}  // namespace

void register_cuda_attention_kernels() {
  kernels::attention_forward.set(DeviceType::kCUDA, &attention_forward);
  kernels::attention_backward.set(DeviceType::kCUDA, &attention_backward);
}

}  // namespace kusari::cuda
