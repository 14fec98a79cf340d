// kusari.functions: every differentiable function of kusari/functions.h, with Chainer's argument
// names and defaults. Arguments that are variables take any array (Variable, NumPy, kusari,
// DLPack); each call releases the GIL while the kernels run.
#include "common.h"
#include "kusari/functions.h"

namespace kusari::python {
namespace {

namespace F = kusari::functions;
using R = py::call_guard<py::gil_scoped_release>;

/// Axes from Chainer's `axis` argument: None (all), an int, or a tuple.
Shape axes_of(py::handle axis) { return axis.is_none() ? Shape() : axis.cast<Shape>(); }

std::vector<Variable> vars_of(const std::vector<VarArg>& xs) {
  std::vector<Variable> out;
  out.reserve(xs.size());
  for (const VarArg& a : xs) out.push_back(a.v);
  return out;
}

py::tuple tuple_of(const std::vector<Variable>& vs) {
  py::tuple t(vs.size());
  for (size_t i = 0; i < vs.size(); ++i) t[i] = py::cast(vs[i]);
  return t;
}

F::Reduce reduce_of(const std::string& reduce, const char* where) {
  if (reduce == "mean") return F::Reduce::kMean;
  if (reduce == "no") return F::Reduce::kNone;
  throw py::value_error(std::string(where) + ": reduce must be 'mean' or 'no', got '" + reduce + "'");
}

std::optional<int64_t> optional_label(py::handle h) {
  if (h.is_none()) return std::nullopt;
  return h.cast<int64_t>();
}

}  // namespace

void init_functions(py::module_& f) {
  // --- activations
  f.def("relu", [](const VarArg& x) { return F::relu(x.v); }, py::arg("x"), R());
  f.def("leaky_relu", [](const VarArg& x, double slope) { return F::leaky_relu(x.v, slope); }, py::arg("x"),
        py::arg("slope") = 0.2, R());
  f.def("elu", [](const VarArg& x, double alpha) { return F::elu(x.v, alpha); }, py::arg("x"), py::arg("alpha") = 1.0, R());
  f.def("sigmoid", [](const VarArg& x) { return F::sigmoid(x.v); }, py::arg("x"), R());
  f.def("tanh", [](const VarArg& x) { return F::tanh(x.v); }, py::arg("x"), R());
  f.def("softplus", [](const VarArg& x, double beta) { return F::softplus(x.v, beta); }, py::arg("x"),
        py::arg("beta") = 1.0, R());
  f.def("softmax", [](const VarArg& x, int axis) { return F::softmax(x.v, axis); }, py::arg("x"), py::arg("axis") = 1, R());
  f.def("log_softmax", [](const VarArg& x, int axis) { return F::log_softmax(x.v, axis); }, py::arg("x"),
        py::arg("axis") = 1, R());

  f.def("selu", [](const VarArg& x, double alpha, double scale) { return F::selu(x.v, alpha, scale); }, py::arg("x"),
        py::arg("alpha") = 1.6732632423543772848170429916717, py::arg("scale") = 1.0507009873554804934193349852946,
        R());
  f.def("hard_sigmoid", [](const VarArg& x) { return F::hard_sigmoid(x.v); }, py::arg("x"), R());
  f.def("crelu", [](const VarArg& x, int axis) { return F::crelu(x.v, axis); }, py::arg("x"), py::arg("axis") = 1, R());
  f.def("maxout", [](const VarArg& x, int64_t pool_size, int axis) { return F::maxout(x.v, pool_size, axis); },
        py::arg("x"), py::arg("pool_size"), py::arg("axis") = 1, R());

  // --- array manipulation
  f.def("resize_images", [](const VarArg& x, const Shape& output_shape, const std::string& mode, bool align_corners) {
          if (mode != "bilinear") {
            throw py::value_error("F.resize_images: mode '" + mode + "' is not available; kusari has 'bilinear'");
          }
          py::gil_scoped_release r;
          return F::resize_images(x.v, output_shape, align_corners);
        }, py::arg("x"), py::arg("output_shape"), py::arg("mode") = "bilinear", py::arg("align_corners") = true);
  f.def("spatial_transformer_grid", [](const VarArg& theta, const Shape& output_shape) {
          return F::spatial_transformer_grid(theta.v, output_shape);
        }, py::arg("theta"), py::arg("output_shape"), R());
  f.def("spatial_transformer_sampler", [](const VarArg& x, const VarArg& grid) {
          return F::spatial_transformer_sampler(x.v, grid.v);
        }, py::arg("x"), py::arg("grid"), R());
  f.def("take", [](const VarArg& x, const ArrArg& indices, int axis) { return F::take(x.v, indices.a, axis); },
        py::arg("x"), py::arg("indices"), py::arg("axis") = 0, R());
  f.def("reshape", [](const VarArg& x, const Shape& shape) { return F::reshape(x.v, shape); }, py::arg("x"),
        py::arg("shape"), R());
  f.def("transpose", [](const VarArg& x, py::handle axes) { return F::transpose(x.v, axes_of(axes)); }, py::arg("x"),
        py::arg("axes") = py::none());
  f.def("swapaxes", [](const VarArg& x, int a, int b) { return F::swapaxes(x.v, a, b); }, py::arg("x"),
        py::arg("axis1"), py::arg("axis2"), R());
  f.def("broadcast_to", [](const VarArg& x, const Shape& shape) { return F::broadcast_to(x.v, shape); }, py::arg("x"),
        py::arg("shape"), R());
  f.def("squeeze", [](const VarArg& x, py::handle axis) { return F::squeeze(x.v, axes_of(axis)); }, py::arg("x"),
        py::arg("axis") = py::none());
  f.def("expand_dims", [](const VarArg& x, int axis) { return F::expand_dims(x.v, axis); }, py::arg("x"),
        py::arg("axis"), R());
  f.def("flatten", [](const VarArg& x) { return F::flatten(x.v); }, py::arg("x"), R());
  f.def("cast", [](const VarArg& x, Dtype dtype) { return F::cast(x.v, dtype); }, py::arg("x"), py::arg("typ"));
  f.def("copy", [](const VarArg& x, py::handle dst) { return F::copy(x.v, device_from_python(dst, "F.copy")); },
        py::arg("x"), py::arg("dst"), "Copies to device `dst` (Chainer's F.copy); the gradient is copied back.");
  f.def("concat", [](const std::vector<VarArg>& xs, int axis) {
          auto v = vars_of(xs);
          py::gil_scoped_release r;
          return F::concat(v, axis);
        }, py::arg("xs"), py::arg("axis") = 1);
  f.def("stack", [](const std::vector<VarArg>& xs, int axis) {
          auto v = vars_of(xs);
          py::gil_scoped_release r;
          return F::stack(v, axis);
        }, py::arg("xs"), py::arg("axis") = 0);
  f.def("split_axis", [](const VarArg& x, py::handle indices_or_sections, int axis) {
          std::vector<Variable> out;
          if (PyLong_Check(indices_or_sections.ptr())) {
            out = F::split_axis(x.v, indices_or_sections.cast<int64_t>(), axis);
          } else {
            out = F::split_axis(x.v, indices_or_sections.cast<std::vector<int64_t>>(), axis);
          }
          return tuple_of(out);
        }, py::arg("x"), py::arg("indices_or_sections"), py::arg("axis"));
  f.def("get_item", [](const VarArg& x, py::handle key) {
          return py::cast(x.v).attr("__getitem__")(key);
        }, py::arg("x"), py::arg("slices"));
  f.def("where", [](const ArrArg& cond, const VarArg& a, const VarArg& b) { return F::where(cond.a, a.v, b.v); },
        py::arg("condition"), py::arg("x"), py::arg("y"), R());

  // --- connections
  f.def("linear", [](const VarArg& x, const VarArg& W, py::handle b, int n_batch_axes) {
          Variable bias = b.is_none() ? Variable() : variable_from_python(b, false, "F.linear");
          py::gil_scoped_release r;
          return F::linear(x.v, W.v, bias, n_batch_axes);
        }, py::arg("x"), py::arg("W"), py::arg("b") = py::none(), py::arg("n_batch_axes") = 1);
  f.def("embed_id", [](const ArrArg& x, const VarArg& W, py::handle ignore_label, py::handle valid_ids) {
          return F::embed_id(x.a, W.v, optional_label(ignore_label), optional_label(valid_ids));
        }, py::arg("x"), py::arg("W"), py::arg("ignore_label") = py::none(), py::kw_only(),
        py::arg("valid_ids") = py::none());
  f.def("convolution_2d",
        [](const VarArg& x, const VarArg& W, py::handle b, F::IntPair stride, F::IntPair pad, F::IntPair dilate,
           int64_t groups) {
          Variable bias = b.is_none() ? Variable() : variable_from_python(b, false, "F.convolution_2d");
          py::gil_scoped_release r;
          return F::convolution_2d(x.v, W.v, bias, stride, pad, dilate, groups);
        },
        py::arg("x"), py::arg("W"), py::arg("b") = py::none(), py::arg("stride") = 1, py::arg("pad") = 0,
        py::kw_only(), py::arg("dilate") = 1, py::arg("groups") = 1);
  f.def("deconvolution_2d",
        [](const VarArg& x, const VarArg& W, py::handle b, F::IntPair stride, F::IntPair pad, py::handle outsize,
           F::IntPair dilate, int64_t groups) {
          Variable bias = b.is_none() ? Variable() : variable_from_python(b, false, "F.deconvolution_2d");
          std::optional<F::IntPair> out;
          if (!outsize.is_none()) out = outsize.cast<F::IntPair>();
          py::gil_scoped_release r;
          return F::deconvolution_2d(x.v, W.v, bias, stride, pad, out, dilate, groups);
        },
        py::arg("x"), py::arg("W"), py::arg("b") = py::none(), py::arg("stride") = 1, py::arg("pad") = 0,
        py::arg("outsize") = py::none(), py::kw_only(), py::arg("dilate") = 1, py::arg("groups") = 1);

  // --- evaluation and losses
  f.def("accuracy", [](const VarArg& y, const ArrArg& t, py::handle ignore_label) {
          return F::accuracy(y.v, t.a, optional_label(ignore_label));
        }, py::arg("y"), py::arg("t"), py::arg("ignore_label") = py::none());
  f.def("softmax_cross_entropy",
        [](const VarArg& x, const ArrArg& t, bool normalize, py::handle cache_score, int64_t ignore_label,
           const std::string& reduce, double label_smoothing) {
          if (!normalize) {
            throw py::value_error("F.softmax_cross_entropy: normalize=False is not supported (kusari averages over "
                                  "the examples that are not ignored, as normalize=True)");
          }
          const F::Reduce red = reduce_of(reduce, "F.softmax_cross_entropy");
          py::gil_scoped_release r;
          return F::softmax_cross_entropy(x.v, t.a, ignore_label, red, label_smoothing);
        },
        py::arg("x"), py::arg("t"), py::arg("normalize") = true, py::arg("cache_score") = true,
        py::arg("ignore_label") = -1, py::arg("reduce") = "mean", py::kw_only(), py::arg("label_smoothing") = 0.0);
  f.def("softmax_cross_entropy_padded",
        [](const VarArg& x, const ArrArg& t, int64_t classes, int64_t ignore_label, const std::string& reduce,
           double label_smoothing) {
          const F::Reduce red = reduce_of(reduce, "F.softmax_cross_entropy_padded");
          py::gil_scoped_release r;
          return F::softmax_cross_entropy_padded(x.v, t.a, classes, ignore_label, red, label_smoothing);
        },
        py::arg("x"), py::arg("t"), py::arg("classes"), py::arg("ignore_label") = -1, py::arg("reduce") = "mean",
        py::kw_only(), py::arg("label_smoothing") = 0.0,
        "softmax_cross_entropy of x[:, :classes]: the columns after them are padding (a padded vocabulary), left "
        "out of the softmax with a zero gradient, and no slice of x is made.");
  f.def("sigmoid_cross_entropy", [](const VarArg& x, const ArrArg& t, bool normalize, const std::string& reduce) {
          return F::sigmoid_cross_entropy(x.v, t.a, normalize, reduce_of(reduce, "F.sigmoid_cross_entropy"));
        }, py::arg("x"), py::arg("t"), py::arg("normalize") = true, py::arg("reduce") = "mean");
  f.def("huber_loss", [](const VarArg& x, const VarArg& t, double delta, const std::string& reduce) {
          F::HuberReduce red;
          if (reduce == "sum_along_second_axis") {
            red = F::HuberReduce::kSumAlongSecondAxis;
          } else if (reduce == "no") {
            red = F::HuberReduce::kNone;
          } else {
            throw py::value_error("F.huber_loss: reduce must be 'sum_along_second_axis' or 'no', got '" + reduce + "'");
          }
          return F::huber_loss(x.v, t.v, delta, red);
        }, py::arg("x"), py::arg("t"), py::arg("delta"), py::arg("reduce") = "sum_along_second_axis");
  f.def("sigmoid_focal_loss", [](const VarArg& x, const ArrArg& t, double alpha, double gamma, const std::string& reduce) {
          return F::sigmoid_focal_loss(x.v, t.a, alpha, gamma, reduce_of(reduce, "F.sigmoid_focal_loss"));
        }, py::arg("x"), py::arg("t"), py::arg("alpha") = 0.25, py::arg("gamma") = 2.0, py::arg("reduce") = "no");
  f.def("connectionist_temporal_classification",
        [](const std::vector<VarArg>& x, const ArrArg& t, int64_t blank_symbol, py::handle input_length,
           py::handle label_length, const std::string& reduce) {
          const auto lengths = [](py::handle h) { return h.is_none() ? Array() : h.cast<ArrArg>().a; };
          const Array il = lengths(input_length), ll = lengths(label_length);
          const F::Reduce red = reduce_of(reduce, "F.connectionist_temporal_classification");
          const std::vector<Variable> xs = vars_of(x);
          py::gil_scoped_release r;
          return F::connectionist_temporal_classification(xs, t.a, blank_symbol, il, ll, red);
        }, py::arg("x"), py::arg("t"), py::arg("blank_symbol"), py::arg("input_length") = py::none(),
        py::arg("label_length") = py::none(), py::arg("reduce") = "mean");
  f.def("mean_squared_error", [](const VarArg& a, const VarArg& b) { return F::mean_squared_error(a.v, b.v); },
        py::arg("x0"), py::arg("x1"), R());

  // --- recurrent
  f.def("lstm", [](const VarArg& c, const VarArg& x) {
          auto [c_new, h] = F::lstm(c.v, x.v);
          return py::make_tuple(c_new, h);
        }, py::arg("c_prev"), py::arg("x"));

  // Chainer's n_step_* take ws and bs as lists (one per layer and direction) of lists of arrays.
  const auto nested = [](const std::vector<std::vector<VarArg>>& xs) {
    std::vector<std::vector<Variable>> out;
    for (const auto& x : xs) out.push_back(vars_of(x));
    return out;
  };
  for (bool bi : {false, true}) {
    f.def(
        bi ? "n_step_bilstm" : "n_step_lstm",
        [=](int64_t n_layers, double dropout_ratio, const VarArg& hx, const VarArg& cx,
            const std::vector<std::vector<VarArg>>& ws, const std::vector<std::vector<VarArg>>& bs,
            const std::vector<VarArg>& xs) {
          const auto w = nested(ws), b = nested(bs);
          const auto x = vars_of(xs);
          auto [hy, cy, ys] = [&] {
            py::gil_scoped_release r;
            return bi ? F::n_step_bilstm(n_layers, dropout_ratio, hx.v, cx.v, w, b, x)
                      : F::n_step_lstm(n_layers, dropout_ratio, hx.v, cx.v, w, b, x);
          }();
          return py::make_tuple(hy, cy, py::list(tuple_of(ys)));
        },
        py::arg("n_layers"), py::arg("dropout_ratio"), py::arg("hx"), py::arg("cx"), py::arg("ws"),
        py::arg("bs"), py::arg("xs"));
    f.def(
        bi ? "n_step_bigru" : "n_step_gru",
        [=](int64_t n_layers, double dropout_ratio, const VarArg& hx,
            const std::vector<std::vector<VarArg>>& ws, const std::vector<std::vector<VarArg>>& bs,
            const std::vector<VarArg>& xs) {
          const auto w = nested(ws), b = nested(bs);
          const auto x = vars_of(xs);
          auto [hy, ys] = [&] {
            py::gil_scoped_release r;
            return bi ? F::n_step_bigru(n_layers, dropout_ratio, hx.v, w, b, x)
                      : F::n_step_gru(n_layers, dropout_ratio, hx.v, w, b, x);
          }();
          return py::make_tuple(hy, py::list(tuple_of(ys)));
        },
        py::arg("n_layers"), py::arg("dropout_ratio"), py::arg("hx"), py::arg("ws"), py::arg("bs"),
        py::arg("xs"));
    f.def(
        bi ? "n_step_birnn" : "n_step_rnn",
        [=](int64_t n_layers, double dropout_ratio, const VarArg& hx,
            const std::vector<std::vector<VarArg>>& ws, const std::vector<std::vector<VarArg>>& bs,
            const std::vector<VarArg>& xs, const std::string& activation) {
          const auto w = nested(ws), b = nested(bs);
          const auto x = vars_of(xs);
          auto [hy, ys] = [&] {
            py::gil_scoped_release r;
            return bi ? F::n_step_birnn(n_layers, dropout_ratio, hx.v, w, b, x, activation)
                      : F::n_step_rnn(n_layers, dropout_ratio, hx.v, w, b, x, activation);
          }();
          return py::make_tuple(hy, py::list(tuple_of(ys)));
        },
        py::arg("n_layers"), py::arg("dropout_ratio"), py::arg("hx"), py::arg("ws"), py::arg("bs"),
        py::arg("xs"), py::arg("activation") = "tanh");
  }

  // --- arithmetic and reductions
  f.def("add", [](const VarArg& a, const VarArg& b) { return F::add(a.v, b.v); }, R());
  f.def("add", [](const VarArg& a, Scalar b) { return F::add(a.v, b); }, R());
  f.def("sub", [](const VarArg& a, const VarArg& b) { return F::sub(a.v, b.v); }, R());
  f.def("mul", [](const VarArg& a, const VarArg& b) { return F::mul(a.v, b.v); }, R());
  f.def("mul", [](const VarArg& a, Scalar b) { return F::mul(a.v, b); }, R());
  f.def("div", [](const VarArg& a, const VarArg& b) { return F::div(a.v, b.v); }, R());
  f.def("rsub", [](const VarArg& a, Scalar b) { return F::rsub(a.v, b); }, R());
  f.def("rdiv", [](const VarArg& a, Scalar b) { return F::rdiv(a.v, b); }, R());
  f.def("neg", [](const VarArg& x) { return F::neg(x.v); }, R());
  f.def("pow", [](const VarArg& x, const VarArg& p) { return F::pow(x.v, p.v); }, R());
  f.def("pow", [](const VarArg& x, Scalar p) { return F::pow(x.v, p); }, R());
  f.def("pow", [](Scalar b, const VarArg& x) { return F::pow(b, x.v); }, R());
  f.def("absolute", [](const VarArg& x) { return F::abs(x.v); }, py::arg("x"), R());
  f.def("abs", [](const VarArg& x) { return F::abs(x.v); }, py::arg("x"), R());
  f.def("exp", [](const VarArg& x) { return F::exp(x.v); }, py::arg("x"), R());
  f.def("log", [](const VarArg& x) { return F::log(x.v); }, py::arg("x"), R());
  f.def("sqrt", [](const VarArg& x) { return F::sqrt(x.v); }, py::arg("x"), R());
  f.def("square", [](const VarArg& x) { return F::square(x.v); }, py::arg("x"), R());
  f.def("maximum", [](const VarArg& a, const VarArg& b) { return F::maximum(a.v, b.v); }, py::arg("x1"),
        py::arg("x2"), R());
  f.def("minimum", [](const VarArg& a, const VarArg& b) { return F::minimum(a.v, b.v); }, py::arg("x1"),
        py::arg("x2"), R());
  f.def("clip", [](const VarArg& x, double lo, double hi) { return F::clip(x.v, lo, hi); }, py::arg("x"),
        py::arg("x_min"), py::arg("x_max"), R());
  f.def("sum", [](const VarArg& x, py::handle axis, bool keepdims) { return F::sum(x.v, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  f.def("mean", [](const VarArg& x, py::handle axis, bool keepdims) { return F::mean(x.v, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  f.def("max", [](const VarArg& x, py::handle axis, bool keepdims) { return F::max(x.v, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  f.def("min", [](const VarArg& x, py::handle axis, bool keepdims) { return F::min(x.v, axes_of(axis), keepdims); },
        py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  f.def("logsumexp", [](const VarArg& x, py::handle axis, bool keepdims) {
          return F::logsumexp(x.v, axes_of(axis), keepdims);
        }, py::arg("x"), py::arg("axis") = py::none(), py::arg("keepdims") = false);
  f.def("sum_to", [](const VarArg& x, const Shape& shape) { return F::sum_to(x.v, shape); }, py::arg("x"),
        py::arg("shape"), R());
  f.def("matmul", [](const VarArg& a, const VarArg& b, bool transa, bool transb) {
          return F::matmul(a.v, b.v, transa, transb);
        }, py::arg("a"), py::arg("b"), py::arg("transa") = false, py::arg("transb") = false, R());

  // --- transformer functions
  f.def("gelu", [](const VarArg& x, const std::string& approximate) {
          if (approximate != "none" && approximate != "tanh") {
            throw py::value_error("F.gelu: approximate must be 'none' or 'tanh', got '" + approximate + "'");
          }
          py::gil_scoped_release r;
          return F::gelu(x.v, approximate == "tanh");
        }, py::arg("x"), py::arg("approximate") = "none");
  f.def("silu", [](const VarArg& x) { return F::silu(x.v); }, py::arg("x"), R());
  f.def("layer_normalization", [](const VarArg& x, py::handle gamma, py::handle beta, double eps) {
          Variable g = gamma.is_none() ? Variable() : variable_from_python(gamma, false, "F.layer_normalization");
          Variable b = beta.is_none() ? Variable() : variable_from_python(beta, false, "F.layer_normalization");
          py::gil_scoped_release r;
          return F::layer_normalization(x.v, g, b, eps);
        }, py::arg("x"), py::arg("gamma") = py::none(), py::arg("beta") = py::none(), py::arg("eps") = 1e-5);
  f.def("group_normalization", [](const VarArg& x, int64_t groups, const VarArg& gamma, const VarArg& beta, double eps) {
          py::gil_scoped_release r;
          return F::group_normalization(x.v, groups, gamma.v, beta.v, eps);
        }, py::arg("x"), py::arg("groups"), py::arg("gamma"), py::arg("beta"), py::arg("eps") = 1e-5);
  f.def("local_response_normalization", [](const VarArg& x, int64_t n, double k, double alpha, double beta) {
          py::gil_scoped_release r;
          return F::local_response_normalization(x.v, n, k, alpha, beta);
        }, py::arg("x"), py::arg("n") = 5, py::arg("k") = 2.0, py::arg("alpha") = 1e-4, py::arg("beta") = 0.75);
  f.def("rms_normalization", [](const VarArg& x, py::handle gamma, double eps) {
          Variable g = gamma.is_none() ? Variable() : variable_from_python(gamma, false, "F.rms_normalization");
          py::gil_scoped_release r;
          return F::rms_normalization(x.v, g, eps);
        }, py::arg("x"), py::arg("gamma") = py::none(), py::arg("eps") = 1e-6);
  f.def("scaled_dot_product_attention",
        [](const VarArg& q, const VarArg& k, const VarArg& v, py::handle attn_mask, double dropout_p, bool is_causal,
           py::handle scale, const std::string& path) {
          F::AttentionOptions o;
          if (!attn_mask.is_none()) o.mask = array_from_python(attn_mask, "F.scaled_dot_product_attention");
          o.dropout = dropout_p;
          o.causal = is_causal;
          if (!scale.is_none()) o.scale = scale.cast<double>();
          if (path == "auto") {
            o.path = F::AttentionPath::kAuto;
          } else if (path == "fused") {
            o.path = F::AttentionPath::kFused;
          } else if (path == "composed") {
            o.path = F::AttentionPath::kComposed;
          } else {
            throw py::value_error("F.scaled_dot_product_attention: path must be 'auto', 'fused' or 'composed', got '" +
                                  path + "'");
          }
          py::gil_scoped_release r;
          return F::scaled_dot_product_attention(q.v, k.v, v.v, o);
        },
        py::arg("query"), py::arg("key"), py::arg("value"), py::arg("attn_mask") = py::none(),
        py::arg("dropout_p") = 0.0, py::arg("is_causal") = false, py::kw_only(), py::arg("scale") = py::none(),
        py::arg("path") = "auto",
        "softmax(q k^T * scale + mask) v (PyTorch's argument names); a bool mask is True where a query may "
        "attend; is_causal aligns at the bottom right (the same as PyTorch's when q and k have the same length).");

  // --- noise
  f.def("dropout", [](const VarArg& x, double ratio) { return F::dropout(x.v, ratio); }, py::arg("x"),
        py::arg("ratio") = 0.5, R());

  // --- normalization
  f.def("batch_normalization",
        [](const VarArg& x, const VarArg& gamma, const VarArg& beta, double eps, py::handle running_mean,
           py::handle running_var, double decay, py::handle axis) {
          Array rm, rv;
          Array* prm = nullptr;
          Array* prv = nullptr;
          if (!running_mean.is_none()) {
            rm = array_from_python(running_mean, "F.batch_normalization");
            prm = &rm;
          }
          if (!running_var.is_none()) {
            rv = array_from_python(running_var, "F.batch_normalization");
            prv = &rv;
          }
          Variable y;
          {
            py::gil_scoped_release r;
            y = F::batch_normalization(x.v, gamma.v, beta.v, eps, prm, prv, decay, axes_of(axis));
          }
          // The running statistics are updated in place: NumPy arrays given see the new values.
          return y;
        },
        py::arg("x"), py::arg("gamma"), py::arg("beta"), py::kw_only(), py::arg("eps") = 2e-5,
        py::arg("running_mean") = py::none(), py::arg("running_var") = py::none(), py::arg("decay") = 0.9,
        py::arg("axis") = py::none());
  f.def("fixed_batch_normalization",
        [](const VarArg& x, const VarArg& gamma, const VarArg& beta, const VarArg& mean, const VarArg& var,
           double eps, py::handle axis) {
          return F::fixed_batch_normalization(x.v, gamma.v, beta.v, mean.v, var.v, eps, axes_of(axis));
        },
        py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("mean"), py::arg("var"), py::arg("eps") = 2e-5,
        py::arg("axis") = py::none());
  f.def("batch_normalization_relu",
        [](const VarArg& x, const VarArg& gamma, const VarArg& beta, py::handle residual, double eps) {
          Variable res = residual.is_none() ? Variable() : variable_from_python(residual, false, "F.batch_normalization_relu");
          py::gil_scoped_release r;
          return F::batch_normalization_relu(x.v, gamma.v, beta.v, res, eps);
        },
        py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("residual") = py::none(), py::arg("eps") = 2e-5,
        "relu(batch_normalization(x) + residual) as one fused operation.");
  f.def("fixed_batch_normalization_relu",
        [](const VarArg& x, const VarArg& gamma, const VarArg& beta, const VarArg& mean, const VarArg& var,
           py::handle residual, double eps) {
          Variable res = residual.is_none() ? Variable() : variable_from_python(residual, false, "F.fixed_batch_normalization_relu");
          py::gil_scoped_release r;
          return F::fixed_batch_normalization_relu(x.v, gamma.v, beta.v, mean.v, var.v, res, eps);
        },
        py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("mean"), py::arg("var"),
        py::arg("residual") = py::none(), py::arg("eps") = 2e-5);

  // --- detection (ChainerCV's box conventions)
  f.def("bbox_iou", [](const VarArg& a, const VarArg& b) { return F::bbox_iou(a.v, b.v); }, py::arg("bbox_a"),
        py::arg("bbox_b"), R());
  f.def("bbox_to_loc", [](const VarArg& src, const VarArg& dst) { return F::bbox_to_loc(src.v, dst.v); },
        py::arg("src_bbox"), py::arg("dst_bbox"), R());
  f.def("loc_to_bbox", [](const VarArg& src, const VarArg& loc) { return F::loc_to_bbox(src.v, loc.v); },
        py::arg("src_bbox"), py::arg("loc"), R());
  // Chainer's outsize (an int or a pair) and sampling_ratio (None, an int or a pair of equal ints:
  // kusari samples as many points along both axes).
  const auto roi_outsize = [](py::handle outsize) -> Shape {
    if (py::isinstance<py::int_>(outsize))
      return {outsize.cast<int64_t>(), outsize.cast<int64_t>()};
    return outsize.cast<Shape>();
  };
  const auto roi_ratio = [](py::handle sampling_ratio, const char* fn) -> std::optional<int64_t> {
    if (sampling_ratio.is_none()) return std::nullopt;
    if (py::isinstance<py::int_>(sampling_ratio)) return sampling_ratio.cast<int64_t>();
    const Shape pair = sampling_ratio.cast<Shape>();
    if (pair.size() != 2 || pair[0] != pair[1]) {
      throw py::value_error(std::string("F.") + fn +
                            ": sampling_ratio must be an int (or a pair of equal ints)");
    }
    return pair[0];
  };
  f.def(
      "roi_average_align_2d",
      [=](const VarArg& x, const ArrArg& rois, const ArrArg& roi_indices, py::handle outsize,
          double spatial_scale, py::handle sampling_ratio) {
        const Shape out = roi_outsize(outsize);
        const std::optional<int64_t> ratio = roi_ratio(sampling_ratio, "roi_average_align_2d");
        py::gil_scoped_release r;
        return F::roi_average_align_2d(x.v, rois.a, roi_indices.a, out, spatial_scale, ratio);
      },
      py::arg("x"), py::arg("rois"), py::arg("roi_indices"), py::arg("outsize"),
      py::arg("spatial_scale"), py::arg("sampling_ratio") = py::none());
  f.def(
      "roi_max_align_2d",
      [=](const VarArg& x, const ArrArg& rois, const ArrArg& roi_indices, py::handle outsize,
          double spatial_scale, py::handle sampling_ratio) {
        const Shape out = roi_outsize(outsize);
        const std::optional<int64_t> ratio = roi_ratio(sampling_ratio, "roi_max_align_2d");
        py::gil_scoped_release r;
        return F::roi_max_align_2d(x.v, rois.a, roi_indices.a, out, spatial_scale, ratio);
      },
      py::arg("x"), py::arg("rois"), py::arg("roi_indices"), py::arg("outsize"),
      py::arg("spatial_scale"), py::arg("sampling_ratio") = py::none());
  f.def(
      "roi_average_pooling_2d",
      [=](const VarArg& x, const ArrArg& rois, const ArrArg& roi_indices, py::handle outsize,
          double spatial_scale) {
        const Shape out = roi_outsize(outsize);
        py::gil_scoped_release r;
        return F::roi_average_pooling_2d(x.v, rois.a, roi_indices.a, out, spatial_scale);
      },
      py::arg("x"), py::arg("rois"), py::arg("roi_indices"), py::arg("outsize"),
      py::arg("spatial_scale"));
  f.def(
      "roi_max_pooling_2d",
      [=](const VarArg& x, const ArrArg& rois, const ArrArg& roi_indices, py::handle outsize,
          double spatial_scale) {
        const Shape out = roi_outsize(outsize);
        py::gil_scoped_release r;
        return F::roi_max_pooling_2d(x.v, rois.a, roi_indices.a, out, spatial_scale);
      },
      py::arg("x"), py::arg("rois"), py::arg("roi_indices"), py::arg("outsize"),
      py::arg("spatial_scale"));
  f.def(
      "roi_pooling_2d",
      [](const VarArg& x, const ArrArg& rois, int64_t outh, int64_t outw, double spatial_scale) {
        py::gil_scoped_release r;
        return F::roi_pooling_2d(x.v, rois.a, outh, outw, spatial_scale);
      },
      py::arg("x"), py::arg("rois"), py::arg("outh"), py::arg("outw"), py::arg("spatial_scale"));
  f.def("non_maximum_suppression",
        [](const ArrArg& bbox, double thresh, py::handle score, py::handle limit, py::handle label) {
          Array s = score.is_none() ? Array() : array_from_python(score, "non_maximum_suppression");
          Array l = label.is_none() ? Array() : array_from_python(label, "non_maximum_suppression");
          std::optional<int64_t> lim;
          if (!limit.is_none()) lim = limit.cast<int64_t>();
          py::gil_scoped_release r;
          return F::non_maximum_suppression(bbox.a, thresh, s, lim, l);
        },
        py::arg("bbox"), py::arg("thresh"), py::arg("score") = py::none(), py::arg("limit") = py::none(),
        py::arg("label") = py::none(),
        "Indices of the boxes kept by non-maximum suppression, highest score first (ChainerCV's "
        "non_maximum_suppression; with label, per class).");

  // --- pooling
  f.def("max_pooling_2d",
        [](const VarArg& x, F::IntPair ksize, py::handle stride, F::IntPair pad, bool cover_all) {
          std::optional<F::IntPair> s;
          if (!stride.is_none()) s = stride.cast<F::IntPair>();
          py::gil_scoped_release r;
          return F::max_pooling_2d(x.v, ksize, s, pad, cover_all);
        },
        py::arg("x"), py::arg("ksize"), py::arg("stride") = py::none(), py::arg("pad") = 0,
        py::arg("cover_all") = true);
  f.def("unpooling_2d",
        [](const VarArg& x, F::IntPair ksize, py::handle stride, F::IntPair pad, py::handle outsize, bool cover_all) {
          std::optional<F::IntPair> s, o;
          if (!stride.is_none()) s = stride.cast<F::IntPair>();
          if (!outsize.is_none()) o = outsize.cast<F::IntPair>();
          py::gil_scoped_release r;
          return F::unpooling_2d(x.v, ksize, s, pad, o, cover_all);
        },
        py::arg("x"), py::arg("ksize"), py::arg("stride") = py::none(), py::arg("pad") = 0,
        py::arg("outsize") = py::none(), py::arg("cover_all") = true);
  f.def("average_pooling_2d",
        [](const VarArg& x, F::IntPair ksize, py::handle stride, F::IntPair pad) {
          std::optional<F::IntPair> s;
          if (!stride.is_none()) s = stride.cast<F::IntPair>();
          py::gil_scoped_release r;
          return F::average_pooling_2d(x.v, ksize, s, pad);
        },
        py::arg("x"), py::arg("ksize"), py::arg("stride") = py::none(), py::arg("pad") = 0);
}

}  // namespace kusari::python
