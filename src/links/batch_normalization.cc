#include "kusari/links/batch_normalization.h"

#include <algorithm>
#include <utility>

#include "kusari/autograd/mode.h"
#include "kusari/functions/array.h"
#include "kusari/functions/normalization.h"

namespace kusari::links {

namespace {

constexpr const char* kName = "BatchNormalization";

// Fills like `inner` but allocates `dtype`: Chainer sets the dtype of the gamma and beta
// initializers to the link's dtype, whatever initializer the user gave.
class InitializerWithDtype : public Initializer {
 public:
  InitializerWithDtype(std::shared_ptr<Initializer> inner, Dtype dtype)
      : inner_(std::move(inner)), dtype_(dtype) {}
  void operator()(Array& array) const override { (*inner_)(array); }
  Dtype dtype() const override { return dtype_; }

 private:
  std::shared_ptr<Initializer> inner_;
  Dtype dtype_;
};

std::shared_ptr<Initializer> with_dtype(std::shared_ptr<Initializer> init, double default_value,
                                        Dtype dtype) {
  if (!init) return std::make_shared<initializers::Constant>(default_value, dtype);
  if (init->dtype() == dtype) return init;
  return std::make_shared<InitializerWithDtype>(std::move(init), dtype);
}

// Note [Mixed-precision batch norm]
// Chainer keeps a batch norm's parameters and statistics in the link's own dtype whatever the
// input's. An input of another dtype is normalised with gamma and beta cast to its dtype
// (differentiably: their gradients come back in the parameters' dtype), except float32
// parameters of a float16 or bfloat16 input, which the functions take as they are and which keep
// the statistics in float32 (Note [Fused batch normalization in autograd]). The running
// statistics are updated in place in their own dtype.
Variable as_param_dtype(const Variable& v, Dtype dtype) {
  if (v.dtype() == dtype || (is_half_precision(dtype) && v.dtype() == float32)) return v;
  return functions::cast(v, dtype);
}

}  // namespace

BatchNormalization::BatchNormalization(std::optional<Shape> size, double decay, double eps,
                                       Dtype dtype, bool use_gamma, bool use_beta,
                                       std::shared_ptr<Initializer> initial_gamma,
                                       std::shared_ptr<Initializer> initial_beta,
                                       std::optional<Axes> axis,
                                       std::shared_ptr<Initializer> initial_avg_mean,
                                       std::shared_ptr<Initializer> initial_avg_var)
    : decay_(decay),
      eps_(eps),
      dtype_(dtype),
      axis_(std::move(axis)),
      initial_avg_mean_(std::move(initial_avg_mean)),
      initial_avg_var_(std::move(initial_avg_var)) {
  KUSARI_CHECK(
      size || axis_, ValueError, kName,
      ": size or axis is required (without a size the parameter shape is taken from the input over "
      "the axes that are not normalised)");
  if (size) {
    for (int64_t d : *size) {
      KUSARI_CHECK(d > 0, ValueError, kName, ": size must be positive, got ", *size);
    }
  }
  KUSARI_CHECK(!axis_ || !axis_->empty(), ValueError, kName, ": axis must name at least one axis");
  KUSARI_CHECK(decay >= 0.0 && decay <= 1.0, ValueError, kName, ": decay must be in [0, 1], got ",
               decay);
  KUSARI_CHECK(eps > 0.0, ValueError, kName, ": eps must be positive, got ", eps);
  KUSARI_CHECK(is_floating(dtype), DtypeError, kName, ": dtype must be floating-point, got ",
               dtype_name(dtype));
  // Chainer's persistents, in its order: N, avg_mean, avg_var.
  add_persistent("N", Array::scalar(int64_t{0}, int64, device()));
  add_persistent("avg_mean", Array());
  add_persistent("avg_var", Array());
  if (use_gamma) {
    gamma = add_param("gamma", Parameter(with_dtype(std::move(initial_gamma), 1.0, dtype),
                                         std::nullopt, device()));
  }
  if (use_beta) {
    beta = add_param(
        "beta", Parameter(with_dtype(std::move(initial_beta), 0.0, dtype), std::nullopt, device()));
  }
  if (size) initialize(*size);
}

BatchNormalization::BatchNormalization(int64_t size, double decay, double eps, Dtype dtype,
                                       bool use_gamma, bool use_beta,
                                       std::shared_ptr<Initializer> initial_gamma,
                                       std::shared_ptr<Initializer> initial_beta,
                                       std::optional<Axes> axis,
                                       std::shared_ptr<Initializer> initial_avg_mean,
                                       std::shared_ptr<Initializer> initial_avg_var)
    : BatchNormalization(Shape{size}, decay, eps, dtype, use_gamma, use_beta,
                         std::move(initial_gamma), std::move(initial_beta), std::move(axis),
                         std::move(initial_avg_mean), std::move(initial_avg_var)) {}

void BatchNormalization::initialize(const Shape& shape) {
  auto statistic = [&](const std::shared_ptr<Initializer>& init, double default_value) {
    Array a = Array::empty(shape, dtype_, device());
    if (init) {
      (*init)(a);
    } else {
      a.fill(default_value);
    }
    return a;
  };
  if (!persistent("avg_mean").defined()) persistent("avg_mean") = statistic(initial_avg_mean_, 0.0);
  if (!persistent("avg_var").defined()) persistent("avg_var") = statistic(initial_avg_var_, 1.0);
  if (gamma.defined() && !gamma.is_initialized()) gamma.initialize(shape);
  if (beta.defined() && !beta.is_initialized()) beta.initialize(shape);
}

void BatchNormalization::to_dtype(Dtype dtype) {
  check_link_dtype(dtype);
  dtype_ = is_half_precision(dtype) ? float32 : dtype;
  convert_dtype(dtype_);
}

Shape BatchNormalization::param_shape_for(const Variable& x) const {
  Shape shape;
  if (axis_) {
    Axes axes = normalize_axes(*axis_, x.ndim(), kName, false);
    for (int d = 0; d < x.ndim(); ++d) {
      if (std::find(axes.begin(), axes.end(), d) == axes.end()) shape.push_back(x.shape()[d]);
    }
    return shape;
  }
  // Chainer's default axes: 0 and those after the parameter's, so the parameter covers x's
  // axes 1 .. ndim(size).
  const int n = avg_mean().ndim();
  KUSARI_CHECK(x.ndim() >= n + 1, ShapeError, kName, ": an input of shape ", x.shape(),
               " has too few axes for parameters of shape ", avg_mean().shape(),
               " (expected (batch, ", avg_mean().shape(), ", ...))");
  for (int d = 1; d <= n; ++d) shape.push_back(x.shape()[d]);
  return shape;
}

int64_t BatchNormalization::N() const {
  return persistent("N").item<int64_t>();
}

void BatchNormalization::start_finetuning() {
  persistent("N").fill(int64_t{0});
}

// Note [Batch normalization without moving averages]
// The running mean and variance that a trained network is evaluated with are, by default,
// exponential moving averages of the batch statistics (decay 0.9): mostly the statistics of the
// last few dozen batches, taken while the weights still moved. With the large learning rates of
// large-minibatch training the weights move a lot per step, so those averages can be far from
// the statistics of the final network. The 15-minute ImageNet run (Akiba et al. 2017) names
// "batch normalization without moving averages" among the techniques that kept its 32k batch
// accurate: the statistics the network is evaluated with are not exponential moving averages.
// What we implement, for the last epochs of a run (or any other stretch):
//   kCumulativeAverage  the running statistics become the plain (equally weighted) mean of the
//                       batch statistics seen since the mode was set, as Chainer's finetune mode
//                       (decay 1 - 1/N at the N-th batch), so at the end of training they
//                       average the last epochs' batches, none of them weighted more;
//   kFrozen             the running statistics are not updated at all (training still
//                       normalises with each batch's statistics).
// set_running_statistics(model, mode) switches every batch normalization of a model; the
// train_imagenet flag --bn-freeze-epochs K switches to kCumulativeAverage for the last K epochs.
// The mode is not saved with the model, the count N (a persistent) is: a run resumed inside the
// averaging sets the mode again with restart = false, and goes on averaging where it stopped.
void BatchNormalization::set_running_statistics(RunningStatistics mode, bool restart) {
  if (restart && mode == RunningStatistics::kCumulativeAverage &&
      running_statistics_ != RunningStatistics::kCumulativeAverage) {
    start_finetuning();
  }
  running_statistics_ = mode;
}

int64_t set_running_statistics(Link& model, RunningStatistics mode, bool restart) {
  int64_t count = 0;
  for (auto& [path, link] : model.namedlinks(false)) {
    if (auto* bn = dynamic_cast<BatchNormalization*>(link)) {
      bn->set_running_statistics(mode, restart);
      ++count;
    }
  }
  return count;
}

Variable BatchNormalization::forward(const Variable& x, bool finetune) {
  return normalize(x, finetune, false, Variable());
}

Variable BatchNormalization::forward_relu(const Variable& x, const Variable& residual) {
  return normalize(x, false, true, residual);
}

Variable BatchNormalization::normalize(const Variable& x, bool finetune, bool relu,
                                       const Variable& residual) {
  KUSARI_CHECK(x.defined(), ValueError, kName, ": the input is undefined");
  KUSARI_CHECK(is_floating(x.dtype()), DtypeError, kName, ": expected a floating-point input, got ",
               dtype_name(x.dtype()));
  const Shape shape = param_shape_for(x);
  if (!avg_mean().defined() || !avg_var().defined() ||
      (gamma.defined() && !gamma.is_initialized()) || (beta.defined() && !beta.is_initialized())) {
    initialize(shape);
  }
  KUSARI_CHECK(avg_mean().shape() == shape, ShapeError, kName, ": an input of shape ", x.shape(),
               " needs parameters of shape ", shape, " but this link's are ", avg_mean().shape());

  // Parameters and statistics are used in the input's dtype (Note [Mixed-precision batch norm]).
  Variable g = gamma.defined() ? Variable(gamma) : Variable(Array::full_like(avg_mean(), 1.0));
  Variable b = beta.defined() ? Variable(beta) : Variable(Array::zeros_like(avg_mean()));
  g = as_param_dtype(g, x.dtype());
  b = as_param_dtype(b, x.dtype());
  const Axes axis = axis_ ? *axis_ : Axes{};
  if (is_train_mode()) {
    double decay = decay_;
    if (running_statistics_ == RunningStatistics::kFrozen) {
      // Note [Batch normalization without moving averages]: normalise with the batch's
      // statistics, leave the running ones alone.
      if (relu) {
        return functions::batch_normalization_relu(x, g, b, residual, eps_, nullptr, nullptr,
                                                   decay, axis, reducer_.get());
      }
      return functions::batch_normalization(x, g, b, eps_, nullptr, nullptr, decay, axis,
                                            reducer_.get());
    }
    if (finetune || running_statistics_ == RunningStatistics::kCumulativeAverage) {
      const int64_t n = N() + 1;
      persistent("N").fill(n);
      decay = 1.0 - 1.0 / static_cast<double>(n);
    }
    if (relu) {
      return functions::batch_normalization_relu(x, g, b, residual, eps_, &persistent("avg_mean"),
                                                 &persistent("avg_var"), decay, axis,
                                                 reducer_.get());
    }
    return functions::batch_normalization(x, g, b, eps_, &persistent("avg_mean"),
                                          &persistent("avg_var"), decay, axis, reducer_.get());
  }
  const Variable mean = as_param_dtype(Variable(avg_mean()), x.dtype());
  const Variable var = as_param_dtype(Variable(avg_var()), x.dtype());
  if (relu)
    return functions::fixed_batch_normalization_relu(x, g, b, mean, var, residual, eps_, axis);
  return functions::fixed_batch_normalization(x, g, b, mean, var, eps_, axis);
}

}  // namespace kusari::links
