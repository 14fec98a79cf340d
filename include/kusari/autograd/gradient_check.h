// Numerical gradient checking (Chainer's gradient_check.check_backward / check_double_backward).
#pragma once

#include <functional>
#include <vector>

#include "kusari/autograd/variable.h"

namespace kusari {

/// A failed gradient check: the message names the input, both derivatives and the tolerance.
class GradientCheckError : public Error {
 public:
  using Error::Error;
};

/// A function of several variables returning several variables (the thing being checked).
using VariadicFunction = std::function<std::vector<Variable>(const std::vector<Variable>&)>;

struct GradientCheckOptions {
  /// Step of the central difference (relative to a random unit-RMS direction).
  double eps = 1e-3;
  double atol = 1e-5;
  double rtol = 1e-4;
  /// Inputs not to check (e.g. labels); integer inputs are never checked.
  std::vector<int> no_grad_inputs;
  /// Seed of the random directions and output gradients.
  uint64_t seed = 0;
  /// Random directions tried per input.
  int directions = 2;
};

// Note [Directional gradient check]
// For each checked input x_i and a random direction d, the analytic directional derivative
// <grad_i, d> (from backward) is compared with the central difference
// (<gy, f(x + eps d)> - <gy, f(x - eps d)>) / (2 eps), accumulated in float64 on the host.
// The direction actually applied is measured after rounding x +- eps d to x's dtype, so float32
// and float16 inputs are checked against the step they really took.

/// Checks f's backward at `inputs`: throws GradientCheckError on a mismatch.
/// Empty grad_outputs means random ones.
void check_backward(const VariadicFunction& f, const std::vector<Array>& inputs,
                    const std::vector<Array>& grad_outputs = {}, const GradientCheckOptions& options = {});

/// Convenience overload for a function of one variable with one output.
void check_backward(const std::function<Variable(const Variable&)>& f, const Array& input,
                    const GradientCheckOptions& options = {});

/// Checks the second-order gradient: the backward of (x, gy) -> grad of <gy, f(x)> wrt x.
/// Empty grad_outputs / grad_grad_inputs mean random ones.
void check_double_backward(const VariadicFunction& f, const std::vector<Array>& inputs,
                           const std::vector<Array>& grad_outputs = {},
                           const std::vector<Array>& grad_grad_inputs = {},
                           const GradientCheckOptions& options = {});

void check_double_backward(const std::function<Variable(const Variable&)>& f, const Array& input,
                           const GradientCheckOptions& options = {});

}  // namespace kusari
