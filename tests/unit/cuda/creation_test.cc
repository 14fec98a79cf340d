// GPU creation kernels against the CPU: random numbers (bit parity of the Philox streams), fill,
// arange and copies with dtype conversion.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cuda_test_util.h"

namespace kusari {
namespace {

using testing::all_dtypes;
using testing::bytes_of;
using testing::CudaTest;
using testing::floating_dtypes;
using testing::GpuMatchesCpu;

class CudaRandom : public CudaTest {};

TEST_F(CudaRandom, UniformIsBitIdenticalToTheCpu) {
  for (Dtype dtype : floating_dtypes()) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{1001}, int64_t{1} << 20}) {
      Generator on_cpu(1234), on_gpu(1234);
      for (int draw = 0; draw < 2; ++draw) {
        const Array a = Array::uniform({n}, -2.0, 3.0, dtype, Device::cpu(), &on_cpu);
        const Array b = Array::uniform({n}, -2.0, 3.0, dtype, gpu(), &on_gpu);
        ASSERT_EQ(bytes_of(b), bytes_of(a)) << dtype_name(dtype) << " n=" << n << " draw " << draw;
      }
      EXPECT_EQ(on_gpu.offset(), on_cpu.offset());
    }
  }
}

TEST_F(CudaRandom, UniformUsesTheWholeSeed) {
  Generator a(uint64_t{1} << 40), b(uint64_t{1} << 40);
  a.set_offset(uint64_t{1} << 33);  // a counter past 32 bits
  b.set_offset(uint64_t{1} << 33);
  const Array x = Array::uniform({4097}, 0.0, 1.0, float32, Device::cpu(), &a);
  const Array y = Array::uniform({4097}, 0.0, 1.0, float32, gpu(), &b);
  EXPECT_EQ(bytes_of(y), bytes_of(x));
}

TEST_F(CudaRandom, NormalMatchesTheCpu) {
  for (Dtype dtype : floating_dtypes()) {
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{100001}}) {
      Generator on_cpu(99), on_gpu(99);
      const Array a = Array::normal({n}, 0.5, 2.0, dtype, Device::cpu(), &on_cpu);
      const Array b = Array::normal({n}, 0.5, 2.0, dtype, gpu(), &on_gpu);
      // libm differs in the last bits; after rounding to the dtype values agree to 1e-6 (or to
      // one unit in the last place of a 16-bit float).
      testing::Tolerance tol{1e-6, 1e-6};
      if (dtype == float16) tol = {1e-3, 1e-3};
      if (dtype == bfloat16) tol = {8e-3, 8e-3};
      EXPECT_TRUE(GpuMatchesCpu(b, a, tol)) << dtype_name(dtype) << " n=" << n;
      EXPECT_EQ(on_gpu.offset(), on_cpu.offset());
    }
  }
}

class CudaCreation : public CudaTest {};

TEST_F(CudaCreation, FillEveryDtype) {
  for (Dtype dtype : all_dtypes()) {
    for (Scalar v : {Scalar(0), Scalar(1), Scalar(-2.75), Scalar(true), Scalar(300)}) {
      const Array a = Array::full({3, 5}, v, dtype, Device::cpu());
      const Array b = Array::full({3, 5}, v, dtype, gpu());
      EXPECT_EQ(bytes_of(b), bytes_of(a)) << dtype_name(dtype) << " value " << v;
    }
    // A strided view.
    Array c = Array::zeros({4, 6}, dtype, Device::cpu());
    Array d = Array::zeros({4, 6}, dtype, gpu());
    c.at({Slice(), Slice(1, 6, 2)}).fill(Scalar(1));
    d.at({Slice(), Slice(1, 6, 2)}).fill(Scalar(1));
    EXPECT_TRUE(GpuMatchesCpu(d, c)) << dtype_name(dtype);
  }
}

TEST_F(CudaCreation, ArangeEveryDtype) {
  for (Dtype dtype : all_dtypes()) {
    if (dtype == bool_) continue;
    const Array a = Array::arange(-3.0, 7.5, 0.7, dtype, Device::cpu());
    const Array b = Array::arange(-3.0, 7.5, 0.7, dtype, gpu());
    EXPECT_EQ(bytes_of(b), bytes_of(a)) << dtype_name(dtype);
  }
  const Array big_cpu = Array::arange(0.1, 100000.0, 0.37, float64, Device::cpu());
  const Array big_gpu = Array::arange(0.1, 100000.0, 0.37, float64, gpu());
  EXPECT_EQ(bytes_of(big_gpu), bytes_of(big_cpu));
}

TEST_F(CudaCreation, CopyBetweenEveryPairOfDtypes) {
  for (Dtype from : all_dtypes()) {
    // Values every dtype can hold (uint8 included), with fractions to exercise the roundings.
    const Array src = testing::random_array({7, 9}, from, 0.0, 100.0, 5).astype(from);
    const Array src_gpu = src.to_device(gpu());
    for (Dtype to : all_dtypes()) {
      EXPECT_EQ(bytes_of(src_gpu.astype(to)), bytes_of(src.astype(to)))
          << dtype_name(from) << " -> " << dtype_name(to);
      // Through a transposed (strided) view, into a strided destination.
      const Array t_cpu = src.transpose().astype(to);
      const Array t_gpu = src_gpu.transpose().astype(to);
      EXPECT_EQ(bytes_of(t_gpu), bytes_of(t_cpu)) << dtype_name(from) << " -> " << dtype_name(to);
      Array dst_cpu = Array::zeros({9, 14}, to, Device::cpu());
      Array dst_gpu = Array::zeros({9, 14}, to, gpu());
      dst_cpu.at({Slice(), Slice(0, 14, 2)}).assign(src.transpose().astype(to));
      dst_gpu.at({Slice(), Slice(0, 14, 2)}).assign(src_gpu.transpose().astype(to));
      EXPECT_EQ(bytes_of(dst_gpu), bytes_of(dst_cpu)) << dtype_name(from) << " -> " << dtype_name(to);
    }
  }
}

TEST_F(CudaCreation, NegativeFloatsConvertLikeTheCpu) {
  const Array src = Array::from({-3.7, -0.5, 0.0, 0.5, 2.5, 1e6}, Shape{6}, float32, Device::cpu());
  const Array src_gpu = src.to_device(gpu());
  for (Dtype to : {bool_, int32, int64, float16, bfloat16, float64}) {
    EXPECT_EQ(bytes_of(src_gpu.astype(to)), bytes_of(src.astype(to))) << dtype_name(to);
  }
}

TEST_F(CudaCreation, BroadcastCopy) {
  const Array row = testing::random_array({1, 5}, float32, -1, 1, 3);
  Array a = Array::zeros({4, 5}, float32, Device::cpu());
  Array b = Array::zeros({4, 5}, float32, gpu());
  a.assign(row);
  b.assign(row.to_device(gpu()));
  EXPECT_TRUE(GpuMatchesCpu(b, a));
}

}  // namespace
}  // namespace kusari
