// Helpers for the GPU tests: a fixture that skips without a GPU, random CPU data of every dtype,
// and a CPU/GPU parity assertion with per-dtype tolerances.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/core/cuda.h"
#include "kusari/core/random.h"
#include "kusari/core/routines.h"
#include "test_util.h"

namespace kusari::testing {

/// Every dtype, in the order of the Dtype enum.
inline const std::vector<Dtype>& all_dtypes() {
  static const std::vector<Dtype> d{bool_,   uint8,    int32,   int64,
                                    float16, bfloat16, float32, float64};
  return d;
}

inline const std::vector<Dtype>& floating_dtypes() {
  static const std::vector<Dtype> d{float16, bfloat16, float32, float64};
  return d;
}

/// Random CPU data of `dtype`: uniform in [lo, hi) for floats, its floor for integers, and
/// values below the middle of the range for bool.
inline Array random_array(const Shape& shape, Dtype dtype, double lo, double hi, uint64_t seed) {
  Generator gen(seed);
  const Array u = Array::uniform(shape, lo, hi, float64, Device::cpu(), &gen);
  if (dtype == bool_) return less(u, Scalar((lo + hi) / 2));
  if (is_integral(dtype)) return floor(u).astype(dtype);
  return u.astype(dtype);
}

/// Tolerances for comparing a GPU result with the CPU's: a few units in the last place of the
/// dtype (libm functions and fused multiply-adds differ in the last bits), exact for integers.
struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
};

inline Tolerance tolerance(Dtype d) {
  switch (d) {
    case Dtype::kFloat64:
      return {1e-12, 1e-13};
    case Dtype::kFloat32:
      return {2e-5, 1e-6};
    case Dtype::kFloat16:
      return {2e-3, 1e-3};
    case Dtype::kBFloat16:
      return {1.6e-2, 1e-2};
    default:
      return {0.0, 0.0};
  }
}

/// The GPU array `actual` equals the CPU array `expected` in dtype, shape and values (NaN equals
/// NaN), within `tol`.
inline ::testing::AssertionResult GpuMatchesCpu(const Array& actual, const Array& expected,
                                                Tolerance tol) {
  if (!actual.device().is_cuda()) {
    return ::testing::AssertionFailure() << "the result is on " << actual.device() << ", not a GPU";
  }
  if (actual.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure() << "dtypes differ: " << dtype_name(actual.dtype())
                                         << " vs expected " << dtype_name(expected.dtype());
  }
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << "shapes differ: " << actual.shape() << " vs expected " << expected.shape();
  }
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(e[i])) continue;
    if (a[i] == e[i]) continue;
    if (!(std::abs(a[i] - e[i]) <= tol.atol + tol.rtol * std::abs(e[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << " of " << a.size() << ": GPU " << a[i] << " vs CPU " << e[i]
             << " (rtol " << tol.rtol << ", atol " << tol.atol << ", dtype "
             << dtype_name(actual.dtype()) << ", shape " << actual.shape() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult GpuMatchesCpu(const Array& actual, const Array& expected) {
  return GpuMatchesCpu(actual, expected, tolerance(expected.dtype()));
}

/// The raw bytes of an array (copied to the host), for bit-for-bit comparisons.
inline std::vector<uint8_t> bytes_of(const Array& a) {
  const Array h = a.to_device(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(h.raw_data());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

}  // namespace kusari::testing
