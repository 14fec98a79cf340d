#include "kusari/optimizers/hooks.h"

#include <cmath>

#include "kusari/core/routines.h"

namespace kusari::optimizers {
namespace {

// Calls f(data, grad) for every parameter with data and a gradient. Like Chainer's per-parameter
// hooks, this includes parameters whose update is disabled (their gradients are not used).
// Under use_fp32_update a 16-bit parameter's gradient is float32 during the kPre hooks (Note
// [Float32 master weights]); its data is then passed as the float32 master copy when there is
// one (the exact weights), else widened.
template <typename F>
void for_each_grad(Optimizer& optimizer, F f, const ParamPredicate& exclude = nullptr) {
  for (ParamState& s : optimizer.param_states()) {
    Array g = s.param.grad();  // a handle to the gradient's memory: hooks update it in place
    if (!g.defined()) continue;
    if (exclude && exclude(s.path, s.param)) continue;
    const Array& data = s.param.data();
    if (data.dtype() == g.dtype()) {
      f(data, g);
    } else {
      const Array* master = s.find("master");
      f(master && master->dtype() == g.dtype() ? *master : data.astype(g.dtype()), g);
    }
  }
}

}  // namespace

// Note [No weight decay on biases and normalisation]
// Weight decay pulls every parameter toward 0. For a weight that is followed by batch
// normalisation this only changes its scale, which the normalisation divides out; for batch
// normalisation's gamma and beta and for biases it changes what the layer computes, and with the
// large learning rates of large-minibatch training it shrinks them for no gain. Large-minibatch
// recipes after Goyal et al. (Jia et al., "Highly Scalable Deep Learning Training System with
// Mixed-Precision", 2018, and the usual LARS and LAMB setups) therefore decay only the weights.
// is_bias_or_norm picks the others by kind: a parameter of at most one axis is a bias, a gamma
// or a beta, whatever its name; any other rule can be given as a predicate on the path.
bool is_bias_or_norm(const std::string&, const Parameter& param) {
  return param.is_initialized() && param.ndim() <= 1;
}

WeightDecay::WeightDecay(double value, ParamPredicate exclude_in)
    : rate(value), exclude(std::move(exclude_in)) {}

void WeightDecay::operator()(Optimizer& optimizer) {
  if (rate == 0.0) return;
  for_each_grad(optimizer, [&](const Array& p, Array& g) { g.assign(g + p * rate); }, exclude);
}

Lasso::Lasso(double value) : rate(value) {}

void Lasso::operator()(Optimizer& optimizer) {
  if (rate == 0.0) return;
  for_each_grad(optimizer, [&](const Array& p, Array& g) { g.assign(g + sign(p) * rate); });
}

GradientClipping::GradientClipping(double value) : threshold(value) {
  KUSARI_CHECK(value >= 0.0, ValueError,
               "GradientClipping: the threshold must be non-negative, got ", value);
}

double gradient_norm(Optimizer& optimizer) {
  // Squares summed in float64 so that float16 gradients neither overflow nor lose the small
  // ones; the per-parameter sums stay on the device and are read once.
  Array sqnorm;
  for_each_grad(optimizer, [&](const Array&, Array& g) {
    const Array g64 = g.astype(Dtype::kFloat64);
    Array s = sum(g64 * g64);
    sqnorm = sqnorm.defined() ? sqnorm + s.to_device(sqnorm.device()) : s;
  });
  // (A sharded optimizer holds a part of the gradient: the squares of every part are summed.)
  return std::sqrt(optimizer.sum_over_shards(sqnorm.defined() ? sqnorm.item<double>() : 0.0));
}

void GradientClipping::operator()(Optimizer& optimizer) {
  const double norm = gradient_norm(optimizer);
  const double rate = threshold / norm;  // inf when the norm is 0: nothing to clip
  if (!(rate < 1.0)) return;
  for_each_grad(optimizer, [&](const Array&, Array& g) { g.assign(g * rate); });
}

GradientHardClipping::GradientHardClipping(double lower, double upper)
    : lower_bound(lower), upper_bound(upper) {
  KUSARI_CHECK(lower <= upper, ValueError, "GradientHardClipping: lower_bound (", lower,
               ") must not exceed upper_bound (", upper, ")");
}

void GradientHardClipping::operator()(Optimizer& optimizer) {
  for_each_grad(optimizer,
                [&](const Array&, Array& g) { g.assign(clip(g, lower_bound, upper_bound)); });
}

}  // namespace kusari::optimizers
