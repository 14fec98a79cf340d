// Matrix products on the GPU against the CPU: every dtype, transposed operands (no copies),
// batched and broadcast batch axes, vectors, and the TF32 switch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kusari/core/cuda.h"

namespace kusari {
namespace {

using testing::CudaTest;
using testing::GpuMatchesCpu;

/// Products accumulate k terms; allow for their rounding in the dtype of the result.
testing::Tolerance matmul_tolerance(Dtype d) {
  switch (d) {
    case Dtype::kFloat64:
      return {1e-12, 1e-12};
    case Dtype::kFloat32:
      return {1e-4, 1e-4};
    case Dtype::kFloat16:
      return {4e-3, 4e-3};
    case Dtype::kBFloat16:
      return {2e-2, 2e-2};
    default:
      return {0, 0};
  }
}

class CudaMatmul : public CudaTest {
 protected:
  void check(const Array& a, const Array& b, const std::string& what) {
    const Array expected = matmul(a, b);
    const Array actual = matmul(a.to_device(gpu()), b.to_device(gpu()));
    EXPECT_TRUE(GpuMatchesCpu(actual, expected, matmul_tolerance(a.dtype())))
        << what << ": " << a.shape() << " @ " << b.shape() << " in " << dtype_name(a.dtype());
  }
  // The same, with the operands transposed on the GPU (views, not copies).
  void check_views(const Array& at, const Array& bt, bool ta, bool tb, const std::string& what) {
    const Array a = ta ? at.swapaxes(-1, -2) : at;
    const Array b = tb ? bt.swapaxes(-1, -2) : bt;
    const Array ag = ta ? at.to_device(gpu()).swapaxes(-1, -2) : at.to_device(gpu());
    const Array bg = tb ? bt.to_device(gpu()).swapaxes(-1, -2) : bt.to_device(gpu());
    EXPECT_TRUE(GpuMatchesCpu(matmul(ag, bg), matmul(a, b), matmul_tolerance(a.dtype())))
        << what << " (views, ta=" << ta << ", tb=" << tb << ") in " << dtype_name(a.dtype());
  }
};

TEST_F(CudaMatmul, EveryDtypeAndLayout) {
  uint64_t seed = 1;
  for (Dtype dtype : {float32, float64, float16, bfloat16, int32, int64}) {
    const int64_t m = 37, k = 53, n = 29;
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Array at =
            testing::random_array(ta ? Shape{k, m} : Shape{m, k}, dtype, -2, 2, seed++);
        const Array bt =
            testing::random_array(tb ? Shape{n, k} : Shape{k, n}, dtype, -2, 2, seed++);
        check_views(at, bt, ta, tb, "2-d");
      }
    }
  }
}

TEST_F(CudaMatmul, BatchedAndBroadcastBatches) {
  uint64_t seed = 50;
  for (Dtype dtype : {float32, float64, float16, bfloat16, int64}) {
    const Array a = testing::random_array({4, 3, 5, 6}, dtype, -2, 2, seed++);
    const Array b = testing::random_array({4, 3, 6, 7}, dtype, -2, 2, seed++);
    check(a, b, "batched");
    // Broadcast batch axes (stride 0), in one and in two batch axes.
    check(testing::random_array({5, 6}, dtype, -2, 2, seed++), b, "broadcast a");
    check(a, testing::random_array({1, 3, 6, 7}, dtype, -2, 2, seed++), "broadcast b over axis 0");
    check(testing::random_array({4, 1, 5, 6}, dtype, -2, 2, seed++), b, "broadcast a over axis 1");
    // Transposed batched views.
    check_views(testing::random_array({4, 3, 6, 5}, dtype, -2, 2, seed++),
                b.swapaxes(-1, -2).copy(), true, true, "batched");
  }
}

TEST_F(CudaMatmul, VectorsAndDegenerateShapes) {
  const Array v = testing::random_array({8}, float32, -1, 1, 1);
  const Array m = testing::random_array({8, 3}, float32, -1, 1, 2);
  check(v, m, "vector @ matrix");
  check(m.transpose(), v, "matrix @ vector");
  check(v, v, "dot");
  check(testing::random_array({1, 1}, float32, -1, 1, 3),
        testing::random_array({1, 4}, float32, -1, 1, 4), "1x1");
  // k == 0 gives zeros.
  check(Array::zeros({3, 0}, float32, Device::cpu()), Array::zeros({0, 4}, float32, Device::cpu()),
        "k = 0");
}

TEST_F(CudaMatmul, LayoutsThatNeedACopy) {
  // Every other column: neither axis is unit-stride, so the operand is copied first.
  const Array a = testing::random_array({6, 20}, float32, -1, 1, 5);
  const Array b = testing::random_array({10, 7}, float32, -1, 1, 6);
  const Array as = a.at({Slice(), Slice(0, 20, 2)});
  const Array ag = a.to_device(gpu()).at({Slice(), Slice(0, 20, 2)});
  EXPECT_TRUE(
      GpuMatchesCpu(matmul(ag, b.to_device(gpu())), matmul(as, b), matmul_tolerance(float32)));
}

// Large 16-bit products whose rows are not a multiple of 8 elements long run on padded copies
// (Note [Aligning 16-bit GEMM operands]): an odd output width (a language model's vocabulary),
// an odd inner size (padded with zeros), odd rows, and transposed views, as a model's backward
// makes them.
TEST_F(CudaMatmul, SixteenBitProductsWithUnalignedRowsMatchTheCpu) {
  // The padded copies are opt-in (KUSARI_CUBLAS_PAD=1, read at each product): on for this test.
  struct PadScope {
    PadScope() { setenv("KUSARI_CUBLAS_PAD", "1", 1); }
    ~PadScope() { unsetenv("KUSARI_CUBLAS_PAD"); }
  } pad;
  for (Dtype d : {bfloat16, float16}) {
    const Array a = testing::random_array({128, 1024}, d, -1, 1, 9);
    const Array b = testing::random_array({1024, 1001}, d, -1, 1, 10);
    check(a, b, "odd output width");
    const Array c = testing::random_array({128, 1001}, d, -1, 1, 11);
    const Array e = testing::random_array({1001, 1024}, d, -1, 1, 12);
    check(c, e, "odd inner size");
    // An odd number of rows read from a transposed view (its rows are the contiguous axis).
    check_views(testing::random_array({1024, 129}, d, -1, 1, 17),
                testing::random_array({1024, 1001}, d, -1, 1, 18), true, false,
                "odd rows of a transposed view");
    // A Linear layer over (batch, length, features): the batch folds into the rows of one product.
    check(testing::random_array({4, 64, 512}, d, -1, 1, 13),
          testing::random_array({512, 1001}, d, -1, 1, 14),
          "batch folded into rows, odd output width");
    check(testing::random_array({4, 64, 512}, d, -1, 1, 15),
          testing::random_array({512, 1024}, d, -1, 1, 16), "batch folded into rows");
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const Array at = ta ? a.swapaxes(0, 1).copy() : a, bt = tb ? b.swapaxes(0, 1).copy() : b;
        check_views(at, bt, ta, tb, "odd output width");
        const Array ct = ta ? c.swapaxes(0, 1).copy() : c, et = tb ? e.swapaxes(0, 1).copy() : e;
        check_views(ct, et, ta, tb, "odd inner size");
      }
    }
  }
}

TEST_F(CudaMatmul, LargeFloat32IsAccurateWithoutTf32AndCloseWithIt) {
  const Array a = testing::random_array({256, 512}, float32, -1, 1, 7);
  const Array b = testing::random_array({512, 128}, float32, -1, 1, 8);
  const Array expected = matmul(a.astype(float64), b.astype(float64)).astype(float32);
  const testing::Tf32Scope restore(cuda::allow_tf32_convolution(), cuda::allow_tf32_matmul());
  cuda::set_allow_tf32(false);
  EXPECT_TRUE(
      GpuMatchesCpu(matmul(a.to_device(gpu()), b.to_device(gpu())), expected, {1e-4, 1e-4}));
  cuda::set_allow_tf32(true);
  // TF32 keeps 10 bits of mantissa in the products.
  EXPECT_TRUE(
      GpuMatchesCpu(matmul(a.to_device(gpu()), b.to_device(gpu())), expected, {2e-2, 5e-2}));
}

}  // namespace
}  // namespace kusari
