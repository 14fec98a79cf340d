// PowerSGD gradient compression with error feedback (Note [PowerSGD] in powersgd.cc): a
// model-level strategy of reduce/, owned by the multi-node optimizer, that talks to the
// communicator through allreduce only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "kusari/mn/communicator.h"
#include "kusari/mn/optimizer.h"

namespace kusari::mn::detail {

class PowerSgdReducer {
 public:
  /// `rank`: the rank of the approximation (> 0); a gradient of n x m (its first axis by the
  /// rest) is compressed when n m >= min_ratio * rank (n + m); `start_step`: the steps before
  /// it averages exactly; `seed`: of the first Q (the same on every process).
  PowerSgdReducer(std::shared_ptr<Communicator> comm, int rank, double min_ratio, int64_t start_step, uint64_t seed);

  /// Replaces every gradient of `model` by the average over the processes, compressed where it
  /// pays (missing gradients count as zeros). Collective.
  void mean_grad(Link& model);
  /// Drops the error feedback and the warm-start Qs (the parameters changed).
  void forget();
  CompressionStats stats() const { return stats_; }
  int rank() const { return rank_; }

 private:
  struct Matrix {
    std::string path;
    int64_t n = 0, m = 0, r = 0;
    Array q;      // m x r, float32: the warm start
    Array error;  // n x m, float32: what the last approximations left out (this process's)
  };
  /// The matrix state of `path` with gradient `g`, made on first use (null: not compressed).
  Matrix* matrix_of(const std::string& path, const Array& g);

  std::shared_ptr<Communicator> comm_;
  int rank_;
  double min_ratio_;
  int64_t start_step_;
  uint64_t seed_;
  int64_t steps_ = 0;
  std::deque<Matrix> matrices_;  // (a deque: the pointers of one step stay valid while it grows)
  std::vector<std::string> plain_;  // paths averaged exactly
  CompressionStats stats_;
};

/// Makes the columns of `p` (n x r, float32) orthonormal in place (Gram-Schmidt; a column that is
/// zero, or depends on the ones before (less than 1e-4 of it is left), becomes zero).
void orthonormalize_columns(Array& p);

}  // namespace kusari::mn::detail
