#include "kusari/core/routines.h"

#include "kernels/reduction.h"
#include "routines/reduction.h"
#include "routines/routine_util.h"

namespace kusari {

using routines::check_defined;

// --- reductions --------------------------------------------------------------------------------

namespace {

Shape keepdims_shape(const Shape& shape, const Axes& axes) {
  Shape s = shape;
  for (int64_t a : axes) s[static_cast<int>(a)] = 1;
  return s;
}

Array reduce_impl(ReduceOp op, const Array& x, const Axes& axes_in, bool keepdims, const char* fn, Dtype out_dtype) {
  check_defined(fn, x);
  Axes axes = normalize_axes(axes_in, x.ndim(), fn, true);
  Shape kshape = keepdims_shape(x.shape(), axes);
  Array out = Array::empty(kshape, out_dtype, x.device());
  if (out.size() > 0) kernels::reduce(x.device(), op, x, out);
  return keepdims ? out : out.squeeze(axes);
}

}  // namespace

Array sum(const Array& x, const Axes& axes, bool keepdims) {
  return reduce_impl(ReduceOp::kSum, x, axes, keepdims, "sum", x.dtype() == Dtype::kBool ? Dtype::kInt64 : x.dtype());
}

Array mean(const Array& x, const Axes& axes_in, bool keepdims) {
  check_defined("mean", x);
  check_floating("mean", x);
  Axes axes = normalize_axes(axes_in, x.ndim(), "mean", true);
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[static_cast<int>(a)];
  Array s = sum(x, axes, keepdims);
  return s * (1.0 / static_cast<double>(n));
}

Array prod(const Array& x, const Axes& axes, bool keepdims) {
  return reduce_impl(ReduceOp::kProd, x, axes, keepdims, "prod",
                     x.dtype() == Dtype::kBool ? Dtype::kInt64 : x.dtype());
}

Array amax(const Array& x, const Axes& axes, bool keepdims) {
  return reduce_impl(ReduceOp::kMax, x, axes, keepdims, "max", x.dtype());
}

Array amin(const Array& x, const Axes& axes, bool keepdims) {
  return reduce_impl(ReduceOp::kMin, x, axes, keepdims, "min", x.dtype());
}

// any / all look at truth values: non-zero elements are true (0.5 is true, NaN is true).
Array any(const Array& x, const Axes& axes, bool keepdims) {
  const Array b = x.dtype() == Dtype::kBool ? x : not_equal(x, Scalar(0));
  return reduce_impl(ReduceOp::kAny, b, axes, keepdims, "any", Dtype::kBool);
}

Array all(const Array& x, const Axes& axes, bool keepdims) {
  const Array b = x.dtype() == Dtype::kBool ? x : not_equal(x, Scalar(0));
  return reduce_impl(ReduceOp::kAll, b, axes, keepdims, "all", Dtype::kBool);
}

Array var(const Array& x, const Axes& axes_in, bool keepdims, int ddof) {
  check_floating("var", x);
  Axes axes = normalize_axes(axes_in, x.ndim(), "var", true);
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[static_cast<int>(a)];
  KUSARI_CHECK(n - ddof > 0, ValueError, "var: ", n, " elements with ddof=", ddof, " leave no degrees of freedom");
  Array d = x - mean(x, axes, true);
  return sum(square(d), axes, keepdims) * (1.0 / static_cast<double>(n - ddof));
}

namespace {

Array arg_reduce_impl(ArgReduceOp op, const Array& x_in, std::optional<int> axis_in, bool keepdims, const char* fn) {
  check_defined(fn, x_in);
  Array x = x_in;
  int axis;
  if (!axis_in) {
    x = x_in.reshape({x_in.size()});
    axis = 0;
  } else {
    axis = normalize_axis(*axis_in, x.ndim(), fn);
  }
  KUSARI_CHECK(x.shape()[axis] > 0, ValueError, fn, ": attempt to get ", fn, " of an empty axis");
  Shape kshape = x.shape();
  kshape[axis] = 1;
  Array out = Array::empty(kshape, Dtype::kInt64, x.device());
  if (out.size() > 0) kernels::arg_reduce(x.device(), op, x, axis, out);
  if (!axis_in) return keepdims ? out.reshape(Shape(std::vector<int64_t>(x_in.ndim(), 1))) : out.reshape({});
  return keepdims ? out : out.squeeze({axis});
}

}  // namespace

Array argmax(const Array& x, std::optional<int> axis, bool keepdims) {
  return arg_reduce_impl(ArgReduceOp::kArgMax, x, axis, keepdims, "argmax");
}

Array argmin(const Array& x, std::optional<int> axis, bool keepdims) {
  return arg_reduce_impl(ArgReduceOp::kArgMin, x, axis, keepdims, "argmin");
}

Array sum_to(const Array& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int lead = x.ndim() - shape.size();
  KUSARI_CHECK(lead >= 0, ShapeError, "sum_to: cannot sum shape ", x.shape(), " to the larger shape ", shape);
  Axes axes;
  for (int i = 0; i < lead; ++i) axes.push_back(i);
  for (int i = 0; i < shape.size(); ++i) {
    const int64_t xd = x.shape()[i + lead];
    if (shape[i] == 1 && xd != 1) {
      axes.push_back(i + lead);
    } else {
      KUSARI_CHECK(shape[i] == xd, ShapeError, "sum_to: shape ", shape, " does not broadcast to ", x.shape());
    }
  }
  Array s = sum(x, axes, true);
  return s.reshape(shape);
}

Array logsumexp(const Array& x, const Axes& axes_in, bool keepdims) {
  check_floating("logsumexp", x);
  Axes axes = normalize_axes(axes_in, x.ndim(), "logsumexp", true);
  Array m = amax(x, axes, true);
  // Rows that are entirely -inf (or +inf) would give nan in x - m; shift them by 0 instead.
  m = where(isfinite(m), m, Scalar(0.0));
  Array s = log(sum(exp(x - m), axes, true)) + m;
  return keepdims ? s : s.squeeze(axes);
}

Array softmax(const Array& x, int axis) {
  check_floating("softmax", x);
  int ax = normalize_axis(axis, x.ndim(), "softmax");
  Array out = Array::empty(x.shape(), x.dtype(), x.device());
  if (out.size() > 0) kernels::softmax(x.device(), x, ax, false, out);
  return out;
}

Array log_softmax(const Array& x, int axis) {
  check_floating("log_softmax", x);
  int ax = normalize_axis(axis, x.ndim(), "log_softmax");
  Array out = Array::empty(x.shape(), x.dtype(), x.device());
  if (out.size() > 0) kernels::softmax(x.device(), x, ax, true, out);
  return out;
}

}  // namespace kusari

// --- softmax cross entropy (src/routines/reduction.h) ---------------------------------------------

namespace kusari::routines {

Dtype cross_entropy_stat_dtype(Dtype x) { return x == Dtype::kFloat64 ? Dtype::kFloat64 : Dtype::kFloat32; }

namespace {

kernels::CrossEntropyParams params(const Array& x, int64_t classes, int64_t ignore_label,
                                   double label_smoothing) {
  KUSARI_ASSERT(classes >= 0 && classes <= x.shape()[1]);
  kernels::CrossEntropyParams p;
  p.rows = x.shape()[0];
  p.classes = classes;
  p.width = x.shape()[1];
  p.ignore_label = ignore_label;
  p.label_smoothing = label_smoothing;
  return p;
}

}  // namespace

Array softmax_cross_entropy_rows(const Array& x_in, const Array& t_in, int64_t classes,
                                 int64_t ignore_label, double label_smoothing, Array& lse) {
  KUSARI_ASSERT(x_in.ndim() == 2 && t_in.ndim() == 1 && t_in.shape()[0] == x_in.shape()[0]);
  const Array x = x_in.contiguous(), t = t_in.contiguous();
  const kernels::CrossEntropyParams p = params(x, classes, ignore_label, label_smoothing);
  const Dtype stat = cross_entropy_stat_dtype(x.dtype());
  Array loss = Array::empty({p.rows}, stat, x.device());
  lse = Array::empty({p.rows}, stat, x.device());
  if (p.rows == 0) return loss;
  if (p.classes == 0 || !kernels::softmax_cross_entropy_forward.try_run(x.device(), x, t, p, loss, lse)) {
    lse = Array();
    return Array();
  }
  return loss;
}

Array softmax_cross_entropy_rows_backward(const Array& x_in, const Array& t_in, int64_t classes,
                                          const Array& lse, const Array& g, int64_t ignore_label,
                                          double label_smoothing) {
  const Array x = x_in.contiguous(), t = t_in.contiguous();
  const kernels::CrossEntropyParams p = params(x, classes, ignore_label, label_smoothing);
  Array gx = Array::empty(x.shape(), x.dtype(), x.device());
  if (p.rows == 0) return gx;
  const Array gc = g.astype(cross_entropy_stat_dtype(x.dtype())).contiguous();
  if (!kernels::softmax_cross_entropy_backward.try_run(x.device(), x, t, lse, gc, p, gx)) return Array();
  return gx;
}

}  // namespace kusari::routines
