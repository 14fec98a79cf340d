// cuDNN's fused attention (Note [cuDNN fused attention]) against the CPU: forward and the three
// gradients for bfloat16 and float16, head dims 64 and 128, causal or not, lengths that are and
// are not multiples of the kernel's tiles, more keys than queries, and q, k, v as strided views
// of one projection (the transformer's layout). AttentionPath::kFused makes a declined call an
// error, so a case the kernel stopped taking fails here instead of passing through the composed
// path. The reference is the CPU's float32 attention of the same 16-bit-rounded inputs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/cuda/libs/cudnn_variant_pack.h"
#include "cuda_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::CudaTest;
using testing::GpuMatchesCpu;

class CudaFusedAttention : public CudaTest {};

struct Result {
  Array y, gq, gk, gv;
};

// q, k, v (batch, heads, length, dim) on `device` in `dtype`, attention, and the gradients of
// sum(y * gy).
Result run(const Array& q, const Array& k, const Array& v, const Array& gy, bool causal,
           Dtype dtype, Device device, F::AttentionPath path) {
  Variable vq(q.astype(dtype).to_device(device), true), vk(k.astype(dtype).to_device(device), true),
      vv(v.astype(dtype).to_device(device), true);
  F::AttentionOptions o;
  o.causal = causal;
  o.path = path;
  Variable y = F::scaled_dot_product_attention(vq, vk, vv, o);
  y.set_grad(gy.astype(dtype).to_device(device));
  y.backward();
  return {y.data(), vq.grad(), vk.grad(), vv.grad()};
}

// The GPU's 16-bit result, widened, against the float32 CPU reference: the kernel rounds the
// probabilities and the score gradients to 16 bits before its products, so the tolerance is a
// few units of the 16-bit format relative to the values' scale.
::testing::AssertionResult close(const Array& gpu, const Array& cpu, Dtype dtype) {
  const double unit = dtype == bfloat16 ? 7.8e-3 : 9.8e-4;
  const double scale = std::max(1e-3, kusari::amax(kusari::abs(cpu)).item<double>());
  return GpuMatchesCpu(gpu.astype(float32), cpu, {4 * unit, 4 * unit * scale});
}

TEST_F(CudaFusedAttention, MatchesTheCpuForwardAndBackward) {
  struct Case {
    int64_t batch, heads, q_len, kv_len, dim;
    bool causal;
  };
  const std::vector<Case> cases = {
      {2, 3, 128, 128, 64, true}, {2, 3, 128, 128, 64, false}, {1, 2, 200, 200, 128, true},
      {1, 2, 77, 77, 64, true},   {2, 1, 100, 150, 64, false}, {1, 4, 256, 256, 128, false},
  };
  Generator gen(11);
  for (Dtype dtype : {bfloat16, float16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " batch " + std::to_string(c.batch) +
                   " heads " + std::to_string(c.heads) + " q_len " + std::to_string(c.q_len) +
                   " kv_len " + std::to_string(c.kv_len) + " dim " + std::to_string(c.dim) +
                   (c.causal ? " causal" : ""));
      const auto rounded = [&](const Shape& s, double lo, double hi) {
        return Array::uniform(s, lo, hi, float32, Device::cpu(), &gen)
            .astype(dtype)
            .astype(float32);
      };
      Array q = rounded({c.batch, c.heads, c.q_len, c.dim}, -2, 2);
      Array k = rounded({c.batch, c.heads, c.kv_len, c.dim}, -2, 2);
      Array v = rounded({c.batch, c.heads, c.kv_len, c.dim}, -1, 1);
      Array gy = rounded({c.batch, c.heads, c.q_len, c.dim}, -1, 1);
      Result cpu = run(q, k, v, gy, c.causal, float32, Device::cpu(), F::AttentionPath::kAuto);
      Result gpu = run(q, k, v, gy, c.causal, dtype, Device::cuda(0), F::AttentionPath::kFused);
      EXPECT_TRUE(close(gpu.y, cpu.y, dtype));
      EXPECT_TRUE(close(gpu.gq, cpu.gq, dtype));
      EXPECT_TRUE(close(gpu.gk, cpu.gk, dtype));
      EXPECT_TRUE(close(gpu.gv, cpu.gv, dtype));
    }
  }
}

// q, k and v as the transformer makes them: one (batch, length, 3, heads, dim) projection, each
// a (batch, heads, length, dim) view with strides (length * 3 * heads * dim, dim, 3 * heads * dim,
// 1).
TEST_F(CudaFusedAttention, TakesStridedViewsOfOneProjection) {
  const int64_t batch = 2, len = 96, heads = 4, dim = 64;
  Generator gen(12);
  Array qkv = Array::uniform({batch, len, 3, heads, dim}, -2, 2, float32, Device::cpu(), &gen)
                  .astype(bfloat16)
                  .astype(float32);
  Array gy = Array::uniform({batch, heads, len, dim}, -1, 1, float32, Device::cpu(), &gen);
  Array out[2], grad[2];
  for (int i = 0; i < 2; ++i) {
    const Device dev = i == 0 ? Device::cpu() : Device::cuda(0);
    const Dtype dt = i == 0 ? float32 : bfloat16;
    Variable x(qkv.astype(dt).to_device(dev), true);
    Variable t = F::transpose(x, {2, 0, 3, 1, 4});  // (3, batch, heads, len, dim), a view
    std::vector<Variable> parts = F::split_axis(t, 3, 0);
    F::AttentionOptions o;
    o.causal = true;
    o.path = i == 0 ? F::AttentionPath::kAuto : F::AttentionPath::kFused;
    Variable y = F::scaled_dot_product_attention(
        F::squeeze(parts[0], {0}), F::squeeze(parts[1], {0}), F::squeeze(parts[2], {0}), o);
    y.set_grad(gy.astype(dt).to_device(dev));
    y.backward();
    out[i] = y.data();
    grad[i] = x.grad();
  }
  EXPECT_TRUE(close(out[1], out[0], bfloat16));
  EXPECT_TRUE(close(grad[1], grad[0], bfloat16));
}

// What the fused kernel does not take runs composed under kAuto (same values) and is an error
// under kFused that names the function.
TEST_F(CudaFusedAttention, DeclinedCallsRunComposedOrFailUnderKFused) {
  Generator gen(13);
  Array q = Array::uniform({1, 2, 32, 64}, -1, 1, float32, Device::cpu(), &gen);
  // float32 has no fused kernel.
  Variable v32(q.to_device(Device::cuda(0)));
  F::AttentionOptions fused;
  fused.path = F::AttentionPath::kFused;
  try {
    F::scaled_dot_product_attention(v32, v32, v32, fused);
    FAIL() << "kFused with float32 data did not throw";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("scaled_dot_product_attention"), std::string::npos)
        << e.what();
  }
  // A head dim that is not a multiple of 8 is declined: composed, with the same values.
  Array odd = Array::uniform({1, 2, 32, 36}, -1, 1, float32, Device::cpu(), &gen).astype(bfloat16);
  Variable vo(odd.to_device(Device::cuda(0)));
  Variable y = F::scaled_dot_product_attention(vo, vo, vo);
  Variable ref = F::scaled_dot_product_attention(
      Variable(odd.astype(float32)), Variable(odd.astype(float32)), Variable(odd.astype(float32)));
  EXPECT_TRUE(close(y.data(), ref.data(), bfloat16));
}

// The check every cuDNN graph execution makes of its variant pack (no GPU needed): cuDNN itself
// refuses a pack with one id too many with a bare "bad parameter".
TEST(CudnnVariantPack, NamesMissingExtraAndRepeatedIds) {
  namespace G = cuda::cudnn_graph;
  const std::vector<int64_t> graph = {1, 2, 5};
  const int64_t exact[] = {5, 1, 2};
  EXPECT_EQ(G::variant_pack_mismatch(graph, exact, 3), "");
  const int64_t extra[] = {1, 2, 5, 9};
  EXPECT_EQ(G::variant_pack_mismatch(graph, extra, 4),
            "uid 9 is not a tensor of the graph (or a virtual one)");
  const int64_t missing[] = {1, 5};
  EXPECT_EQ(G::variant_pack_mismatch(graph, missing, 2), "uid 2 is missing");
  const int64_t twice[] = {1, 2, 2, 2, 5};
  EXPECT_EQ(G::variant_pack_mismatch(graph, twice, 5), "uid 2 is given more than once");
  const int64_t both[] = {1, 7};
  EXPECT_EQ(G::variant_pack_mismatch(graph, both, 2),
            "uid 7 is not a tensor of the graph (or a virtual one); uid 2 is missing; uid 5 is "
            "missing");
  EXPECT_EQ(G::variant_pack_mismatch({}, nullptr, 0), "");
}

}  // namespace
}  // namespace kusari
