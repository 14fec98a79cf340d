// kusari.optimizers and kusari.optimizer_hooks: every optimizer of kusari/optimizers, their
// hyperparameters as attributes (optimizer.lr = 0.1), and hooks (the C++ ones and Python
// callables).
#include "common.h"
#include "kusari/optimizers/adagrad.h"
#include "kusari/optimizers/adam.h"
#include "kusari/optimizers/hooks.h"
#include "kusari/optimizers/lamb.h"
#include "kusari/optimizers/lars.h"
#include "kusari/optimizers/optimizer.h"
#include "kusari/optimizers/rmsprop.h"
#include "kusari/optimizers/rmsprop_warmup.h"
#include "kusari/optimizers/sgd.h"

namespace kusari::python {
namespace {

namespace O = kusari::optimizers;

/// A hook written in Python: a callable taking the optimizer (Chainer's hooks), with optional
/// `name` and `timing` ('pre' or 'post') attributes.
class PyHook : public OptimizerHook {
 public:
  PyHook(py::object fn, std::string name, Timing timing)
      : fn_(hold(std::move(fn))), name_(std::move(name)), timing_(timing) {}
  const char* name() const override { return name_.c_str(); }
  Timing timing() const override { return timing_; }
  void operator()(Optimizer& optimizer) override {
    py::gil_scoped_acquire gil;
    fn_->object(py::cast(&optimizer, py::return_value_policy::reference));
  }

 private:
  std::shared_ptr<GilObject> fn_;
  std::string name_;
  Timing timing_;
};

std::shared_ptr<OptimizerHook> hook_of(py::handle h, std::string& name) {
  if (py::isinstance<OptimizerHook>(h)) {
    auto hook = h.cast<std::shared_ptr<OptimizerHook>>();
    if (name.empty()) name = hook->name();
    return hook;
  }
  if (!PyCallable_Check(h.ptr())) {
    throw py::type_error("Optimizer.add_hook: expected a hook (kusari.optimizer_hooks.*) or a callable taking the "
                         "optimizer, got " + py::str(py::type::of(h)).cast<std::string>());
  }
  if (name.empty()) {
    if (py::hasattr(h, "name")) {
      name = py::str(h.attr("name")).cast<std::string>();
    } else if (py::hasattr(h, "__name__")) {
      name = py::str(h.attr("__name__")).cast<std::string>();
    } else {
      name = py::str(py::type::of(h).attr("__name__")).cast<std::string>();
    }
  }
  OptimizerHook::Timing timing = OptimizerHook::Timing::kPre;
  if (py::hasattr(h, "timing")) {
    const std::string t = py::str(h.attr("timing")).cast<std::string>();
    if (t == "post") {
      timing = OptimizerHook::Timing::kPost;
    } else if (t != "pre") {
      throw py::value_error("Optimizer.add_hook: a hook's timing must be 'pre' or 'post', got '" + t + "'");
    }
  }
  return std::make_shared<PyHook>(py::reinterpret_borrow<py::object>(h), name, timing);
}

/// The predicate of Chainer's "leave biases and batch norm out" flags.
O::ParamPredicate exclude_of(bool exclude_bias_and_norm) {
  if (!exclude_bias_and_norm) return nullptr;
  return [](const std::string& path, const Parameter& p) { return O::is_bias_or_norm(path, p); };
}

}  // namespace

void init_optimizers(py::module_& m) {
  py::class_<OptimizerHook, std::shared_ptr<OptimizerHook>>(m, "OptimizerHook")
      .def_property_readonly("name", [](const OptimizerHook& h) { return std::string(h.name()); })
      .def("__call__", [](OptimizerHook& h, Optimizer& o) { h(o); });

  py::class_<Optimizer, std::shared_ptr<Optimizer>> opt(m, "Optimizer", py::dynamic_attr(),
                                                        "Updates a link's parameters from their gradients.");
  opt.def("setup", [](py::object self, std::shared_ptr<Link> link) {
           self.cast<Optimizer&>().setup(std::move(link));
           return self;
         }, py::arg("link"), py::keep_alive<1, 2>(), "Makes `link` the target; returns the optimizer.")
      .def("update",
           [](Optimizer& o, py::handle lossfun, py::args args, py::kwargs kwargs) {
             if (lossfun.is_none()) {
               py::gil_scoped_release r;
               o.update();
               return;
             }
             py::object f = py::reinterpret_borrow<py::object>(lossfun);
             std::function<Variable()> loss = [&]() {
               py::gil_scoped_acquire gil;
               return variable_from_python(f(*args, **kwargs), false, "Optimizer.update lossfun");
             };
             py::gil_scoped_release r;
             o.update(loss);
           },
           py::arg("lossfun") = py::none(),
           "update(): a step from the gradients the parameters hold; update(lossfun, *args): clears the "
           "gradients, computes lossfun(*args), runs backward, then steps.")
      .def("add_hook", [](Optimizer& o, py::handle hook, py::handle name, py::handle timing) {
             std::string n = name.is_none() ? std::string() : name.cast<std::string>();
             if (!timing.is_none() && !py::isinstance<OptimizerHook>(hook)) py::setattr(hook, "timing", timing);
             auto h = hook_of(hook, n);
             o.add_hook(h, n);
           },
           py::arg("hook"), py::arg("name") = py::none(), py::arg("timing") = py::none())
      .def("remove_hook", &Optimizer::remove_hook, py::arg("name"))
      .def("new_epoch", [](Optimizer& o, bool) { o.new_epoch(); }, py::arg("auto") = false)
      .def_property_readonly("t", &Optimizer::t)
      .def_property_readonly("epoch", &Optimizer::epoch)
      .def_property_readonly("target", [](const Optimizer& o) { return o.target_ptr(); })
      .def("use_fp32_update", &Optimizer::use_fp32_update, py::arg("flag") = true)
      .def("loss_scaling", [](Optimizer& o, int64_t interval, py::handle scale) {
             std::optional<double> s;
             if (!scale.is_none()) s = scale.cast<double>();
             o.loss_scaling(interval, s);
           }, py::arg("interval") = 1000, py::arg("scale") = py::none())
      .def("set_hyperparam_where", [](Optimizer& o, const std::string& name, double value, py::function select) {
             // (called from update(), which runs without the GIL; released with it held)
             std::shared_ptr<py::function> f(new py::function(std::move(select)), [](py::function* p) {
               py::gil_scoped_acquire g;
               delete p;
             });
             o.set_hyperparam_where(name, value, [f](const std::string& path, const Parameter& param) {
               py::gil_scoped_acquire g;
               return py::bool_((*f)(path, param)).cast<bool>();
             });
           },
           py::arg("name"), py::arg("value"), py::arg("select"),
           "Gives the parameters that select(path, param) picks their own value of a hyperparameter, e.g. "
           "opt.set_hyperparam_where('weight_decay_rate', 0.0, kusari.optimizers.is_bias_or_norm).")
      .def_property_readonly("per_parameter_hyperparams", &Optimizer::per_parameter_hyperparams)
      .def_property_readonly("hyperparam_names", &Optimizer::hyperparam_names)
      .def("__getattr__", [](Optimizer& o, const std::string& name) -> py::object {
        if (o.has_hyperparam(name)) {
          if (name == "amsgrad" || name == "eps_inside_sqrt" || name == "bias_correction") {
            return py::bool_(o.hyperparam(name) != 0.0);
          }
          return py::float_(o.hyperparam(name));
        }
        throw py::attribute_error(std::string(o.type_name()) + " has no attribute or hyperparameter '" + name + "'");
      })
      .def("_has_hyperparam", &Optimizer::has_hyperparam)
      .def("_set_hyperparam", [](Optimizer& o, const std::string& name, double value) { o.hyperparam(name) = value; })
      .def("__repr__", [](const Optimizer& o) { return std::string(o.type_name()) + "()"; });

  m.def("is_bias_or_norm", &O::is_bias_or_norm, py::arg("path"), py::arg("param"),
        "A selector for set_hyperparam_where: biases and normalization parameters (at most one axis).");

  py::class_<O::SGD, Optimizer, std::shared_ptr<O::SGD>>(m, "SGD").def(py::init<double>(), py::arg("lr") = 0.01);
  py::class_<O::MomentumSGD, Optimizer, std::shared_ptr<O::MomentumSGD>>(m, "MomentumSGD")
      .def(py::init<double, double>(), py::arg("lr") = 0.01, py::arg("momentum") = 0.9);
  py::class_<O::NesterovAG, Optimizer, std::shared_ptr<O::NesterovAG>>(m, "NesterovAG")
      .def(py::init<double, double>(), py::arg("lr") = 0.01, py::arg("momentum") = 0.9);
  py::class_<O::Adam, Optimizer, std::shared_ptr<O::Adam>>(m, "Adam")
      .def(py::init<double, double, double, double, double, double, bool>(), py::arg("alpha") = 0.001,
           py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8, py::arg("eta") = 1.0,
           py::arg("weight_decay_rate") = 0.0, py::arg("amsgrad") = false)
      .def_property_readonly("lr", &O::Adam::lr)
      .def_property_readonly("alpha_t", &O::Adam::alpha_t);
  py::class_<O::AdamW, O::Adam, std::shared_ptr<O::AdamW>>(m, "AdamW")
      .def(py::init<double, double, double, double, double, double, bool>(), py::arg("alpha") = 0.001,
           py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-8, py::arg("eta") = 1.0,
           py::arg("weight_decay_rate") = 0.0, py::arg("amsgrad") = false);
  py::class_<O::RMSprop, Optimizer, std::shared_ptr<O::RMSprop>>(m, "RMSprop")
      .def(py::init<double, double, double, bool>(), py::arg("lr") = 0.01, py::arg("alpha") = 0.99,
           py::arg("eps") = 1e-8, py::arg("eps_inside_sqrt") = false);
  py::class_<O::AdaGrad, Optimizer, std::shared_ptr<O::AdaGrad>>(m, "AdaGrad")
      .def(py::init<double, double>(), py::arg("lr") = 0.001, py::arg("eps") = 1e-8);
  py::class_<O::RMSpropWarmup, Optimizer, std::shared_ptr<O::RMSpropWarmup>>(m, "RMSpropWarmup")
      .def(py::init<double, double, double, double, double, double>(), py::arg("lr") = 0.1,
           py::arg("lr_rmsprop") = 0.001, py::arg("momentum") = 0.9, py::arg("alpha") = 0.99, py::arg("eps") = 1e-8,
           py::arg("sgd_weight") = 0.0);
  py::class_<O::LARS, Optimizer, std::shared_ptr<O::LARS>>(m, "LARS")
      .def(py::init([](double lr, double momentum, double weight_decay_rate, double eta, double eps,
                       bool exclude_bias_and_norm) {
             O::LARSOptions o;
             o.lr = lr;
             o.momentum = momentum;
             o.weight_decay_rate = weight_decay_rate;
             o.eta = eta;
             o.eps = eps;
             auto opt = std::make_shared<O::LARS>(o);
             opt->exclude = exclude_of(exclude_bias_and_norm);
             return opt;
           }),
           py::arg("lr") = 0.1, py::arg("momentum") = 0.9, py::arg("weight_decay_rate") = 0.0,
           py::arg("eta") = 0.001, py::arg("eps") = 1e-9, py::arg("exclude_bias_and_norm") = false);
  py::class_<O::LAMB, Optimizer, std::shared_ptr<O::LAMB>>(m, "LAMB")
      .def(py::init([](double lr, double beta1, double beta2, double eps, double weight_decay_rate, bool bias_correction) {
             O::LAMBOptions o;
             o.lr = lr;
             o.beta1 = beta1;
             o.beta2 = beta2;
             o.eps = eps;
             o.weight_decay_rate = weight_decay_rate;
             o.bias_correction = bias_correction;
             return std::make_shared<O::LAMB>(o);
           }),
           py::arg("lr") = 0.001, py::arg("beta1") = 0.9, py::arg("beta2") = 0.999, py::arg("eps") = 1e-6,
           py::arg("weight_decay_rate") = 0.01, py::arg("bias_correction") = true);

  py::module_ hooks = m.def_submodule("hooks", "Optimizer hooks (Chainer's chainer.optimizer_hooks)");
  py::class_<O::WeightDecay, OptimizerHook, std::shared_ptr<O::WeightDecay>>(hooks, "WeightDecay")
      .def(py::init([](double rate, bool exclude_bias_and_norm) {
             return std::make_shared<O::WeightDecay>(rate, exclude_of(exclude_bias_and_norm));
           }),
           py::arg("rate"), py::arg("exclude_bias_and_norm") = false)
      .def_readwrite("rate", &O::WeightDecay::rate);
  py::class_<O::Lasso, OptimizerHook, std::shared_ptr<O::Lasso>>(hooks, "Lasso")
      .def(py::init<double>(), py::arg("rate"))
      .def_readwrite("rate", &O::Lasso::rate);
  py::class_<O::GradientClipping, OptimizerHook, std::shared_ptr<O::GradientClipping>>(hooks, "GradientClipping")
      .def(py::init<double>(), py::arg("threshold"))
      .def_readwrite("threshold", &O::GradientClipping::threshold);
  py::class_<O::GradientHardClipping, OptimizerHook, std::shared_ptr<O::GradientHardClipping>>(hooks,
                                                                                                 "GradientHardClipping")
      .def(py::init<double, double>(), py::arg("lower_bound"), py::arg("upper_bound"))
      .def_readwrite("lower_bound", &O::GradientHardClipping::lower_bound)
      .def_readwrite("upper_bound", &O::GradientHardClipping::upper_bound);
  hooks.def("gradient_norm", [](Optimizer& o) { return O::gradient_norm(o); },
            "The L2 norm of all the target's gradients together.");
}

}  // namespace kusari::python
