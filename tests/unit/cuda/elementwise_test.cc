// Every unary and binary op and where, on the GPU against the CPU, in every dtype, for
// contiguous, strided and broadcast operands.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"

namespace kusari {
namespace {

using testing::all_dtypes;
using testing::CudaTest;
using testing::GpuMatchesCpu;

struct UnaryCase {
  UnaryOp op;
  double p0 = 0.0, p1 = 0.0;
  double lo = -3.0, hi = 3.0;  // input range (floats; integers take its floor)
};

std::vector<UnaryCase> unary_cases() {
  using U = UnaryOp;
  return {
      {U::kIdentity},
      {U::kNeg},
      {U::kAbs},
      {U::kSign},
      {U::kExp},
      {U::kLog, 0, 0, 0.01, 10},
      {U::kLog1p, 0, 0, -0.9, 5},
      {U::kExpm1},
      {U::kSqrt, 0, 0, 0, 9},
      {U::kRsqrt, 0, 0, 0.01, 9},
      {U::kSquare},
      {U::kReciprocal, 0, 0, 0.5, 4},
      {U::kSin},
      {U::kCos},
      {U::kTanh},
      {U::kSigmoid, 0, 0, -30, 30},
      {U::kRelu},
      {U::kFloor},
      {U::kCeil},
      {U::kErf},
      {U::kSoftplus, 1.5},
      {U::kSoftplus, -0.5, 0, -40, 40},
      {U::kLeakyRelu, 0.2},
      {U::kElu, 1.1},
      {U::kGelu, 0, 0, -8, 8},
      {U::kGeluTanh, 0, 0, -8, 8},
      {U::kSilu, 0, 0, -30, 30},
      {U::kGeluDerivative, 0, 0, -8, 8},
      {U::kGeluTanhDerivative, 0, 0, -8, 8},
      {U::kSiluDerivative, 0, 0, -30, 30},
      {U::kAddScalar, 2},
      {U::kAddScalar, 0.5},
      {U::kMulScalar, 3},
      {U::kMulScalar, -1.5},
      {U::kRSubScalar, 2},
      {U::kRDivScalar, 2, 0, 0.5, 4},
      {U::kPowScalar, 2.5, 0, 0, 4},
      {U::kPowScalar, 2},
      {U::kPowScalar, 0.5, 0, 0, 4},
      {U::kPowScalar, -1, 0, 0.5, 4},
      {U::kRPowScalar, 1.7},
      {U::kMaxScalar, 0.3},
      {U::kMinScalar, 1},
      {U::kClip, -1, 1.5},
      {U::kEqScalar, 1},
      {U::kNeScalar, 1},
      {U::kLtScalar, 0.5},
      {U::kLeScalar, 1},
      {U::kGtScalar, -1},
      {U::kGeScalar, 0},
      {U::kIsNan},
      {U::kIsInf},
      {U::kIsFinite},
      {U::kLogicalNot},
  };
}

class CudaElementwise : public CudaTest {};

TEST_F(CudaElementwise, EveryUnaryOpInEveryDtype) {
  uint64_t seed = 1;
  for (const UnaryCase& c : unary_cases()) {
    for (Dtype dtype : all_dtypes()) {
      const std::string what =
          detail::concat("op ", static_cast<int>(c.op), " (p0 ", c.p0, ") on ", dtype_name(dtype));
      // Scalar parameters of integer arrays are integers.
      const double p0 = is_floating(dtype) ? c.p0 : std::floor(c.p0);
      const double p1 = is_floating(dtype) ? c.p1 : std::floor(c.p1);
      Array x = testing::random_array({6, 33}, dtype, c.lo, c.hi, seed++);
      if (is_floating(dtype) && c.op >= UnaryOp::kIsNan && c.op <= UnaryOp::kIsFinite) {
        x = Array::from({1.0, NAN, INFINITY, -INFINITY, 0.0, -2.0}, Shape{6}, dtype, Device::cpu());
      }
      Array expected;
      try {
        expected = unary(c.op, x, p0, p1);
      } catch (const DtypeError&) {
        EXPECT_THROW(unary(c.op, x.to_device(gpu()), p0, p1), DtypeError) << what;
        continue;
      }
      const Array xg = x.to_device(gpu());
      EXPECT_TRUE(GpuMatchesCpu(unary(c.op, xg, p0, p1), expected)) << what;
      // A strided view.
      if (x.ndim() == 2) {
        EXPECT_TRUE(GpuMatchesCpu(unary(c.op, xg.transpose().at({Slice(0, 33, 3)}), p0, p1),
                                  unary(c.op, x.transpose().at({Slice(0, 33, 3)}), p0, p1)))
            << what << " (strided)";
      }
    }
  }
}

TEST_F(CudaElementwise, LongAndMisalignedInputs) {
  // A long array takes the vectorised path; an offset view of it cannot (misaligned).
  const Array x = testing::random_array({100003}, float32, -5, 5, 11);
  const Array xg = x.to_device(gpu());
  EXPECT_TRUE(GpuMatchesCpu(tanh(xg), tanh(x)));
  EXPECT_TRUE(
      GpuMatchesCpu(tanh(xg.at({Slice(1, std::nullopt)})), tanh(x.at({Slice(1, std::nullopt)}))));
  EXPECT_TRUE(GpuMatchesCpu(xg.at({Slice(3, std::nullopt)}) + xg.at({Slice(0, 100000)}),
                            x.at({Slice(3, std::nullopt)}) + x.at({Slice(0, 100000)})));
}

TEST_F(CudaElementwise, EveryBinaryOpInEveryDtype) {
  const std::vector<BinaryOp> ops = {
      BinaryOp::kAdd, BinaryOp::kSub,        BinaryOp::kMul,      BinaryOp::kDiv,
      BinaryOp::kPow, BinaryOp::kMaximum,    BinaryOp::kMinimum,  BinaryOp::kEq,
      BinaryOp::kNe,  BinaryOp::kLt,         BinaryOp::kLe,       BinaryOp::kGt,
      BinaryOp::kGe,  BinaryOp::kLogicalAnd, BinaryOp::kLogicalOr};
  uint64_t seed = 100;
  for (BinaryOp op : ops) {
    for (Dtype dtype : all_dtypes()) {
      const std::string what =
          detail::concat("op ", static_cast<int>(op), " on ", dtype_name(dtype));
      // pow: a positive base (floats) and small exponents (integers, including 0 and negatives).
      const bool pow = op == BinaryOp::kPow;
      const Array a = testing::random_array({3, 1, 5}, dtype, pow ? 0.1 : -4, 4, seed++);
      const Array b = testing::random_array({4, 5}, dtype, pow ? -1 : -4, pow ? 4 : 4, seed++);
      Array expected;
      try {
        expected = binary(op, a, b);
      } catch (const DtypeError&) {
        EXPECT_THROW(binary(op, a.to_device(gpu()), b.to_device(gpu())), DtypeError) << what;
        continue;
      }
      const Array ag = a.to_device(gpu()), bg = b.to_device(gpu());
      // Broadcast operands (stride 0), then same-shape contiguous, then transposed views.
      EXPECT_TRUE(GpuMatchesCpu(binary(op, ag, bg), expected)) << what << " (broadcast)";
      const Array a2 = testing::random_array({7, 9}, dtype, pow ? 0.1 : -4, 4, seed++);
      const Array b2 = testing::random_array({7, 9}, dtype, pow ? -1 : -4, 4, seed++);
      const Array a2g = a2.to_device(gpu()), b2g = b2.to_device(gpu());
      EXPECT_TRUE(GpuMatchesCpu(binary(op, a2g, b2g), binary(op, a2, b2))) << what;
      EXPECT_TRUE(GpuMatchesCpu(binary(op, a2g.transpose(), b2g.transpose()),
                                binary(op, a2.transpose(), b2.transpose())))
          << what << " (strided)";
      // A 0-d operand.
      const Array s = testing::random_array({}, dtype, pow ? 0.5 : 1, 3, seed++);
      EXPECT_TRUE(GpuMatchesCpu(binary(op, a2g, s.to_device(gpu())), binary(op, a2, s)))
          << what << " (scalar)";
    }
  }
}

TEST_F(CudaElementwise, IntegerDivisionAndPowerEdgeCases) {
  for (Dtype dtype : {int32, int64, uint8}) {
    const Array a =
        Array::from({7, -7, 7, -7, 5, 0, 3, 2}, Shape{8}, float64, Device::cpu()).astype(dtype);
    const Array b =
        Array::from({2, 2, -2, -2, 0, 3, 0, 20}, Shape{8}, float64, Device::cpu()).astype(dtype);
    const Array ag = a.to_device(gpu()), bg = b.to_device(gpu());
    EXPECT_TRUE(GpuMatchesCpu(divide(ag, bg), divide(a, b))) << dtype_name(dtype);
    EXPECT_TRUE(GpuMatchesCpu(power(ag, bg), power(a, b))) << dtype_name(dtype);
  }
}

TEST_F(CudaElementwise, NanPropagationOfMaximumAndMinimum) {
  const Array a = Array::from({1.0, NAN, 3.0, NAN}, Shape{4}, float32, Device::cpu());
  const Array b = Array::from({NAN, 2.0, 1.0, NAN}, Shape{4}, float32, Device::cpu());
  const Array ag = a.to_device(gpu()), bg = b.to_device(gpu());
  EXPECT_TRUE(GpuMatchesCpu(maximum(ag, bg), maximum(a, b)));
  EXPECT_TRUE(GpuMatchesCpu(minimum(ag, bg), minimum(a, b)));
  EXPECT_TRUE(GpuMatchesCpu(maximum(ag, Scalar(2.0)), maximum(a, Scalar(2.0))));
}

TEST_F(CudaElementwise, WhereInEveryDtype) {
  const Array cond = testing::random_array({4, 1}, bool_, 0, 1, 5);
  for (Dtype dtype : all_dtypes()) {
    const Array a = testing::random_array({4, 6}, dtype, -5, 5, 6);
    const Array b = testing::random_array({6}, dtype, -5, 5, 7);
    EXPECT_TRUE(GpuMatchesCpu(where(cond.to_device(gpu()), a.to_device(gpu()), b.to_device(gpu())),
                              where(cond, a, b)))
        << dtype_name(dtype);
  }
}

// The fused relu_grad kernel (contiguous floats) and its declined cases (strided, broadcast,
// integer operands, served by the composition) against the CPU, bit for bit.
TEST_F(CudaElementwise, ReluGradMatchesCpu) {
  for (Dtype dtype : {float16, bfloat16, float32, float64, int32}) {
    const Array y = testing::random_array({6, 5}, dtype, -3, 3, 8);
    const Array gy = testing::random_array({6, 5}, dtype, -3, 3, 9);
    const Array yg = y.to_device(gpu()), gyg = gy.to_device(gpu());
    EXPECT_TRUE(GpuMatchesCpu(relu_grad(gyg, yg), relu_grad(gy, y))) << dtype_name(dtype);
    EXPECT_TRUE(GpuMatchesCpu(relu_grad(gyg.transpose(), yg.transpose()), relu_grad(gy.transpose(), y.transpose())))
        << dtype_name(dtype);
    const Array row = testing::random_array({5}, dtype, -3, 3, 10);
    EXPECT_TRUE(GpuMatchesCpu(relu_grad(row.to_device(gpu()), yg), relu_grad(row, y))) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace kusari
