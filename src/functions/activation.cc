#include "kusari/functions/activation.h"

#include "functions/function_util.h"
#include "kusari/core/routines.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"

namespace kusari::functions {

// Note [Activation gradients]
// Every rule below is written with differentiable functions, so it can be differentiated again.
// Where the derivative is a function of the output (sigmoid, tanh, softmax, log_softmax, elu on
// its negative side) the output is retained: ctx.output() keeps this node as its creator, so the
// second derivative flows back through the same function. Piecewise rules select with a constant
// mask computed from the input, so the kink itself is never differentiated.

// gy where y > 0, else 0, as one fused kernel (kusari::relu_grad). It is linear in gy with a
// constant mask, so its own gradient is the same function of the incoming gradient.
Variable detail::relu_grad(const Variable& gy, const Array& y) {
  return record("relu_grad", {gy}, kusari::relu_grad(gy.data(), y), [y](BackwardContext& ctx) {
    ctx.set_input_grad(0, relu_grad(ctx.output_grad(), y));
  });
}

Variable relu(const Variable& x) {
  detail::check_floating("relu", x);
  return record(
      "relu", {x}, kusari::relu(x.data()),
      [](BackwardContext& ctx) {
        ctx.set_input_grad(0, detail::relu_grad(ctx.output_grad(), ctx.output().data()));
      },
      kRetainOutput);
}

Variable leaky_relu(const Variable& x, double slope) {
  detail::check_floating("leaky_relu", x);
  return record("leaky_relu", {x}, kusari::leaky_relu(x.data(), slope),
                [slope](BackwardContext& ctx) {
                  const Variable& gy = ctx.output_grad();
                  Array positive = kusari::greater_equal(ctx.input(0).data(), 0.0);
                  ctx.set_input_grad(0, where(positive, gy, mul(gy, slope)));
                });
}

Variable elu(const Variable& x, double alpha) {
  detail::check_floating("elu", x);
  return record(
      "elu", {x}, kusari::elu(x.data(), alpha),
      [alpha](BackwardContext& ctx) {
        // For x < 0, dy/dx = alpha exp(x) = y + alpha; unlike exp(x) it stays finite on the
        // discarded positive side, so no inf * 0 appears in the double backward.
        const Variable& gy = ctx.output_grad();
        Array positive = kusari::greater_equal(ctx.input(0).data(), 0.0);
        ctx.set_input_grad(0, where(positive, gy, mul(gy, add(ctx.output(), alpha))));
      },
      kRetainOutput);
}

Variable sigmoid(const Variable& x) {
  detail::check_floating("sigmoid", x);
  return record(
      "sigmoid", {x}, kusari::sigmoid(x.data()),
      [](BackwardContext& ctx) {
        Variable y = ctx.output();
        ctx.set_input_grad(0, mul(ctx.output_grad(), mul(y, rsub(y, 1.0))));
      },
      kRetainOutput);
}

Variable tanh(const Variable& x) {
  detail::check_floating("tanh", x);
  return record(
      "tanh", {x}, kusari::tanh(x.data()),
      [](BackwardContext& ctx) {
        ctx.set_input_grad(0, mul(ctx.output_grad(), rsub(square(ctx.output()), 1.0)));
      },
      kRetainOutput);
}

Variable softplus(const Variable& x, double beta) {
  detail::check_floating("softplus", x);
  KUSARI_CHECK(beta != 0.0, ValueError, "softplus: beta must be nonzero, got ", beta);
  return record("softplus", {x}, kusari::softplus(x.data(), beta), [beta](BackwardContext& ctx) {
    // d/dx log(1 + exp(beta x)) / beta = sigmoid(beta x).
    ctx.set_input_grad(0, mul(ctx.output_grad(), sigmoid(mul(ctx.input(0), beta))));
  });
}

// Note [Activations with a derivative kernel]
// gelu and silu compute their derivative at x in one kernel (kusari::gelu_derivative,
// silu_derivative), so the backward is that kernel and a multiplication by gy. The derivative is
// itself a recorded function of x whose backward is the second derivative written with
// differentiable functions, so every order of gradient is available:
//   gelu:      f''(x) = phi(x) (2 - x^2),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
//   gelu tanh: f''(x) = (1 - t^2) (u' (1 - x t u') + 3 a k x^2),  u = k (x + a x^3), t = tanh(u),
//              u' = k (1 + 3 a x^2), k = sqrt(2 / pi), a = 0.044715
//   silu:      f''(x) = s (1 - s) (2 + x (1 - 2 s)),  s = sigmoid(x)
namespace {

constexpr double kGeluK = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;

Variable gelu_derivative(const Variable& x, bool tanh_approximation) {
  return record("gelu_derivative", {x}, kusari::gelu_derivative(x.data(), tanh_approximation),
                [tanh_approximation](BackwardContext& ctx) {
                  const Variable& x = ctx.input(0);
                  Variable x2 = square(x);
                  Variable second;
                  if (!tanh_approximation) {
                    Variable phi = mul(exp(mul(x2, -0.5)), 0.39894228040143267794);
                    second = mul(phi, rsub(x2, 2.0));
                  } else {
                    Variable t = tanh(mul(add(x, mul(mul(x2, x), kGeluA)), kGeluK));
                    Variable du = mul(add(mul(x2, 3.0 * kGeluA), 1.0), kGeluK);
                    Variable inner = add(mul(du, rsub(mul(mul(x, t), du), 1.0)), mul(x2, 3.0 * kGeluA * kGeluK));
                    second = mul(rsub(square(t), 1.0), inner);
                  }
                  ctx.set_input_grad(0, mul(ctx.output_grad(), second));
                });
}

Variable silu_derivative(const Variable& x) {
  return record("silu_derivative", {x}, kusari::silu_derivative(x.data()), [](BackwardContext& ctx) {
    const Variable& x = ctx.input(0);
    Variable s = sigmoid(x);
    Variable second = mul(mul(s, rsub(s, 1.0)), add(mul(x, rsub(mul(s, 2.0), 1.0)), 2.0));
    ctx.set_input_grad(0, mul(ctx.output_grad(), second));
  });
}

}  // namespace

Variable gelu(const Variable& x, bool tanh_approximation) {
  detail::check_floating("gelu", x);
  return record("gelu", {x}, kusari::gelu(x.data(), tanh_approximation),
                [tanh_approximation](BackwardContext& ctx) {
                  ctx.set_input_grad(0, mul(ctx.output_grad(), gelu_derivative(ctx.input(0), tanh_approximation)));
                });
}

Variable silu(const Variable& x) {
  detail::check_floating("silu", x);
  return record("silu", {x}, kusari::silu(x.data()), [](BackwardContext& ctx) {
    ctx.set_input_grad(0, mul(ctx.output_grad(), silu_derivative(ctx.input(0))));
  });
}

Variable softmax(const Variable& x, int axis_in) {
  detail::check_floating("softmax", x);
  KUSARI_CHECK(x.ndim() >= 1, ShapeError, "softmax: x must have at least one axis, got shape ",
               x.shape());
  const int axis = normalize_axis(axis_in, x.ndim(), "softmax");
  return record(
      "softmax", {x}, kusari::softmax(x.data(), axis),
      [axis](BackwardContext& ctx) {
        // gx = y * (gy - sum(gy * y, axis))
        Variable y = ctx.output();
        Variable gyy = mul(ctx.output_grad(), y);
        ctx.set_input_grad(0, sub(gyy, mul(y, sum(gyy, {axis}, true))));
      },
      kRetainOutput);
}

Variable log_softmax(const Variable& x, int axis_in) {
  detail::check_floating("log_softmax", x);
  KUSARI_CHECK(x.ndim() >= 1, ShapeError, "log_softmax: x must have at least one axis, got shape ",
               x.shape());
  const int axis = normalize_axis(axis_in, x.ndim(), "log_softmax");
  return record(
      "log_softmax", {x}, kusari::log_softmax(x.data(), axis),
      [axis](BackwardContext& ctx) {
        // gx = gy - exp(y) * sum(gy, axis)
        const Variable& gy = ctx.output_grad();
        ctx.set_input_grad(0, sub(gy, mul(exp(ctx.output()), sum(gy, {axis}, true))));
      },
      kRetainOutput);
}

// Note [Composed Chainer functions]
// selu, hard_sigmoid, crelu, maxout, huber_loss, sigmoid_focal_loss, group_normalization,
// local_response_normalization, unpooling_2d and resize_images (array.cc) are written with other
// differentiable functions, so they run on every device that has those, have gradients of every
// order, and need no kernel of their own (Chainer's F. of the same names; docs/functions.md).

Variable selu(const Variable& x, double alpha, double scale) {
  detail::check_floating("selu", x);
  return mul(elu(x, alpha), scale);
}

Variable hard_sigmoid(const Variable& x) {
  detail::check_floating("hard_sigmoid", x);
  return clip(add(mul(x, 0.2), 0.5), 0.0, 1.0);
}

Variable crelu(const Variable& x, int axis) {
  detail::check_floating("crelu", x);
  const int nd = x.ndim();
  KUSARI_CHECK(axis >= -nd && axis < nd, ValueError, "crelu: axis ", axis, " is out of range for a ", nd,
               "-d input of shape ", x.shape());
  return concat({relu(x), relu(neg(x))}, axis);
}

Variable maxout(const Variable& x, int64_t pool_size, int axis) {
  detail::check_floating("maxout", x);
  const int nd = x.ndim();
  KUSARI_CHECK(axis >= -nd && axis < nd, ValueError, "maxout: axis ", axis, " is out of range for a ", nd,
               "-d input of shape ", x.shape());
  if (axis < 0) axis += nd;
  const int64_t m = x.shape()[axis];
  KUSARI_CHECK(pool_size > 0 && m % pool_size == 0, ValueError, "maxout: pool_size ", pool_size,
               " must be positive and divide the size ", m, " of axis ", axis, " of x ", x.shape());
  Shape s;
  for (int d = 0; d < nd; ++d) {
    if (d == axis) {
      s.push_back(m / pool_size);
      s.push_back(pool_size);
    } else {
      s.push_back(x.shape()[d]);
    }
  }
  return max(reshape(x, s), {axis + 1});
}

}  // namespace kusari::functions
