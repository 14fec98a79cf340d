// Pooling and convolution on channels-last (NHWC) arrays through their native kernels: the same
// values and gradients as NCHW (pooling bit for bit, convolution within rounding), channels-last
// outputs, CUDA pooling against the CPU, and the oneDNN convolution caches staying correct when
// the filter changes in place (Note [GPU pooling layouts], Note [oneDNN layouts]).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kusari/core/routines.h"
#include "kusari/functions/convolution.h"
#include "kusari/functions/math.h"
#include "kusari/functions/pooling.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;
constexpr MemoryFormat kCL = MemoryFormat::kChannelsLast;
constexpr MemoryFormat kC = MemoryFormat::kContiguous;

/// One pooling configuration.
struct PoolCase {
  bool is_max;
  Shape shape;
  int64_t ksize, stride, pad;
  bool cover_all;
};

std::string describe(const PoolCase& c) {
  std::ostringstream os;
  os << (c.is_max ? "max" : "average") << " x " << c.shape << " ksize " << c.ksize << " stride "
     << c.stride << " pad " << c.pad << " cover_all " << c.cover_all;
  return os.str();
}

std::vector<PoolCase> pool_cases() {
  std::vector<PoolCase> out;
  for (bool is_max : {true, false}) {
    out.push_back({is_max, {2, 3, 7, 9}, 3, 2, 1, false});
    out.push_back({is_max, {3, 5, 5, 6}, 2, 2, 0, false});
    out.push_back({is_max, {1, 17, 6, 5}, 3, 1, 1, false});
    out.push_back({is_max, {2, 4, 7, 7}, 2, 3, 0, false});
    out.push_back({is_max, {2, 6, 4, 4}, 4, 1, 0, false});  // one window: global pooling
    if (is_max) {
      out.push_back({is_max, {2, 3, 7, 9}, 3, 2, 1, true});
      out.push_back({is_max, {2, 5, 5, 8}, 2, 2, 0, true});
    }
  }
  return out;
}

Variable pool(const PoolCase& c, const Variable& x) {
  return c.is_max ? F::max_pooling_2d(x, c.ksize, c.stride, c.pad, c.cover_all)
                  : F::average_pooling_2d(x, c.ksize, c.stride, c.pad);
}

/// y and gx of pooling x in `format`, with the upstream gradient gy given in `gy_format` (only y
/// when gy is undefined).
struct PoolRun {
  Array y, gx;
};

PoolRun run_pool(const PoolCase& c, const Array& x, const Array& gy, MemoryFormat format,
                 MemoryFormat gy_format) {
  Variable v(x.to_memory_format(format), true);
  Variable y = pool(c, v);
  if (!gy.defined()) return {y.data(), Array()};  // the output only
  F::sum(F::mul(y, Variable(gy.to_memory_format(gy_format)))).backward();
  return {y.data(), v.grad()};
}

class LayoutKernelsTest : public testing::DeviceTest {
 protected:
  Array rand(const Shape& s, Dtype dtype = Dtype::kFloat32) {
    return Array::uniform(s, -1.0, 1.0, dtype, device());
  }
};

TEST_P(LayoutKernelsTest, PoolingNhwcEqualsNchwExactly) {
  manual_seed(1);
  for (const PoolCase& c : pool_cases()) {
    for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat64, Dtype::kFloat16}) {
      Array x = rand(c.shape, dtype);
      if (c.is_max) {
        // Ties: the first maximum in window order gets the gradient in both layouts.
        x = floor(x * 4.0);
      }
      const PoolRun ref = run_pool(c, x, Array(), kC, kC);
      const Array gy = Array::uniform(ref.y.shape(), -1.0, 1.0, dtype, device());
      const PoolRun nchw = run_pool(c, x, gy, kC, kC);
      for (MemoryFormat gy_format : {kCL, kC}) {
        const PoolRun nhwc = run_pool(c, x, gy, kCL, gy_format);
        SCOPED_TRACE(describe(c) + " " + dtype_name(dtype) + " gy " +
                     memory_format_name(gy_format));
        EXPECT_TRUE(nhwc.y.is_contiguous(kCL));
        EXPECT_TRUE(nhwc.gx.is_contiguous(kCL));
        if (nhwc.y.shape()[2] * nhwc.y.shape()[3] > 1) EXPECT_EQ(nhwc.y.memory_format(), kCL);
        EXPECT_EQ(nhwc.gx.memory_format(), kCL);
        EXPECT_TRUE(testing::ArraysClose(nhwc.y, nchw.y, 0, 0)) << "values";
        EXPECT_TRUE(testing::ArraysClose(nhwc.gx, nchw.gx, 0, 0)) << "gradients";
      }
    }
  }
}

TEST_P(LayoutKernelsTest, MaxPoolingNaNAndEmptyWindowsInNhwc) {
  // A NaN wins its windows; cover_all with a pad of 2 on a 3x3 window leaves windows without
  // input taps at the end (-inf, no gradient), in both layouts alike.
  std::vector<float> v(2 * 3 * 4 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7) % 11) - 5.0f;
  v[13] = std::numeric_limits<float>::quiet_NaN();
  const Array x = Array::from_vector(v).reshape({2, 3, 4, 5}).to_device(device());
  const PoolCase c{true, {2, 3, 4, 5}, 3, 3, 2, true};
  const PoolRun ref = run_pool(c, x, Array(), kC, kC);
  const Array gy = Array::ones_like(ref.y);
  const PoolRun nchw = run_pool(c, x, gy, kC, kC);
  const PoolRun nhwc = run_pool(c, x, gy, kCL, kCL);
  const std::vector<float> yn = nchw.y.astype(Dtype::kFloat32).to_vector<float>();
  const std::vector<float> yc = nhwc.y.to_memory_format(kC).to_vector<float>();
  ASSERT_EQ(yn.size(), yc.size());
  bool saw_nan = false, saw_inf = false;
  for (size_t i = 0; i < yn.size(); ++i) {
    if (std::isnan(yn[i])) {
      saw_nan = true;
      EXPECT_TRUE(std::isnan(yc[i])) << "output " << i;
    } else {
      saw_inf = saw_inf || std::isinf(yn[i]);
      EXPECT_EQ(yc[i], yn[i]) << "output " << i;
    }
  }
  EXPECT_TRUE(saw_nan);
  EXPECT_TRUE(saw_inf);
  EXPECT_TRUE(testing::ArraysClose(nhwc.gx, nchw.gx, 0, 0));
}

TEST_P(LayoutKernelsTest, ConvolutionNhwcMatchesNchw) {
  manual_seed(2);
  struct ConvCase {
    Shape x, w;
    int stride, pad, groups;
  };
  for (const ConvCase& c : std::vector<ConvCase>{{{2, 3, 9, 7}, {8, 3, 3, 3}, 1, 1, 1},
                                                 {{3, 16, 8, 8}, {32, 16, 3, 3}, 2, 1, 1},
                                                 {{2, 4, 6, 5}, {6, 2, 3, 3}, 1, 0, 2},
                                                 {{1, 32, 7, 7}, {64, 32, 1, 1}, 1, 0, 1}}) {
    SCOPED_TRACE(::testing::Message() << "x " << c.x << " W " << c.w << " stride " << c.stride);
    const Array x = rand(c.x), w = rand(c.w), b = rand({c.w[0]});
    std::vector<Array> outs[2];
    Array gy;
    for (int cl = 0; cl < 2; ++cl) {
      const MemoryFormat f = cl ? kCL : kC;
      Variable vx(x.to_memory_format(f), true), vw(w.to_memory_format(f), true), vb(b, true);
      Variable y = F::convolution_2d(vx, vw, vb, c.stride, c.pad, 1, c.groups);
      if (!gy.defined()) gy = Array::uniform(y.shape(), -1.0, 1.0, Dtype::kFloat32, device());
      F::sum(F::mul(y, Variable(gy.to_memory_format(f)))).backward();
      if (cl) {
        EXPECT_EQ(y.data().memory_format(), y.shape()[2] * y.shape()[3] > 1 ? kCL : kC);
        EXPECT_TRUE(vx.grad().is_contiguous(kCL));
      }
      outs[cl] = {y.data(), vx.grad(), vw.grad(), vb.grad()};
    }
    // cuDNN may pick other algorithms (and reduced-precision math) per layout.
    const double tol = device().is_cpu() ? 1e-5 : 1e-2;
    for (size_t k = 0; k < outs[0].size(); ++k) {
      EXPECT_TRUE(testing::ArraysClose(outs[1][k], outs[0][k], tol, tol)) << "output " << k;
    }
  }
}

TEST_P(LayoutKernelsTest, ConvolutionCachesFollowInPlaceFilterUpdates) {
  // The same geometry with a filter whose storage is updated in place between the calls (as an
  // optimizer does): every call must see the current values, in both layouts.
  manual_seed(3);
  // The filter changes by far more than this between the steps, so a stale one cannot pass.
  const double tol = device().is_cpu() ? 1e-5 : 1e-2;
  for (MemoryFormat f : {kC, kCL}) {
    const Array x = rand({4, 8, 10, 10}).to_memory_format(f);
    Array w = rand({16, 8, 3, 3}).to_memory_format(f);
    for (int step = 0; step < 3; ++step) {
      const Array y = F::convolution_2d(Variable(x), Variable(w), Variable(), 1, 1).data();
      const Array ref =
          F::convolution_2d(Variable(x.to_memory_format(kC)), Variable(w.copy()), Variable(), 1, 1)
              .data();
      EXPECT_TRUE(testing::ArraysClose(y, ref, tol, tol))
          << memory_format_name(f) << " step " << step;
      Variable vx(x, true);
      Variable vw(w, true);
      Variable yv = F::convolution_2d(vx, vw, Variable(), 1, 1);
      F::sum(F::mul(yv, yv)).backward();
      Variable rx(x.to_memory_format(kC), true);
      Variable rw(w.copy(), true);
      Variable ry = F::convolution_2d(rx, rw, Variable(), 1, 1);
      F::sum(F::mul(ry, ry)).backward();
      EXPECT_TRUE(testing::ArraysClose(vx.grad(), rx.grad(), 10 * tol, 10 * tol))
          << memory_format_name(f) << " step " << step;
      EXPECT_TRUE(testing::ArraysClose(vw.grad(), rw.grad(), 10 * tol, 10 * tol))
          << memory_format_name(f) << " step " << step;
      // An in-place update: same storage, new values.
      multiply_to(w, 0.5);
      add_to(w, Array::full_like(w, 0.25));
    }
  }
}

KUSARI_INSTANTIATE_DEVICE_TEST(LayoutKernelsTest);

// --- CUDA against the CPU ------------------------------------------------------------------------

TEST(LayoutKernelsCudaTest, NhwcPoolingEqualsCpuPooling) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device is available on this machine";
  manual_seed(4);
  for (const PoolCase& c : pool_cases()) {
    for (Dtype dtype : {Dtype::kFloat32, Dtype::kFloat64}) {
      SCOPED_TRACE(describe(c) + " " + dtype_name(dtype));
      Array x = Array::uniform(c.shape, -1.0, 1.0, dtype);
      if (c.is_max) x = floor(x * 4.0);
      const PoolRun shape_only = run_pool(c, x, Array(), kC, kC);
      const Array gy = Array::uniform(shape_only.y.shape(), -1.0, 1.0, dtype);
      const PoolRun cpu = run_pool(c, x, gy, kC, kC);
      const Device gpu = Device::cuda(0);
      for (MemoryFormat gy_format : {kCL, kC}) {
        const PoolRun cuda = run_pool(c, x.to_device(gpu), gy.to_device(gpu), kCL, gy_format);
        EXPECT_TRUE(cuda.y.is_contiguous(kCL));
        EXPECT_TRUE(cuda.gx.is_contiguous(kCL));
        EXPECT_EQ(cuda.gx.memory_format(), kCL);
        // The same sums in the same order; the average's division is IEEE on both.
        const double tol = dtype == Dtype::kFloat32 ? 1e-6 : 1e-12;
        EXPECT_TRUE(testing::ArraysClose(cuda.y.to_device(Device::cpu()), cpu.y, tol, tol))
            << "values";
        EXPECT_TRUE(testing::ArraysClose(cuda.gx.to_device(Device::cpu()), cpu.gx, tol, tol))
            << "gradients";
      }
    }
  }
}

}  // namespace
}  // namespace kusari
