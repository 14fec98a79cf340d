#include "kusari/functions/lstm.h"

#include <array>
#include <optional>
#include <vector>

#include "functions/function_util.h"
#include "kusari/core/routines.h"
#include "kusari/functions/activation.h"

namespace kusari::functions {

// Note [LSTM gate layout]
// Chainer's F.lstm reshapes x (B, 4 S, ...) to (B, S, 4, ...) and takes gate k as r[:, :, k]: the
// gates are interleaved unit by unit (a0 i0 f0 o0 a1 i1 f1 o1 ...), not stored as four blocks of
// S columns (PyTorch's and cuDNN's layout). Weights saved by Chainer (an L.LSTM's upward/W and
// lateral/W, whose rows produce x) are laid out this way, so reading x the same way is what makes
// a model loaded from a Chainer npz file compute what it computed in Chainer. links::LSTM sets the
// forget bias on the same interleaved positions, upward/b[4 s + 2].

namespace {

// x's shape (B, 4 S, rest...) as (B, S, 4, rest...).
Shape gate_view_shape(const Shape& x_shape) {
  Shape r = x_shape;
  r[1] = x_shape[1] / 4;
  r.insert(2, 4);
  return r;
}

// The activated gates a = tanh, i, f, o = sigmoid and tanh(c) of the updated rows, as Variables:
// constants in plain backward, differentiable functions of the inputs in double backward.
struct LstmGates {
  Variable a, i, f, o, tanh_c;
};

// Recomputes the forward from the inputs with differentiable functions.
LstmGates lstm_gates(const Variable& c_prev_rows, const Variable& x) {
  Variable r = reshape(x, gate_view_shape(x.shape()));
  auto gate = [&r](int64_t k) { return get_item(r, {Slice(), Slice(), k}); };
  LstmGates g;
  g.a = tanh(gate(0));
  g.i = sigmoid(gate(1));
  g.f = sigmoid(gate(2));
  g.o = sigmoid(gate(3));
  g.tanh_c = tanh(add(mul(g.a, g.i), mul(g.f, c_prev_rows)));
  return g;
}

// The first `batch` rows of v (v itself when it has exactly that many).
Variable head_rows(const Variable& v, int64_t batch) {
  return v.shape()[0] == batch ? v : get_item(v, {Slice(0, batch)});
}

}  // namespace

std::pair<Variable, Variable> lstm(const Variable& c_prev, const Variable& x) {
  const char* fn = "lstm";
  KUSARI_CHECK(c_prev.defined() && x.defined(), ValueError, fn, ": c_prev and x must be defined");
  detail::check_floating(fn, x);
  KUSARI_CHECK(c_prev.dtype() == x.dtype(), DtypeError, fn, ": c_prev is ",
               dtype_name(c_prev.dtype()), " but x is ", dtype_name(x.dtype()),
               "; expected the same dtype");
  KUSARI_CHECK(c_prev.device() == x.device(), DeviceError, fn, ": c_prev is on ", c_prev.device(),
               " but x is on ", x.device());
  KUSARI_CHECK(x.ndim() >= 2 && x.ndim() < kMaxNdim, ShapeError, fn, ": x must have between 2 and ",
               kMaxNdim - 1, " axes (batch, 4 * units, ...), got shape ", x.shape());
  KUSARI_CHECK(c_prev.ndim() == x.ndim(), ShapeError, fn, ": c_prev of shape ", c_prev.shape(),
               " and x of shape ", x.shape(), " must have the same number of axes");
  const int64_t units = c_prev.shape()[1];
  KUSARI_CHECK(x.shape()[1] == 4 * units, ShapeError, fn, ": x of shape ", x.shape(),
               " must have 4 * ", units, " = ", 4 * units, " columns for c_prev of shape ",
               c_prev.shape(), " (four gates per unit)");
  const int64_t batch = x.shape()[0];
  KUSARI_CHECK(batch <= c_prev.shape()[0], ShapeError, fn, ": x has a batch of ", batch,
               " rows but c_prev of shape ", c_prev.shape(), " has only ", c_prev.shape()[0]);
  for (int d = 2; d < x.ndim(); ++d) {
    KUSARI_CHECK(x.shape()[d] == c_prev.shape()[d], ShapeError, fn, ": x of shape ", x.shape(),
                 " and c_prev of shape ", c_prev.shape(), " differ beyond axis 1");
  }

  // Forward on arrays.
  const Array r = x.data().reshape(gate_view_shape(x.shape()));
  auto gate = [&r](int64_t k) { return r.at({Slice(), Slice(), k}); };
  Array a = kusari::tanh(gate(0));
  Array i = kusari::sigmoid(gate(1));
  Array f = kusari::sigmoid(gate(2));
  Array o = kusari::sigmoid(gate(3));
  const bool all_rows = batch == c_prev.shape()[0];
  Array c_rows = a * i + f * (all_rows ? c_prev.data() : c_prev.data().at({Slice(0, batch)}));
  Array tanh_c = kusari::tanh(c_rows);
  Array h = o * tanh_c;
  Array c = all_rows
                ? c_rows
                : kusari::concatenate({c_rows, c_prev.data().at({Slice(batch, std::nullopt)})}, 0);

  // gc = gc_next[:B] + gh * o * (1 - tanh(c)^2) is the gradient reaching the updated rows; then
  //   ga = gc i (1 - a^2), gi = gc a i (1 - i), gf = gc c_prev f (1 - f), go = gh tanh(c) o (1 -
  //   o), gc_prev = gc f on the updated rows and gc_next on the passed-through ones.
  auto rule = [batch, a, i, f, o, tanh_c](BackwardContext& ctx) {
    const Variable c_prev_v = ctx.input(0), x_v = ctx.input(1);
    const Variable c_prev_rows = head_rows(c_prev_v, batch);
    LstmGates g = ctx.is_double_backprop() ? lstm_gates(c_prev_rows, x_v)
                                           : LstmGates{Variable(a), Variable(i), Variable(f),
                                                       Variable(o), Variable(tanh_c)};
    const Variable& gc_next = ctx.output_grad(0);
    const Variable& gh = ctx.output_grad(1);
    Variable gc = add(head_rows(gc_next, batch), mul(mul(gh, g.o), rsub(square(g.tanh_c), 1.0)));
    if (ctx.needs_input_grad(1)) {
      Variable ga = mul(mul(gc, g.i), rsub(square(g.a), 1.0));
      Variable gi = mul(mul(gc, g.a), mul(g.i, rsub(g.i, 1.0)));
      Variable gf = mul(mul(gc, c_prev_rows), mul(g.f, rsub(g.f, 1.0)));
      Variable go = mul(mul(gh, g.tanh_c), mul(g.o, rsub(g.o, 1.0)));
      ctx.set_input_grad(1, reshape(stack({ga, gi, gf, go}, 2), x_v.shape()));
    }
    if (ctx.needs_input_grad(0)) {
      Variable g_prev = mul(gc, g.f);
      if (batch < c_prev_v.shape()[0]) {
        g_prev = concat({g_prev, get_item(gc_next, {Slice(batch, std::nullopt)})}, 0);
      }
      ctx.set_input_grad(0, g_prev);
    }
  };
  std::vector<Variable> out = record_multi(fn, {c_prev, x}, {std::move(c), std::move(h)}, rule);
  return {out[0], out[1]};
}

}  // namespace kusari::functions
