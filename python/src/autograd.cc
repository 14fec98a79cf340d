// Variables, parameters, backward, modes, and differentiable functions written in Python.
#include <mutex>
#include <set>

#include "common.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"

namespace kusari::python {
namespace {

namespace F = kusari::functions;

// --- indexing ----------------------------------------------------------------------------------

std::optional<int64_t> optional_index(py::handle h) {
  if (h.is_none()) return std::nullopt;
  return h.cast<int64_t>();
}

Index index_of(py::handle h, const char* where) {
  if (h.is_none()) return NewAxis{};
  if (h.ptr() == Py_Ellipsis) return Ellipsis{};
  if (PySlice_Check(h.ptr())) {
    py::object step = h.attr("step");
    const int64_t s = step.is_none() ? 1 : step.cast<int64_t>();
    return Slice(optional_index(h.attr("start")), optional_index(h.attr("stop")), s);
  }
  if ((PyLong_Check(h.ptr()) || PyIndex_Check(h.ptr())) && !PyBool_Check(h.ptr())) return h.cast<int64_t>();
  throw py::index_error(std::string(where) + ": only integers, slices (a:b:c), None and ... index kusari "
                        "variables (basic indexing); got " + py::str(py::type::of(h)).cast<std::string>());
}

/// NumPy basic indexing of a Python key (an index or a tuple of them).
std::vector<Index> indices_of(py::handle key, const char* where) {
  std::vector<Index> out;
  if (py::isinstance<py::tuple>(key)) {
    for (py::handle h : key) out.push_back(index_of(h, where));
  } else {
    out.push_back(index_of(key, where));
  }
  return out;
}

// --- Variable from Python values ---------------------------------------------------------------

}  // namespace

Variable variable_from_python(py::handle obj, bool requires_grad, const char* where) {
  if (py::isinstance<Variable>(obj)) return obj.cast<Variable>();
  return Variable(array_from_python(obj, where), requires_grad);
}

namespace {

Shape shape_of_args(py::args args, const char* where) {
  // x.reshape(2, 3) and x.reshape((2, 3)) alike.
  if (args.size() == 1 && !PyLong_Check(args[0].ptr())) return args[0].cast<Shape>();
  Shape s;
  for (py::handle h : args) s.push_back(h.cast<int64_t>());
  return s;
}

// --- differentiable functions written in Python --------------------------------------------------

/// The name a node of class `name` records: kept for the life of the process (nodes hold a
/// const char*).
const char* interned(const std::string& name) {
  static std::mutex mutex;
  static auto* names = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mutex);
  return names->insert(name).first->c_str();
}

/// FunctionNode.apply of a function written in Python (kusari.FunctionNode): runs its forward on
/// the inputs' arrays, then records it with a backward rule that calls its backward (under the
/// GIL) with the output gradients as Variables. See Note [Python functions].
std::vector<Variable> apply_python_function(py::object self, py::sequence inputs) {
  std::vector<Variable> xs;
  for (py::handle h : inputs) xs.push_back(variable_from_python(h, false, "FunctionNode.apply"));
  py::tuple in_arrays(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) in_arrays[i] = array_to_python(xs[i].data());
  self.attr("_kusari_input_shapes") = py::none();
  py::object result = self.attr("forward")(in_arrays);
  std::vector<Array> ys;
  const std::string cls = py::str(py::type::of(self).attr("__name__")).cast<std::string>();
  const std::string where = cls + ".forward";
  if (py::isinstance<py::tuple>(result) || py::isinstance<py::list>(result)) {
    for (py::handle h : result) ys.push_back(array_from_python(h, where.c_str()));
  } else {
    throw py::type_error(where + " must return a tuple of arrays (e.g. `return y,`), got " +
                         py::str(py::type::of(result)).cast<std::string>());
  }
  if (ys.empty()) throw py::value_error(where + " returned no output; expected at least one array");
  std::vector<int> retained_outputs;
  if (py::hasattr(self, "_kusari_retained_outputs")) {
    for (py::handle h : self.attr("_kusari_retained_outputs")) {
      const int i = h.cast<int>();
      if (i < 0 || i >= static_cast<int>(ys.size())) {
        throw py::index_error(cls + ".retain_outputs: output " + std::to_string(i) + " of " +
                              std::to_string(ys.size()));
      }
      retained_outputs.push_back(i);
    }
  }
  const int n_in = static_cast<int>(xs.size());
  const int n_out = static_cast<int>(ys.size());
  auto holder = hold(self);
  BackwardRule rule = [holder, n_in, n_out, retained_outputs, cls](BackwardContext& ctx) {
    py::gil_scoped_acquire gil;
    py::object self = holder->object;
    py::tuple inputs(n_in);
    for (int i = 0; i < n_in; ++i) inputs[static_cast<size_t>(i)] = py::cast(ctx.input(i));
    self.attr("_kusari_input_vars") = inputs;
    py::tuple outputs(retained_outputs.size());
    for (size_t k = 0; k < retained_outputs.size(); ++k) outputs[k] = py::cast(ctx.output(retained_outputs[k]));
    self.attr("_kusari_output_vars") = outputs;
    py::list targets;
    for (int i = 0; i < n_in; ++i) {
      if (ctx.needs_input_grad(i)) targets.append(i);
    }
    py::tuple grad_outputs(n_out);
    for (int i = 0; i < n_out; ++i) {
      grad_outputs[static_cast<size_t>(i)] = ctx.has_output_grad(i) ? py::cast(ctx.output_grad(i)) : py::none();
    }
    py::tuple target_tuple(targets);
    py::object gxs = self.attr("backward")(target_tuple, grad_outputs);
    if (!py::isinstance<py::tuple>(gxs) && !py::isinstance<py::list>(gxs)) gxs = py::make_tuple(gxs);
    py::sequence seq = py::reinterpret_borrow<py::sequence>(gxs);
    const size_t n = seq.size();
    // Chainer accepts one gradient per input, or one per target index.
    const bool per_target = n == target_tuple.size() && n != static_cast<size_t>(n_in);
    if (!per_target && n != static_cast<size_t>(n_in)) {
      throw py::value_error(cls + ".backward returned " + std::to_string(n) + " gradients; expected one per input (" +
                            std::to_string(n_in) + ") or one per target index (" +
                            std::to_string(target_tuple.size()) + ")");
    }
    for (size_t k = 0; k < n; ++k) {
      const int i = per_target ? target_tuple[k].cast<int>() : static_cast<int>(k);
      py::handle g = seq[k];
      if (g.is_none() || !ctx.needs_input_grad(i)) continue;
      ctx.set_input_grad(i, variable_from_python(g, false, (cls + ".backward").c_str()));
    }
  };
  std::vector<Variable> out;
  {
    out = detail::record_node(interned(cls), xs.data(), xs.size(), std::move(ys), std::move(rule), retained_outputs);
  }
  return out;
}

// --- scopes ----------------------------------------------------------------------------------

/// A C++ scope (NoBackpropMode, ...) entered and left from Python's `with`.
template <typename Scope, typename... Args>
struct PyScope {
  std::unique_ptr<Scope> scope;
  std::tuple<Args...> args;
  explicit PyScope(Args... a) : args(a...) {}
  void enter() {
    if (scope) throw py::value_error("this scope is already entered; use a new one");
    scope = std::apply([](auto... a) { return std::make_unique<Scope>(a...); }, args);
  }
  void exit() { scope.reset(); }
};

template <typename Scope, typename... Args>
void bind_scope(py::module_& m, const char* name, const char* doc) {
  using S = PyScope<Scope, Args...>;
  py::class_<S>(m, name, doc)
      .def(py::init<Args...>())
      .def("__enter__", [](S& s) {
        s.enter();
        return &s;
      }, py::return_value_policy::reference)
      .def("__exit__", [](S& s, py::handle, py::handle, py::handle) {
        s.exit();
        return false;
      });
}

}  // namespace

void init_autograd(py::module_& m) {
  using V = Variable;
  py::class_<Variable> var(m, "Variable", py::dynamic_attr(),
                           "An array that takes part in define-by-run differentiation (Chainer's "
                           "chainer.Variable).");
  var.def(py::init([](py::handle data, bool requires_grad, py::handle name) {
            Variable v = data.is_none() ? Variable() : variable_from_python(data, requires_grad, "Variable");
            if (py::isinstance<Variable>(data)) v = Variable(v.data(), requires_grad);
            if (!name.is_none() && v.defined()) v.set_name(name.cast<std::string>());
            return v;
          }),
          py::arg("data") = py::none(), py::kw_only(), py::arg("requires_grad") = true, py::arg("name") = py::none(),
          "Variable(array, requires_grad=True, name=None): the array is a NumPy array (no copy on the CPU), a "
          "kusari.ndarray, a CuPy or PyTorch tensor (DLPack, no copy) or a list.")
      .def_property(
          "array", [](const V& v) { return v.defined() ? array_to_python(v.data()) : py::none(); },
          [](V& v, py::handle a) { v.set_data(array_from_python(a, "Variable.array")); },
          "The data: a NumPy array over the variable's memory on the CPU, a kusari.ndarray on a GPU.")
      .def_property(
          "data", [](const V& v) { return v.defined() ? array_to_python(v.data()) : py::none(); },
          [](V& v, py::handle a) { v.set_data(array_from_python(a, "Variable.data")); }, "Chainer's other name of .array.")
      .def_property(
          "grad",
          [](const V& v) -> py::object {
            if (!v.defined()) return py::none();
            Array g = v.grad();
            return g.defined() ? array_to_python(g) : py::none();
          },
          [](V& v, py::handle g) {
            if (g.is_none()) {
              v.cleargrad();
            } else {
              v.set_grad(array_from_python(g, "Variable.grad"));
            }
          },
          "The gradient (None when none was computed).")
      .def_property(
          "grad_var",
          [](const V& v) -> py::object {
            Variable g = v.grad_var();
            return g.defined() ? py::cast(g) : py::none();
          },
          [](V& v, py::handle g) {
            if (g.is_none()) {
              v.cleargrad();
            } else {
              v.set_grad_var(variable_from_python(g, false, "Variable.grad_var"));
            }
          })
      .def_property_readonly("shape", [](const V& v) { return v.shape(); })
      .def_property_readonly("dtype", [](const V& v) { return v.dtype(); })
      .def_property_readonly("ndim", &V::ndim)
      .def_property_readonly("size", &V::size)
      .def_property_readonly("device", [](const V& v) { return v.device(); })
      .def_property_readonly("xp", [](const V& v) -> py::object {
        if (v.device().is_cpu()) return py::module_::import("numpy");
        return py::module_::import("kusari");
      })
      .def_property("name", [](const V& v) { return v.name(); }, [](V& v, const std::string& n) { v.set_name(n); })
      .def_property("requires_grad", &V::requires_grad, &V::set_requires_grad)
      .def_property_readonly("creator_name", [](const V& v) -> py::object {
        return v.creator() ? py::object(py::str(v.creator()->name())) : py::object(py::none());
      }, "The name of the function that made this variable (None for a leaf).")
      .def_property_readonly("creator", [](const V& v) -> py::object {
        return v.creator() ? py::cast(v.creator_ptr()) : py::none();
      }, "The node of the function that made this variable (None for a leaf).")
      .def_property_readonly("rank", [](const V& v) { return v.generation(); })
      .def("backward",
           [](const V& v, bool retain_grad, bool enable_double_backprop, py::handle loss_scale, bool retain_graph) {
             BackwardOptions o;
             o.retain_grad = retain_grad;
             o.enable_double_backprop = enable_double_backprop;
             if (!loss_scale.is_none()) o.loss_scale = loss_scale.cast<double>();
             o.retain_graph = retain_graph;
             py::gil_scoped_release release;
             v.backward(o);
           },
           py::arg("retain_grad") = false, py::arg("enable_double_backprop") = false, py::arg("loss_scale") = py::none(),
           py::arg("retain_graph") = true,
           "Computes the gradients of this variable with respect to the variables it depends on.")
      .def("cleargrad", &V::cleargrad)
      .def("zerograd", &V::zerograd)
      .def("unchain", &V::unchain)
      .def("unchain_backward", &V::unchain_backward)
      .def("detach", &V::detached, "A new leaf sharing this variable's data.")
      .def("to_device", [](V& v, py::handle d) {
        const Device dev = device_from_python(d, "Variable.to_device");
        Array g = v.grad();
        v.set_data(v.data().to_device(dev));
        if (g.defined()) v.set_grad(g.to_device(dev));
      }, py::arg("device"), "Moves the data (and gradient) to `device`, in place (Chainer's to_device).")
      .def("to_cpu", [](V& v) {
        Array g = v.grad();
        v.set_data(v.data().to_device(Device::cpu()));
        if (g.defined()) v.set_grad(g.to_device(Device::cpu()));
      })
      .def("to_gpu", [](V& v, py::handle d) {
        const Device dev = d.is_none() ? Device::cuda(0) : device_from_python(d, "Variable.to_gpu");
        Array g = v.grad();
        v.set_data(v.data().to_device(dev));
        if (g.defined()) v.set_grad(g.to_device(dev));
      }, py::arg("device") = py::none())
      .def("item", [](const V& v) -> py::object {
        if (is_floating(v.dtype())) return py::float_(v.data().item<double>());
        return py::int_(v.data().item<int64_t>());
      })
      .def("reshape", [](const V& v, py::args shape) { return F::reshape(v, shape_of_args(shape, "reshape")); })
      .def("transpose", [](const V& v, py::args axes) {
        return F::transpose(v, axes.size() == 0 ? Shape() : shape_of_args(axes, "transpose"));
      })
      .def_property_readonly("T", [](const V& v) { return F::transpose(v); })
      .def("__len__", [](const V& v) {
        if (v.ndim() == 0) throw py::type_error("len() of a 0-d Variable");
        return v.shape()[0];
      })
      .def("__getitem__", [](const V& v, py::handle key) { return F::get_item(v, indices_of(key, "Variable[...]")); })
      .def("__neg__", [](const V& a) { return -a; })
      .def("__abs__", [](const V& a) { return F::abs(a); })
      .def("__add__", [](const V& a, const VarArg& b) { return a + b.v; }, py::is_operator())
      .def("__add__", [](const V& a, Scalar b) { return a + b; }, py::is_operator())
      .def("__radd__", [](const V& a, Scalar b) { return b + a; }, py::is_operator())
      .def("__radd__", [](const V& a, const VarArg& b) { return b.v + a; }, py::is_operator())
      .def("__sub__", [](const V& a, const VarArg& b) { return a - b.v; }, py::is_operator())
      .def("__sub__", [](const V& a, Scalar b) { return a - b; }, py::is_operator())
      .def("__rsub__", [](const V& a, Scalar b) { return b - a; }, py::is_operator())
      .def("__rsub__", [](const V& a, const VarArg& b) { return b.v - a; }, py::is_operator())
      .def("__mul__", [](const V& a, const VarArg& b) { return a * b.v; }, py::is_operator())
      .def("__mul__", [](const V& a, Scalar b) { return a * b; }, py::is_operator())
      .def("__rmul__", [](const V& a, Scalar b) { return b * a; }, py::is_operator())
      .def("__rmul__", [](const V& a, const VarArg& b) { return b.v * a; }, py::is_operator())
      .def("__truediv__", [](const V& a, const VarArg& b) { return a / b.v; }, py::is_operator())
      .def("__truediv__", [](const V& a, Scalar b) { return a / b; }, py::is_operator())
      .def("__rtruediv__", [](const V& a, Scalar b) { return b / a; }, py::is_operator())
      .def("__rtruediv__", [](const V& a, const VarArg& b) { return b.v / a; }, py::is_operator())
      .def("__pow__", [](const V& a, const VarArg& b) { return F::pow(a, b.v); }, py::is_operator())
      .def("__pow__", [](const V& a, Scalar b) { return F::pow(a, b); }, py::is_operator())
      .def("__rpow__", [](const V& a, Scalar b) { return F::pow(b, a); }, py::is_operator())
      .def("__matmul__", [](const V& a, const VarArg& b) { return F::matmul(a, b.v); }, py::is_operator())
      .def("__repr__", [](const V& v) { return v.defined() ? v.to_string() : std::string("variable(None)"); })
      .def("__str__", [](const V& v) { return v.defined() ? v.to_string() : std::string("variable(None)"); })
      .def("__hash__", [](const V& v) { return reinterpret_cast<intptr_t>(v.impl_ptr().get()); })
      .def("__eq__", [](const V& a, py::handle b) -> py::object {
        if (py::isinstance<Variable>(b)) return py::bool_(a.is(b.cast<const V&>()));
        return py::reinterpret_borrow<py::object>(Py_NotImplemented);
      })
      .def("__bool__", [](const V& v) -> bool {
        if (!v.defined()) return false;
        if (v.size() != 1) {
          throw py::value_error("the truth value of a Variable with " + std::to_string(v.size()) +
                                " elements is ambiguous");
        }
        return v.data().item<double>() != 0;
      })
      .def("__dlpack__", [](const V& v, py::handle stream) {
        return py::cast(v.data()).attr("__dlpack__")(stream);
      }, py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const V& v) { return py::cast(v.data()).attr("__dlpack_device__")(); });
  var.attr("__array_priority__") = 200;  // NumPy defers `ndarray + Variable` to Variable.__radd__

  py::class_<FunctionNode, std::shared_ptr<FunctionNode>>(m, "FunctionNodeView",
                                                         "A node of the graph: a function applied to its inputs.")
      .def_property_readonly("name", [](const FunctionNode& n) { return std::string(n.name()); })
      .def_property_readonly("label", [](const FunctionNode& n) { return std::string(n.name()); })
      .def_property_readonly("inputs", [](const FunctionNode& n) {
        py::tuple t(static_cast<size_t>(n.num_inputs()));
        for (int i = 0; i < n.num_inputs(); ++i) t[static_cast<size_t>(i)] = py::cast(n.input(i));
        return t;
      })
      .def_property_readonly("rank", &FunctionNode::generation)
      .def("__hash__", [](const FunctionNode& n) { return reinterpret_cast<intptr_t>(&n); })
      .def("__eq__", [](const FunctionNode& a, const FunctionNode& b) { return &a == &b; });

  py::class_<Parameter, Variable>(m, "Parameter", py::dynamic_attr(),
                                  "A trainable variable owned by a link; it may be sized later (Chainer's "
                                  "chainer.Parameter).")
      .def(py::init([](py::handle initializer, py::handle shape) -> Parameter {
             // Parameter(array), Parameter(initializer, shape), Parameter(scalar, shape), Parameter().
             if (initializer.is_none()) {
               return shape.is_none() ? Parameter(py::module_::import("kusari._kusari").attr("links").attr("LeCunNormal")()
                                                      .cast<std::shared_ptr<Initializer>>())
                                      : Parameter(py::module_::import("kusari._kusari").attr("links").attr("LeCunNormal")()
                                                      .cast<std::shared_ptr<Initializer>>(), shape.cast<Shape>());
             }
             if (py::isinstance<Initializer>(initializer)) {
               auto init = initializer.cast<std::shared_ptr<Initializer>>();
               return shape.is_none() ? Parameter(init) : Parameter(init, shape.cast<Shape>());
             }
             if (PyFloat_Check(initializer.ptr()) || (PyLong_Check(initializer.ptr()) && !shape.is_none())) {
               auto init = py::module_::import("kusari._kusari").attr("links").attr("Constant")(initializer)
                               .cast<std::shared_ptr<Initializer>>();
               return shape.is_none() ? Parameter(init) : Parameter(init, shape.cast<Shape>());
             }
             return Parameter(array_from_python(initializer, "Parameter"));
           }),
           py::arg("initializer") = py::none(), py::arg("shape") = py::none())
      .def_property_readonly("is_initialized", &Parameter::is_initialized)
      .def("initialize", &Parameter::initialize, py::arg("shape"))
      .def_property_readonly("update_rule_enabled", [](const Parameter& p) { return p.impl().update_enabled; });

  m.def("grad",
        [](const std::vector<VarArg>& outputs_, const std::vector<VarArg>& inputs_, py::handle grad_outputs,
           bool enable_double_backprop) {
          std::vector<Variable> outputs, inputs, gos;
          for (const VarArg& a : outputs_) outputs.push_back(a.v);
          for (const VarArg& a : inputs_) inputs.push_back(a.v);
          if (!grad_outputs.is_none()) {
            for (py::handle h : grad_outputs) gos.push_back(h.is_none() ? Variable() : variable_from_python(h, false, "grad"));
          }
          std::vector<Variable> out;
          {
            py::gil_scoped_release release;
            out = grad(outputs, inputs, gos, enable_double_backprop);
          }
          py::list result;
          for (const Variable& v : out) result.append(v.defined() ? py::cast(v) : py::none());
          return result;
        },
        py::arg("outputs"), py::arg("inputs"), py::arg("grad_outputs") = py::none(),
        py::arg("enable_double_backprop") = false,
        "d outputs / d inputs, without touching any variable's .grad (Chainer's chainer.grad); None for an input "
        "the outputs do not depend on.");

  bind_scope<NoBackpropMode>(m, "_NoBackpropMode", "with kusari.no_backprop_mode(): no graph is recorded");
  bind_scope<ForceBackpropMode>(m, "_ForceBackpropMode", "with kusari.force_backprop_mode(): the graph is recorded");
  bind_scope<TrainMode, bool>(m, "_TrainMode", "with kusari.using_config('train', False): test mode");
  m.def("is_backprop_enabled", &is_backprop_enabled);
  m.def("is_train_mode", &is_train_mode);
  m.def("_apply_function", &apply_python_function);
}

}  // namespace kusari::python
