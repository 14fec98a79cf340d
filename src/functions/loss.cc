#include "kusari/functions/loss.h"

#include <algorithm>

#include "functions/function_util.h"
#include "kusari/core/debug.h"
#include "kusari/core/routines.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"
#include "routines/reduction.h"

namespace kusari::functions {

// Note [Softmax cross entropy]
// Forward runs the fused kernels (Note [Fused softmax cross entropy]): one pass over x per row
// for the loss, keeping only each row's log-sum-exp; backward writes (softmax(x) - onehot(t)) *
// gy / count, 0 where t == ignore_label, in one more pass. For double backprop the gradient is
// written again with differentiable functions of x, so the loss can be differentiated twice; a
// device without the kernels composes the loss from log_softmax. Labels out of range are an
// IndexError on the CPU, and on a GPU in debug mode (KUSARI_DEBUG=1: checking every step would
// wait for the device); otherwise the GPU kernel gives such a sample a NaN loss rather than read
// past its row.
//
// Note [Label smoothing]
// With label_smoothing = eps the target of a sample is not onehot(t) but the mixture
// q = (1 - eps) onehot(t) + eps / K over the K classes (Szegedy et al.'s label-smoothing
// regularisation, as PyTorch's CrossEntropyLoss(label_smoothing=eps): the uniform part covers the
// true class too), so the per-sample loss is -sum_k q_k log p_k and the gradient with respect to
// x is (softmax(x) - q) * gy / count. q replaces onehot(t) in both, so ignored samples and the
// mean are handled as before, and eps = 0 is exactly the plain loss. Goyal et al.'s and the
// large-minibatch ImageNet runs use eps = 0.1.
//
// Note [Softmax cross entropy in 16-bit floats]
// The loss of float16 or bfloat16 x is float32, like its sums: bfloat16 would keep 2-3 digits of
// it, and the first gradient of a loss scaled for float16 training (2^16) would overflow float16
// (its largest value is 65504). The fused kernels (Note [Fused softmax cross entropy]) read x in
// its own dtype and compute in float32, so only the gradient with respect to x is rounded, once,
// to x's dtype, and no float32 copy of the (batch, classes) logits is made; the composed path
// casts x to float32 first.
namespace {

// The target q of each row (Note [Label smoothing]) in `dtype`; rows of ignored samples are 0.
Array target_rows(const Array& safe_t, const Array& valid, int64_t n, int64_t classes, double label_smoothing,
                  Dtype dtype, const Device& device) {
  Array onehot = kusari::equal(Array::arange(classes, int64, device).reshape({1, classes}).broadcast_to({n, classes}),
                               safe_t.reshape({n, 1}).broadcast_to({n, classes}));
  onehot = kusari::logical_and(onehot, valid.reshape({n, 1}).broadcast_to({n, classes}));
  Array q = onehot.astype(dtype);
  if (label_smoothing != 0.0) {
    Array row_valid = valid.reshape({n, 1}).broadcast_to({n, classes}).astype(dtype);
    q = q * (1.0 - label_smoothing) + row_valid * (label_smoothing / static_cast<double>(classes));
  }
  return q;
}

// (softmax(x) - q) * gy * coeff written with differentiable functions of x, in float32 for
// 16-bit x: the rule for double backprop (Note [Softmax cross entropy]).
Variable composed_grad(const Variable& x, const Array& q, const Array& coeff, Reduce reduce, const Variable& gy) {
  const int64_t n = x.shape()[0], k = x.shape()[1];
  const Variable xf = is_half_precision(x.dtype()) ? cast(x, float32) : x;
  // softmax(x) = e / sum(e) with e = exp(x - rowmax); the shift is a constant, so this is exactly
  // softmax and differentiable. Rows of ignored samples (q all 0) get no gradient.
  Variable e = exp(sub(xf, Variable(kusari::amax(xf.data(), {1}, true))));
  Variable p = div(e, sum(e, {1}, true));
  Array row_valid = kusari::not_equal(kusari::sum(q, {1}, true), 0.0).astype(q.dtype());
  Variable diff = mul(sub(p, Variable(q)), Variable(row_valid));
  Variable scale = reduce == Reduce::kMean ? broadcast_to(reshape(mul(gy, Variable(coeff)), {1, 1}), {n, k})
                                           : broadcast_to(reshape(gy, {n, 1}), {n, k});
  Variable g = mul(diff, scale);
  return g.dtype() == x.dtype() ? g : cast(g, x.dtype());
}

}  // namespace

namespace {

// softmax_cross_entropy over the first `classes` columns of x (Note [Padded classes]).
Variable cross_entropy(const char* fn, const Variable& x, const Array& t, int64_t classes,
                       int64_t ignore_label, Reduce reduce, double label_smoothing) {
  detail::check_floating(fn, x);
  KUSARI_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, ValueError, fn,
               ": label_smoothing must be in [0, 1], got ", label_smoothing);
  KUSARI_CHECK(x.ndim() == 2, ShapeError, fn, ": x must be 2-d (batch, classes), got shape ", x.shape());
  KUSARI_CHECK(classes <= x.shape()[1] && (classes >= 1 || x.shape()[1] == 0), ValueError, fn,
               ": classes must be in [1, ", x.shape()[1], "] (x's columns), got ", classes);
  KUSARI_CHECK(t.dtype() == int32 || t.dtype() == int64, DtypeError, fn, ": labels must be int32 or int64, got ",
               dtype_name(t.dtype()));
  KUSARI_CHECK(t.ndim() == 1 && t.shape()[0] == x.shape()[0], ShapeError, fn, ": labels of shape ", t.shape(),
               " do not match x of shape ", x.shape(), " (expected (", x.shape()[0], ",))");
  KUSARI_CHECK(t.device() == x.device(), DeviceError, fn, ": x is on ", x.device(), " but the labels are on ",
               t.device());
  const int64_t n = x.shape()[0], width = x.shape()[1];
  Array t64 = t.astype(int64);
  Array valid = kusari::not_equal(t64, ignore_label);
  Array safe_t = kusari::where(valid, t64, Scalar(int64_t{0}));
  if (x.device().is_cpu() || is_debug()) {
    // Labels out of range are a user error; report the first one. On a GPU this check would
    // wait for the device every step, so it runs only in debug mode there (KUSARI_DEBUG=1).
    Array bad = kusari::logical_and(valid, kusari::logical_or(kusari::less(safe_t, int64_t{0}),
                                                              kusari::greater_equal(safe_t, classes)));
    if (kusari::any(bad).item<bool>()) {
      int64_t i = kusari::argmax(bad.astype(int32)).item<int64_t>();
      KUSARI_THROW(IndexError, fn, ": label ", t64.at({i}).item<int64_t>(), " of sample ", i,
                   " is out of range for ", classes, " classes (ignore_label is ", ignore_label, ")");
    }
  }
  const Dtype stat = routines::cross_entropy_stat_dtype(x.dtype());
  // 1 / (number of labels not ignored), kept on the device (no synchronisation).
  Array coeff = kusari::reciprocal(kusari::maximum(kusari::sum(valid).astype(stat), 1.0));
  Array lse;
  Array per_sample = routines::softmax_cross_entropy_rows(x.data(), t64, classes, ignore_label,
                                                          label_smoothing, lse);
  if (per_sample.defined()) {
    Array y = reduce == Reduce::kMean ? kusari::multiply(kusari::sum(per_sample), coeff) : per_sample;
    return record(
        fn, {x}, std::move(y),
        [t64, valid, safe_t, lse, coeff, reduce, ignore_label, label_smoothing, stat, classes,
         width](BackwardContext& ctx) {
          const Variable x = ctx.input(0);
          const Variable& gy = ctx.output_grad();
          const int64_t n = x.shape()[0];
          if (!ctx.is_double_backprop()) {
            Array g = reduce == Reduce::kMean ? kusari::multiply(gy.data(), coeff).broadcast_to({n})
                                              : gy.data();
            g = kusari::multiply(g, valid.astype(stat));
            Array gx = routines::softmax_cross_entropy_rows_backward(x.data(), t64, classes, lse, g,
                                                                     ignore_label, label_smoothing);
            if (gx.defined()) {
              ctx.set_input_grad(0, Variable(std::move(gx)));
              return;
            }
          }
          const Array q = target_rows(safe_t, valid, n, classes, label_smoothing, stat, x.device());
          if (classes == width) {
            ctx.set_input_grad(0, composed_grad(x, q, coeff, reduce, gy));
            return;
          }
          Variable g =
              composed_grad(get_item(x, {Slice(), Slice(0, classes)}), q, coeff, reduce, gy);
          ctx.set_input_grad(
              0,
              concat({g, Variable(Array::zeros({n, width - classes}, g.dtype(), g.device()))}, 1));
        });
  }
  // The device has no fused kernel: -sum(q log_softmax(x)) composed, differentiable throughout.
  const Variable xc = classes == width ? x : get_item(x, {Slice(), Slice(0, classes)});
  const Variable xf = is_half_precision(x.dtype()) ? cast(xc, float32) : xc;
  const Array q = target_rows(safe_t, valid, n, classes, label_smoothing, xf.dtype(), x.device());
  Variable per = neg(sum(mul(log_softmax(xf, 1), Variable(q)), {1}));
  return reduce == Reduce::kMean ? mul(sum(per), Variable(coeff)) : per;
}

}  // namespace

Variable softmax_cross_entropy(const Variable& x, const Array& t, int64_t ignore_label,
                               Reduce reduce, double label_smoothing) {
  // (x's shape is checked there; a malformed x gets 1 here.)
  const int64_t classes = x.defined() && x.ndim() == 2 ? x.shape()[1] : 1;
  return cross_entropy("softmax_cross_entropy", x, t, classes, ignore_label, reduce,
                       label_smoothing);
}

// Note [Padded classes]
// A language model's vocabulary is often padded so that its products run on fast kernels (GPT's
// output layer: Note [Padded vocabulary] in src/models/gpt.cc): the logits then have more columns
// than there are classes. softmax_cross_entropy_padded takes such logits as they are: the fused
// kernels read each row's first `classes` entries and write a gradient row of the full width
// whose padding is 0, so neither a slice of the logits nor a scatter of their gradient (two
// passes over the largest array of the step, each way) is made, and the padding takes no part in
// the softmax: the loss is exactly that of x[:, :classes].
Variable softmax_cross_entropy_padded(const Variable& x, const Array& t, int64_t classes,
                                      int64_t ignore_label, Reduce reduce, double label_smoothing) {
  return cross_entropy("softmax_cross_entropy_padded", x, t, classes, ignore_label, reduce,
                       label_smoothing);
}

// Note [Sigmoid cross entropy]
// Per element, -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))) = max(x, 0) - x t +
// log1p(exp(-|x|)), which never exponentiates a positive number. Elements labelled -1 are masked
// out. The gradient, (sigmoid(x) - t) * mask * gy / count, is written with the differentiable
// sigmoid, so the loss can be differentiated twice.
Variable sigmoid_cross_entropy(const Variable& x, const Array& t, bool normalize, Reduce reduce) {
  const char* fn = "sigmoid_cross_entropy";
  constexpr int64_t kIgnoreLabel = -1;
  detail::check_floating(fn, x);
  KUSARI_CHECK(t.dtype() == int32 || t.dtype() == int64, DtypeError, fn,
               ": labels must be int32 or int64, got ", dtype_name(t.dtype()));
  KUSARI_CHECK(t.shape() == x.shape(), ShapeError, fn, ": labels of shape ", t.shape(),
               " do not match x of shape ", x.shape(), " (expected the same shape)");
  KUSARI_CHECK(x.ndim() >= 1, ShapeError, fn, ": x must have a batch axis, got shape ", x.shape());
  KUSARI_CHECK(t.device() == x.device(), DeviceError, fn, ": x is on ", x.device(),
               " but the labels are on ", t.device());
  const Array& xd = x.data();
  Array valid = kusari::not_equal(t, kIgnoreLabel);
  Array mask = valid.astype(x.dtype());
  Array tf = t.astype(x.dtype());
  // -(x (t - [x >= 0]) - log1p(exp(-|x|))), masked.
  Array step = kusari::greater_equal(xd, 0.0).astype(x.dtype());
  Array elem = kusari::log1p(kusari::exp(kusari::negative(kusari::abs(xd)))) - xd * (tf - step);
  elem = elem * mask;
  // 1 / count on the device (no synchronisation): the labels not ignored, or the batch size.
  Array coeff = normalize ? kusari::reciprocal(kusari::maximum(kusari::sum(valid).astype(x.dtype()), 1.0))
                          : Array::full({}, 1.0 / static_cast<double>(std::max<int64_t>(x.shape()[0], 1)),
                                        x.dtype(), x.device());
  Array y;
  if (reduce == Reduce::kMean) {
    y = kusari::multiply(kusari::sum(elem), coeff);
  } else {
    y = std::move(elem);
  }
  return record(fn, {x}, std::move(y), [mask, tf, coeff, reduce](BackwardContext& ctx) {
    Variable x = ctx.input(0);
    Variable diff = mul(sub(sigmoid(x), Variable(tf)), Variable(mask));
    Variable gy = ctx.output_grad();
    if (reduce == Reduce::kMean) gy = broadcast_to(mul(gy, Variable(coeff)), x.shape());
    ctx.set_input_grad(0, mul(diff, gy));
  });
}

Variable mean_squared_error(const Variable& x0, const Variable& x1) {
  const char* fn = "mean_squared_error";
  detail::check_floating(fn, x0);
  KUSARI_CHECK(x0.dtype() == x1.dtype(), DtypeError, fn, ": x0 is ", dtype_name(x0.dtype()),
               " but x1 is ", dtype_name(x1.dtype()), "; expected the same dtype");
  KUSARI_CHECK(x0.shape() == x1.shape(), ShapeError, fn, ": x0 of shape ", x0.shape(),
               " and x1 of shape ", x1.shape(), " differ; expected the same shape");
  KUSARI_CHECK(x0.device() == x1.device(), DeviceError, fn, ": x0 is on ", x0.device(),
               " but x1 is on ", x1.device());
  const double coeff = 1.0 / static_cast<double>(std::max<int64_t>(x0.size(), 1));
  Array diff = kusari::subtract(x0.data(), x1.data());
  Array y = kusari::sum(kusari::square(diff)) * coeff;
  return record(fn, {x0, x1}, std::move(y), [coeff](BackwardContext& ctx) {
    // d/dx0 = 2 (x0 - x1) gy / n, d/dx1 = -d/dx0.
    Variable x0 = ctx.input(0), x1 = ctx.input(1);
    Variable gx0 = mul(sub(x0, x1), broadcast_to(mul(ctx.output_grad(), 2.0 * coeff), x0.shape()));
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, gx0);
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, neg(gx0));
  });
}

// (Note [Composed Chainer functions] in activation.cc.)
Variable huber_loss(const Variable& x, const Variable& t, double delta, HuberReduce reduce) {
  detail::check_floating("huber_loss", x);
  KUSARI_CHECK(x.shape() == t.shape() && x.dtype() == t.dtype(), ValueError,
               "huber_loss: x and t must have the same shape and dtype, got ", x.shape(), " ",
               dtype_name(x.dtype()), " and ", t.shape(), " ", dtype_name(t.dtype()));
  KUSARI_CHECK(delta > 0, ValueError, "huber_loss: delta must be positive, got ", delta);
  // With a = |x - t| and q = min(a, delta): 0.5 q^2 + delta (a - q) is 0.5 a^2 inside and
  // delta (a - 0.5 delta) outside, with one expression (and its gradients) for both.
  const Variable a = abs(sub(x, t));
  const Variable q = minimum(a, Variable(Array::full_like(a.data(), delta)));
  Variable loss = add(mul(square(q), 0.5), mul(sub(a, q), delta));
  if (reduce == HuberReduce::kNone || loss.ndim() < 2) return loss;
  Axes rest;
  for (int d = 1; d < loss.ndim(); ++d) rest.push_back(d);
  return sum(loss, rest);
}

Variable sigmoid_focal_loss(const Variable& x, const Array& t, double alpha, double gamma, Reduce reduce) {
  detail::check_floating("sigmoid_focal_loss", x);
  KUSARI_CHECK(t.shape() == x.shape(), ValueError, "sigmoid_focal_loss: t's shape ", t.shape(),
               " is not x's ", x.shape());
  KUSARI_CHECK(gamma >= 0, ValueError, "sigmoid_focal_loss: gamma must be non-negative, got ", gamma);
  KUSARI_CHECK(alpha <= 1, ValueError, "sigmoid_focal_loss: alpha must be at most 1 (negative: no weighting), got ",
               alpha);
  const Variable tv(t.astype(x.dtype()).to_device(x.device()));
  // The cross entropy of logits, softplus(x) - x t, stable in both tails.
  const Variable ce = sub(softplus(x), mul(x, tv));
  const Variable p = sigmoid(x);
  // 1 - p_t = p + t - 2 p t.
  const Variable one_minus_pt = sub(add(p, tv), mul(mul(p, tv), 2.0));
  Variable loss = gamma == 0 ? ce : mul(ce, pow(one_minus_pt, gamma));
  if (alpha >= 0) loss = mul(loss, add(mul(tv, 2.0 * alpha - 1.0), 1.0 - alpha));  // alpha t + (1 - alpha)(1 - t)
  return reduce == Reduce::kMean ? mean(loss) : loss;
}

// Note [CTC as a recursion of functions]
// The labels t of a sample are extended to l' = (blank, t_1, blank, t_2, ..., t_L, blank), S =
// 2 L + 1 states. alpha_t(s), the log-probability of the alignments of the first t + 1 steps that
// end in state s, follows
//   alpha_t(s) = logsumexp(alpha_{t-1}(s), alpha_{t-1}(s-1), [alpha_{t-1}(s-2)]) + log p_t(l'_s),
// the third term only where l'_s is a label that differs from l'_{s-2}, starting from
// alpha_{-1} = (0, lowest, ...): a virtual step before the first, in state 0 with probability 1,
// which gives the usual alpha_0 (only states 0 and 1 reachable). A sample whose steps have ended
// (t >= input_length) keeps its alpha. The loss is -logsumexp(alpha(2 L), alpha(2 L - 1)) at the
// sample's own L. Unreachable states hold `lowest` = -1e30 instead of -inf, so no gradient is
// NaN; the emissions log p_t(l'_s) are gathered from log_softmax(x_t) with take. Each step is a
// few (batch, S) functions, so the graph is O(T) nodes and holds O(T batch S) values besides x.
Variable connectionist_temporal_classification(const std::vector<Variable>& xs, const Array& t, int64_t blank_symbol,
                                               const Array& input_length, const Array& label_length,
                                               Reduce reduce) {
  const char* fn = "connectionist_temporal_classification";
  KUSARI_CHECK(!xs.empty(), ValueError, fn, ": x is empty; expected one (batch, classes) array of scores per step");
  const Variable& x0 = xs[0];
  detail::check_floating(fn, x0);
  KUSARI_CHECK(x0.ndim() == 2, ShapeError, fn, ": each step's scores must be (batch, classes), got shape ",
               x0.shape());
  const int64_t batch = x0.shape()[0], classes = x0.shape()[1], steps = static_cast<int64_t>(xs.size());
  const Device device = x0.device();
  for (size_t i = 1; i < xs.size(); ++i) {
    KUSARI_CHECK(xs[i].defined() && xs[i].shape() == x0.shape() && xs[i].dtype() == x0.dtype() &&
                     xs[i].device() == device,
                 ValueError, fn, ": the scores of step ", i, " (", xs[i].defined() ? xs[i].shape().to_string() : "undefined",
                 ") differ from step 0's (", x0.shape(), ", ", dtype_name(x0.dtype()), ", ", device,
                 ") in shape, dtype or device");
  }
  KUSARI_CHECK(blank_symbol >= 0 && blank_symbol < classes, ValueError, fn, ": blank_symbol ", blank_symbol,
               " is not one of the ", classes, " classes");
  KUSARI_CHECK(t.dtype() == int32 || t.dtype() == int64, DtypeError, fn, ": labels must be int32 or int64, got ",
               dtype_name(t.dtype()));
  KUSARI_CHECK(t.ndim() == 2 && t.shape()[0] == batch, ShapeError, fn, ": labels must be (batch, max_label_length) "
               "with the scores' batch ", batch, ", got shape ", t.shape());
  KUSARI_CHECK(t.device() == device, DeviceError, fn, ": the labels are on ", t.device(), " but x is on ", device);
  const int64_t max_labels = t.shape()[1], states = 2 * max_labels + 1;
  const auto lengths = [&](const Array& given, int64_t all, const char* name) {
    if (!given.defined()) return Array::full({batch}, Scalar(all), int64, device);
    KUSARI_CHECK(given.dtype() == int32 || given.dtype() == int64, DtypeError, fn, ": ", name,
                 " must be int32 or int64, got ", dtype_name(given.dtype()));
    KUSARI_CHECK(given.ndim() == 1 && given.shape()[0] == batch, ShapeError, fn, ": ", name, " must be (batch,) = (",
                 batch, ",), got shape ", given.shape());
    KUSARI_CHECK(given.device() == device, DeviceError, fn, ": ", name, " is on ", given.device(), " but x is on ",
                 device);
    return given.astype(int64);
  };
  const Array in_len = lengths(input_length, steps, "input_length");
  const Array lab_len = lengths(label_length, max_labels, "label_length");
  const Array labels = t.astype(int64);
  if (device.is_cpu() || is_debug()) {
    // Out-of-range lengths and labels are user errors (read on the host: on a GPU only in debug mode).
    const std::vector<int64_t> il = in_len.to_vector<int64_t>(), ll = lab_len.to_vector<int64_t>(),
                               tv = labels.to_vector<int64_t>();
    for (int64_t b = 0; b < batch; ++b) {
      KUSARI_CHECK(il[b] >= 0 && il[b] <= steps, ValueError, fn, ": input_length ", il[b], " of sample ", b,
                   " is not in [0, ", steps, "]");
      KUSARI_CHECK(ll[b] >= 0 && ll[b] <= max_labels, ValueError, fn, ": label_length ", ll[b], " of sample ", b,
                   " is not in [0, ", max_labels, "]");
      for (int64_t j = 0; j < ll[b]; ++j) {
        const int64_t l = tv[static_cast<size_t>(b * max_labels + j)];
        KUSARI_CHECK(l >= 0 && l < classes && l != blank_symbol, IndexError, fn, ": label ", l, " at position ", j,
                     " of sample ", b, " is not a class in [0, ", classes, ") other than the blank ", blank_symbol);
      }
    }
  }
  const Dtype dtype = is_half_precision(x0.dtype()) ? float32 : x0.dtype();
  constexpr double kLowest = -1e30;
  // l' (batch, S): blanks at the even states, the labels at the odd ones.
  const Array blanks = Array::full({batch, max_labels}, Scalar(blank_symbol), int64, device);
  const Array ext = kusari::concatenate(
      {kusari::stack({blanks, labels}, 2).reshape({batch, 2 * max_labels}),
       Array::full({batch, 1}, Scalar(blank_symbol), int64, device)},
      1);
  // Where the skip from s - 2 is allowed: a label differing from the one two states back.
  const Array back2 = states > 2 ? kusari::concatenate({Array::full({batch, 2}, Scalar(blank_symbol), int64, device),
                                                        ext.at({Slice(), Slice(0, states - 2)})},
                                                       1)
                                 : Array::full({batch, states}, Scalar(blank_symbol), int64, device);
  const Array skip = kusari::logical_and(kusari::not_equal(ext, blank_symbol), kusari::not_equal(ext, back2));
  const Array emission_index =
      ((Array::arange(batch, int64, device) * classes).reshape({batch, 1}).broadcast_to({batch, states}) + ext)
          .reshape({batch * states});
  const Variable lowest(Array::full({batch, states}, kLowest, dtype, device));
  const auto lowest_cols = [&](int64_t n) { return Variable(Array::full({batch, n}, kLowest, dtype, device)); };
  const auto shifted = [&](const Variable& a, int64_t by) {  // a moved `by` states right, `lowest` coming in
    if (states <= by) return lowest;
    return concat({lowest_cols(by), get_item(a, {Slice(), Slice(0, states - by)})}, 1);
  };
  Array start = Array::full({batch, states}, kLowest, dtype, device);
  start.at({Slice(), int64_t{0}}).fill(0.0);
  Variable alpha(start);
  for (int64_t step = 0; step < steps; ++step) {
    const Variable xt = xs[static_cast<size_t>(step)].dtype() == dtype ? xs[static_cast<size_t>(step)]
                                                                       : cast(xs[static_cast<size_t>(step)], dtype);
    const Variable emission = reshape(take(reshape(log_softmax(xt, 1), {batch * classes}), emission_index, 0),
                                      {batch, states});
    const Variable from2 = where(skip, shifted(alpha, 2), lowest);
    const Variable next = add(logsumexp(stack({alpha, shifted(alpha, 1), from2}, 0), {0}), emission);
    const Array running = kusari::greater(in_len, step).reshape({batch, 1}).broadcast_to({batch, states});
    alpha = where(running, next, alpha);
  }
  const Array row = Array::arange(batch, int64, device) * states;
  const Variable flat = reshape(alpha, {batch * states});
  const Variable last = take(flat, row + lab_len * 2, 0);
  const Variable before = where(kusari::greater(lab_len, 0), take(flat, row + kusari::maximum(lab_len * 2 - 1, Scalar(int64_t{0})), 0),
                                Variable(Array::full({batch}, kLowest, dtype, device)));
  const Variable nll = neg(logsumexp(stack({last, before}, 0), {0}));
  return reduce == Reduce::kMean ? mean(nll) : nll;
}

}  // namespace kusari::functions
