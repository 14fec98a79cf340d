// The fused layer and RMS normalization kernels on the GPU against the CPU's (Note [Layer norm
// kernel geometry]): forward, gx and the parameters' gradients, for float32, bfloat16 and float16
// data with float32 parameters, rows shorter than a warp, between the two block sizes, longer
// than a block, and many rows (several splits of the column sums). Also the activations' and
// attention's GPU paths against the CPU.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::CudaTest;
using testing::GpuMatchesCpu;

class CudaTransformerFunctions : public CudaTest {};

struct NormOutputs {
  Array y, gx, ggamma, gbeta;
};

NormOutputs norm_step(const Array& x, const Array& gamma, const Array& beta, const Array& gy, bool rms,
                      Device device) {
  Variable vx(x.to_device(device), true), vg(gamma.to_device(device), true), vb(beta.to_device(device), true);
  Variable y = rms ? F::rms_normalization(vx, vg) : F::layer_normalization(vx, vg, vb);
  y.set_grad(gy.to_device(device));
  y.backward();
  return {y.data(), vx.grad(), vg.grad(), rms ? Array() : vb.grad()};
}

testing::Tolerance tol(Dtype d) {
  if (d == float32) return {1e-4, 1e-4};
  return {2e-2, 3e-2};  // one rounding of a 16-bit value either way
}

TEST_F(CudaTransformerFunctions, LayerNormKernelsMatchTheCpu) {
  const std::vector<Shape> shapes = {{3, 1}, {5, 7}, {4, 33}, {2, 3, 768}, {6, 1025}, {2, 5000}, {4100, 64}};
  Generator gen(3);
  for (Dtype d : {float32, bfloat16, float16}) {
    for (const Shape& s : shapes) {
      for (bool rms : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(d)) + " " + (rms ? "rms " : "layer ") + s.to_string());
        const int64_t cols = s[s.size() - 1];
        Array x = (Array::uniform(s, -2, 2, float32, Device::cpu(), &gen) + 3.0).astype(d);
        Array gamma = Array::uniform({cols}, 0.5, 1.5, float32, Device::cpu(), &gen);
        Array beta = Array::uniform({cols}, -1, 1, float32, Device::cpu(), &gen);
        Array gy = Array::uniform(s, -1, 1, float32, Device::cpu(), &gen).astype(d);
        NormOutputs cpu = norm_step(x, gamma, beta, gy, rms, Device::cpu());
        NormOutputs gpu = norm_step(x, gamma, beta, gy, rms, Device::cuda(0));
        EXPECT_TRUE(GpuMatchesCpu(gpu.y, cpu.y, tol(d)));
        EXPECT_TRUE(GpuMatchesCpu(gpu.gx, cpu.gx, tol(d)));
        // Column sums over up to 4100 rows of 16-bit products: relative to the sum's size.
        EXPECT_TRUE(GpuMatchesCpu(gpu.ggamma, cpu.ggamma, {1e-3, 1e-2}));
        if (!rms) EXPECT_TRUE(GpuMatchesCpu(gpu.gbeta, cpu.gbeta, {1e-3, 1e-2}));
      }
    }
  }
}

TEST_F(CudaTransformerFunctions, ActivationsAndAttentionMatchTheCpu) {
  Generator gen(5);
  Array x = Array::uniform({1000}, -6, 6, float32, Device::cpu(), &gen);
  for (bool tanh_form : {false, true}) {
    Variable a(x, true), b(x.to_device(Device::cuda(0)), true);
    F::sum(F::gelu(a, tanh_form)).backward();
    F::sum(F::gelu(b, tanh_form)).backward();
    EXPECT_TRUE(GpuMatchesCpu(b.grad(), a.grad(), {1e-5, 1e-6}));
  }
  Variable a(x, true), b(x.to_device(Device::cuda(0)), true);
  F::sum(F::silu(a)).backward();
  F::sum(F::silu(b)).backward();
  EXPECT_TRUE(GpuMatchesCpu(b.grad(), a.grad(), {1e-5, 1e-6}));
  // Attention with a causal mask and a key padding mask, forward and backward.
  Array q = Array::uniform({2, 3, 40, 16}, -1, 1, float32, Device::cpu(), &gen);
  Array k = Array::uniform({2, 3, 50, 16}, -1, 1, float32, Device::cpu(), &gen);
  Array v = Array::uniform({2, 3, 50, 8}, -1, 1, float32, Device::cpu(), &gen);
  Array pad = kusari::greater(Array::uniform({2, 1, 1, 50}, 0, 1, float32, Device::cpu(), &gen), 0.1);
  std::vector<Array> grads[2];
  Array ys[2];
  for (int i = 0; i < 2; ++i) {
    const Device dev = i == 0 ? Device::cpu() : Device::cuda(0);
    Variable vq(q.to_device(dev), true), vk(k.to_device(dev), true), vv(v.to_device(dev), true);
    F::AttentionOptions o;
    o.causal = true;
    o.mask = pad.to_device(dev);
    Variable y = F::scaled_dot_product_attention(vq, vk, vv, o);
    F::sum(F::square(y)).backward();
    ys[i] = y.data();
    grads[i] = {vq.grad(), vk.grad(), vv.grad()};
  }
  EXPECT_TRUE(GpuMatchesCpu(ys[1], ys[0], {1e-4, 1e-5}));
  for (int j = 0; j < 3; ++j) EXPECT_TRUE(GpuMatchesCpu(grads[1][j], grads[0][j], {1e-4, 1e-5}));
}

}  // namespace
}  // namespace kusari
