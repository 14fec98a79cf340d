// Optimizer hooks (Chainer's chainer.optimizer_hooks): functions of the gradients that run before
// the parameter updates.
//
//   opt->add_hook(std::make_shared<kusari::optimizers::WeightDecay>(5e-4));
//   opt->add_hook(std::make_shared<kusari::optimizers::GradientClipping>(5.0));
//
// Note [Hooks and the loss scale]
// Optimizer::update() divides gradients by the loss scale before any hook runs, so hooks see true
// gradients: weight decay needs no scaled rate (Chainer multiplies it by the loss scale) and
// gradient clipping compares the true norm with the threshold.
#pragma once

#include <functional>
#include <string>

#include "kusari/optimizers/optimizer.h"

namespace kusari::optimizers {

/// Selects parameters by their path in the target link ("/layer1/0/bn1/gamma") and the
/// parameter itself.
using ParamPredicate = std::function<bool(const std::string& path, const Parameter& param)>;

/// True for a bias or a normalisation parameter: a parameter of at most one axis (Linear's and
/// Convolution2D's b, BatchNormalization's gamma and beta), the parameters that large-minibatch
/// training leaves out of weight decay and of LARS/LAMB's trust ratio (Note [No weight decay on
/// biases and normalisation]). Weights (2-d and 4-d W, EmbedID's table) are not.
bool is_bias_or_norm(const std::string& path, const Parameter& param);

/// L2 regularisation: g += rate p for every parameter with a gradient, except those that
/// `exclude` selects (none when it is empty), e.g. WeightDecay(1e-4, is_bias_or_norm).
class WeightDecay : public OptimizerHook {
 public:
  explicit WeightDecay(double rate, ParamPredicate exclude = nullptr);
  const char* name() const override { return "WeightDecay"; }
  void operator()(Optimizer& optimizer) override;
  /// The coefficient of the L2 term.
  double rate;
  /// The parameters left without decay (empty: none).
  ParamPredicate exclude;
};

/// L1 regularisation: g += rate sign(p) for every parameter with a gradient.
class Lasso : public OptimizerHook {
 public:
  explicit Lasso(double rate);
  const char* name() const override { return "Lasso"; }
  void operator()(Optimizer& optimizer) override;
  /// The coefficient of the L1 term.
  double rate;
};

/// Scales all gradients by threshold / norm when their global L2 norm (over every parameter's
/// gradient together) exceeds `threshold`.
class GradientClipping : public OptimizerHook {
 public:
  explicit GradientClipping(double threshold);
  const char* name() const override { return "GradientClipping"; }
  void operator()(Optimizer& optimizer) override;
  /// The largest global gradient norm left unscaled.
  double threshold;
};

/// Clips every gradient element to [lower_bound, upper_bound].
class GradientHardClipping : public OptimizerHook {
 public:
  GradientHardClipping(double lower_bound, double upper_bound);
  const char* name() const override { return "GradientHardClipping"; }
  void operator()(Optimizer& optimizer) override;
  /// The smallest gradient value kept.
  double lower_bound;
  /// The largest gradient value kept.
  double upper_bound;
};

/// The global L2 norm of the gradients of the optimizer's parameters (those that have one).
double gradient_norm(Optimizer& optimizer);

}  // namespace kusari::optimizers
