// Helpers for tests of differentiable functions: gradient-check tolerances per dtype, random and
// non-contiguous inputs, and a fixture (over devices) that runs first- and second-order checks.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "kusari/autograd/gradient_check.h"
#include "kusari/autograd/variable.h"
#include "test_util.h"

namespace kusari::testing {

/// Gradient-check tolerances: tight for float64, loose for float32.
inline GradientCheckOptions grad_tol(Dtype d) {
  GradientCheckOptions o;
  if (d == float64) {
    o.eps = 1e-5;
    o.atol = 1e-8;
    o.rtol = 1e-6;
  } else {
    o.eps = 1e-2;
    o.atol = 1e-3;
    o.rtol = 1e-2;
  }
  return o;
}

/// The dtypes every function's gradients are checked in.
inline std::vector<Dtype> grad_dtypes() {
  return {float64, float32};
}

/// A device-parameterised fixture with input generators and gradient-check shortcuts.
class FunctionTest : public DeviceTest {
 protected:
  /// Uniform numbers in [lo, hi).
  Array uniform(const Shape& s, Dtype d, double lo = -1, double hi = 1) {
    return Array::uniform(s, lo, hi, d, device(), &gen_);
  }
  /// A non-contiguous array of shape s: the transposed view of a fresh array.
  Array noncontig(const Shape& s, Dtype d, double lo = -1, double hi = 1) {
    Shape r(s.begin(), s.end());
    std::reverse(r.begin(), r.end());
    Array a = uniform(r, d, lo, hi).transpose();
    EXPECT_TRUE(s.size() < 2 || !a.is_contiguous());
    return a;
  }
  /// Magnitudes in [lo, hi) with random signs: keeps inputs away from a kink at 0.
  Array away_from_zero(const Shape& s, Dtype d, double lo = 0.1, double hi = 1) {
    Array m = uniform(s, d, lo, hi);
    return kusari::where(kusari::less(uniform(s, d, 0, 1), 0.5), kusari::negative(m), m);
  }
  /// check_backward and (unless told otherwise) check_double_backward, with grad_tol of the first
  /// floating input's dtype.
  void check(const VariadicFunction& f, const std::vector<Array>& inputs,
             bool double_backward = true, std::vector<int> no_grad_inputs = {}) {
    Dtype d = float64;
    for (const Array& a : inputs) {
      if (is_floating(a.dtype())) {
        d = a.dtype();
        break;
      }
    }
    GradientCheckOptions o = grad_tol(d);
    o.no_grad_inputs = std::move(no_grad_inputs);
    check_backward(f, inputs, {}, o);
    if (double_backward) check_double_backward(f, inputs, {}, {}, o);
  }
  void check(const std::function<Variable(const Variable&)>& f, const Array& x,
             bool double_backward = true) {
    check([&f](const std::vector<Variable>& v) { return std::vector<Variable>{f(v[0])}; }, {x},
          double_backward);
  }

  Generator gen_{20240601};
};

}  // namespace kusari::testing
