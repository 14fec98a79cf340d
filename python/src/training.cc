// kusari.training: the Trainer, updaters (StandardUpdater subclassable in Python, with several
// iterators and optimizers as Chainer's), triggers, the extensions of kusari/training, extensions
// and triggers written in Python, and the reporter.
//
// Note [Extensions written in Python]
// trainer.extend takes the C++ extensions, and any Python callable taking the trainer (a function,
// a make_extension-decorated function, an object with __call__, or a subclass of
// kusari.training.Extension): PyExtension calls it under the GIL, and reads Chainer's attributes
// (trigger, priority, name / default_name, initialize, finalize, on_error, serialize) when the
// object has them. Triggers may be Python callables returning a bool too. The trainer's run()
// releases the GIL; the C++ loop takes it only to call Python code.
#include <sstream>

#include "common.h"
#include "kusari/training/early_stopping.h"
#include "kusari/training/extensions.h"
#include "kusari/training/trainer.h"
#include "kusari/training/trigger.h"
#include "kusari/training/updater.h"

namespace kusari::python {
namespace {

namespace T = kusari::training;
namespace E = kusari::training::extensions;

/// A trigger from Chainer's forms: None, (period, unit), a Trigger, or a callable(trainer) -> bool.
std::shared_ptr<T::Trigger> trigger_of(py::handle h, const char* where);

class PyTrigger : public T::Trigger {
 public:
  explicit PyTrigger(py::object fn) : fn_(hold(std::move(fn))) {}
  bool operator()(T::Trainer& trainer) override {
    py::gil_scoped_acquire gil;
    return fn_->object(py::cast(&trainer, py::return_value_policy::reference)).cast<bool>();
  }
  void serialize(Serializer& s) override {
    py::gil_scoped_acquire gil;
    if (py::hasattr(fn_->object, "serialize")) fn_->object.attr("serialize")(py::cast(&s, py::return_value_policy::reference));
  }

 private:
  std::shared_ptr<GilObject> fn_;
};

std::shared_ptr<T::Trigger> trigger_of(py::handle h, const char* where) {
  if (h.is_none()) return nullptr;
  if (py::isinstance<T::Trigger>(h)) return h.cast<std::shared_ptr<T::Trigger>>();
  if (py::isinstance<py::tuple>(h) || py::isinstance<py::list>(h)) {
    py::sequence s = py::reinterpret_borrow<py::sequence>(h);
    if (s.size() != 2) {
      throw py::value_error(std::string(where) + ": a trigger is (period, 'epoch' | 'iteration'), got " +
                            py::str(h).cast<std::string>());
    }
    return T::interval(s[0].cast<double>(), s[1].cast<std::string>());
  }
  if (PyCallable_Check(h.ptr())) return std::make_shared<PyTrigger>(py::reinterpret_borrow<py::object>(h));
  throw py::type_error(std::string(where) + ": expected a trigger ((period, unit), a kusari trigger or a callable "
                       "taking the trainer), got " + py::str(py::type::of(h)).cast<std::string>());
}

/// An extension written in Python (Note [Extensions written in Python]).
class PyExtension : public T::Extension {
 public:
  explicit PyExtension(py::object fn) : fn_(hold(std::move(fn))) {
    py::object f = fn_->object;
    if (py::hasattr(f, "default_name")) {
      py::object d = f.attr("default_name");
      default_name_ = py::str(PyCallable_Check(d.ptr()) && !py::isinstance<py::str>(d) ? d() : d).cast<std::string>();
    } else if (py::hasattr(f, "__name__")) {
      default_name_ = py::str(f.attr("__name__")).cast<std::string>();
    } else {
      default_name_ = py::str(py::type::of(f).attr("__name__")).cast<std::string>();
    }
    if (py::hasattr(f, "trigger") && !f.attr("trigger").is_none()) trigger_ = trigger_of(f.attr("trigger"), "extension.trigger");
    if (py::hasattr(f, "priority")) priority_ = f.attr("priority").cast<int>();
  }
  void operator()(T::Trainer& trainer) override {
    py::gil_scoped_acquire gil;
    fn_->object(py::cast(&trainer, py::return_value_policy::reference));
  }
  std::string default_name() const override { return default_name_; }
  std::shared_ptr<T::Trigger> default_trigger() const override {
    return trigger_ ? trigger_ : T::interval(1, "iteration");
  }
  int priority() const override { return priority_; }
  void initialize(T::Trainer& trainer) override { call_if("initialize", &trainer); }
  void finalize() override {
    py::gil_scoped_acquire gil;
    if (py::hasattr(fn_->object, "finalize")) fn_->object.attr("finalize")();
  }
  void on_error(T::Trainer& trainer, const std::exception& e) override {
    py::gil_scoped_acquire gil;
    if (py::hasattr(fn_->object, "on_error")) {
      fn_->object.attr("on_error")(py::cast(&trainer, py::return_value_policy::reference), py::str(e.what()), py::none());
    }
  }
  void serialize(Serializer& s) override {
    py::gil_scoped_acquire gil;
    if (py::hasattr(fn_->object, "serialize")) fn_->object.attr("serialize")(py::cast(&s, py::return_value_policy::reference));
  }
  py::object object() const { return fn_->object; }

 private:
  void call_if(const char* name, T::Trainer* trainer) {
    py::gil_scoped_acquire gil;
    if (py::hasattr(fn_->object, name)) fn_->object.attr(name)(py::cast(trainer, py::return_value_policy::reference));
  }
  std::shared_ptr<GilObject> fn_;
  std::string default_name_;
  std::shared_ptr<T::Trigger> trigger_;
  int priority_ = T::kPriorityReader;
};

/// A converter from Python: None (concat_examples in C++), or a callable(batch, device) returning
/// an array or a tuple of arrays.
T::Converter converter_of(py::handle h) {
  if (h.is_none()) return nullptr;
  // kusari's own concat_examples (also Chainer's, through the compatibility modules): the C++ one.
  if (h.is(py::module_::import("kusari._kusari").attr("data").attr("concat_examples"))) return nullptr;
  auto f = hold(py::reinterpret_borrow<py::object>(h));
  return [f](const std::vector<Example>& batch, Device device) {
    py::gil_scoped_acquire gil;
    py::list b;
    for (const Example& e : batch) {
      py::tuple t(e.size());
      for (size_t i = 0; i < e.size(); ++i) t[i] = array_to_python(e[i]);
      b.append(t);
    }
    py::object out = f->object(b, py::cast(device));
    std::vector<Array> arrays;
    if (py::isinstance<py::tuple>(out) || py::isinstance<py::list>(out)) {
      for (py::handle h : out) arrays.push_back(array_from_python(h, "converter"));
    } else if (py::isinstance<py::dict>(out)) {
      throw py::type_error("converter: a dict batch is not supported; return a tuple of arrays");
    } else {
      arrays.push_back(array_from_python(out, "converter"));
    }
    return arrays;
  };
}

T::LossFunction loss_func_of(py::handle h) {
  if (h.is_none()) return nullptr;
  auto f = hold(py::reinterpret_borrow<py::object>(h));
  return [f](const std::vector<Variable>& batch) {
    py::gil_scoped_acquire gil;
    py::tuple args(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) args[i] = py::cast(batch[i]);
    return variable_from_python(f->object(*args), false, "loss_func");
  };
}

std::shared_ptr<Iterator> iterator_of(py::handle h) { return h.cast<std::shared_ptr<Iterator>>(); }

/// StandardUpdater, as Chainer's: one or several iterators and optimizers (dicts), an
/// update_core that a Python subclass may override.
class PyStandardUpdater : public T::StandardUpdater {
 public:
  PyStandardUpdater(std::map<std::string, std::shared_ptr<Iterator>> iterators,
                    std::map<std::string, std::shared_ptr<Optimizer>> optimizers, Device device,
                    T::Converter converter, T::LossFunction loss_func)
      : T::StandardUpdater(main_of(iterators, "iterator"), main_of(optimizers, "optimizer"), device, converter,
                           loss_func),
        iterators_(std::move(iterators)),
        optimizers_(std::move(optimizers)) {}

  void update_core() override {
    py::gil_scoped_acquire gil;
    py::function f = py::get_override(static_cast<const T::StandardUpdater*>(this), "update_core");
    if (f) {
      f();
      return;
    }
    py::gil_scoped_release release;
    T::StandardUpdater::update_core();
  }
  Optimizer& optimizer(const std::string& name) override {
    auto it = optimizers_.find(name);
    if (it == optimizers_.end()) throw_missing("optimizer", name, optimizers_);
    return *it->second;
  }
  Iterator& iterator(const std::string& name) override {
    auto it = iterators_.find(name);
    if (it == iterators_.end()) throw_missing("iterator", name, iterators_);
    return *it->second;
  }
  void serialize(Serializer& s) override {
    // Chainer's keys, as StandardUpdater::serialize: iterator:<name>, optimizer:<name>,
    // model:<name> (each optimizer's target), and the iteration.
    for (auto& [name, it] : iterators_) it->serialize(*s.child("iterator:" + name));
    for (auto& [name, o] : optimizers_) {
      o->serialize(*s.child("optimizer:" + name));
      if (o->target()) o->target()->serialize(*s.child("model:" + name));
    }
    s.count("iteration", iteration_);
  }
  void finalize() override {
    for (auto& [name, it] : iterators_) it->finalize();
  }
  const std::map<std::string, std::shared_ptr<Optimizer>>& optimizers() const { return optimizers_; }
  std::vector<std::pair<std::string, Optimizer*>> all_optimizers() override {
    std::vector<std::pair<std::string, Optimizer*>> out;
    for (auto& [name, o] : optimizers_) out.emplace_back(name, o.get());
    return out;
  }
  const std::map<std::string, std::shared_ptr<Iterator>>& iterators() const { return iterators_; }
  T::Converter converter() const { return converter_; }

 private:
  template <typename M>
  static typename M::mapped_type main_of(const M& m, const char* what) {
    if (m.empty()) throw py::value_error(std::string("StandardUpdater: no ") + what + " given");
    auto it = m.find("main");
    return it != m.end() ? it->second : m.begin()->second;
  }
  template <typename M>
  [[noreturn]] static void throw_missing(const char* what, const std::string& name, const M& m) {
    std::string names;
    for (auto& [n, v] : m) names += (names.empty() ? "'" : ", '") + n + "'";
    throw py::key_error(std::string("StandardUpdater: no ") + what + " '" + name + "' (it has " + names + ")");
  }
  std::map<std::string, std::shared_ptr<Iterator>> iterators_;
  std::map<std::string, std::shared_ptr<Optimizer>> optimizers_;
};

/// Lets Ctrl-C stop a training loop that runs no Python code: every iteration it takes the GIL and
/// runs Python's signal handlers, and a KeyboardInterrupt (or any exception they raise) ends the
/// loop as an exception of an extension would (finalize, then the exception in Python).
class InterruptCheck : public T::Extension {
 public:
  void operator()(T::Trainer&) override {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  std::string default_name() const override { return "_kusari_interrupt_check"; }
  std::shared_ptr<T::Trigger> default_trigger() const override { return T::interval(1, "iteration"); }
  int priority() const override { return T::kPriorityWriter + 1000; }
};

template <typename V>
std::map<std::string, V> named_map(py::handle h) {
  std::map<std::string, V> out;
  if (py::isinstance<py::dict>(h)) {
    for (auto item : py::reinterpret_borrow<py::dict>(h)) out[item.first.cast<std::string>()] = item.second.cast<V>();
  } else {
    out["main"] = h.cast<V>();
  }
  return out;
}

py::dict observation_to_python(const Observation& o) {
  py::dict d;
  for (const auto& [key, value] : o) d[py::str(key)] = array_to_python(value);
  return d;
}

}  // namespace

std::shared_ptr<T::Trigger> trigger_from_python(py::handle h, const char* where) { return trigger_of(h, where); }

void init_training(py::module_& m) {
  // --- triggers
  py::module_ triggers = m.def_submodule("triggers", "Triggers (Chainer's chainer.training.triggers)");
  py::class_<T::Trigger, std::shared_ptr<T::Trigger>>(m, "Trigger")
      .def("__call__", [](T::Trigger& t, T::Trainer& trainer) { return t(trainer); });
  py::class_<T::IntervalTrigger, T::Trigger, std::shared_ptr<T::IntervalTrigger>>(triggers, "IntervalTrigger")
      .def(py::init<double, const std::string&>(), py::arg("period"), py::arg("unit"))
      .def_property_readonly("period", &T::IntervalTrigger::period)
      .def_property_readonly("unit", &T::IntervalTrigger::unit);
  py::class_<T::ManualScheduleTrigger, T::Trigger, std::shared_ptr<T::ManualScheduleTrigger>>(triggers,
                                                                                              "ManualScheduleTrigger")
      .def(py::init([](py::handle points, const std::string& unit) {
             std::vector<double> p;
             if (PyFloat_Check(points.ptr()) || PyLong_Check(points.ptr())) {
               p.push_back(points.cast<double>());
             } else {
               p = points.cast<std::vector<double>>();
             }
             return std::make_shared<T::ManualScheduleTrigger>(p, unit);
           }),
           py::arg("points"), py::arg("unit"));
  py::class_<T::EarlyStoppingTrigger, T::Trigger, std::shared_ptr<T::EarlyStoppingTrigger>>(triggers,
                                                                                            "EarlyStoppingTrigger")
      .def(py::init([](py::handle check_trigger, const std::string& monitor, int patience, const std::string& mode,
                       bool verbose, py::handle max_trigger) {
             return std::make_shared<T::EarlyStoppingTrigger>(trigger_of(check_trigger, "EarlyStoppingTrigger"), monitor,
                                                              patience, mode, verbose,
                                                              trigger_of(max_trigger, "EarlyStoppingTrigger"));
           }),
           py::arg("check_trigger") = py::make_tuple(1, "epoch"), py::arg("monitor") = "main/loss",
           py::arg("patience") = 3, py::arg("mode") = "auto", py::arg("verbose") = false,
           py::arg("max_trigger") = py::make_tuple(100, "epoch"));

  // --- updaters
  py::class_<T::Updater, std::shared_ptr<T::Updater>>(m, "Updater")
      .def("update", [](T::Updater& u) {
        py::gil_scoped_release r;
        u.update();
      })
      .def_property_readonly("iteration", &T::Updater::iteration)
      .def_property_readonly("epoch", &T::Updater::epoch)
      .def_property_readonly("epoch_detail", &T::Updater::epoch_detail)
      .def_property_readonly("previous_epoch_detail", &T::Updater::previous_epoch_detail)
      .def_property_readonly("is_new_epoch", &T::Updater::is_new_epoch)
      .def("get_optimizer", [](T::Updater& u, const std::string& name) {
        return py::cast(&u.optimizer(name), py::return_value_policy::reference);
      }, py::arg("name"))
      .def("get_iterator", [](T::Updater& u, const std::string& name) {
        return py::cast(&u.iterator(name), py::return_value_policy::reference);
      }, py::arg("name"));
  py::class_<T::StandardUpdater, T::Updater, PyStandardUpdater, std::shared_ptr<T::StandardUpdater>>(
      m, "StandardUpdater", py::dynamic_attr())
      .def(py::init([](py::handle iterator, py::handle optimizer, py::handle converter, py::handle device,
                       py::handle loss_func) {
             return std::make_shared<PyStandardUpdater>(named_map<std::shared_ptr<Iterator>>(iterator),
                                                        named_map<std::shared_ptr<Optimizer>>(optimizer),
                                                        device_from_python(device, "StandardUpdater"),
                                                        converter_of(converter), loss_func_of(loss_func));
           }),
           py::arg("iterator"), py::arg("optimizer"), py::arg("converter") = py::none(), py::arg("device") = py::none(),
           py::arg("loss_func") = py::none(), py::keep_alive<1, 2>(), py::keep_alive<1, 3>(),
           "StandardUpdater(iterator, optimizer, converter=None, device=None, loss_func=None): iterator and "
           "optimizer may be dicts of names to them (Chainer's; 'main' is the default name).")
      .def("update_core", [](T::StandardUpdater& u) {
        py::gil_scoped_release r;
        u.T::StandardUpdater::update_core();
      })
      .def_property_readonly("device", &T::StandardUpdater::device)
      .def("get_all_optimizers", [](T::StandardUpdater& u) {
        py::dict d;
        if (auto* p = dynamic_cast<PyStandardUpdater*>(&u)) {
          for (auto& [name, o] : p->optimizers()) d[py::str(name)] = o;
        } else {
          d["main"] = u.optimizer_ptr();
        }
        return d;
      })
      .def("converter", [](T::StandardUpdater& u, py::handle batch, py::handle device) -> py::object {
        py::object concat = py::module_::import("kusari._kusari").attr("data").attr("concat_examples");
        return concat(batch, device);
      }, py::arg("batch"), py::arg("device") = py::none())
      .def("set_use_cuda_graph", &T::StandardUpdater::set_use_cuda_graph, py::arg("use"))
      .def_property_readonly("graph_replays", &T::StandardUpdater::graph_replays);

  // --- the trainer
  py::class_<T::Trainer, std::shared_ptr<T::Trainer>>(m, "Trainer", py::dynamic_attr())
      .def(py::init([](std::shared_ptr<T::Updater> updater, py::handle stop_trigger, const std::string& out) {
             return std::make_shared<T::Trainer>(std::move(updater), trigger_of(stop_trigger, "Trainer"), out);
           }),
           py::arg("updater"), py::arg("stop_trigger") = py::none(), py::arg("out") = "result", py::keep_alive<1, 2>())
      .def("extend",
           [](T::Trainer& t, py::handle extension, py::handle name, py::handle trigger, py::handle priority) {
             std::shared_ptr<T::Extension> ext;
             if (py::isinstance<T::Extension>(extension)) {
               ext = extension.cast<std::shared_ptr<T::Extension>>();
             } else if (PyCallable_Check(extension.ptr())) {
               ext = std::make_shared<PyExtension>(py::reinterpret_borrow<py::object>(extension));
             } else {
               throw py::type_error("Trainer.extend: expected an extension (kusari's, or a callable taking the trainer), "
                                    "got " + py::str(py::type::of(extension)).cast<std::string>());
             }
             std::optional<int> p;
             if (!priority.is_none()) p = priority.cast<int>();
             t.extend(ext, name.is_none() ? std::string() : name.cast<std::string>(), trigger_of(trigger, "extend"), p);
           },
           py::arg("extension"), py::arg("name") = py::none(), py::arg("trigger") = py::none(),
           py::arg("priority") = py::none(), py::keep_alive<1, 2>())
      .def("run", [](py::object self) {
        T::Trainer& t = self.cast<T::Trainer&>();
        if (!py::hasattr(self, "_kusari_interrupt_check")) {
          t.extend(std::make_shared<InterruptCheck>(), "_kusari_interrupt_check");
          self.attr("_kusari_interrupt_check") = true;
        }
        py::module_::import("sys").attr("stdout").attr("flush")();
        py::gil_scoped_release r;
        t.run();
      }, "Runs the training loop until the stop trigger fires (the GIL is released while C++ runs; Ctrl-C "
         "stops it with KeyboardInterrupt).")
      .def_property_readonly("updater", [](T::Trainer& t) { return py::cast(&t.updater(), py::return_value_policy::reference); })
      .def_property_readonly("out", &T::Trainer::out)
      .def_property_readonly("elapsed_time", &T::Trainer::elapsed_time)
      .def_property_readonly("observation", [](T::Trainer& t) { return observation_to_python(t.observation()); })
      .def("get_extension", [](T::Trainer& t, const std::string& name) -> py::object {
        T::Extension& e = t.get_extension(name);
        if (auto* p = dynamic_cast<PyExtension*>(&e)) return p->object();
        return py::cast(&e, py::return_value_policy::reference);
      }, py::arg("name"));

  // --- extensions
  py::module_ ext = m.def_submodule("extensions", "Trainer extensions (Chainer's chainer.training.extensions)");
  py::class_<T::Extension, std::shared_ptr<T::Extension>>(m, "Extension")
      .def("__call__", [](T::Extension& e, T::Trainer& t) { e(t); })
      .def_property_readonly("default_name", &T::Extension::default_name)
      .def_property_readonly("priority", &T::Extension::priority)
      .def_property_readonly("name", [](const T::Extension& e) { return e.name(); });
  m.attr("PRIORITY_WRITER") = T::kPriorityWriter;
  m.attr("PRIORITY_EDITOR") = T::kPriorityEditor;
  m.attr("PRIORITY_READER") = T::kPriorityReader;

  py::class_<E::LogReport, T::Extension, std::shared_ptr<E::LogReport>>(ext, "LogReport")
      .def(py::init([](py::handle keys, py::handle trigger, py::handle postprocess, const std::string& log_name,
                       py::handle filename) {
             std::optional<std::vector<std::string>> k;
             if (!keys.is_none()) k = keys.cast<std::vector<std::string>>();
             const std::string name = filename.is_none() ? log_name : filename.cast<std::string>();
             auto r = std::make_shared<E::LogReport>(k, trigger_of(trigger, "LogReport"), name);
             if (!postprocess.is_none()) {
               auto f = hold(py::reinterpret_borrow<py::object>(postprocess));
               r->set_postprocess([f](E::LogReport::Entry& entry) {
                 py::gil_scoped_acquire gil;
                 py::dict d = py::cast(entry);
                 f->object(d);
                 entry = d.cast<E::LogReport::Entry>();
               });
             }
             return r;
           }),
           py::arg("keys") = py::none(), py::arg("trigger") = py::make_tuple(1, "epoch"),
           py::arg("postprocess") = py::none(), py::arg("log_name") = "log", py::arg("filename") = py::none())
      .def_property_readonly("log", [](const E::LogReport& r) { return py::cast(r.log()); });
  py::class_<E::PrintReport, T::Extension, std::shared_ptr<E::PrintReport>>(ext, "PrintReport")
      .def(py::init([](std::vector<std::string> entries, py::handle log_report, py::handle out) {
             if (!log_report.is_none() && py::isinstance<E::LogReport>(log_report)) {
               return std::make_shared<E::PrintReport>(entries, log_report.cast<std::shared_ptr<E::LogReport>>());
             }
             const std::string name = log_report.is_none() ? "LogReport" : log_report.cast<std::string>();
             return std::make_shared<E::PrintReport>(entries, name);
           }),
           py::arg("entries"), py::arg("log_report") = "LogReport", py::arg("out") = py::none(),
           "Prints the LogReport's entries as a table on the standard output.");
  py::class_<E::ProgressBar, T::Extension, std::shared_ptr<E::ProgressBar>>(ext, "ProgressBar")
      .def(py::init([](py::handle training_length, int64_t update_interval, int bar_length, py::handle out) {
             std::optional<std::pair<double, std::string>> len;
             if (!training_length.is_none()) len = training_length.cast<std::pair<double, std::string>>();
             return std::make_shared<E::ProgressBar>(len, update_interval, bar_length);
           }),
           py::arg("training_length") = py::none(), py::arg("update_interval") = 100, py::arg("bar_length") = 50,
           py::arg("out") = py::none());
  py::class_<E::Evaluator, T::Extension, std::shared_ptr<E::Evaluator>>(ext, "Evaluator")
      .def(py::init([](py::handle iterator, std::shared_ptr<Link> target, py::handle converter, py::handle device,
                       py::handle eval_hook, py::handle eval_func) {
             if (!eval_hook.is_none()) throw py::value_error("Evaluator: eval_hook is not supported");
             std::shared_ptr<Iterator> it;
             if (py::isinstance<py::dict>(iterator)) {
               it = py::reinterpret_borrow<py::dict>(iterator)["main"].cast<std::shared_ptr<Iterator>>();
             } else {
               it = iterator.cast<std::shared_ptr<Iterator>>();
             }
             E::Evaluator::EvalFunction fn;
             if (!eval_func.is_none()) {
               auto f = hold(py::reinterpret_borrow<py::object>(eval_func));
               fn = [f](const std::vector<Variable>& batch) {
                 py::gil_scoped_acquire gil;
                 py::tuple args(batch.size());
                 for (size_t i = 0; i < batch.size(); ++i) args[i] = py::cast(batch[i]);
                 f->object(*args);
               };
             }
             return std::make_shared<E::Evaluator>(it, std::move(target), converter_of(converter),
                                                   device_from_python(device, "Evaluator"), fn);
           }),
           py::arg("iterator"), py::arg("target"), py::arg("converter") = py::none(), py::arg("device") = py::none(),
           py::arg("eval_hook") = py::none(), py::arg("eval_func") = py::none(), py::keep_alive<1, 2>(),
           py::keep_alive<1, 3>())
      .def("evaluate", [](E::Evaluator& e) {
        std::map<std::string, double> r;
        {
          py::gil_scoped_release g;
          r = e.evaluate();
        }
        return r;
      });
  auto snapshot_options = [](const std::string& filename, int n_retains, bool autoload, bool snapshot_on_error) {
    E::SnapshotOptions o;
    o.filename = filename;
    o.n_retains = n_retains;
    o.autoload = autoload;
    o.snapshot_on_error = snapshot_on_error;
    return o;
  };
  py::class_<E::Snapshot, T::Extension, std::shared_ptr<E::Snapshot>>(ext, "Snapshot");
  ext.def("snapshot", [snapshot_options](py::handle savefun, const std::string& filename, int n_retains, bool autoload,
                                         bool snapshot_on_error) {
            if (!savefun.is_none()) throw py::value_error("snapshot: only savefun=None (npz) is supported");
            return E::snapshot(snapshot_options(filename, n_retains, autoload, snapshot_on_error));
          },
          py::arg("savefun") = py::none(), py::arg("filename") = "snapshot_iter_{.updater.iteration}",
          py::arg("n_retains") = -1, py::arg("autoload") = false, py::arg("snapshot_on_error") = false);
  ext.def("snapshot_object", [snapshot_options](py::object target, const std::string& filename, py::handle savefun,
                                                int n_retains, bool autoload) {
            if (!savefun.is_none()) throw py::value_error("snapshot_object: only savefun=None (npz) is supported");
            auto s = E::snapshot_object(target.cast<Serializable&>(), filename,
                                        snapshot_options(filename, n_retains, autoload, false));
            py::object o = py::cast(s);
            o.attr("_kusari_target") = target;  // (the target lives as long as the extension)
            return o;
          },
          py::arg("target"), py::arg("filename"), py::arg("savefun") = py::none(), py::arg("n_retains") = -1,
          py::arg("autoload") = false);
  py::class_<E::PlotReport, T::Extension, std::shared_ptr<E::PlotReport>>(ext, "PlotReport", py::dynamic_attr())
      .def(py::init([](py::handle y_keys, const std::string& x_key, py::handle trigger, py::handle postprocess,
                       const std::string& file_name, py::handle marker, bool grid, py::handle filename) {
             std::vector<std::string> keys;
             if (py::isinstance<py::str>(y_keys)) {
               keys.push_back(y_keys.cast<std::string>());
             } else {
               keys = y_keys.cast<std::vector<std::string>>();
             }
             E::PlotStyle style;
             style.grid = grid;
             if (marker.is_none()) {
               style.marker = 0;
             } else {
               const std::string mk = marker.cast<std::string>();
               style.marker = mk.empty() ? 0 : mk[0];
             }
             const std::string name = filename.is_none() ? file_name : filename.cast<std::string>();
             return std::make_shared<E::PlotReport>(keys, x_key, trigger_of(trigger, "PlotReport"), name, style);
           }),
           py::arg("y_keys"), py::arg("x_key") = "epoch", py::arg("trigger") = py::make_tuple(1, "epoch"),
           py::arg("postprocess") = py::none(), py::arg("file_name") = "plot.png", py::arg("marker") = "x",
           py::arg("grid") = true, py::arg("filename") = py::none());
  py::class_<E::ExponentialShift, T::Extension, std::shared_ptr<E::ExponentialShift>>(ext, "ExponentialShift")
      .def(py::init([](const std::string& attr, double rate, py::handle init, py::handle target, py::handle optimizer) {
             std::optional<double> i, t;
             if (!init.is_none()) i = init.cast<double>();
             if (!target.is_none()) t = target.cast<double>();
             if (!optimizer.is_none() && !py::isinstance<py::str>(optimizer)) {
               throw py::value_error("ExponentialShift: give the optimizer by its updater name ('main'), not the object");
             }
             return std::make_shared<E::ExponentialShift>(attr, rate, i, t,
                                                          optimizer.is_none() ? "main" : optimizer.cast<std::string>());
           }),
           py::arg("attr"), py::arg("rate"), py::arg("init") = py::none(), py::arg("target") = py::none(),
           py::arg("optimizer") = py::none());
  py::class_<E::LinearShift, T::Extension, std::shared_ptr<E::LinearShift>>(ext, "LinearShift")
      .def(py::init([](const std::string& attr, std::pair<double, double> value_range,
                       std::pair<int64_t, int64_t> time_range, py::handle optimizer) {
             return std::make_shared<E::LinearShift>(attr, value_range, time_range,
                                                     optimizer.is_none() ? "main" : optimizer.cast<std::string>());
           }),
           py::arg("attr"), py::arg("value_range"), py::arg("time_range"), py::arg("optimizer") = py::none());
  py::class_<E::FailOnNonNumber, T::Extension, std::shared_ptr<E::FailOnNonNumber>>(ext, "FailOnNonNumber")
      .def(py::init<bool, std::string>(), py::arg("check_grad") = true, py::arg("optimizer") = "main");
  ext.def("observe_lr", &E::observe_lr, py::arg("optimizer_name") = "main", py::arg("observation_key") = "lr");
  ext.def("observe_value", [](const std::string& key, py::object fn) {
            auto f = hold(std::move(fn));
            return E::observe_value(key, [f](T::Trainer& t) {
              py::gil_scoped_acquire gil;
              return f->object(py::cast(&t, py::return_value_policy::reference)).cast<double>();
            });
          }, py::arg("observation_key"), py::arg("target_func"));

  // --- the reporter
  m.def("report", [](py::dict values, py::handle observer) {
          Observation obs;
          for (auto item : values) {
            py::handle v = item.second;
            Array a = py::isinstance<Variable>(v) ? v.cast<const Variable&>().data() : array_from_python(v, "report");
            obs[item.first.cast<std::string>()] = a;
          }
          const void* who = nullptr;
          if (!observer.is_none()) {
            if (!py::isinstance<Link>(observer)) throw py::type_error("report: the observer must be a link");
            who = &observer.cast<const Link&>();
          }
          report(obs, who);
        }, py::arg("values"), py::arg("observer") = py::none(),
        "Reports values (Variables, arrays, numbers) to the trainer's current observation; with an observer "
        "link, the keys get its name ('main/loss').");
}

}  // namespace kusari::python
