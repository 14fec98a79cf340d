// Batch normalization layer (Chainer's L.BatchNormalization).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kusari/functions/normalization.h"
#include "kusari/links/initializers.h"
#include "kusari/links/link.h"

namespace kusari::links {

/// How a BatchNormalization in train mode keeps its running statistics (Note [Batch
/// normalization without moving averages] in src/links/batch_normalization.cc).
enum class RunningStatistics {
  /// avg = decay avg + (1 - decay) batch statistic (the default).
  kMovingAverage,
  /// The plain mean of the batch statistics since the mode was set (Chainer's finetune: decay
  /// 1 - 1/N at the N-th batch).
  kCumulativeAverage,
  /// Not updated: training normalises with the batch statistics and leaves avg_mean and avg_var
  /// as they are.
  kFrozen,
};

/// Batch normalization with a learnt scale gamma and shift beta and running statistics
/// (Chainer's L.BatchNormalization).
///
/// In train mode (is_train_mode(), Chainer's config.train) forward normalises with the batch's
/// statistics and updates the persistents avg_mean and avg_var in place:
///   avg = decay * avg + (1 - decay) * batch statistic   (avg_var takes the unbiased variance);
/// forward(x, true) is Chainer's `finetune`: it counts calls in the persistent N and uses
/// decay = 1 - 1 / N, so the averages become the plain mean over the calls since
/// start_finetuning(). In test mode (TrainMode(false)) forward normalises with avg_mean and
/// avg_var (functions::fixed_batch_normalization) and changes nothing.
///
/// The statistics are taken over `axis`; by default over axis 0 and the axes after the parameter
/// shape, i.e. per channel for (N, C) and (N, C, H, W) inputs with size C. gamma, beta, avg_mean
/// and avg_var have the shape `size`. Without a size, `axis` is required and the shape is the
/// input's over the other axes, fixed at the first forward (Chainer's `size=None`).
///
///   links::BatchNormalization bn(64);                                    // (N, 64, H, W)
///   links::BatchNormalization lazy(std::nullopt, 0.9, 2e-5, float32, true, true, nullptr,
///                                  nullptr, Axes{0, 2, 3});                // C from the input
class BatchNormalization : public Link {
 public:
  /// Chainer's constructor and defaults. `size` is the shape of the parameters (std::nullopt: from
  /// the first input; `axis` is then required). `dtype` is the dtype of the parameters and
  /// statistics; inputs of another floating dtype are normalised with them cast to the input's.
  /// initial_gamma / initial_beta default to ones / zeros, initial_avg_mean / initial_avg_var
  /// to zeros / ones. use_gamma / use_beta false drop the parameter (a constant 1 / 0 is used).
  BatchNormalization(std::optional<Shape> size, double decay = 0.9, double eps = 2e-5,
                     Dtype dtype = float32, bool use_gamma = true, bool use_beta = true,
                     std::shared_ptr<Initializer> initial_gamma = nullptr,
                     std::shared_ptr<Initializer> initial_beta = nullptr,
                     std::optional<Axes> axis = std::nullopt,
                     std::shared_ptr<Initializer> initial_avg_mean = nullptr,
                     std::shared_ptr<Initializer> initial_avg_var = nullptr);
  /// The common case: `size` channels, e.g. BatchNormalization(64) for (N, 64) or (N, 64, H, W).
  explicit BatchNormalization(int64_t size, double decay = 0.9, double eps = 2e-5,
                              Dtype dtype = float32, bool use_gamma = true, bool use_beta = true,
                              std::shared_ptr<Initializer> initial_gamma = nullptr,
                              std::shared_ptr<Initializer> initial_beta = nullptr,
                              std::optional<Axes> axis = std::nullopt,
                              std::shared_ptr<Initializer> initial_avg_mean = nullptr,
                              std::shared_ptr<Initializer> initial_avg_var = nullptr);

  /// Converts gamma, beta and the running statistics to `dtype`, or to float32 when `dtype` is
  /// float16 or bfloat16: the statistics are averages that 16-bit floats would round away
  /// (Chainer's mixed16). Inputs of a 16-bit dtype are normalised with them cast to the input's
  /// dtype (see Note [Link dtype] and Note [Mixed-precision batch norm]).
  void to_dtype(Dtype dtype) override;
  /// The dtype of the parameters and statistics.
  Dtype dtype() const { return dtype_; }

  /// forward(x, false).
  Variable forward(const Variable& x) override { return forward(x, false); }
  /// Normalises x as described above; `finetune` is Chainer's forward(x, finetune=True).
  Variable forward(const Variable& x, bool finetune);
  /// relu(forward(x) + residual), or relu(forward(x)) with an undefined residual: the end of a
  /// residual block, with the addition and the relu inside the normalising pass where the fused
  /// kernels take x (functions::batch_normalization_relu).
  Variable forward_relu(const Variable& x, const Variable& residual = Variable());
  /// Resets the fine-tuning count N to 0 (Chainer's start_finetuning).
  void start_finetuning();
  /// How train-mode forwards update avg_mean and avg_var from now on (every forward, also
  /// forward_relu and forward(x, false)). Switching to kCumulativeAverage restarts the count N,
  /// so the averages become the plain mean of the batches from here on; with restart = false the
  /// count goes on from its value (a run resumed inside the averaging, N loaded from a snapshot).
  void set_running_statistics(RunningStatistics mode, bool restart = true);
  /// The current way of keeping the running statistics.
  RunningStatistics running_statistics() const { return running_statistics_; }

  /// The scale, the shift (undefined when not used).
  Parameter gamma, beta;
  /// The running mean and variance (undefined until sized).
  const Array& avg_mean() const { return persistent("avg_mean"); }
  const Array& avg_var() const { return persistent("avg_var"); }
  /// The number of fine-tuning calls since start_finetuning().
  int64_t N() const;
  /// The decay of the running averages, and the epsilon added to the variance.
  double decay() const { return decay_; }
  double eps() const { return eps_; }
  /// The axes the statistics are taken over, when given.
  const std::optional<Axes>& axis() const { return axis_; }

  /// Makes the batch statistics (in train mode) those of all processes sharing `reducer`
  /// (multi-node batch normalization; see kusari::mn::create_mnbn_model). Null: local statistics.
  void set_statistics_reducer(std::shared_ptr<functions::BatchStatisticsReducer> reducer) {
    reducer_ = std::move(reducer);
  }
  const std::shared_ptr<functions::BatchStatisticsReducer>& statistics_reducer() const {
    return reducer_;
  }

 protected:
  const char* type_name() const override { return "BatchNormalization"; }

 private:
  // Sizes whatever is not sized yet (parameters and statistics) with `shape`.
  void initialize(const Shape& shape);
  // The parameter shape x implies (checked against the current one when sized).
  Shape param_shape_for(const Variable& x) const;
  // forward(x, finetune), then + residual and relu when `relu` (residual may be undefined).
  Variable normalize(const Variable& x, bool finetune, bool relu, const Variable& residual);

  double decay_;
  double eps_;
  Dtype dtype_;
  std::optional<Axes> axis_;
  std::shared_ptr<Initializer> initial_avg_mean_;
  std::shared_ptr<Initializer> initial_avg_var_;
  std::shared_ptr<functions::BatchStatisticsReducer> reducer_;
  RunningStatistics running_statistics_ = RunningStatistics::kMovingAverage;
};

/// set_running_statistics(mode, restart) on every BatchNormalization in `model` (itself included,
/// at any depth); returns how many there were.
int64_t set_running_statistics(Link& model, RunningStatistics mode, bool restart = true);

}  // namespace kusari::links
