#include "kusari/functions/connection.h"

#include <string>

#include "functions/function_util.h"
#include "kusari/core/debug.h"
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
  const bool flatten = !(x_in.ndim() == 2 && n_batch_axes == 1);
  if (flatten) x = reshape(x_in, {batch, x_in.size() / std::max<int64_t>(batch, 1)});
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
  if (flatten) {
    Shape os = batch_shape;
    os.push_back(W.shape()[0]);
    out = reshape(out, os);
  }
  return out;
}

// Note [Embed ID gradients]
// embed_id gathers rows of W (kusari::take); its gradient with respect to W scatters gy back into
// zeros of W's shape (kusari::add_at_zeros). The scatter is itself a recorded function of gy whose
// gradient is the gather again, so the pair differentiates any number of times. Ignored ids are
// replaced by 0 before indexing and their rows masked out, both in the gather's output and in the
// scatter's input, so they neither read nor receive anything.

// Note [Valid ids of an embedding]
// A table may have rows that no id selects: GPT pads its vocabulary with rows that only make the
// output layer's products faster (Note [Padded vocabulary] in src/models/gpt.cc). embed_id's
// valid_ids (default: all rows) bounds the ids, and the ids are checked once, against it, so a
// caller needs no pass of its own over them. The check is the one without a bound: on the CPU
// (and on a GPU in debug mode) the ids are compared on the host before the gather, which reports
// the first bad id and its position. On a GPU otherwise the gather reads W's first valid_ids
// rows, a view, so take's own check (Note [Device-side argument errors]) refuses an id beyond
// the bound as it refuses one beyond the table, and embed_id rethrows its IndexError under its
// own name; negative ids down to -valid_ids wrap there, as they do in take. The gradient is still
// a scatter into W's full shape: the rows beyond the bound receive zeros.
namespace {

struct EmbedIds {
  Array ids;    // ids with ignored entries replaced by 0 (int64)
  Array valid;  // bool, x.shape + (1,): false at ignored ids; undefined without ignore_label
  int64_t valid_ids = 0;  // the rows the gather reads (Note [Valid ids of an embedding])
};

Variable embed_gather(const EmbedIds& e, const Variable& W);

// gy (x.shape + (dim,)) scattered into zeros of shape `w_shape`.
Variable embed_scatter(const EmbedIds& e, const Variable& gy, const Shape& w_shape) {
  Array values = e.valid.defined() ? kusari::where(e.valid, gy.data(), Scalar(0.0)) : gy.data();
  return record(
      "embed_id_grad", {gy}, kusari::add_at_zeros(w_shape, e.ids, 0, values),
      [e](BackwardContext& ctx) { ctx.set_input_grad(0, embed_gather(e, ctx.output_grad())); });
}

Variable embed_gather(const EmbedIds& e, const Variable& W) {
  const Array& w = W.data();
  Array y = kusari::take(e.valid_ids < w.shape()[0] ? w.at({Slice(0, e.valid_ids)}) : w, e.ids, 0);
  if (e.valid.defined()) y = kusari::where(e.valid, y, Scalar(0.0));
  return record("embed_id", {W}, std::move(y), [e](BackwardContext& ctx) {
    ctx.set_input_grad(0, embed_scatter(e, ctx.output_grad(), ctx.input(0).shape()));
  });
}

}  // namespace

Variable embed_id(const Array& x, const Variable& W, std::optional<int64_t> ignore_label,
                  std::optional<int64_t> valid_ids) {
  const char* fn = "embed_id";
  KUSARI_CHECK(x.dtype() == int32 || x.dtype() == int64, DtypeError, fn,
               ": ids must be int32 or int64, got ", dtype_name(x.dtype()));
  KUSARI_CHECK(W.ndim() == 2, ShapeError, fn, ": W must be 2-d (vocab, dim), got shape ",
               W.shape());
  detail::check_floating(fn, W);
  KUSARI_CHECK(x.ndim() < kMaxNdim, ShapeError, fn, ": ids of shape ", x.shape(),
               " leave no room for the embedding axis");
  KUSARI_CHECK(x.device() == W.device(), DeviceError, fn, ": W is on ", W.device(),
               " but the ids are on ", x.device());
  const int64_t vocab = W.shape()[0];
  KUSARI_CHECK(!valid_ids || (*valid_ids > 0 && *valid_ids <= vocab), ValueError, fn,
               ": valid_ids must satisfy 0 < valid_ids <= ", vocab, " (the rows of W of shape ",
               W.shape(), "), got ", valid_ids.value_or(0));
  EmbedIds e;
  e.valid_ids = valid_ids.value_or(vocab);
  e.ids = x.astype(int64);
  Array valid;
  if (ignore_label) {
    valid = kusari::not_equal(e.ids, *ignore_label);
    e.ids = kusari::where(valid, e.ids, Scalar(int64_t{0}));
  }
  // What the ids must satisfy, for the messages.
  auto expected = [&] {
    return ::kusari::detail::concat(
        "expected 0 <= id < ", e.valid_ids,
        valid_ids ? ::kusari::detail::concat(" (the embedding's valid ids; W of shape ", W.shape(),
                                             " has ", vocab, " rows)")
                  : ::kusari::detail::concat(" (the rows of W of shape ", W.shape(), ")"),
        ignore_label ? ::kusari::detail::concat(" or id == ignore_label (", *ignore_label, ")")
                     : std::string());
  };
  if (x.device().is_cpu() || is_debug()) {
    // Report the first id out of range (ids wrap in take, so they must be checked here). On a
    // GPU the check would wait for the device every call: it runs in debug mode only there.
    Array bad = kusari::logical_or(kusari::less(e.ids, int64_t{0}),
                                   kusari::greater_equal(e.ids, e.valid_ids));
    if (x.size() > 0 && kusari::any(bad).item<bool>()) {
      const int64_t i = kusari::argmax(bad.astype(int32)).item<int64_t>();
      const int64_t id = e.ids.reshape({x.size()}).at({i}).item<int64_t>();
      KUSARI_THROW(IndexError, fn, ": id ", id, " (flat position ", i, " of ids of shape ",
                   x.shape(), ") is out of range; ", expected());
    }
  }
  if (valid.defined()) {
    Shape vs = x.shape();
    vs.push_back(1);
    e.valid = valid.reshape(vs);
  }
  try {
    return embed_gather(e, W);
  } catch (const IndexError& err) {
    // take's own check on a GPU (Note [Valid ids of an embedding]).
    KUSARI_THROW(IndexError, fn, ": an id of ids of shape ", x.shape(), " is out of range; ",
                 expected(), " (", err.what(), ")");
  }
}

}  // namespace kusari::functions
