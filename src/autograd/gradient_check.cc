#include "kusari/autograd/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "kusari/autograd/mode.h"
#include "kusari/core/random.h"
#include "kusari/core/routines.h"

namespace kusari {
namespace {

double dot(const Array& a, const Array& b) {
  std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < va.size(); ++i) s += va[i] * vb[i];
  return s;
}

std::vector<Array> evaluate(const VariadicFunction& f, const std::vector<Array>& xs) {
  NoBackpropMode no_backprop;
  std::vector<Variable> vs;
  vs.reserve(xs.size());
  for (const Array& x : xs) vs.emplace_back(x);
  std::vector<Variable> ys = f(vs);
  std::vector<Array> out;
  out.reserve(ys.size());
  for (const Variable& y : ys) out.push_back(y.defined() ? y.data() : Array());
  return out;
}

bool checked(const GradientCheckOptions& o, const Array& x, int i) {
  if (!is_floating(x.dtype())) return false;
  return std::find(o.no_grad_inputs.begin(), o.no_grad_inputs.end(), i) == o.no_grad_inputs.end();
}

}  // namespace

void check_backward(const VariadicFunction& f, const std::vector<Array>& inputs_in,
                    const std::vector<Array>& grad_outputs_in, const GradientCheckOptions& o) {
  Generator gen(o.seed);
  // Work on contiguous copies so the function cannot alias the caller's arrays.
  std::vector<Array> inputs;
  for (const Array& x : inputs_in) inputs.push_back(x);

  std::vector<Variable> xs;
  std::vector<Variable> targets;
  std::vector<int> target_index;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const bool c = checked(o, inputs[i], static_cast<int>(i));
    xs.emplace_back(inputs[i], c);
    if (c) {
      targets.push_back(xs.back());
      target_index.push_back(static_cast<int>(i));
    }
  }
  std::vector<Variable> ys = f(xs);
  KUSARI_CHECK(!ys.empty(), ValueError, "check_backward: the function returned no outputs");
  std::vector<Array> gys;
  for (size_t j = 0; j < ys.size(); ++j) {
    if (!grad_outputs_in.empty()) {
      KUSARI_CHECK(grad_outputs_in.size() == ys.size(), ValueError, "check_backward: ", grad_outputs_in.size(),
                   " grad_outputs for ", ys.size(), " outputs");
      gys.push_back(grad_outputs_in[j]);
    } else if (is_floating(ys[j].dtype())) {
      gys.push_back(Array::normal(ys[j].shape(), 0, 1, ys[j].dtype(), ys[j].device(), &gen));
    } else {
      gys.push_back(Array());
    }
  }
  std::vector<Variable> gy_vars;
  std::vector<Variable> ys_used;
  for (size_t j = 0; j < ys.size(); ++j) {
    if (gys[j].defined() && ys[j].requires_grad()) {
      ys_used.push_back(ys[j]);
      gy_vars.emplace_back(gys[j]);
    }
  }
  std::vector<Variable> analytic;
  if (!ys_used.empty()) analytic = grad(ys_used, targets, gy_vars);

  for (size_t t = 0; t < targets.size(); ++t) {
    const int i = target_index[t];
    const Array& x = inputs[i];
    for (int dir = 0; dir < o.directions; ++dir) {
      Array d = Array::normal(x.shape(), 0, 1, Dtype::kFloat64, Device::cpu(), &gen);
      Array x64 = x.to_device(Device::cpu()).astype(Dtype::kFloat64);
      Array xp = (x64 + d * o.eps).astype(x.dtype()).to_device(x.device());
      Array xm = (x64 - d * o.eps).astype(x.dtype()).to_device(x.device());
      // The step actually taken after rounding to x's dtype.
      Array step = xp.astype(Dtype::kFloat64).to_device(Device::cpu()) - xm.astype(Dtype::kFloat64).to_device(Device::cpu());
      std::vector<Array> in_p = inputs, in_m = inputs;
      in_p[i] = xp;
      in_m[i] = xm;
      std::vector<Array> yp = evaluate(f, in_p), ym = evaluate(f, in_m);
      double numeric = 0;
      for (size_t j = 0; j < ys.size(); ++j) {
        if (!gys[j].defined()) continue;
        Array dy = yp[j].astype(Dtype::kFloat64) - ym[j].astype(Dtype::kFloat64);
        numeric += dot(gys[j].astype(Dtype::kFloat64), dy);
      }
      double analytic_dd = 0;
      if (t < analytic.size() && analytic[t].defined()) {
        analytic_dd = dot(analytic[t].data().astype(Dtype::kFloat64), step);
      }
      // Both are derivatives times the step taken (2 eps d); compare them as such, scaled back.
      const double scale = 1.0 / (2.0 * o.eps);
      numeric *= scale;
      analytic_dd *= scale;
      if (!(std::abs(numeric - analytic_dd) <= o.atol + o.rtol * std::abs(numeric))) {
        std::ostringstream os;
        os << "check_backward: the gradient of input " << i << " (shape " << x.shape() << ", "
           << dtype_name(x.dtype()) << ") does not match the numerical gradient:\n"
           << "  directional derivative, numerical: " << numeric << "\n"
           << "  directional derivative, analytic:  " << analytic_dd << "\n"
           << "  |difference| = " << std::abs(numeric - analytic_dd) << " > atol + rtol |numerical| = "
           << o.atol + o.rtol * std::abs(numeric) << " (eps=" << o.eps << ", direction " << dir << ")";
        if (t >= analytic.size() || !analytic[t].defined()) os << "\n  (backward produced no gradient for this input)";
        throw GradientCheckError(os.str());
      }
    }
  }
}

void check_backward(const std::function<Variable(const Variable&)>& f, const Array& input,
                    const GradientCheckOptions& options) {
  check_backward([&f](const std::vector<Variable>& xs) { return std::vector<Variable>{f(xs[0])}; }, {input}, {},
                 options);
}

void check_double_backward(const VariadicFunction& f, const std::vector<Array>& inputs,
                           const std::vector<Array>& grad_outputs_in, const std::vector<Array>& grad_grad_inputs,
                           const GradientCheckOptions& o) {
  Generator gen(o.seed + 1);
  const size_t n = inputs.size();
  std::vector<Array> grad_outputs = grad_outputs_in;
  if (grad_outputs.empty()) {
    std::vector<Array> ys = evaluate(f, inputs);
    for (const Array& y : ys) grad_outputs.push_back(Array::normal(y.shape(), 0, 1, y.dtype(), y.device(), &gen));
  }
  std::vector<int> checked_idx;
  for (size_t i = 0; i < n; ++i) {
    if (checked(o, inputs[i], static_cast<int>(i))) checked_idx.push_back(static_cast<int>(i));
  }
  // g(x, gy) = d<gy, f(x)>/dx for the checked inputs.
  VariadicFunction first_order = [&f, n, checked_idx](const std::vector<Variable>& args) {
    std::vector<Variable> xs(args.begin(), args.begin() + static_cast<long>(n));
    std::vector<Variable> gys(args.begin() + static_cast<long>(n), args.end());
    // Inside evaluate() backprop is off; the first-order graph must still be recorded so that
    // its gradient exists (it is discarded there).
    ForceBackpropMode force;
    std::vector<Variable> xs_req;
    for (size_t i = 0; i < xs.size(); ++i) {
      bool c = std::find(checked_idx.begin(), checked_idx.end(), static_cast<int>(i)) != checked_idx.end();
      if (c && !xs[i].requires_grad()) {
        // A fresh leaf would disconnect x from the outer graph; keep the same variable instead.
        xs[i].set_requires_grad(true);
      }
    }
    std::vector<Variable> ys = f(xs);
    std::vector<Variable> targets;
    for (int i : checked_idx) targets.push_back(xs[static_cast<size_t>(i)]);
    std::vector<Variable> gxs = grad(ys, targets, gys, true);
    for (size_t k = 0; k < gxs.size(); ++k) {
      if (!gxs[k].defined()) gxs[k] = Variable(Array::zeros_like(targets[k].data()));
    }
    return gxs;
  };
  std::vector<Array> args = inputs;
  for (const Array& g : grad_outputs) args.push_back(g);
  check_backward(first_order, args, grad_grad_inputs, o);
}

void check_double_backward(const std::function<Variable(const Variable&)>& f, const Array& input,
                           const GradientCheckOptions& options) {
  check_double_backward([&f](const std::vector<Variable>& xs) { return std::vector<Variable>{f(xs[0])}; }, {input},
                        {}, {}, options);
}

}  // namespace kusari
