// Differentiable loss functions (Chainer's F.loss family).
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// How a loss combines per-sample values.
enum class Reduce { kMean, kNone };

/// Cross entropy of softmax(x) along axis 1 against integer labels t (int32 or int64).
/// Samples whose label equals `ignore_label` contribute nothing; with Reduce::kMean the sum is
/// divided by the number of samples that are not ignored (Chainer's normalize=True). The loss
/// has x's dtype, except for float16 and bfloat16 x: it is then computed and returned in float32
/// (the gradient with respect to x keeps x's dtype; Note [Softmax cross entropy in 16-bit floats]).
/// With label_smoothing = eps in [0, 1] the target is (1 - eps) onehot(t) + eps / classes
/// instead of onehot(t) (Note [Label smoothing] in src/functions/loss.cc).
Variable softmax_cross_entropy(const Variable& x, const Array& t, int64_t ignore_label = -1,
                               Reduce reduce = Reduce::kMean, double label_smoothing = 0.0);

/// softmax_cross_entropy of x[:, :classes], for logits whose last columns are padding (a
/// vocabulary padded to a multiple of 64, say): the padding takes no part in the softmax and gets
/// a zero gradient, and no slice of x is made (Note [Padded classes] in src/functions/loss.cc).
/// classes must be in [1, x.shape[1]].
Variable softmax_cross_entropy_padded(const Variable& x, const Array& t, int64_t classes,
                                      int64_t ignore_label = -1, Reduce reduce = Reduce::kMean,
                                      double label_smoothing = 0.0);

/// Sigmoid cross entropy of logits x against binary labels t (int32 or int64, same shape as x;
/// 0 or 1, or -1 to ignore an element), computed stably as
/// max(x, 0) - x t + log(1 + exp(-|x|)). With Reduce::kMean the sum is divided by the number of
/// elements not ignored when `normalize`, else by the batch size x.shape[0] (Chainer's semantics).
Variable sigmoid_cross_entropy(const Variable& x, const Array& t, bool normalize = true,
                               Reduce reduce = Reduce::kMean);

/// mean((x0 - x1)^2) over all elements; x0 and x1 must have the same shape and dtype.
Variable mean_squared_error(const Variable& x0, const Variable& x1);

/// How huber_loss reduces its elementwise values (Chainer's reduce argument).
enum class HuberReduce {
  kSumAlongSecondAxis,  ///< the sum over every axis but the first: one loss per sample
  kNone,                ///< the elementwise values
};

/// Huber's loss of x against t (same shape and dtype): 0.5 d^2 where |d| <= delta, else
/// delta (|d| - 0.5 delta), d = x - t (Chainer's huber_loss; with delta = 1 the smooth L1 loss of
/// Fast R-CNN). Both x and t get gradients. delta must be positive.
Variable huber_loss(const Variable& x, const Variable& t, double delta,
                    HuberReduce reduce = HuberReduce::kSumAlongSecondAxis);

/// The focal loss of RetinaNet (Lin et al. 2017) on logits x against binary targets t (x's
/// shape; 0 or 1 as a floating array): the elementwise sigmoid cross entropy times
/// (1 - p_t)^gamma, times alpha_t = alpha t + (1 - alpha)(1 - t) when alpha >= 0 (torchvision's
/// sigmoid_focal_loss). Reduce::kMean averages over every element; kNone keeps them.
Variable sigmoid_focal_loss(const Variable& x, const Array& t, double alpha = 0.25, double gamma = 2.0,
                            Reduce reduce = Reduce::kNone);

/// Connectionist temporal classification (Graves et al. 2006; Chainer's
/// connectionist_temporal_classification): the negative log-likelihood of the label sequences t
/// (batch, max_label_length; int32 or int64, no blank among them) under the per-step scores x
/// (one (batch, classes) array per step, unnormalised: log_softmax is applied), summed over every
/// alignment that collapses to t (repeats merged, then blanks removed). input_length and
/// label_length (batch; int32 or int64) are each sample's number of steps and of labels;
/// undefined, they are all the steps and all the labels. Reduce::kMean averages over the batch,
/// kNone keeps one loss per sample. 16-bit scores are computed in float32 and the loss is
/// float32. A sample that no alignment fits (fewer steps than its labels need) gets a loss of
/// about 1e30. Composed from log_softmax, take and logsumexp, one recursion step per time step
/// (Note [CTC as a recursion of functions]), so it runs, and differentiates twice, on every
/// device.
Variable connectionist_temporal_classification(const std::vector<Variable>& x, const Array& t, int64_t blank_symbol,
                                               const Array& input_length = Array(),
                                               const Array& label_length = Array(), Reduce reduce = Reduce::kMean);

}  // namespace kusari::functions
