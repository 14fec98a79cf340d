// Every reduction, arg-reduction and softmax on the GPU against the CPU, in every dtype, over
// every axis set, for small (one group per output), large (split) and strided inputs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace kusari {
namespace {

using testing::all_dtypes;
using testing::CudaTest;
using testing::floating_dtypes;
using testing::GpuMatchesCpu;

using ReduceFn = Array (*)(const Array&, const Axes&, bool);

struct NamedReduction {
  const char* name;
  ReduceFn fn;
};

std::vector<NamedReduction> reductions() {
  return {{"sum", &sum}, {"prod", &prod}, {"max", &amax}, {"min", &amin}, {"any", &any}, {"all", &all}};
}

/// Sums in double on both sides differ only in order; compare with a tolerance that covers it.
testing::Tolerance reduce_tolerance(Dtype d) {
  testing::Tolerance t = testing::tolerance(d);
  if (d == float64) t = {1e-10, 1e-10};
  return t;
}

class CudaReduction : public CudaTest {};

TEST_F(CudaReduction, EveryReductionOverEveryAxisSet) {
  const std::vector<Axes> axis_sets = {{}, {0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  uint64_t seed = 1;
  for (const NamedReduction& r : reductions()) {
    for (Dtype dtype : all_dtypes()) {
      // prod stays finite on values near 1; the others see zeros, fractions and negatives (any
      // and all then exercise the CPU's truncation of floats).
      const bool is_prod = std::string(r.name) == "prod";
      const Array x = testing::random_array({5, 7, 9}, dtype, is_prod ? 0.5 : -3, is_prod ? 1.6 : 3,
                                            seed++);
      const Array xg = x.to_device(gpu());
      for (const Axes& axes : axis_sets) {
        for (bool keepdims : {false, true}) {
          const std::string what = detail::concat(r.name, " over ", axes, " of ", dtype_name(dtype),
                                                  keepdims ? " (keepdims)" : "");
          const Array expected = r.fn(x, axes, keepdims);
          EXPECT_TRUE(GpuMatchesCpu(r.fn(xg, axes, keepdims), expected,
                                    reduce_tolerance(expected.dtype())))
              << what;
        }
        // A transposed input.
        const Array expected = r.fn(x.transpose(), axes, false);
        EXPECT_TRUE(GpuMatchesCpu(r.fn(xg.transpose(), axes, false), expected,
                                  reduce_tolerance(expected.dtype())))
            << r.name << " over " << axes << " of transposed " << dtype_name(dtype);
      }
    }
  }
}

TEST_F(CudaReduction, LargeReductionsSplitAcrossTheGpu) {
  // Whole-array, inner-axis and outer-axis reductions large enough to be split into chunks.
  const Array x = testing::random_array({1000, 3001}, float32, -1, 1, 42);
  const Array xg = x.to_device(gpu());
  for (const Axes& axes : std::vector<Axes>{{}, {0}, {1}}) {
    EXPECT_TRUE(GpuMatchesCpu(sum(xg, axes), sum(x, axes), {1e-5, 1e-5})) << "sum over " << axes;
    EXPECT_TRUE(GpuMatchesCpu(amax(xg, axes), amax(x, axes))) << "max over " << axes;
  }
  const Array ints = testing::random_array({2000, 700}, int32, -100, 100, 43);
  const Array ig = ints.to_device(gpu());
  for (const Axes& axes : std::vector<Axes>{{}, {0}, {1}}) {
    EXPECT_TRUE(GpuMatchesCpu(sum(ig, axes), sum(ints, axes))) << "int sum over " << axes;
  }
  // The same reduction twice gives the same bits (deterministic plans).
  EXPECT_EQ(testing::bytes_of(sum(xg)), testing::bytes_of(sum(xg)));
}

TEST_F(CudaReduction, MaxPropagatesNanAndEmptyMaxThrows) {
  const Array x = Array::from({1, NAN, 3, 4, 5, 6}, Shape{2, 3}, float32, Device::cpu());
  const Array xg = x.to_device(gpu());
  EXPECT_TRUE(GpuMatchesCpu(amax(xg, {1}), amax(x, {1})));
  EXPECT_TRUE(GpuMatchesCpu(amin(xg, {0}), amin(x, {0})));
  EXPECT_THROW(amax(Array::zeros({0, 3}, float32, gpu())), ValueError);
  // A sum over an empty axis is 0 (and a product 1).
  EXPECT_TRUE(GpuMatchesCpu(sum(Array::zeros({0, 3}, float32, gpu()), {0}),
                            sum(Array::zeros({0, 3}, float32, Device::cpu()), {0})));
  EXPECT_TRUE(GpuMatchesCpu(prod(Array::zeros({0, 3}, float32, gpu()), {0}),
                            prod(Array::zeros({0, 3}, float32, Device::cpu()), {0})));
}

TEST_F(CudaReduction, ArgMaxAndArgMinPickTheFirstExtremeOrTheFirstNan) {
  uint64_t seed = 7;
  for (Dtype dtype : all_dtypes()) {
    // Few distinct values, so ties are common.
    const Array x = testing::random_array({6, 5, 40}, dtype, 0, 4, seed++);
    const Array xg = x.to_device(gpu());
    for (int axis : {0, 1, 2}) {
      EXPECT_TRUE(GpuMatchesCpu(argmax(xg, axis), argmax(x, axis))) << dtype_name(dtype) << " axis " << axis;
      EXPECT_TRUE(GpuMatchesCpu(argmin(xg, axis), argmin(x, axis))) << dtype_name(dtype) << " axis " << axis;
      EXPECT_TRUE(GpuMatchesCpu(argmax(xg.transpose(), axis), argmax(x.transpose(), axis)))
          << dtype_name(dtype) << " axis " << axis << " (transposed)";
    }
    EXPECT_TRUE(GpuMatchesCpu(argmax(xg), argmax(x))) << dtype_name(dtype) << " flattened";
  }
  const Array nan = Array::from({1, NAN, 7, NAN, 7, 0}, Shape{6}, float64, Device::cpu());
  EXPECT_TRUE(GpuMatchesCpu(argmax(nan.to_device(gpu())), argmax(nan)));
  EXPECT_TRUE(GpuMatchesCpu(argmin(nan.to_device(gpu())), argmin(nan)));
  const Array long_row = testing::random_array({3, 200000}, float32, 0, 1000, 9);
  EXPECT_TRUE(GpuMatchesCpu(argmax(long_row.to_device(gpu()), 1), argmax(long_row, 1)));
}

TEST_F(CudaReduction, SoftmaxAndLogSoftmaxAlongEveryAxis) {
  uint64_t seed = 20;
  for (Dtype dtype : floating_dtypes()) {
    for (const Shape& shape : std::vector<Shape>{{4, 10}, {3, 5, 6}, {2, 20000}, {100, 3}}) {
      const Array x = testing::random_array(shape, dtype, -10, 10, seed++);
      const Array xg = x.to_device(gpu());
      for (int axis = 0; axis < x.ndim(); ++axis) {
        EXPECT_TRUE(GpuMatchesCpu(softmax(xg, axis), softmax(x, axis)))
            << "softmax " << shape << " axis " << axis << " " << dtype_name(dtype);
        EXPECT_TRUE(GpuMatchesCpu(log_softmax(xg, axis), log_softmax(x, axis)))
            << "log_softmax " << shape << " axis " << axis << " " << dtype_name(dtype);
      }
    }
  }
  // Rows of -inf and large values stay finite where the CPU's do.
  const Array x = Array::from({1000, 1000, -1000, 0, 0, 0}, Shape{2, 3}, float32, Device::cpu());
  EXPECT_TRUE(GpuMatchesCpu(softmax(x.to_device(gpu()), 1), softmax(x, 1)));
}

}  // namespace
}  // namespace kusari
