#include "kusari/functions/connection.h"

#include "functions/function_util.h"
#include "kusari/core/routines.h"

namespace kusari::functions {

Variable linear(const Variable& x_in, const Variable& W, const Variable& b, int n_batch_axes) {
  KUSARI_CHECK(n_batch_axes >= 1 && n_batch_axes < x_in.ndim() + (x_in.ndim() == 1 ? 1 : 0), ValueError,
               "linear: n_batch_axes=", n_batch_axes, " does not fit x of shape ", x_in.shape());
  KUSARI_CHECK(W.ndim() == 2, ShapeError, "linear: W must be 2-d (out_size, in_size), got ", W.shape());
  // Flatten x to (batch, features).
  Shape batch_shape(x_in.shape().begin(), x_in.shape().begin() + n_batch_axes);
  int64_t batch = batch_shape.numel();
  Variable x = x_in;
  if (x_in.ndim() != n_batch_axes + 1) x = reshape(x_in, {batch, x_in.size() / std::max<int64_t>(batch, 1)});
  KUSARI_CHECK(x.shape()[1] == W.shape()[1], ShapeError, "linear: x has ", x.shape()[1], " features (shape ",
               x_in.shape(), ") but W of shape ", W.shape(), " expects ", W.shape()[1]);
  KUSARI_CHECK(!b.defined() || (b.ndim() == 1 && b.shape()[0] == W.shape()[0]), ShapeError, "linear: b of shape ",
               b.defined() ? b.shape() : Shape{}, " does not match W ", W.shape());
  check_same_device("linear", {&x.data(), &W.data(), b.defined() ? &b.data() : &W.data()});
  check_same_dtype("linear", {&x.data(), &W.data(), b.defined() ? &b.data() : &W.data()});
  Array y = kusari::matmul(x.data(), W.data().transpose());
  if (b.defined()) y = kusari::add(y, b.data());
  auto rule = [](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, matmul(gy, ctx.input(1)));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, matmul(gy, ctx.input(0), true, false));
    if (ctx.num_inputs() > 2 && ctx.needs_input_grad(2)) ctx.set_input_grad(2, sum(gy, {0}));
  };
  Variable out = b.defined() ? record("linear", {x, W, b}, std::move(y), rule) : record("linear", {x, W}, std::move(y), rule);
  if (x_in.ndim() != n_batch_axes + 1) {
    Shape os = batch_shape;
    os.push_back(W.shape()[0]);
    out = reshape(out, os);
  }
  return out;
}

}  // namespace kusari::functions
