#include "kusari/functions/attention.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <string>

#include "functions/function_util.h"
#include "kusari/autograd/mode.h"
#include "kusari/core/routines.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"
#include "routines/attention.h"

namespace kusari::functions {

namespace {

constexpr const char* kFn = "scaled_dot_product_attention";

// The checked geometry of one call, its kernel parameters and its 4-d operands.
struct AttentionCall {
  kernels::AttentionParams p;
  bool three_d = false;
  Array mask;        // broadcast to (batch, heads, q_len, kv_len), or undefined
  uint64_t seed = 0;  // the dropout generator's seed (counter in p)
};

Variable as_4d(const Variable& x) { return x.ndim() == 4 ? x : reshape(x, {x.shape()[0], 1, x.shape()[1], x.shape()[2]}); }

AttentionCall check_call(const Variable& q, const Variable& k, const Variable& v, const AttentionOptions& o) {
  for (const auto& [name, x] : {std::pair<const char*, const Variable*>{"q", &q}, {"k", &k}, {"v", &v}}) {
    KUSARI_CHECK(x->defined(), ValueError, kFn, ": ", name, " is undefined");
    detail::check_floating(kFn, *x);
    KUSARI_CHECK(x->ndim() == 3 || x->ndim() == 4, ShapeError, kFn, ": ", name, " must be (batch, heads, length, dim) "
                 "or (batch, length, dim), got shape ", x->shape());
    KUSARI_CHECK(x->ndim() == q.ndim(), ShapeError, kFn, ": q of shape ", q.shape(), " and ", name, " of shape ",
                 x->shape(), " differ in their number of axes");
    KUSARI_CHECK(x->dtype() == q.dtype(), DtypeError, kFn, ": ", name, " is ", dtype_name(x->dtype()), " but q is ",
                 dtype_name(q.dtype()));
    KUSARI_CHECK(x->device() == q.device(), DeviceError, kFn, ": ", name, " is on ", x->device(), " but q is on ",
                 q.device());
  }
  const int n = q.ndim();
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  KUSARI_CHECK(qs[n - 1] == ks[n - 1], ShapeError, kFn, ": q's head dim ", qs[n - 1], " differs from k's ",
               ks[n - 1], " (q of shape ", qs, ", k of shape ", ks, ")");
  KUSARI_CHECK(ks[n - 2] == vs[n - 2], ShapeError, kFn, ": k has ", ks[n - 2], " keys but v has ", vs[n - 2],
               " values (k of shape ", ks, ", v of shape ", vs, ")");
  for (int d = 0; d < n - 2; ++d) {
    KUSARI_CHECK(qs[d] == ks[d] && qs[d] == vs[d], ShapeError, kFn, ": the batch and head axes of q ", qs, ", k ", ks,
                 " and v ", vs, " must be equal");
  }
  KUSARI_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, ValueError, kFn, ": dropout must be in [0, 1), got ", o.dropout);
  AttentionCall c;
  c.three_d = n == 3;
  kernels::AttentionParams& p = c.p;
  p.batch = qs[0];
  p.heads = n == 4 ? qs[1] : 1;
  p.q_len = qs[n - 2];
  p.kv_len = ks[n - 2];
  p.head_dim = qs[n - 1];
  p.v_dim = vs[n - 1];
  p.scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(p.head_dim, 1)));
  KUSARI_CHECK(std::isfinite(p.scale), ValueError, kFn, ": scale must be finite, got ", p.scale);
  p.causal = o.causal;
  p.dropout = is_train_mode() ? o.dropout : 0.0;
  if (o.mask.defined()) {
    KUSARI_CHECK(o.mask.dtype() == Dtype::kBool || o.mask.dtype() == q.dtype(), DtypeError, kFn, ": the mask is ",
                 dtype_name(o.mask.dtype()), "; expected bool (true: attend) or q's dtype ", dtype_name(q.dtype()),
                 " (added to the scores)");
    KUSARI_CHECK(o.mask.device() == q.device(), DeviceError, kFn, ": the mask is on ", o.mask.device(),
                 " but q is on ", q.device());
    const Shape full{p.batch, p.heads, p.q_len, p.kv_len};
    bool ok = o.mask.ndim() <= 4;
    for (int d = 0; ok && d < o.mask.ndim(); ++d) {
      const int64_t m = o.mask.shape()[o.mask.ndim() - 1 - d], f = full[3 - d];
      ok = m == f || m == 1;
    }
    KUSARI_CHECK(ok, ShapeError, kFn, ": a mask of shape ", o.mask.shape(), " does not broadcast to (batch, heads, "
                 "q_len, kv_len) = ", full);
    c.mask = o.mask.broadcast_to(full);
  }
  return c;
}

// Note [Attention paths]
// On a device with attention kernels (the CPU's blocked ones, a GPU's cuDNN fused attention:
// Note [cuDNN fused attention]) the forward and the first-order backward run there. Otherwise
// (a kernel declines what it does not take, as float32 or a mask on a GPU), and for double
// backprop, attention is composed: the scores, a softmax and the products, holding the (batch,
// heads, q_len, kv_len) weights. On a GPU that is a fallback the user should know about, so it
// is said once per process (to stderr).
void note_gpu_fallback(const Device& device, Dtype dtype) {
  static std::once_flag once;
  std::call_once(once, [&] {
    std::fprintf(
        stderr,
        "kusari: scaled_dot_product_attention has no fused kernel for this call (%s on %s; the "
        "fused "
        "one takes float16 and bfloat16 without a mask or dropout, see docs/transformers.md); it "
        "is "
        "composed from matmul and softmax, which holds a (batch, heads, q_len, kv_len) matrix "
        "(said once)\n",
        dtype_name(dtype), device.str().c_str());
  });
}

// The dropout factors (0 or 1 / (1 - dropout)) of the call, as the kernels draw them.
Array keep_factors(const AttentionCall& c, Dtype dtype, const Device& device) {
  Generator g(c.seed);
  g.set_offset(c.p.counter);
  const Shape full{c.p.batch, c.p.heads, c.p.q_len, c.p.kv_len};
  Array u = Array::uniform(full, 0.0, 1.0, Dtype::kFloat32, device, &g);
  return kusari::greater_equal(u, c.p.dropout).astype(dtype) * (1.0 / (1.0 - c.p.dropout));
}

// The most negative finite value of a floating dtype.
double lowest_finite(Dtype dtype) {
  switch (dtype) {
    case Dtype::kFloat16: return -65504.0;
    case Dtype::kBFloat16: return -3.3895313892515355e38;
    case Dtype::kFloat32: return static_cast<double>(std::numeric_limits<float>::lowest());
    default: return std::numeric_limits<double>::lowest();
  }
}

// The attention weights softmax(scores), composed with differentiable functions of q and k
// (4-d); rows with no attended key are 0.
Variable composed_weights(const Variable& q, const Variable& k, const AttentionCall& c) {
  const kernels::AttentionParams& p = c.p;
  Variable s = mul(matmul(q, k, false, true), p.scale);
  Array attend;  // bool (batch or 1, heads or 1, q_len, kv_len), or undefined: all attend
  if (p.causal) {
    Array i = Array::arange(p.q_len, Dtype::kInt64, q.device()).reshape({p.q_len, 1});
    Array j = Array::arange(p.kv_len, Dtype::kInt64, q.device()).reshape({1, p.kv_len});
    attend = kusari::less_equal(j, i + (p.kv_len - p.q_len));
  }
  if (c.mask.defined()) {
    if (c.mask.dtype() == Dtype::kBool) {
      attend = attend.defined() ? kusari::logical_and(attend, c.mask) : c.mask;
    } else {
      s = add(s, Variable(c.mask));
    }
  }
  if (!attend.defined()) return softmax(s, 3);
  const Shape full{p.batch, p.heads, p.q_len, p.kv_len};
  Array attend_full = attend.broadcast_to(full);
  // Not -inf: a row with nothing attended would give NaN weights, and NaN gradients even where
  // the row's output is replaced by 0 (Note [Attention paths]).
  Variable lowest(Array::full({1}, lowest_finite(s.dtype()), s.dtype(), s.device()));
  Variable w = softmax(where(attend_full, s, broadcast_to(lowest, full)), 3);
  Array any_row = kusari::any(attend_full, {3}, true).broadcast_to(full);
  return where(any_row, w, Variable(Array::zeros(full, s.dtype(), s.device())));
}

Variable composed_attention(const Variable& q, const Variable& k, const Variable& v, const AttentionCall& c) {
  Variable w = composed_weights(q, k, c);
  if (c.p.dropout > 0.0) w = mul(w, Variable(keep_factors(c, q.dtype(), q.device())));
  return matmul(w, v);
}

// Note [Attention gradients]
// With w the weights, w_d = w * keep (keep the dropout factors, 1 without dropout) and the output
// gradient g: gv = w_d^T g, gw = (g v^T) * keep, gs = w * (gw - rowsum(gw * w)), gq = gs k * scale,
// gk = gs^T q * scale. Written with differentiable functions, so this rule (used for double
// backprop and by the composed path) can itself be differentiated.
void composed_backward(BackwardContext& ctx, const AttentionCall& c) {
  Variable q = ctx.input(0), k = ctx.input(1), v = ctx.input(2);
  const Variable& g = ctx.output_grad();
  Variable w = composed_weights(q, k, c);
  Variable wd = w, keep;
  if (c.p.dropout > 0.0) {
    keep = Variable(keep_factors(c, q.dtype(), q.device()));
    wd = mul(w, keep);
  }
  if (ctx.needs_input_grad(2)) ctx.set_input_grad(2, matmul(wd, g, true, false));
  if (ctx.needs_input_grad(0) || ctx.needs_input_grad(1)) {
    Variable gw = matmul(g, v, false, true);
    if (keep.defined()) gw = mul(gw, keep);
    Variable gs = mul(mul(w, sub(gw, sum(mul(gw, w), {3}, true))), c.p.scale);
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, matmul(gs, k));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, matmul(gs, q, true, false));
  }
}

}  // namespace

Variable scaled_dot_product_attention(const Variable& q_in, const Variable& k_in, const Variable& v_in,
                                      const AttentionOptions& options) {
  AttentionCall c = check_call(q_in, k_in, v_in, options);
  const Variable q = as_4d(q_in), k = as_4d(k_in), v = as_4d(v_in);
  if (c.p.dropout > 0.0) {
    Generator& gen = options.generator ? *options.generator : default_generator();
    const auto key = gen.key();
    c.p.key0 = key[0];
    c.p.key1 = key[1];
    c.seed = gen.seed();
    const uint64_t n = static_cast<uint64_t>(c.p.batch * c.p.heads * c.p.q_len * c.p.kv_len);
    c.p.counter = gen.advance((n + 3) / 4);
  }
  Variable out;
  if (options.path != AttentionPath::kComposed) {
    Array lse;
    Array y = routines::attention_forward(q.data(), k.data(), v.data(), c.mask.defined() ? &c.mask : nullptr, c.p,
                                          lse);
    if (y.defined()) {
      auto rule = [c, lse, y](BackwardContext& ctx) {
        if (!ctx.is_double_backprop()) {
          Array gq, gk, gv;
          if (routines::attention_backward(ctx.input(0).data(), ctx.input(1).data(), ctx.input(2).data(),
                                           c.mask.defined() ? &c.mask : nullptr, y, ctx.output_grad().data(), lse,
                                           c.p, gq, gk, gv)) {
            if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, Variable(std::move(gq)));
            if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, Variable(std::move(gk)));
            if (ctx.needs_input_grad(2)) ctx.set_input_grad(2, Variable(std::move(gv)));
            return;
          }
        }
        composed_backward(ctx, c);
      };
      out = record(kFn, {q, k, v}, y, std::move(rule));
    } else {
      KUSARI_CHECK(options.path != AttentionPath::kFused, NotImplementedError, kFn,
                   ": AttentionPath::kFused was "
                   "asked for, but ",
                   q.device(), " has no attention kernel that takes this call (",
                   dtype_name(q.dtype()), ", q ", q.shape(), ", k ", k.shape(), ", v ", v.shape(),
                   c.mask.defined() ? ", a mask" : "", c.p.dropout > 0 ? ", dropout" : "",
                   c.p.causal ? ", causal" : "",
                   "); see docs/transformers.md "
                   "for what the fused kernels take, or use AttentionPath::kAuto or kComposed");
      if (q.device().type() != DeviceType::kCPU) note_gpu_fallback(q.device(), q.dtype());
    }
  }
  if (!out.defined()) {
    out = record(kFn, {q, k, v}, composed_attention(Variable(q.data()), Variable(k.data()), Variable(v.data()), c).data(),
                 [c](BackwardContext& ctx) { composed_backward(ctx, c); });
  }
  if (c.three_d) out = reshape(out, {c.p.batch, c.p.q_len, c.p.v_dim});
  return out;
}

}  // namespace kusari::functions
