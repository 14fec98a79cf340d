// Helpers for kusari's unit tests: device parameterisation and array assertions.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/core/build.h"
#include "kusari/core/cuda.h"
#include "kusari/core/debug.h"
#include "kusari/core/random.h"
#include "kusari/core/routines.h"

namespace kusari::testing {

/// Success when `fn` throws an `E` whose message contains every one of `parts`; otherwise a
/// failure saying what was thrown instead, or that nothing was. For the error-message tests:
///   EXPECT_TRUE(ThrowsWith<ValueError>([&] { f(bad); }, {"f:", "expected"}));
template <typename E, typename F>
::testing::AssertionResult ThrowsWith(F&& fn, std::initializer_list<std::string_view> parts) {
  try {
    fn();
  } catch (const E& e) {
    const std::string what = e.what();
    for (std::string_view part : parts) {
      if (what.find(part) == std::string::npos) {
        return ::testing::AssertionFailure() << "the message lacks '" << part << "': " << what;
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "another exception was thrown: " << e.what();
  }
  return ::testing::AssertionFailure() << "nothing was thrown";
}

/// The devices a parameterised test runs on: CPU, plus cuda:0 in a CUDA build (skipped at run
/// time with a message when no GPU is present).
inline std::vector<Device> test_devices() {
  std::vector<Device> d{Device::cpu()};
  if (build_info().cuda) d.push_back(Device::cuda(0));
  return d;
}

inline std::string device_name(const ::testing::TestParamInfo<Device>& info) {
  return info.param.is_cpu() ? "cpu" : "cuda" + std::to_string(info.param.index());
}

/// Sets the GPU's TF32 switches for the scope and restores the previous ones at its end. The
/// tests compare float32 GPU results with the CPU's at float32 tolerances, so their fixtures turn
/// TF32 (on by default for convolutions) off; a test of TF32 itself turns it on inside.
class Tf32Scope {
 public:
  Tf32Scope(bool convolution, bool matmul)
      : convolution_(cuda::allow_tf32_convolution()), matmul_(cuda::allow_tf32_matmul()) {
    cuda::set_allow_tf32_convolution(convolution);
    cuda::set_allow_tf32_matmul(matmul);
  }
  ~Tf32Scope() {
    cuda::set_allow_tf32_convolution(convolution_);
    cuda::set_allow_tf32_matmul(matmul_);
  }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;

 private:
  bool convolution_;
  bool matmul_;
};

/// Base fixture for tests parameterised over devices; skips GPU runs when no GPU is present, and
/// runs float32 GPU work without TF32 (Tf32Scope).
class DeviceTest : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam().is_cuda() && !cuda_available()) {
      GTEST_SKIP()
          << "no CUDA device is available on this machine; the GPU variant of this test is skipped";
    }
  }
  Device device() const { return GetParam(); }

 private:
  Tf32Scope full_float32_{false, false};
};

/// Base fixture of the GPU tests: skips (with a message) on a machine without a usable GPU.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) {
      GTEST_SKIP() << "no CUDA device is available on this machine (cuda_device_count() == 0); "
                      "the GPU tests run where a GPU is present";
    }
  }
  static Device gpu() { return Device::cuda(0); }

 private:
  Tf32Scope full_float32_{false, false};  // float32 compared at float32 tolerances
};

/// Turns debug mode on for the scope (checks that read back from a GPU, e.g. label ranges).
class DebugModeScope {
 public:
  DebugModeScope() : previous_(is_debug()) { set_debug(true); }
  ~DebugModeScope() { set_debug(previous_); }
  DebugModeScope(const DebugModeScope&) = delete;
  DebugModeScope& operator=(const DebugModeScope&) = delete;

 private:
  bool previous_;
};

/// Asserts that two arrays have the same shape and are close elementwise.
inline ::testing::AssertionResult ArraysClose(const Array& actual, const Array& expected,
                                              double rtol = 1e-5, double atol = 1e-7) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << "shapes differ: " << actual.shape() << " vs expected " << expected.shape();
  }
  std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    if (!both_nan && !(std::abs(a[i] - e[i]) <= atol + rtol * std::abs(e[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " vs expected " << e[i] << " (rtol " << rtol
             << ", atol " << atol << ")\nactual:   " << actual << "\nexpected: " << expected;
    }
  }
  return ::testing::AssertionSuccess();
}

/// Sets (or, with nullptr, unsets) an environment variable for the lifetime of the guard, then
/// restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace kusari::testing

#define KUSARI_INSTANTIATE_DEVICE_TEST(Suite)                                                      \
  INSTANTIATE_TEST_SUITE_P(Devices, Suite, ::testing::ValuesIn(::kusari::testing::test_devices()), \
                           ::kusari::testing::device_name)
