// The fused batch normalization kernels on the GPU against the CPU's (Note [Batch norm kernel
// geometry] covers both the planar and the channels-minor kernels): training forward with the
// residual and relu epilogue, running statistics, every gradient, and eval mode, for float32,
// bfloat16 and float16 data in NCHW and channels-last, at odd and at ResNet-like sizes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kusari/functions.h"

namespace kusari {
namespace {

namespace F = functions;
using testing::CudaTest;
using testing::GpuMatchesCpu;

class CudaBatchNorm : public CudaTest {};

struct Outputs {
  Array y, gx, ggamma, gbeta, gresidual, running_mean, running_var;
};

Outputs train_step(const Array& x, const Array& gamma, const Array& beta, const Array& residual,
                   const Array& gy, bool relu, Device device) {
  Variable vx(x.to_device(device), true), vg(gamma.to_device(device), true),
      vb(beta.to_device(device), true), vr(residual.to_device(device), true);
  Array rm = Array::zeros(gamma.shape(), gamma.dtype(), device);
  Array rv = Array::ones(gamma.shape(), gamma.dtype(), device);
  Variable y = relu ? F::batch_normalization_relu(vx, vg, vb, vr, 1e-5, &rm, &rv, 0.9)
                    : F::batch_normalization(vx, vg, vb, 1e-5, &rm, &rv, 0.9);
  y.set_grad(gy.to_device(device));
  y.backward();
  return {y.data(), vx.grad(), vg.grad(), vb.grad(), relu ? vr.grad() : Array(), rm, rv};
}

testing::Tolerance tol(Dtype d) {
  if (d == float32) return {1e-4, 1e-4};
  return {2e-2, 2e-2};  // one rounding of a 16-bit output either way
}

TEST_F(CudaBatchNorm, FusedKernelsMatchTheCpu) {
  struct Case {
    Shape shape;
    bool channels_last;
  };
  const std::vector<Case> cases = {
      {{3, 5, 7, 9}, false},  {{3, 5, 7, 9}, true},      {{1, 33, 1, 1}, false},
      {{2, 33}, false},       {{32, 64, 14, 14}, false}, {{32, 64, 14, 14}, true},
      {{8, 256, 7, 7}, true}, {{4, 3, 56, 56}, false},   {{4, 130, 5, 3}, true},
      // Channels-last shapes of the pack kernels (Note [Batch norm packs]): several tiles of 64
      // packs per row, a last tile with one pack, and fewer packs per row than a warp.
      {{2, 2048, 3, 3}, true}, {{3, 520, 5, 5}, true},  {{5, 24, 7, 9}, true},
  };
  uint64_t seed = 1;
  for (Dtype d : {float32, bfloat16, float16}) {
    for (const Case& c : cases) {
      for (bool relu : {false, true}) {
        const std::string what =
            detail::concat(dtype_name(d), " ", c.shape, c.channels_last ? " channels-last" : "",
                           relu ? " + residual, relu" : "");
        SCOPED_TRACE(what);
        auto layout = [&c](Array a) {
          return c.channels_last ? a.to_memory_format(MemoryFormat::kChannelsLast) : a;
        };
        const int64_t ch = c.shape[1];
        const Array x = layout(testing::random_array(c.shape, float64, -2, 3, seed++).astype(d));
        const Array r = layout(testing::random_array(c.shape, d, -1, 1, seed++));
        const Array gy = layout(testing::random_array(c.shape, d, -1, 1, seed++));
        const Array gamma = testing::random_array({ch}, float32, 0.5, 1.5, seed++);
        const Array beta = testing::random_array({ch}, float32, -0.5, 0.5, seed++);

        const Outputs cpu = train_step(x, gamma, beta, r, gy, relu, Device::cpu());
        const Outputs gpu = train_step(x, gamma, beta, r, gy, relu, Device::cuda(0));
        const testing::Tolerance t = tol(d);
        EXPECT_TRUE(GpuMatchesCpu(gpu.y, cpu.y, t));
        EXPECT_EQ(gpu.y.memory_format(), cpu.y.memory_format());
        EXPECT_TRUE(GpuMatchesCpu(gpu.running_mean, cpu.running_mean, {1e-5, 1e-6}));
        EXPECT_TRUE(GpuMatchesCpu(gpu.running_var, cpu.running_var, {1e-4, 1e-6}));
        // An output within rounding of 0 may fall on the relu's other side on one device: the
        // gradients there are compared with that element left out.
        Array agree = Array::ones(c.shape, bool_, Device::cpu());
        if (relu) {
          agree = equal(greater(gpu.y.to_device(Device::cpu()), 0.0), greater(cpu.y, 0.0));
        }
        auto masked = [&agree](const Array& a) {
          return where(agree, a.to_device(Device::cpu()).astype(float64), 0.0)
              .to_device(Device::cuda(0));
        };
        const testing::Tolerance tg{t.rtol, t.atol * 4};
        EXPECT_TRUE(GpuMatchesCpu(masked(gpu.gx), masked(cpu.gx).to_device(Device::cpu()), tg));
        EXPECT_TRUE(GpuMatchesCpu(gpu.ggamma.astype(float64), cpu.ggamma.astype(float64),
                                  {t.rtol, t.atol * 16}));
        EXPECT_TRUE(GpuMatchesCpu(gpu.gbeta.astype(float64), cpu.gbeta.astype(float64),
                                  {t.rtol, t.atol * 16}));
        if (relu) {
          EXPECT_TRUE(GpuMatchesCpu(masked(gpu.gresidual),
                                    masked(cpu.gresidual).to_device(Device::cpu()), t));
        }
      }
    }
  }
}

TEST_F(CudaBatchNorm, EvalModeMatchesTheCpu) {
  uint64_t seed = 100;
  for (Dtype d : {float32, bfloat16, float16}) {
    for (bool cl : {false, true}) {
      SCOPED_TRACE(detail::concat(dtype_name(d), cl ? " channels-last" : ""));
      Array x = testing::random_array({1, 48, 9, 7}, d, -2, 2, seed++);
      if (cl) x = x.to_memory_format(MemoryFormat::kChannelsLast);
      const Array gamma = testing::random_array({48}, d, 0.5, 1.5, seed++);
      const Array beta = testing::random_array({48}, d, -1, 1, seed++);
      const Array mean = testing::random_array({48}, d, -1, 1, seed++);
      const Array var = testing::random_array({48}, d, 0.5, 2, seed++);
      auto run = [&](Device dev) {
        return F::fixed_batch_normalization(
                   Variable(x.to_device(dev)), Variable(gamma.to_device(dev)),
                   Variable(beta.to_device(dev)), Variable(mean.to_device(dev)),
                   Variable(var.to_device(dev)), 1e-5)
            .data();
      };
      EXPECT_TRUE(GpuMatchesCpu(run(Device::cuda(0)), run(Device::cpu()), tol(d)));
    }
  }
}

}  // namespace
}  // namespace kusari
