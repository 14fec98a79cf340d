// Helpers for the tests of links: parameter paths, deterministic parameter values, a gradient
// check that every parameter was reached, and per-test temporary files.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "kusari/kusari.h"
#include "test_util.h"

namespace kusari::testing {

/// The paths of namedparams(include_uninit), in order.
inline std::vector<std::string> param_paths(const Link& link, bool include_uninit = true) {
  std::vector<std::string> out;
  for (const auto& [path, p] : link.namedparams(include_uninit)) out.push_back(path);
  return out;
}

/// The paths of namedpersistents(), in order.
inline std::vector<std::string> persistent_paths(Link& link) {
  std::vector<std::string> out;
  for (const auto& [path, a] : link.namedpersistents()) out.push_back(path);
  return out;
}

/// The keys of an npz file, sorted.
inline std::vector<std::string> npz_keys(const std::string& path) {
  std::vector<std::string> keys;
  for (const auto& [k, a] : read_npz(path)) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  return keys;
}

/// Overwrites every initialised parameter with uniform values in [lo, hi) (biases included, so
/// that a test does not pass only because they are zero).
inline void randomize_params(Link& link, Generator& gen, double lo = -1.0, double hi = 1.0) {
  for (auto& [path, p] : link.namedparams(false)) {
    Array data = p.data();
    data.assign(Array::uniform(data.shape(), lo, hi, data.dtype(), data.device(), &gen));
  }
}

/// Backpropagates sum(y * r) for a random r, so that no gradient vanishes by symmetry (the
/// gradient of sum(batch_normalization(x)) with respect to gamma is zero, for instance).
inline void backward_random_weighted(const Variable& y, Generator& gen) {
  Array r = Array::uniform(y.shape(), 0.5, 1.5, y.dtype(), y.device(), &gen);
  functions::sum(y * Variable(r)).backward();
}

/// Expects every parameter of `link` to be initialised and to hold a nonzero gradient of its shape.
inline void expect_grads_on_every_param(const Link& link) {
  auto params = link.namedparams();
  ASSERT_FALSE(params.empty());
  for (const auto& [path, p] : params) {
    ASSERT_TRUE(p.is_initialized()) << path;
    Array g = p.grad();
    ASSERT_TRUE(g.defined()) << path << " received no gradient";
    EXPECT_EQ(g.shape(), p.shape()) << path;
    EXPECT_GT(kusari::sum(kusari::abs(g.astype(float64))).item<double>(), 0.0)
        << path << ": all-zero gradient";
  }
}

/// A file in the test temporary directory, named after the running test, removed when the
/// object goes out of scope.
struct TempFile {
  explicit TempFile(const std::string& name) {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string stem = std::string(info->test_suite_name()) + "_" + info->name() + "_" + name;
    std::replace(stem.begin(), stem.end(), '/', '_');
    path = (std::filesystem::path(::testing::TempDir()) / ("kusari_links_" + stem)).string();
  }
  ~TempFile() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  /// The file's path.
  std::string path;
};

/// Expects `statement` to throw `E` with a message containing every one of `parts`.
#define KUSARI_EXPECT_THROW_WITH(statement, E, ...)                                \
  do {                                                                             \
    try {                                                                          \
      static_cast<void>(statement);                                                \
      ADD_FAILURE() << "expected " #E " from " #statement;                         \
    } catch (const E& e_) {                                                        \
      for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__}) {     \
        EXPECT_NE(std::string(e_.what()).find(part_), std::string::npos)           \
            << "message of " #statement " lacks '" << part_ << "': " << e_.what(); \
      }                                                                            \
    }                                                                              \
  } while (0)

}  // namespace kusari::testing
