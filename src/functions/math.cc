#include "kusari/functions/math.h"

#include <cmath>

#include "functions/function_util.h"
#include "kusari/core/routines.h"
#include "kusari/functions/array.h"

namespace kusari::functions {

using detail::masked;

// --- arithmetic ----------------------------------------------------------------------------------

Variable add(const Variable& a, const Variable& b) {
  return record("add", {a, b}, kusari::add(a.data(), b.data()), [](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, sum_to(gy, ctx.input(0).shape()));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, sum_to(gy, ctx.input(1).shape()));
  });
}

Variable sub(const Variable& a, const Variable& b) {
  return record("sub", {a, b}, kusari::subtract(a.data(), b.data()), [](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, sum_to(gy, ctx.input(0).shape()));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, sum_to(neg(gy), ctx.input(1).shape()));
  });
}

Variable mul(const Variable& a, const Variable& b) {
  return record("mul", {a, b}, kusari::multiply(a.data(), b.data()), [](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, sum_to(mul(gy, ctx.input(1)), ctx.input(0).shape()));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, sum_to(mul(gy, ctx.input(0)), ctx.input(1).shape()));
  });
}

Variable div(const Variable& a, const Variable& b) {
  return record("div", {a, b}, kusari::divide(a.data(), b.data()), [](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    Variable b = ctx.input(1);
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, sum_to(div(gy, b), ctx.input(0).shape()));
    if (ctx.needs_input_grad(1)) {
      ctx.set_input_grad(1, sum_to(neg(div(mul(gy, ctx.input(0)), square(b))), b.shape()));
    }
  });
}

Variable add(const Variable& a, Scalar b) {
  return record("add_scalar", {a}, a.data() + b, [](BackwardContext& ctx) { ctx.set_input_grad(0, ctx.output_grad()); });
}

Variable mul(const Variable& a, Scalar b) {
  return record("mul_scalar", {a}, a.data() * b, [b](BackwardContext& ctx) { ctx.set_input_grad(0, mul(ctx.output_grad(), b)); });
}

Variable rsub(const Variable& a, Scalar b) {
  return record("rsub_scalar", {a}, b - a.data(), [](BackwardContext& ctx) { ctx.set_input_grad(0, neg(ctx.output_grad())); });
}

Variable rdiv(const Variable& a, Scalar b) {
  // y = b / a, dy/da = -b / a^2 = -y / a
  return record(
      "rdiv_scalar", {a}, b / a.data(),
      [](BackwardContext& ctx) {
        ctx.set_input_grad(0, neg(div(mul(ctx.output_grad(), ctx.output()), ctx.input(0))));
      },
      kRetainOutput);
}

Variable neg(const Variable& x) {
  return record("neg", {x}, kusari::negative(x.data()), [](BackwardContext& ctx) { ctx.set_input_grad(0, neg(ctx.output_grad())); });
}

Variable pow(const Variable& x, Scalar p) {
  return record("pow_scalar", {x}, kusari::power(x.data(), p), [p](BackwardContext& ctx) {
    const double e = p.to_double();
    Variable x = ctx.input(0);
    Variable d = e == 2.0 ? mul(x, 2.0) : (e == 1.0 ? Variable(Array::ones_like(x.data())) : mul(pow(x, Scalar(e - 1.0)), e));
    ctx.set_input_grad(0, mul(ctx.output_grad(), d));
  });
}

Variable pow(Scalar base, const Variable& x) {
  return record(
      "rpow_scalar", {x}, kusari::power(base, x.data()),
      [base](BackwardContext& ctx) {
        ctx.set_input_grad(0, mul(mul(ctx.output_grad(), ctx.output()), std::log(base.to_double())));
      },
      kRetainOutput);
}

Variable pow(const Variable& a, const Variable& b) {
  return record(
      "pow", {a, b}, kusari::power(a.data(), b.data()),
      [](BackwardContext& ctx) {
        const Variable& gy = ctx.output_grad();
        Variable a = ctx.input(0), b = ctx.input(1);
        if (ctx.needs_input_grad(0)) {
          ctx.set_input_grad(0, sum_to(mul(gy, mul(b, pow(a, sub(b, Variable(Array::ones({}, b.dtype(), b.device())))))),
                                       a.shape()));
        }
        if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, sum_to(mul(mul(gy, ctx.output()), log(a)), b.shape()));
      },
      kRetainOutput);
}

Variable abs(const Variable& x) {
  return record("abs", {x}, kusari::abs(x.data()), [](BackwardContext& ctx) {
    ctx.set_input_grad(0, mul(ctx.output_grad(), Variable(kusari::sign(ctx.input(0).data()))));
  });
}

Variable exp(const Variable& x) {
  return record(
      "exp", {x}, kusari::exp(x.data()),
      [](BackwardContext& ctx) { ctx.set_input_grad(0, mul(ctx.output_grad(), ctx.output())); }, kRetainOutput);
}

Variable log(const Variable& x) {
  return record("log", {x}, kusari::log(x.data()), [](BackwardContext& ctx) { ctx.set_input_grad(0, div(ctx.output_grad(), ctx.input(0))); });
}

Variable sqrt(const Variable& x) {
  return record(
      "sqrt", {x}, kusari::sqrt(x.data()),
      [](BackwardContext& ctx) { ctx.set_input_grad(0, div(ctx.output_grad(), mul(ctx.output(), 2.0))); },
      kRetainOutput);
}

Variable square(const Variable& x) {
  return record("square", {x}, kusari::square(x.data()), [](BackwardContext& ctx) {
    ctx.set_input_grad(0, mul(ctx.output_grad(), mul(ctx.input(0), 2.0)));
  });
}

Variable maximum(const Variable& a, const Variable& b) {
  return record("maximum", {a, b}, kusari::maximum(a.data(), b.data()), [](BackwardContext& ctx) {
    Variable a = ctx.input(0), b = ctx.input(1);
    Array cond = kusari::greater_equal(a.data(), b.data());
    const Variable& gy = ctx.output_grad();
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, sum_to(masked(gy, cond), a.shape()));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, sum_to(masked(gy, kusari::logical_not(cond)), b.shape()));
  });
}

Variable minimum(const Variable& a, const Variable& b) {
  return record("minimum", {a, b}, kusari::minimum(a.data(), b.data()), [](BackwardContext& ctx) {
    Variable a = ctx.input(0), b = ctx.input(1);
    Array cond = kusari::less_equal(a.data(), b.data());
    const Variable& gy = ctx.output_grad();
    if (ctx.needs_input_grad(0)) ctx.set_input_grad(0, sum_to(masked(gy, cond), a.shape()));
    if (ctx.needs_input_grad(1)) ctx.set_input_grad(1, sum_to(masked(gy, kusari::logical_not(cond)), b.shape()));
  });
}

Variable clip(const Variable& x, double x_min, double x_max) {
  return record("clip", {x}, kusari::clip(x.data(), x_min, x_max), [x_min, x_max](BackwardContext& ctx) {
    const Array& xd = ctx.input(0).data();
    Array inside = kusari::logical_and(kusari::greater_equal(xd, x_min), kusari::less_equal(xd, x_max));
    ctx.set_input_grad(0, masked(ctx.output_grad(), inside));
  });
}

// --- reductions ---------------------------------------------------------------------------------

Variable sum(const Variable& x, const Axes& axes_in, bool keepdims) {
  Axes axes = normalize_axes(axes_in, x.ndim(), "sum", true);
  return record("sum", {x}, kusari::sum(x.data(), axes, keepdims), [axes](BackwardContext& ctx) {
    const Shape& xs = ctx.input(0).shape();
    Variable g = reshape(ctx.output_grad(), detail::keepdims_shape(xs, axes));
    ctx.set_input_grad(0, broadcast_to(g, xs));
  });
}

Variable mean(const Variable& x, const Axes& axes_in, bool keepdims) {
  detail::check_floating("mean", x);
  Axes axes = normalize_axes(axes_in, x.ndim(), "mean", true);
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[static_cast<int>(a)];
  return mul(sum(x, axes, keepdims), 1.0 / static_cast<double>(n));
}

namespace {

Variable extremum(const Variable& x, const Axes& axes_in, bool keepdims, bool is_max) {
  const char* fn = is_max ? "max" : "min";
  Axes axes = normalize_axes(axes_in, x.ndim(), fn, true);
  Array y = is_max ? kusari::amax(x.data(), axes, keepdims) : kusari::amin(x.data(), axes, keepdims);
  return record(
      fn, {x}, std::move(y),
      [axes](BackwardContext& ctx) {
        const Array& xd = ctx.input(0).data();
        Shape ks = detail::keepdims_shape(xd.shape(), axes);
        Array cond = kusari::equal(xd, ctx.output().data().reshape(ks).broadcast_to(xd.shape()));
        Variable g = broadcast_to(reshape(ctx.output_grad(), ks), xd.shape());
        ctx.set_input_grad(0, masked(g, cond));
      },
      kRetainOutput);
}

}  // namespace

Variable max(const Variable& x, const Axes& axes, bool keepdims) { return extremum(x, axes, keepdims, true); }
Variable min(const Variable& x, const Axes& axes, bool keepdims) { return extremum(x, axes, keepdims, false); }

Variable logsumexp(const Variable& x, const Axes& axes_in, bool keepdims) {
  detail::check_floating("logsumexp", x);
  Axes axes = normalize_axes(axes_in, x.ndim(), "logsumexp", true);
  return record(
      "logsumexp", {x}, kusari::logsumexp(x.data(), axes, keepdims),
      [axes](BackwardContext& ctx) {
        // gx = gy * exp(x - y), with gy and y broadcast back over the reduced axes.
        Variable x = ctx.input(0);
        Shape ks = detail::keepdims_shape(x.shape(), axes);
        Variable y = broadcast_to(reshape(ctx.output(), ks), x.shape());
        Variable gy = broadcast_to(reshape(ctx.output_grad(), ks), x.shape());
        ctx.set_input_grad(0, mul(gy, exp(sub(x, y))));
      },
      kRetainOutput);
}

Variable sum_to(const Variable& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return record("sum_to", {x}, kusari::sum_to(x.data(), shape), [](BackwardContext& ctx) {
    ctx.set_input_grad(0, broadcast_to(ctx.output_grad(), ctx.input(0).shape()));
  });
}

// --- matrix product -------------------------------------------------------------------------------

Variable matmul(const Variable& a_in, const Variable& b_in, bool transa, bool transb) {
  KUSARI_CHECK(a_in.ndim() >= 1 && b_in.ndim() >= 1, ShapeError, "matmul: operands need at least one dimension, got ",
               a_in.shape(), " and ", b_in.shape());
  // 1-d operands are promoted to matrices (and the extra axis removed at the end), like NumPy.
  Variable a = a_in.ndim() == 1 ? reshape(a_in, {1, a_in.shape()[0]}) : a_in;
  Variable b = b_in.ndim() == 1 ? reshape(b_in, {b_in.shape()[0], 1}) : b_in;
  const bool ta = transa && a_in.ndim() > 1, tb = transb && b_in.ndim() > 1;
  Array ad = ta ? a.data().swapaxes(-1, -2) : a.data();
  Array bd = tb ? b.data().swapaxes(-1, -2) : b.data();
  Variable y = record("matmul", {a, b}, kusari::matmul(ad, bd), [ta, tb](BackwardContext& ctx) {
    const Variable& gy = ctx.output_grad();
    Variable a = ctx.input(0), b = ctx.input(1);
    // y = A B with A = op(a), B = op(b): dA = gy B^T, dB = A^T gy.
    if (ctx.needs_input_grad(0)) {
      // da = ta ? (gy B^T)^T = B gy^T : gy B^T
      Variable ga = ta ? matmul(b, gy, tb, true) : matmul(gy, b, false, !tb);
      ctx.set_input_grad(0, sum_to(ga, a.shape()));
    }
    if (ctx.needs_input_grad(1)) {
      // db = tb ? (A^T gy)^T = gy^T A : A^T gy
      Variable gb = tb ? matmul(gy, a, true, ta) : matmul(a, gy, !ta, false);
      ctx.set_input_grad(1, sum_to(gb, b.shape()));
    }
  });
  if (a_in.ndim() == 1 && b_in.ndim() == 1) return reshape(y, {});
  if (a_in.ndim() == 1) return squeeze(y, {y.ndim() - 2});
  if (b_in.ndim() == 1) return squeeze(y, {y.ndim() - 1});
  return y;
}

}  // namespace kusari::functions

namespace kusari {

namespace F = functions;

Variable operator+(const Variable& a, const Variable& b) { return F::add(a, b); }
Variable operator-(const Variable& a, const Variable& b) { return F::sub(a, b); }
Variable operator*(const Variable& a, const Variable& b) { return F::mul(a, b); }
Variable operator/(const Variable& a, const Variable& b) { return F::div(a, b); }
Variable operator-(const Variable& x) { return F::neg(x); }
Variable operator+(const Variable& a, Scalar b) { return F::add(a, b); }
Variable operator-(const Variable& a, Scalar b) { return F::add(a, -b); }
Variable operator*(const Variable& a, Scalar b) { return F::mul(a, b); }
Variable operator/(const Variable& a, Scalar b) { return F::mul(a, 1.0 / b.to_double()); }
Variable operator+(Scalar a, const Variable& b) { return F::add(b, a); }
Variable operator-(Scalar a, const Variable& b) { return F::rsub(b, a); }
Variable operator*(Scalar a, const Variable& b) { return F::mul(b, a); }
Variable operator/(Scalar a, const Variable& b) { return F::rdiv(b, a); }

}  // namespace kusari
