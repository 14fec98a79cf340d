// kusari.links: Link, Chain, ChainList and Sequential (subclassable in Python), every link of
// kusari/links, the initializers, and the model zoo (ResNets, GPT).
//
// Note [Links written in Python]
// A Chain written in Python is a C++ Chain whose forward() and forward_batch() call back into
// Python (the trampoline PyLink): the C++ Classifier, updaters and evaluators call it as they call
// a C++ link, and its children and parameters, registered under init_scope() or as keyword
// arguments of __init__ (kusari/links.py), are the C++ link's. forward() calls the object's
// __call__ (Chainer's older spelling) with the input; kusari.Chain.__call__ calls forward (the
// newer). forward_batch() calls it with the whole batch: model(x, t) for a model that computes its
// own loss. The Python object must outlive the C++ references to it: a parent keeps its
// children as attributes, and the optimizer, the updater and the trainer keep what they are given
// (py::keep_alive).
#include <mutex>
#include <set>

#include "common.h"
#include "kusari/links.h"
#include "kusari/links/initializers.h"
#include "kusari/models.h"

namespace kusari::python {
namespace {

namespace L = kusari::links;
namespace I = kusari::initializers;

/// The Python function kusari puts on Link as __call__ (kusari/_link.py): it calls forward, so the
/// trampoline must not mistake it for a subclass's own __call__.
py::object& base_call() {
  static auto* f = new py::object();
  return *f;
}

/// The trampoline of Link, Chain and ChainList subclasses written in Python.
template <typename Base>
class PyLink : public Base {
 public:
  using Base::Base;
  Variable forward(const Variable& x) override {
    py::gil_scoped_acquire gil;
    return call_python(py::make_tuple(x));
  }
  Variable forward_batch(const std::vector<Variable>& batch) override {
    py::gil_scoped_acquire gil;
    py::tuple args(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) args[i] = py::cast(batch[i]);
    return call_python(args);
  }

 private:
  /// The subclass's forward, else its own __call__ (Chainer's older spelling).
  Variable call_python(const py::tuple& args) const {
    py::object y;
    if (py::function f = py::get_override(static_cast<const Base*>(this), "forward")) {
      y = f(*args);
    } else if (py::function c = py::get_override(static_cast<const Base*>(this), "__call__");
               c && !(py::hasattr(c, "__func__") && py::object(c.attr("__func__")).is(base_call()))) {
      y = c(*args);
    } else {
      py::object self = py::cast(static_cast<const Base*>(this));
      throw py::type_error(py::str(py::type::of(self).attr("__name__")).cast<std::string>() +
                           " defines neither forward(self, ...) nor __call__(self, ...); define forward");
    }
    if (py::isinstance<Variable>(y)) return y.cast<Variable>();
    if (y.is_none()) {
      py::object self = py::cast(static_cast<const Base*>(this));
      throw py::type_error(py::str(py::type::of(self).attr("__name__")).cast<std::string>() +
                           ".forward returned None; expected a Variable (did it forget `return`?)");
    }
    return variable_from_python(y, false, "forward");
  }
};

/// Link's protected registration, opened to the bindings.
class LinkAccess : public Link {
 public:
  static void add_link(Link& parent, const std::string& name, std::shared_ptr<Link> child) {
    static_cast<LinkAccess&>(parent).add_link_impl(name, std::move(child));
  }
};

/// An initializer that copies a given array (Chainer's initialW=numpy_array).
class ArrayInitializer : public Initializer {
 public:
  explicit ArrayInitializer(Array value) : value_(std::move(value)) {}
  void operator()(Array& array) const override {
    KUSARI_CHECK(array.shape() == value_.shape(), ShapeError, "initializer array: its shape ", value_.shape(),
                 " is not the parameter's ", array.shape());
    array.assign(value_.to_device(array.device()));
  }
  Dtype dtype() const override { return value_.dtype(); }

 private:
  Array value_;
};

/// Chainer's initializer arguments: None, an Initializer, a number (Constant) or an array.
std::shared_ptr<Initializer> initializer_of(py::handle h, const char* where) {
  if (h.is_none()) return nullptr;
  if (py::isinstance<Initializer>(h)) return h.cast<std::shared_ptr<Initializer>>();
  if (PyFloat_Check(h.ptr()) || (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr()))) {
    return std::make_shared<I::Constant>(h.cast<double>());
  }
  return std::make_shared<ArrayInitializer>(array_from_python(h, where));
}

std::optional<int64_t> optional_int(py::handle h) {
  if (h.is_none()) return std::nullopt;
  return h.cast<int64_t>();
}

py::object param_or_none(const Parameter& p) { return p.defined() ? py::cast(p) : py::none(); }

py::list named_params(const Link& l, bool include_uninit) {
  py::list out;
  for (auto& [path, p] : l.namedparams(include_uninit)) out.append(py::make_tuple(path, p));
  return out;
}

}  // namespace

void init_links(py::module_& m) {
  // --- initializers
  py::module_ init = m.def_submodule("initializers", "Parameter initializers (Chainer's chainer.initializers)");
  py::class_<Initializer, std::shared_ptr<Initializer>>(init, "Initializer", "Fills a parameter when it is sized.")
      .def("__call__", [](const Initializer& i, py::handle array) {
        Array a = array_from_python(array, "Initializer");
        i(a);
        return array_to_python(a);
      }, "Fills `array` (in place) and returns it.")
      .def_property_readonly("dtype", [](const Initializer& i) { return i.dtype(); });
  py::class_<I::Constant, Initializer, std::shared_ptr<I::Constant>>(init, "Constant")
      .def(py::init<double, Dtype>(), py::arg("fill_value"), py::arg("dtype") = Dtype::kFloat32);
  py::class_<I::Zero, I::Constant, std::shared_ptr<I::Zero>>(init, "Zero").def(py::init<Dtype>(), py::arg("dtype") = Dtype::kFloat32);
  py::class_<I::One, I::Constant, std::shared_ptr<I::One>>(init, "One").def(py::init<Dtype>(), py::arg("dtype") = Dtype::kFloat32);
#define KUSARI_RANDOM_INITIALIZER(Name, scale)                                                           \
  py::class_<I::Name, Initializer, std::shared_ptr<I::Name>>(init, #Name)                             \
      .def(py::init([](double s, Dtype d) { return std::make_shared<I::Name>(s, d); }), py::arg("scale") = scale, \
           py::arg("dtype") = Dtype::kFloat32)
  KUSARI_RANDOM_INITIALIZER(Normal, 0.05);
  KUSARI_RANDOM_INITIALIZER(Uniform, 0.05);
  KUSARI_RANDOM_INITIALIZER(LeCunNormal, 1.0);
  KUSARI_RANDOM_INITIALIZER(GlorotNormal, 1.0);
  KUSARI_RANDOM_INITIALIZER(HeNormal, 1.0);
  KUSARI_RANDOM_INITIALIZER(LeCunUniform, 1.0);
  KUSARI_RANDOM_INITIALIZER(GlorotUniform, 1.0);
  KUSARI_RANDOM_INITIALIZER(HeUniform, 1.0);
#undef KUSARI_RANDOM_INITIALIZER
  // (Parameter's default, looked up by autograd.cc.)
  m.attr("LeCunNormal") = init.attr("LeCunNormal");
  m.attr("Constant") = init.attr("Constant");

  // --- Link, Chain, ChainList, Sequential
  py::class_<Link, PyLink<Link>, std::shared_ptr<Link>> link(m, "Link", py::dynamic_attr(),
                                                              "A piece of a model: parameters, persistents, children.");
  link.def(py::init<>())
      .def("forward", [](Link& l, const VarArg& x) {
        py::gil_scoped_release r;
        return l.forward(x.v);
      }, py::arg("x"), "The link's computation (the C++ link's own; a subclass written in Python defines its own).")
      .def_static("_set_base_call", [](py::object f) { base_call() = std::move(f); })
      .def("_add_link", [](Link& l, const std::string& name, std::shared_ptr<Link> child) {
        LinkAccess::add_link(l, name, std::move(child));
      }, py::keep_alive<1, 3>())
      .def("add_param",
           [](Link& l, const std::string& name, py::handle shape, py::handle dtype, py::handle initializer) {
             std::shared_ptr<Initializer> init = initializer_of(initializer, "add_param");
             if (!init) init = std::make_shared<I::LeCunNormal>(1.0, dtype.is_none() ? Dtype::kFloat32 : dtype.cast<Dtype>());
             Parameter p = shape.is_none() ? Parameter(init) : Parameter(init, shape.cast<Shape>());
             if (!dtype.is_none()) p.to_dtype(dtype.cast<Dtype>());
             return l.add_param(name, p);
           },
           py::arg("name"), py::arg("shape") = py::none(), py::arg("dtype") = py::none(),
           py::arg("initializer") = py::none(), "Registers a new parameter and returns it (Chainer's add_param).")
      .def("_register_param", [](Link& l, const std::string& name, Parameter p) { return l.add_param(name, p); })
      .def("add_persistent", [](Link& l, const std::string& name, py::handle value) {
        l.add_persistent(name, array_from_python(value, "add_persistent"));
      }, py::arg("name"), py::arg("value"))
      .def("persistent", [](Link& l, const std::string& name) { return array_to_python(l.persistent(name)); },
           py::arg("name"), "The persistent array `name` (a NumPy view on the CPU: writes go through).")
      .def("namedparams", &named_params, py::arg("include_uninit") = true)
      .def("params", [](const Link& l, bool include_uninit) {
        py::list out;
        for (auto& p : l.params(include_uninit)) out.append(p);
        return out;
      }, py::arg("include_uninit") = true)
      .def("namedlinks", [](Link& l, bool skipself) {
        py::list out;
        for (auto& [path, child] : l.namedlinks(skipself)) out.append(py::make_tuple(path, py::cast(child, py::return_value_policy::reference)));
        return out;
      }, py::arg("skipself") = false)
      .def("children", [](const Link& l) {
        py::list out;
        for (auto& [name, child] : l.children()) out.append(py::cast(child));
        return out;
      })
      .def("namedpersistents", [](Link& l) {
        py::list out;
        for (auto& [path, a] : l.namedpersistents()) out.append(py::make_tuple(path, array_to_python(*a)));
        return out;
      })
      .def_property_readonly("name", [](const Link& l) -> py::object {
        return l.name().empty() ? py::object(py::none()) : py::object(py::str(l.name()));
      })
      .def("count_params", &Link::count_params)
      .def("cleargrads", &Link::cleargrads)
      .def("zerograds", &Link::zerograds)
      .def("copyparams", &Link::copyparams, py::arg("link"), py::arg("copy_persistent") = true)
      .def("addgrads", &Link::addgrads, py::arg("link"))
      .def("to_device", [](py::object self, py::handle d) {
        self.cast<Link&>().to_device(device_from_python(d, "Link.to_device"));
        return self;
      }, py::arg("device"), "Moves the parameters and persistents to `device`; returns the link.")
      .def("to_cpu", [](py::object self) {
        self.cast<Link&>().to_device(Device::cpu());
        return self;
      })
      .def("to_gpu", [](py::object self, py::handle d) {
        self.cast<Link&>().to_device(d.is_none() ? Device::cuda(0) : device_from_python(d, "Link.to_gpu"));
        return self;
      }, py::arg("device") = py::none())
      .def("to_dtype", [](py::object self, Dtype d) {
        self.cast<Link&>().to_dtype(d);
        return self;
      }, py::arg("dtype"))
      .def_property_readonly("device", [](const Link& l) { return l.device(); })
      .def_property_readonly("xp", [](const Link& l) -> py::object {
        if (l.device().is_cpu()) return py::module_::import("numpy");
        return py::module_::import("kusari");
      })
      .def("disable_update", &Link::disable_update)
      .def("enable_update", &Link::enable_update);

  py::class_<Chain, Link, PyLink<Chain>, std::shared_ptr<Chain>>(m, "Chain", py::dynamic_attr())
      .def(py::init<>())
      .def("add_link", [](Chain& c, const std::string& name, std::shared_ptr<Link> child) {
        LinkAccess::add_link(c, name, std::move(child));
      }, py::arg("name"), py::arg("link"), py::keep_alive<1, 3>());

  py::class_<ChainList, Link, PyLink<ChainList>, std::shared_ptr<ChainList>>(m, "ChainList", py::dynamic_attr())
      .def(py::init<>())
      .def("append", [](ChainList& c, std::shared_ptr<Link> link) { c.append(std::move(link)); }, py::arg("link"),
           py::keep_alive<1, 2>())
      .def("add_link", [](ChainList& c, std::shared_ptr<Link> link) { c.append(std::move(link)); }, py::arg("link"),
           py::keep_alive<1, 2>())
      .def("__len__", &ChainList::size)
      .def("__getitem__", [](const ChainList& c, int64_t i) {
        const int64_t n = static_cast<int64_t>(c.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) throw py::index_error("ChainList index " + std::to_string(i) + " out of range");
        return c.children()[static_cast<size_t>(i)].second;
      });

  py::class_<Sequential, ChainList, std::shared_ptr<Sequential>>(m, "Sequential", py::dynamic_attr())
      .def(py::init([](py::args layers) {
             auto s = std::make_shared<Sequential>();
             return s;
           }))
      .def("_add_link", [](Sequential& s, std::shared_ptr<Link> l) { s.add(std::move(l)); }, py::keep_alive<1, 2>())
      .def("_add_function", [](Sequential& s, std::function<Variable(const Variable&)> fn) { s.add(std::move(fn)); })
      .def("__call__", [](Sequential& s, const VarArg& x) {
        py::gil_scoped_release r;
        return s.forward(x.v);
      });

  // --- the links of kusari/links
  py::class_<L::Linear, Link, std::shared_ptr<L::Linear>>(m, "Linear", py::dynamic_attr())
      .def(py::init([](py::handle in_size, py::handle out_size, bool nobias, py::handle initialW, py::handle initial_bias) {
             // Chainer: Linear(out_size) infers in_size; Linear(in_size, out_size) fixes it.
             std::optional<int64_t> in = optional_int(in_size);
             int64_t out = 0;
             if (out_size.is_none()) {
               if (!in) throw py::value_error("Linear: give out_size (Linear(out_size) or Linear(in_size, out_size))");
               out = *in;
               in.reset();
             } else {
               out = out_size.cast<int64_t>();
             }
             return std::make_shared<L::Linear>(in, out, nobias, initializer_of(initialW, "Linear"),
                                                initializer_of(initial_bias, "Linear"));
           }),
           py::arg("in_size"), py::arg("out_size") = py::none(), py::arg("nobias") = false,
           py::arg("initialW") = py::none(), py::arg("initial_bias") = py::none())
      .def_property_readonly("W", [](const L::Linear& l) { return param_or_none(l.W); })
      .def_property_readonly("b", [](const L::Linear& l) { return param_or_none(l.b); })
      .def_property_readonly("out_size", &L::Linear::out_size);

  auto conv_init = [](auto make) {
    return [make](py::handle in_channels, py::handle out_channels, py::handle ksize, functions::IntPair stride,
                  functions::IntPair pad, bool nobias, py::handle initialW, py::handle initial_bias,
                  functions::IntPair dilate, int64_t groups) {
      // Chainer: Conv(out, ksize) infers the input channels; Conv(in, out, ksize) fixes them.
      std::optional<int64_t> in = optional_int(in_channels);
      int64_t out = 0;
      functions::IntPair k(0);
      if (ksize.is_none()) {
        if (!in || out_channels.is_none()) {
          throw py::value_error("convolution: give out_channels and ksize (Conv(out_channels, ksize) or "
                                "Conv(in_channels, out_channels, ksize))");
        }
        out = *in;
        in.reset();
        k = out_channels.cast<functions::IntPair>();
      } else {
        out = out_channels.cast<int64_t>();
        k = ksize.cast<functions::IntPair>();
      }
      return make(in, out, k, stride, pad, nobias, initializer_of(initialW, "convolution"),
                  initializer_of(initial_bias, "convolution"), dilate, groups);
    };
  };
  py::class_<L::Convolution2D, Link, std::shared_ptr<L::Convolution2D>>(m, "Convolution2D", py::dynamic_attr())
      .def(py::init(conv_init([](std::optional<int64_t> in, int64_t out, functions::IntPair k, functions::IntPair s,
                                 functions::IntPair p, bool nobias, std::shared_ptr<Initializer> w,
                                 std::shared_ptr<Initializer> b, functions::IntPair d, int64_t g) {
             return std::make_shared<L::Convolution2D>(in, out, k, s, p, nobias, w, b, d, g);
           })),
           py::arg("in_channels"), py::arg("out_channels"), py::arg("ksize") = py::none(), py::arg("stride") = 1,
           py::arg("pad") = 0, py::arg("nobias") = false, py::arg("initialW") = py::none(),
           py::arg("initial_bias") = py::none(), py::kw_only(), py::arg("dilate") = 1, py::arg("groups") = 1)
      .def_property_readonly("W", [](const L::Convolution2D& l) { return param_or_none(l.W); })
      .def_property_readonly("b", [](const L::Convolution2D& l) { return param_or_none(l.b); })
      .def_property_readonly("out_channels", &L::Convolution2D::out_channels)
      .def_property_readonly("ksize", &L::Convolution2D::ksize)
      .def_property_readonly("stride", &L::Convolution2D::stride)
      .def_property_readonly("pad", &L::Convolution2D::pad);
  py::class_<L::Deconvolution2D, Link, std::shared_ptr<L::Deconvolution2D>>(m, "Deconvolution2D", py::dynamic_attr())
      .def(py::init([](py::handle in_channels, py::handle out_channels, py::handle ksize, functions::IntPair stride,
                       functions::IntPair pad, bool nobias, py::handle outsize, py::handle initialW,
                       py::handle initial_bias, functions::IntPair dilate, int64_t groups) {
             std::optional<int64_t> in = optional_int(in_channels);
             int64_t out = 0;
             functions::IntPair k(0);
             if (ksize.is_none()) {
               if (!in || out_channels.is_none()) throw py::value_error("Deconvolution2D: give out_channels and ksize");
               out = *in;
               in.reset();
               k = out_channels.cast<functions::IntPair>();
             } else {
               out = out_channels.cast<int64_t>();
               k = ksize.cast<functions::IntPair>();
             }
             std::optional<functions::IntPair> os;
             if (!outsize.is_none()) os = outsize.cast<functions::IntPair>();
             return std::make_shared<L::Deconvolution2D>(in, out, k, stride, pad, nobias, os,
                                                         initializer_of(initialW, "Deconvolution2D"),
                                                         initializer_of(initial_bias, "Deconvolution2D"), dilate, groups);
           }),
           py::arg("in_channels"), py::arg("out_channels"), py::arg("ksize") = py::none(), py::arg("stride") = 1,
           py::arg("pad") = 0, py::arg("nobias") = false, py::arg("outsize") = py::none(),
           py::arg("initialW") = py::none(), py::arg("initial_bias") = py::none(), py::kw_only(),
           py::arg("dilate") = 1, py::arg("groups") = 1)
      .def_property_readonly("W", [](const L::Deconvolution2D& l) { return param_or_none(l.W); })
      .def_property_readonly("b", [](const L::Deconvolution2D& l) { return param_or_none(l.b); });

  py::class_<L::BatchNormalization, Link, std::shared_ptr<L::BatchNormalization>>(m, "BatchNormalization",
                                                                                   py::dynamic_attr())
      .def(py::init([](py::handle size, double decay, double eps, Dtype dtype, bool use_gamma, bool use_beta,
                       py::handle initial_gamma, py::handle initial_beta, py::handle axis, py::handle initial_avg_mean,
                       py::handle initial_avg_var) {
             std::optional<Shape> s;
             if (!size.is_none()) s = size.cast<Shape>();
             std::optional<Axes> ax;
             if (!axis.is_none()) ax = axis.cast<Shape>();
             return std::make_shared<L::BatchNormalization>(
                 s, decay, eps, dtype, use_gamma, use_beta, initializer_of(initial_gamma, "BatchNormalization"),
                 initializer_of(initial_beta, "BatchNormalization"), ax,
                 initializer_of(initial_avg_mean, "BatchNormalization"),
                 initializer_of(initial_avg_var, "BatchNormalization"));
           }),
           py::arg("size") = py::none(), py::arg("decay") = 0.9, py::arg("eps") = 2e-5,
           py::arg("dtype") = Dtype::kFloat32, py::arg("use_gamma") = true, py::arg("use_beta") = true,
           py::arg("initial_gamma") = py::none(), py::arg("initial_beta") = py::none(), py::arg("axis") = py::none(),
           py::arg("initial_avg_mean") = py::none(), py::arg("initial_avg_var") = py::none())
      .def("__call__", [](L::BatchNormalization& bn, const VarArg& x, bool finetune) {
        py::gil_scoped_release r;
        return bn.forward(x.v, finetune);
      }, py::arg("x"), py::kw_only(), py::arg("finetune") = false)
      .def("forward_relu", [](L::BatchNormalization& bn, const VarArg& x, py::handle residual) {
        Variable res = residual.is_none() ? Variable() : variable_from_python(residual, false, "forward_relu");
        py::gil_scoped_release r;
        return bn.forward_relu(x.v, res);
      }, py::arg("x"), py::arg("residual") = py::none())
      .def("start_finetuning", &L::BatchNormalization::start_finetuning)
      .def_property_readonly("gamma", [](const L::BatchNormalization& l) { return param_or_none(l.gamma); })
      .def_property_readonly("beta", [](const L::BatchNormalization& l) { return param_or_none(l.beta); })
      .def_property_readonly("avg_mean", [](const L::BatchNormalization& l) { return array_to_python(l.avg_mean()); })
      .def_property_readonly("avg_var", [](const L::BatchNormalization& l) { return array_to_python(l.avg_var()); })
      .def_property_readonly("N", &L::BatchNormalization::N)
      .def_property_readonly("decay", &L::BatchNormalization::decay)
      .def_property_readonly("eps", &L::BatchNormalization::eps);

  py::class_<L::EmbedID, Link, std::shared_ptr<L::EmbedID>>(m, "EmbedID", py::dynamic_attr())
      .def(py::init([](int64_t in_size, int64_t out_size, py::handle initialW, py::handle ignore_label,
                       py::handle valid_ids) {
             auto e = std::make_shared<L::EmbedID>(in_size, out_size, initializer_of(initialW, "EmbedID"),
                                                   optional_int(ignore_label));
             e->set_valid_ids(optional_int(valid_ids));
             return e;
           }),
           py::arg("in_size"), py::arg("out_size"), py::arg("initialW") = py::none(),
           py::arg("ignore_label") = py::none(), py::kw_only(), py::arg("valid_ids") = py::none())
      .def("__call__", [](L::EmbedID& e, const ArrArg& x) {
        py::gil_scoped_release r;
        return e.forward(Variable(x.a));
      }, py::arg("x"))
      .def_property_readonly("W", [](const L::EmbedID& l) { return param_or_none(l.W); })
      .def_property("valid_ids", &L::EmbedID::valid_ids,
                    [](L::EmbedID& e, py::handle n) { e.set_valid_ids(optional_int(n)); });

  py::class_<L::LSTM, Chain, std::shared_ptr<L::LSTM>>(m, "LSTM", py::dynamic_attr())
      .def(py::init([](py::handle in_size, py::handle out_size, py::handle lateral_init, py::handle upward_init,
                       py::handle bias_init, py::handle forget_bias_init) {
             std::optional<int64_t> in = optional_int(in_size);
             int64_t out = 0;
             if (out_size.is_none()) {
               if (!in) throw py::value_error("LSTM: give out_size (LSTM(out_size) or LSTM(in_size, out_size))");
               out = *in;
               in.reset();
             } else {
               out = out_size.cast<int64_t>();
             }
             return std::make_shared<L::LSTM>(in, out, initializer_of(lateral_init, "LSTM"),
                                              initializer_of(upward_init, "LSTM"), initializer_of(bias_init, "LSTM"),
                                              initializer_of(forget_bias_init, "LSTM"));
           }),
           py::arg("in_size"), py::arg("out_size") = py::none(), py::arg("lateral_init") = py::none(),
           py::arg("upward_init") = py::none(), py::arg("bias_init") = py::none(),
           py::arg("forget_bias_init") = py::none())
      .def("__call__", [](L::LSTM& l, const VarArg& x) {
        py::gil_scoped_release r;
        return l.forward(x.v);
      }, py::arg("x"))
      .def("reset_state", &L::LSTM::reset_state)
      .def("set_state", [](L::LSTM& l, const VarArg& c, const VarArg& h) { l.set_state(c.v, h.v); }, py::arg("c"),
           py::arg("h"))
      .def_property_readonly("c", [](const L::LSTM& l) -> py::object {
        return l.c().defined() ? py::cast(l.c()) : py::none();
      })
      .def_property_readonly("h", [](const L::LSTM& l) -> py::object {
        return l.h().defined() ? py::cast(l.h()) : py::none();
      })
      .def_property_readonly("upward", [](const L::LSTM& l) { return l.upward; })
      .def_property_readonly("lateral", [](const L::LSTM& l) { return l.lateral; });

  py::class_<L::Classifier, Chain, std::shared_ptr<L::Classifier>>(m, "Classifier", py::dynamic_attr())
      .def(py::init([](std::shared_ptr<Link> predictor, py::handle lossfun, py::handle accfun, py::handle label_key) {
             if (!label_key.is_none() && !(PyLong_Check(label_key.ptr()) && label_key.cast<int64_t>() == -1)) {
               throw py::value_error("Classifier: only label_key=-1 (the last element of the batch) is supported");
             }
             L::Classifier::LossFunction loss;
             L::Classifier::AccuracyFunction acc;
             if (!lossfun.is_none()) {
               auto f = hold(py::reinterpret_borrow<py::object>(lossfun));
               loss = [f](const Variable& y, const Array& t) {
                 py::gil_scoped_acquire gil;
                 return variable_from_python(f->object(y, array_to_python(t)), false, "Classifier lossfun");
               };
             }
             if (!accfun.is_none()) {
               auto f = hold(py::reinterpret_borrow<py::object>(accfun));
               acc = [f](const Variable& y, const Array& t) {
                 py::gil_scoped_acquire gil;
                 return variable_from_python(f->object(y, array_to_python(t)), false, "Classifier accfun");
               };
             }
             return std::make_shared<L::Classifier>(std::move(predictor), loss, acc);
           }),
           py::arg("predictor"), py::arg("lossfun") = py::none(), py::arg("accfun") = py::none(),
           py::arg("label_key") = -1, py::keep_alive<1, 2>())
      .def("__call__", [](L::Classifier& c, py::args args) {
        std::vector<Variable> batch;
        for (py::handle h : args) batch.push_back(variable_from_python(h, false, "Classifier"));
        py::gil_scoped_release r;
        return c.forward_batch(batch);
      })
      .def_property_readonly("predictor", [](L::Classifier& c) { return c.predictor_ptr(); })
      .def_readwrite("compute_accuracy", &L::Classifier::compute_accuracy)
      .def_property_readonly("y", [](const L::Classifier& c) -> py::object { return c.y.defined() ? py::cast(c.y) : py::none(); })
      .def_property_readonly("loss", [](const L::Classifier& c) -> py::object {
        return c.loss.defined() ? py::cast(c.loss) : py::none();
      })
      .def_property_readonly("accuracy", [](const L::Classifier& c) -> py::object {
        return c.accuracy.defined() ? py::cast(c.accuracy) : py::none();
      });

  // --- the transformer's links
  py::class_<L::LayerNormalization, Link, std::shared_ptr<L::LayerNormalization>>(m, "LayerNormalization",
                                                                                   py::dynamic_attr())
      .def(py::init<int64_t, double, bool>(), py::arg("size"), py::arg("eps") = 1e-5, py::arg("use_beta") = true)
      .def("__call__", [](L::LayerNormalization& l, const VarArg& x) {
        py::gil_scoped_release r;
        return l.forward(x.v);
      }, py::arg("x"))
      .def_property_readonly("gamma", [](const L::LayerNormalization& l) { return param_or_none(l.gamma); })
      .def_property_readonly("beta", [](const L::LayerNormalization& l) { return param_or_none(l.beta); })
      .def_readonly("eps", &L::LayerNormalization::eps);
  py::class_<L::RMSNormalization, Link, std::shared_ptr<L::RMSNormalization>>(m, "RMSNormalization", py::dynamic_attr())
      .def(py::init<int64_t, double>(), py::arg("size"), py::arg("eps") = 1e-6)
      .def("__call__", [](L::RMSNormalization& l, const VarArg& x) {
        py::gil_scoped_release r;
        return l.forward(x.v);
      }, py::arg("x"))
      .def_property_readonly("gamma", [](const L::RMSNormalization& l) { return param_or_none(l.gamma); })
      .def_readonly("eps", &L::RMSNormalization::eps);
  py::class_<L::KVCache, std::shared_ptr<L::KVCache>>(m, "KVCache",
                                                      "The keys and values a MultiHeadAttention has seen (generation).")
      .def(py::init<>())
      .def_property_readonly("length", &L::KVCache::length)
      .def_property_readonly("k", [](const L::KVCache& c) { return c.k.defined() ? py::cast(c.k) : py::none(); })
      .def_property_readonly("v", [](const L::KVCache& c) { return c.v.defined() ? py::cast(c.v) : py::none(); })
      .def("clear", &L::KVCache::clear);
  auto mask_of = [](py::handle mask) { return mask.is_none() ? Array() : array_from_python(mask, "MultiHeadAttention"); };
  py::class_<L::MultiHeadAttention, Link, std::shared_ptr<L::MultiHeadAttention>>(m, "MultiHeadAttention",
                                                                                   py::dynamic_attr())
      .def(py::init([](int64_t size, int64_t n_heads, int64_t kv_size, bool causal, double dropout, bool bias,
                       py::handle initialW, py::handle initial_out_W) {
             L::MultiHeadAttentionOptions o;
             o.kv_size = kv_size;
             o.causal = causal;
             o.dropout = dropout;
             o.bias = bias;
             o.initialW = initializer_of(initialW, "MultiHeadAttention");
             o.initial_out_W = initializer_of(initial_out_W, "MultiHeadAttention");
             return std::make_shared<L::MultiHeadAttention>(size, n_heads, o);
           }),
           py::arg("size"), py::arg("n_heads"), py::kw_only(), py::arg("kv_size") = 0, py::arg("causal") = false,
           py::arg("dropout") = 0.0, py::arg("bias") = true, py::arg("initialW") = py::none(),
           py::arg("initial_out_W") = py::none())
      .def("__call__", [mask_of](L::MultiHeadAttention& a, const VarArg& x, py::handle memory, py::handle mask,
                                 L::KVCache* cache) {
        Array m = mask_of(mask);
        if (!memory.is_none()) {
          KUSARI_CHECK(cache == nullptr, ValueError,
                       "MultiHeadAttention: a KV cache is for self-attention; got one with memory (cross-attention)");
          Variable mem = variable_from_python(memory, false, "MultiHeadAttention");
          py::gil_scoped_release r;
          return a.forward(x.v, mem, m);
        }
        py::gil_scoped_release r;
        return a.forward(x.v, cache, m);
      }, py::arg("x"), py::arg("memory") = py::none(), py::kw_only(), py::arg("mask") = py::none(),
         py::arg("cache") = static_cast<L::KVCache*>(nullptr),
         "Self-attention of x (batch, length, size), with an optional KV cache, or cross-attention to memory.")
      .def_property_readonly("size", &L::MultiHeadAttention::size)
      .def_property_readonly("n_heads", &L::MultiHeadAttention::n_heads)
      .def_readonly("c_attn", &L::MultiHeadAttention::c_attn)
      .def_readonly("q_proj", &L::MultiHeadAttention::q_proj)
      .def_readonly("kv_proj", &L::MultiHeadAttention::kv_proj)
      .def_readonly("c_proj", &L::MultiHeadAttention::c_proj);
  py::class_<L::TransformerBlock, Link, std::shared_ptr<L::TransformerBlock>>(m, "TransformerBlock", py::dynamic_attr())
      .def(py::init([](int64_t size, int64_t n_heads, int64_t mlp_ratio, bool causal, double dropout, bool bias,
                       double eps, bool gelu_tanh, py::handle initialW, py::handle initial_residual_W) {
             L::TransformerBlockOptions o;
             o.mlp_ratio = mlp_ratio;
             o.causal = causal;
             o.dropout = dropout;
             o.bias = bias;
             o.eps = eps;
             o.gelu_tanh = gelu_tanh;
             o.initialW = initializer_of(initialW, "TransformerBlock");
             o.initial_residual_W = initializer_of(initial_residual_W, "TransformerBlock");
             return std::make_shared<L::TransformerBlock>(size, n_heads, o);
           }),
           py::arg("size"), py::arg("n_heads"), py::kw_only(), py::arg("mlp_ratio") = 4, py::arg("causal") = true,
           py::arg("dropout") = 0.0, py::arg("bias") = true, py::arg("eps") = 1e-5, py::arg("gelu_tanh") = true,
           py::arg("initialW") = py::none(), py::arg("initial_residual_W") = py::none())
      .def("__call__", [](L::TransformerBlock& b, const VarArg& x, L::KVCache* cache) {
        py::gil_scoped_release r;
        return cache ? b.forward(x.v, cache) : b.forward(x.v);
      }, py::arg("x"), py::kw_only(), py::arg("cache") = static_cast<L::KVCache*>(nullptr))
      .def_readonly("ln_1", &L::TransformerBlock::ln_1)
      .def_readonly("attn", &L::TransformerBlock::attn)
      .def_readonly("ln_2", &L::TransformerBlock::ln_2)
      .def_readonly("mlp", &L::TransformerBlock::mlp)
      .def_readonly("c_fc", &L::TransformerBlock::c_fc)
      .def_readonly("c_proj", &L::TransformerBlock::c_proj);

  // --- the ResNet zoo (kusari.models)
  py::module_ models = m.def_submodule("models", "The model zoo");
  py::class_<models::ResNet, Chain, std::shared_ptr<models::ResNet>>(models, "ResNet", py::dynamic_attr())
      .def("__call__", [](models::ResNet& r, const VarArg& x) {
        py::gil_scoped_release g;
        return r.forward(x.v);
      });
  auto resnet = [&](const char* name, std::shared_ptr<models::ResNet> (*make)(const models::ResNetOptions&)) {
    models.def(name, [make](int64_t num_classes, bool zero_init_residual, Dtype dtype, bool channels_last, int64_t width) {
      models::ResNetOptions o;
      o.num_classes = num_classes;
      o.zero_init_residual = zero_init_residual;
      o.dtype = dtype;
      o.memory_format = channels_last ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
      o.width = width;
      return make(o);
    }, py::arg("num_classes") = 1000, py::arg("zero_init_residual") = false, py::arg("dtype") = Dtype::kFloat32,
       py::arg("channels_last") = false, py::arg("width") = 64);
  };
  resnet("resnet18", &models::resnet18);
  resnet("resnet34", &models::resnet34);
  resnet("resnet50", &models::resnet50);
  resnet("resnet101", &models::resnet101);
  resnet("resnet152", &models::resnet152);

  // --- GPT (kusari.models)
  py::class_<models::GPTConfig>(models, "GPTConfig", "The size of a GPT (kusari/models/gpt.h).")
      .def(py::init([](int64_t vocab_size, int64_t block_size, int64_t n_layer, int64_t n_head, int64_t n_embd,
                       double dropout, bool bias, bool gelu_tanh, Dtype dtype, int64_t vocab_multiple) {
             models::GPTConfig c;
             c.vocab_size = vocab_size;
             c.vocab_multiple = vocab_multiple;
             c.block_size = block_size;
             c.n_layer = n_layer;
             c.n_head = n_head;
             c.n_embd = n_embd;
             c.dropout = dropout;
             c.bias = bias;
             c.gelu_tanh = gelu_tanh;
             c.dtype = dtype;
             return c;
           }),
           py::kw_only(), py::arg("vocab_size") = 50257, py::arg("block_size") = 1024, py::arg("n_layer") = 12,
           py::arg("n_head") = 12, py::arg("n_embd") = 768, py::arg("dropout") = 0.0, py::arg("bias") = true,
           py::arg("gelu_tanh") = true, py::arg("dtype") = Dtype::kFloat32, py::arg("vocab_multiple") = 64)
      .def_readwrite("vocab_size", &models::GPTConfig::vocab_size)
      .def_readwrite("vocab_multiple", &models::GPTConfig::vocab_multiple)
      .def_readwrite("block_size", &models::GPTConfig::block_size)
      .def_readwrite("n_layer", &models::GPTConfig::n_layer)
      .def_readwrite("n_head", &models::GPTConfig::n_head)
      .def_readwrite("n_embd", &models::GPTConfig::n_embd)
      .def_readwrite("dropout", &models::GPTConfig::dropout)
      .def_readwrite("bias", &models::GPTConfig::bias)
      .def_readwrite("gelu_tanh", &models::GPTConfig::gelu_tanh)
      .def_readwrite("dtype", &models::GPTConfig::dtype)
      .def("__repr__", [](const models::GPTConfig& c) {
        return "GPTConfig(vocab_size=" + std::to_string(c.vocab_size) + ", vocab_multiple=" +
               std::to_string(c.vocab_multiple) + ", block_size=" + std::to_string(c.block_size) +
               ", n_layer=" + std::to_string(c.n_layer) + ", n_head=" + std::to_string(c.n_head) +
               ", n_embd=" + std::to_string(c.n_embd) + ")";
      });
  models.def("gpt2_small_config", &models::gpt2_small_config);
  models.def("gpt2_medium_config", &models::gpt2_medium_config);
  models.def("gpt_tiny_config", &models::gpt_tiny_config, py::arg("vocab_size") = 256);
  py::class_<models::GPT, Chain, std::shared_ptr<models::GPT>>(models, "GPT", py::dynamic_attr())
      .def(py::init([](const models::GPTConfig& c) { return std::make_shared<models::GPT>(c); }), py::arg("config"))
      .def("__call__", [](models::GPT& g, const ArrArg& idx, py::handle targets) {
        if (targets.is_none()) {
          py::gil_scoped_release r;
          return g.forward(Variable(idx.a));
        }
        Array t = array_from_python(targets, "GPT");
        py::gil_scoped_release r;
        return g.forward_batch({Variable(idx.a), Variable(t)});
      }, py::arg("idx"), py::arg("targets") = py::none(),
         "model(idx): the logits (batch, T, vocab) of the next token; model(idx, targets): the mean "
         "cross-entropy (targets of -1 ignored), reported as 'loss'.")
      .def("generate", [](models::GPT& g, const ArrArg& prompt, int64_t max_new_tokens, double temperature,
                          int64_t top_k) {
        Array out;
        {
          py::gil_scoped_release r;
          out = g.generate(prompt.a, max_new_tokens, temperature, top_k);
        }
        return array_to_python(out);
      }, py::arg("prompt"), py::arg("max_new_tokens"), py::arg("temperature") = 1.0, py::arg("top_k") = 0)
      .def("flops_per_token", &models::GPT::flops_per_token, py::arg("T"))
      .def_property_readonly("config", &models::GPT::config)
      .def_property_readonly("padded_vocab_size", &models::GPT::padded_vocab_size,
                             "wte's rows: vocab_size rounded up to a multiple of config.vocab_multiple")
      .def_readonly("wte", &models::GPT::wte)
      .def_readonly("wpe", &models::GPT::wpe)
      .def_readonly("h", &models::GPT::h)
      .def_readonly("ln_f", &models::GPT::ln_f);
  models.def("gpt2_small", [] { return models::gpt2_small(); });
  models.def("gpt2_medium", [] { return models::gpt2_medium(); });
}

}  // namespace kusari::python
