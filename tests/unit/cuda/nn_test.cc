// Neural-network kernels on the GPU against the CPU: convolution (forward and both gradients,
// with stride, pad, dilation and groups), pooling (max and average, cover_all, forward and
// backward), take / add_at, and the fused optimizer updates.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"

namespace kusari {
namespace {

using testing::CudaTest;
using testing::floating_dtypes;
using testing::GpuMatchesCpu;

/// Convolutions sum many products; allow for their rounding (and 16-bit double rounding).
testing::Tolerance conv_tolerance(Dtype d) {
  switch (d) {
    case Dtype::kFloat64:
      return {1e-11, 1e-11};
    case Dtype::kFloat32:
      return {1e-4, 1e-4};
    case Dtype::kFloat16:
      return {1e-2, 1e-2};
    default:
      return {3e-2, 3e-2};
  }
}

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
};

std::vector<ConvCase> conv_cases() {
  std::vector<ConvCase> cases;
  cases.push_back({{2, 3, 9, 11}, {4, 3, 3, 3}, {}});
  Conv2dParams strided;
  strided.stride[0] = 2;
  strided.pad[0] = 1;
  strided.pad[1] = 2;
  cases.push_back({{2, 3, 9, 11}, {5, 3, 3, 2}, strided});
  Conv2dParams dilated;
  dilated.dilation[0] = 2;
  dilated.dilation[1] = 3;
  dilated.pad[1] = 1;
  cases.push_back({{1, 2, 12, 13}, {3, 2, 3, 3}, dilated});
  Conv2dParams grouped;
  grouped.groups = 2;
  grouped.stride[1] = 2;
  grouped.pad[0] = 1;
  cases.push_back({{3, 4, 8, 8}, {6, 2, 3, 3}, grouped});
  Conv2dParams depthwise;
  depthwise.groups = 4;
  depthwise.pad[0] = depthwise.pad[1] = 1;
  cases.push_back({{2, 4, 7, 7}, {4, 1, 3, 3}, depthwise});
  return cases;
}

class CudaConvolution : public CudaTest {};

TEST_F(CudaConvolution, ForwardAndGradientsMatchTheCpu) {
  uint64_t seed = 1;
  for (Dtype dtype : floating_dtypes()) {
    for (const ConvCase& c : conv_cases()) {
      const std::string what =
          detail::concat("x ", c.x, " w ", c.w, " groups ", c.p.groups, " ", dtype_name(dtype));
      const Array x = testing::random_array(c.x, dtype, -1, 1, seed++);
      const Array w = testing::random_array(c.w, dtype, -1, 1, seed++);
      const Array b = testing::random_array({c.w[0]}, dtype, -1, 1, seed++);
      const Array xg = x.to_device(gpu()), wg = w.to_device(gpu()), bg = b.to_device(gpu());
      const Array y = conv2d(x, w, b, c.p);
      EXPECT_TRUE(GpuMatchesCpu(conv2d(xg, wg, bg, c.p), y, conv_tolerance(dtype)))
          << what << " forward";
      EXPECT_TRUE(GpuMatchesCpu(conv2d(xg, wg, Array(), c.p), conv2d(x, w, Array(), c.p),
                                conv_tolerance(dtype)))
          << what << " forward without bias";
      const Array gy = testing::random_array(y.shape(), dtype, -1, 1, seed++);
      const Array gyg = gy.to_device(gpu());
      EXPECT_TRUE(GpuMatchesCpu(conv2d_backward_data(wg, gyg, x.shape(), c.p),
                                conv2d_backward_data(w, gy, x.shape(), c.p), conv_tolerance(dtype)))
          << what << " gradient of x";
      EXPECT_TRUE(GpuMatchesCpu(conv2d_backward_filter(xg, gyg, w.shape(), c.p),
                                conv2d_backward_filter(x, gy, w.shape(), c.p),
                                conv_tolerance(dtype)))
          << what << " gradient of W";
      // A non-contiguous input (the same values, laid out with H and W swapped).
      const Array x_strided = xg.transpose({0, 1, 3, 2}).copy().transpose({0, 1, 3, 2});
      EXPECT_TRUE(GpuMatchesCpu(conv2d(x_strided, wg, bg, c.p), y, conv_tolerance(dtype)))
          << what << " strided input";
    }
  }
}

// The plans are keyed by layout and by the pointers' alignment (Note [cuDNN graph API
// convolutions]): channels-last operands, and views that start at an odd element (so at most
// 2-byte aligned for 16-bit dtypes), must give the CPU's values in every direction.
TEST_F(CudaConvolution, ChannelsLastAndMisalignedViewsMatchTheCpu) {
  uint64_t seed = 100;
  Conv2dParams p;
  p.pad[0] = p.pad[1] = 1;
  p.stride[0] = 2;
  for (Dtype dtype : floating_dtypes()) {
    const std::string what = dtype_name(dtype);
    const Array x = testing::random_array({3, 8, 9, 10}, dtype, -1, 1, seed++);
    const Array w = testing::random_array({16, 8, 3, 3}, dtype, -1, 1, seed++);
    const Array y = conv2d(x, w, Array(), p);
    const Array gy = testing::random_array(y.shape(), dtype, -1, 1, seed++);
    const Array gx = conv2d_backward_data(w, gy, x.shape(), p);
    const Array gw = conv2d_backward_filter(x, gy, w.shape(), p);
    const Array xl = x.to_device(gpu()).to_memory_format(MemoryFormat::kChannelsLast);
    const Array wl = w.to_device(gpu()).to_memory_format(MemoryFormat::kChannelsLast);
    const Array gyl = gy.to_device(gpu()).to_memory_format(MemoryFormat::kChannelsLast);
    EXPECT_TRUE(GpuMatchesCpu(conv2d(xl, wl, Array(), p), y, conv_tolerance(dtype)))
        << what << " channels-last forward";
    EXPECT_TRUE(GpuMatchesCpu(conv2d_backward_data(wl, gyl, x.shape(), p), gx,
                              conv_tolerance(dtype)))
        << what << " channels-last gradient of x";
    EXPECT_TRUE(GpuMatchesCpu(conv2d_backward_filter(xl, gyl, w.shape(), p), gw,
                              conv_tolerance(dtype)))
        << what << " channels-last gradient of W";
    // Views one element into a larger buffer: the data pointers are misaligned.
    const auto shifted = [&](const Array& a) {
      const Array flat = Array::empty({a.size() + 1}, dtype, gpu());
      Array view = flat.as_strided(a.shape(), Array::empty(a.shape(), dtype).strides(), 1);
      view.assign(a.to_device(gpu()));
      return view;
    };
    EXPECT_TRUE(GpuMatchesCpu(conv2d(shifted(x), shifted(w), Array(), p), y,
                              conv_tolerance(dtype)))
        << what << " misaligned forward";
    EXPECT_TRUE(GpuMatchesCpu(conv2d_backward_data(shifted(w), shifted(gy), x.shape(), p), gx,
                              conv_tolerance(dtype)))
        << what << " misaligned gradient of x";
    EXPECT_TRUE(GpuMatchesCpu(conv2d_backward_filter(shifted(x), shifted(gy), w.shape(), p), gw,
                              conv_tolerance(dtype)))
        << what << " misaligned gradient of W";
  }
}

// gx += the gradient of x (Note [Accumulating convolution gradients]): through a graph-API plan
// with beta = 1 for an aligned output in either layout, computed apart and added for a misaligned
// one; both against the CPU's sum, with the old gx left intact where it should be.
TEST_F(CudaConvolution, AccumulatedGradientOfXMatchesTheCpu) {
  uint64_t seed = 200;
  for (Dtype dtype : floating_dtypes()) {
    for (const ConvCase& c : conv_cases()) {
      const std::string what = detail::concat("x ", c.x, " w ", c.w, " groups ", c.p.groups, " ",
                                              dtype_name(dtype));
      const Array w = testing::random_array(c.w, dtype, -1, 1, seed++);
      const Array y = conv2d(testing::random_array(c.x, dtype, -1, 1, seed++), w, Array(), c.p);
      const Array gy = testing::random_array(y.shape(), dtype, -1, 1, seed++);
      const Array g0 = testing::random_array(c.x, dtype, -1, 1, seed++);
      Array expected = g0.copy();
      conv2d_backward_data_accumulate(w, gy, c.p, expected);
      for (const MemoryFormat format : {MemoryFormat::kContiguous, MemoryFormat::kChannelsLast}) {
        const char* layout = format == MemoryFormat::kChannelsLast ? " channels-last" : " NCHW";
        const Array wg = w.to_device(gpu()).to_memory_format(format);
        const Array gyg = gy.to_device(gpu()).to_memory_format(format);
        Array gx = g0.to_device(gpu()).to_memory_format(format);
        conv2d_backward_data_accumulate(wg, gyg, c.p, gx);
        EXPECT_TRUE(GpuMatchesCpu(gx, expected, conv_tolerance(dtype))) << what << layout;
        // Twice: the cached plan adds again.
        conv2d_backward_data_accumulate(wg, gyg, c.p, gx);
        Array twice = expected.copy();
        conv2d_backward_data_accumulate(w, gy, c.p, twice);
        EXPECT_TRUE(GpuMatchesCpu(gx, twice, conv_tolerance(dtype))) << what << layout << " twice";
      }
      // A gx one element into a larger buffer (misaligned: added apart), and one 16 bytes in
      // (cuDNN adds; with KUSARI_CUDNN_BENCHMARK=1 the plan is timed on a scratch output whose
      // alignment must not become the plan's).
      const int64_t per16 = 16 / static_cast<int64_t>(itemsize(dtype));
      for (const int64_t offset : {int64_t{1}, per16}) {
        const Array flat = Array::empty({g0.size() + offset}, dtype, gpu());
        Array shifted = flat.as_strided(g0.shape(), Array::empty(g0.shape(), dtype).strides(), offset);
        shifted.assign(g0.to_device(gpu()));
        conv2d_backward_data_accumulate(w.to_device(gpu()), gy.to_device(gpu()), c.p, shifted);
        EXPECT_TRUE(GpuMatchesCpu(shifted, expected, conv_tolerance(dtype))) << what << " offset " << offset;
      }
    }
  }
}

// Note [cuDNN workspace]: each call's scratch goes back to the pool once the call is queued, so
// after a convolution's arrays are gone the pool's requested bytes are what they were before.
TEST_F(CudaConvolution, TheWorkspaceIsNotHeldBetweenCalls) {
  const Array x = testing::random_array({8, 32, 28, 28}, float32, -1, 1, 5).to_device(gpu());
  const Array w = testing::random_array({64, 32, 3, 3}, float32, -1, 1, 6).to_device(gpu());
  Conv2dParams p;
  p.pad[0] = p.pad[1] = 1;
  conv2d(x, w, Array(), p);  // plans made (and any timing done) before measuring
  gpu().synchronize();
  const size_t base = cuda::memory_stats(0).requested_bytes;
  cuda::reset_peak_memory_stats(0);
  {
    const Array y = conv2d(x, w, Array(), p);
    const Array gx = conv2d_backward_data(w, y, x.shape(), p);
    const Array gw = conv2d_backward_filter(x, y, w.shape(), p);
    gpu().synchronize();
  }
  const cuda::MemoryStats after = cuda::memory_stats(0);
  EXPECT_EQ(after.requested_bytes, base);
  // The peak saw the outputs (and whatever workspace the calls took), nothing held since.
  EXPECT_GE(after.peak_requested_bytes, base + static_cast<size_t>(x.nbytes() + w.nbytes()));
}

TEST_F(CudaConvolution, RepeatedCallsReuseThePlanAndAgree) {
  const Array x = testing::random_array({4, 8, 16, 16}, float32, -1, 1, 3).to_device(gpu());
  const Array w = testing::random_array({8, 8, 3, 3}, float32, -1, 1, 4).to_device(gpu());
  Conv2dParams p;
  p.pad[0] = p.pad[1] = 1;
  const Array first = conv2d(x, w, Array(), p);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(GpuMatchesCpu(conv2d(x, w, Array(), p), first.to_device(Device::cpu()), {0, 0}));
  }
}

struct PoolCase {
  Shape x;
  Pool2dParams p;
};

std::vector<PoolCase> pool_cases() {
  std::vector<PoolCase> cases;
  for (PoolKind kind : {PoolKind::kMax, PoolKind::kAverage}) {
    Pool2dParams plain;
    plain.kind = kind;
    cases.push_back({{2, 3, 8, 8}, plain});
    Pool2dParams overlapping;  // 3x3 windows with stride 2 overlap: gradients add up
    overlapping.kind = kind;
    overlapping.ksize[0] = overlapping.ksize[1] = 3;
    overlapping.pad[0] = overlapping.pad[1] = 1;
    cases.push_back({{2, 2, 9, 10}, overlapping});
    Pool2dParams cover_all = overlapping;
    cover_all.cover_all = true;
    cover_all.pad[1] = 0;
    cases.push_back({{1, 3, 10, 7}, cover_all});
    Pool2dParams exclude_pad = overlapping;
    exclude_pad.count_include_pad = false;
    exclude_pad.stride[1] = 1;
    cases.push_back({{2, 1, 6, 9}, exclude_pad});
  }
  return cases;
}

class CudaPooling : public CudaTest {};

TEST_F(CudaPooling, ForwardAndBackwardMatchTheCpu) {
  uint64_t seed = 10;
  for (Dtype dtype : floating_dtypes()) {
    for (const PoolCase& c : pool_cases()) {
      const std::string what =
          detail::concat(c.p.kind == PoolKind::kMax ? "max" : "average", " x ", c.x, " cover_all ",
                         c.p.cover_all, " ", dtype_name(dtype));
      // Integer values: ties in max windows (the first maximum must win) and exact sums.
      const Array x = floor(testing::random_array(c.x, float64, 0, 4, seed++)).astype(dtype);
      const Array xg = x.to_device(gpu());
      const Array y = pool2d(x, c.p);
      const Array yg = pool2d(xg, c.p);
      EXPECT_TRUE(GpuMatchesCpu(yg, y)) << what << " forward";
      const Array gy = testing::random_array(y.shape(), dtype, -1, 1, seed++);
      EXPECT_TRUE(GpuMatchesCpu(pool2d_backward(xg, yg, gy.to_device(gpu()), c.p),
                                pool2d_backward(x, y, gy, c.p)))
          << what << " backward";
    }
  }
}

TEST_F(CudaPooling, MaxPoolingPropagatesNan) {
  Array x = Array::from({1, NAN, 3, 4, 5, 6, 7, 8, 9}, Shape{1, 1, 3, 3}, float32, Device::cpu());
  Pool2dParams p;
  p.ksize[0] = p.ksize[1] = 2;
  p.stride[0] = p.stride[1] = 1;
  const Array xg = x.to_device(gpu());
  const Array y = pool2d(x, p);
  EXPECT_TRUE(GpuMatchesCpu(pool2d(xg, p), y));
  const Array gy = Array::ones(y.shape(), float32, Device::cpu());
  EXPECT_TRUE(GpuMatchesCpu(pool2d_backward(xg, pool2d(xg, p), gy.to_device(gpu()), p),
                            pool2d_backward(x, y, gy, p)));
}

// Channels-last max pooling with the channel count a multiple of the 16-byte pack runs the pack
// kernels (Note [Channels-last max pooling on packs]); counts off the pack run the one-element
// kernels. Both must equal the CPU bit for bit: ties (integer values), NaNs, empty windows.
TEST_F(CudaPooling, ChannelsLastMaxPoolingOnPacksMatchesTheCpu) {
  std::vector<std::pair<Shape, Pool2dParams>> cases;
  Pool2dParams resnet;  // ResNet's stem: 3x3, stride 2, pad 1
  resnet.ksize[0] = resnet.ksize[1] = 3;
  resnet.pad[0] = resnet.pad[1] = 1;
  Pool2dParams halve;  // 2x2, stride 2
  Pool2dParams dense = resnet;  // 3x3, stride 1: every input in up to 9 windows
  dense.stride[0] = dense.stride[1] = 1;
  Pool2dParams empty;  // cover_all with stride 3 > ksize 2: the last row and column of windows are empty
  empty.stride[0] = empty.stride[1] = 3;
  empty.pad[0] = empty.pad[1] = 1;
  empty.cover_all = true;
  uint64_t seed = 70;
  for (int64_t c : {8, 12, 16, 24}) {
    cases.push_back({{2, c, 9, 10}, resnet});
    cases.push_back({{1, c, 8, 6}, halve});
    cases.push_back({{2, c, 5, 7}, dense});
    cases.push_back({{1, c, 5, 5}, empty});
  }
  for (Dtype dtype : floating_dtypes()) {
    for (const auto& [shape, p] : cases) {
      const std::string what = detail::concat(shape, " ksize ", p.ksize[0], " stride ", p.stride[0], " pad ",
                                              p.pad[0], " cover_all ", p.cover_all, " ", dtype_name(dtype));
      // Integer values in [0, 4) for ties, and a few NaNs, which win their windows.
      std::vector<double> values =
          floor(testing::random_array(shape, float64, 0, 4, seed++)).to_vector<double>();
      for (size_t i = 5; i < values.size(); i += 37) values[i] = NAN;
      const Array x = Array::from_vector(values, shape, Device::cpu())
                          .astype(dtype)
                          .to_memory_format(MemoryFormat::kChannelsLast);
      const Array xg = x.to_device(gpu());
      ASSERT_EQ(xg.memory_format(), MemoryFormat::kChannelsLast) << what;
      const Array y = pool2d(x, p);
      const Array yg = pool2d(xg, p);
      EXPECT_EQ(yg.memory_format(), MemoryFormat::kChannelsLast) << what;
      EXPECT_EQ(testing::bytes_of(yg), testing::bytes_of(y)) << what << " forward";
      const Array gy = testing::random_array(y.shape(), dtype, -1, 1, seed++)
                           .to_memory_format(MemoryFormat::kChannelsLast);
      const Array gx = pool2d_backward(x, y, gy, p);
      const Array gxg = pool2d_backward(xg, yg, gy.to_device(gpu()), p);
      EXPECT_EQ(gxg.memory_format(), MemoryFormat::kChannelsLast) << what;
      EXPECT_EQ(testing::bytes_of(gxg), testing::bytes_of(gx)) << what << " backward";
    }
  }
}

class CudaIndexing : public CudaTest {};

TEST_F(CudaIndexing, TakeAndAddAtMatchTheCpu) {
  uint64_t seed = 30;
  for (Dtype dtype : testing::all_dtypes()) {
    const Array x = testing::random_array({5, 6, 4}, dtype, -5, 5, seed++);
    const Array xg = x.to_device(gpu());
    for (Dtype index_dtype : {int32, int64}) {
      const Array idx = Array::from({4, 0, -1, 2, 2, -6}, Shape{2, 3}, float64, Device::cpu())
                            .astype(index_dtype);
      const Array idxg = idx.to_device(gpu());
      EXPECT_TRUE(GpuMatchesCpu(take(xg, idxg, 1), take(x, idx, 1))) << dtype_name(dtype);
      EXPECT_TRUE(GpuMatchesCpu(take(xg.transpose(), idxg, 1), take(x.transpose(), idx, 1)))
          << dtype_name(dtype);
      const Array idx0 =
          Array::from({4, 0, -1, 2}, Shape{4}, float64, Device::cpu()).astype(index_dtype);
      EXPECT_TRUE(GpuMatchesCpu(take(xg, idx0.to_device(gpu()), 0), take(x, idx0, 0)))
          << dtype_name(dtype);
      if (dtype == bool_) continue;
      // Repeated indices add up (integer values: the atomic order does not matter).
      const Array values = testing::random_array({5, 2, 3, 4}, dtype, -5, 5, seed++);
      EXPECT_TRUE(GpuMatchesCpu(add_at_zeros(x.shape(), idxg, 1, values.to_device(gpu())),
                                add_at_zeros(x.shape(), idx, 1, values)))
          << dtype_name(dtype);
    }
  }
}

TEST_F(CudaIndexing, OutOfBoundsIndicesRaiseIndexError) {
  const Array x = Array::zeros({3, 4}, float32, gpu());
  const Array bad = Array::from_vector(std::vector<int64_t>{0, 3}, std::nullopt, gpu());
  try {
    take(x, bad, 0);
    FAIL() << "expected IndexError";
  } catch (const IndexError& e) {
    EXPECT_NE(std::string(e.what()).find("index 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(add_at_zeros({3, 4}, bad, 0, Array::ones({2, 4}, float32, gpu())), IndexError);
  // The device is still usable, and a good call after a bad one succeeds.
  const Array good = Array::from_vector(std::vector<int64_t>{2, -3}, std::nullopt, gpu());
  EXPECT_EQ(take(x, good, 0).shape(), (Shape{2, 4}));
}

class CudaUpdate : public CudaTest {};

TEST_F(CudaUpdate, EveryRuleInEveryFloatingDtypeMatchesTheCpu) {
  struct RuleCase {
    UpdateRule rule;
    std::vector<double> hyper;
    int n_state;
  };
  const std::vector<RuleCase> cases = {
      {UpdateRule::kSgd, {0.1}, 0},
      {UpdateRule::kMomentumSgd, {0.05, 0.9}, 1},
      {UpdateRule::kNesterov, {0.05, 0.9}, 1},
      {UpdateRule::kAdam, {0.001, 0.9, 0.999, 1e-8, 1.0, 0.0, 0.0}, 2},
      {UpdateRule::kAdam, {0.002, 0.8, 0.99, 1e-6, 0.5, 0.01, 1.0}, 3},
      {UpdateRule::kRmsprop, {0.01, 0.99, 1e-8, 0.0}, 1},
      {UpdateRule::kRmsprop, {0.01, 0.9, 1e-4, 1.0}, 1},
      {UpdateRule::kAdaGrad, {0.01, 1e-8}, 1},
      {UpdateRule::kRmspropWarmup, {0.05, 0.002, 0.9, 0.99, 1e-6}, 2},
  };
  uint64_t seed = 50;
  for (Dtype dtype : floating_dtypes()) {
    for (const RuleCase& c : cases) {
      const int64_t n = 10007;
      Array p = testing::random_array({n}, dtype, -1, 1, seed++);
      Array pg = p.to_device(gpu());
      std::vector<Array> states, states_g;
      for (int k = 0; k < c.n_state; ++k) {
        // Second moments are non-negative.
        states.push_back(testing::random_array({n}, dtype, 0, 0.5, seed++));
        states_g.push_back(states.back().to_device(gpu()));
      }
      for (int step = 0; step < 3; ++step) {
        const Array g = testing::random_array({n}, dtype, -1, 1, seed++);
        std::vector<Array*> sp, sg;
        for (int k = 0; k < c.n_state; ++k) {
          sp.push_back(&states[static_cast<size_t>(k)]);
          sg.push_back(&states_g[static_cast<size_t>(k)]);
        }
        update_parameter(c.rule, p, g, sp, c.hyper);
        update_parameter(c.rule, pg, g.to_device(gpu()), sg, c.hyper);
      }
      const std::string what =
          detail::concat("rule ", static_cast<int>(c.rule), " ", dtype_name(dtype));
      EXPECT_TRUE(GpuMatchesCpu(pg, p)) << what << " parameter";
      for (int k = 0; k < c.n_state; ++k) {
        EXPECT_TRUE(GpuMatchesCpu(states_g[static_cast<size_t>(k)], states[static_cast<size_t>(k)]))
            << what << " state " << k;
      }
    }
  }
}

}  // namespace
}  // namespace kusari
