// kusari.serializers: save_npz / load_npz of links, optimizers and trainers (Chainer's key layout),
// and the Serializer that Python extensions' serialize() methods receive.
#include "common.h"
#include "kusari/serializers/npz.h"
#include "kusari/training/trainer.h"

namespace kusari::python {
namespace T = kusari::training;

Serializable& serializable_of(py::handle obj, const char* where) {
  if (py::isinstance<Link>(obj)) return obj.cast<Link&>();
  if (py::isinstance<Optimizer>(obj)) return obj.cast<Optimizer&>();
  if (py::isinstance<T::Trainer>(obj)) return obj.cast<T::Trainer&>();
  if (py::isinstance<T::Updater>(obj)) return obj.cast<T::Updater&>();
  if (py::isinstance<Iterator>(obj)) return obj.cast<Iterator&>();
  if (py::isinstance<T::Extension>(obj)) return obj.cast<T::Extension&>();
  throw py::type_error(std::string(where) + ": expected a link, an optimizer, a trainer, an updater, an iterator "
                       "or an extension, got " + py::str(py::type::of(obj)).cast<std::string>());
}

void init_serializers(py::module_& m) {
  py::class_<Serializer>(m, "Serializer", "What a serialize(serializer) method receives: save or load values by key.")
      .def_property_readonly("is_loading", &Serializer::is_loading)
      .def("__getitem__", [](Serializer& s, const std::string& name) { return s.child(name); })
      .def("__contains__", &Serializer::contains)
      .def("__call__", [](Serializer& s, const std::string& key, py::handle value) -> py::object {
        if (PyBool_Check(value.ptr())) {
          bool v = value.cast<bool>();
          s(key, v);
          return py::bool_(v);
        }
        if (PyLong_Check(value.ptr())) {
          int64_t v = value.cast<int64_t>();
          s(key, v);
          return py::int_(v);
        }
        if (PyFloat_Check(value.ptr())) {
          double v = value.cast<double>();
          s(key, v);
          return py::float_(v);
        }
        if (py::isinstance<py::str>(value)) {
          std::string v = value.cast<std::string>();
          s(key, v);
          return py::str(v);
        }
        if (value.is_none()) {
          if (!s.is_loading() || !s.contains(key)) return py::none();
          Array a;
          s(key, a);
          return array_to_python(a);
        }
        // An array: serialized in place (a NumPy array given is filled when loading).
        Array a = array_from_python(value, "serializer");
        s(key, a);
        return array_to_python(a);
      }, py::arg("key"), py::arg("value"),
      "Saves `value` under `key`, or loads it (returned; an array given is filled in place).");

  m.def("save_npz", [](const std::string& file, py::handle obj, bool compression) {
          Serializable& s = serializable_of(obj, "save_npz");
          py::gil_scoped_release r;
          save_npz(file, s, compression);
        }, py::arg("file"), py::arg("obj"), py::arg("compression") = true,
        "Saves a link, optimizer or trainer to an npz file (NumPy-readable, Chainer's keys; atomic).");
  m.def("load_npz", [](const std::string& file, py::handle obj, const std::string& path, bool strict,
                       py::handle ignore_names) {
          std::vector<std::string> ignore;
          if (!ignore_names.is_none()) ignore = ignore_names.cast<std::vector<std::string>>();
          Serializable& s = serializable_of(obj, "load_npz");
          py::gil_scoped_release r;
          load_npz(file, s, path, strict, ignore);
        }, py::arg("file"), py::arg("obj"), py::arg("path") = "", py::arg("strict") = true,
        py::arg("ignore_names") = py::none(),
        "Loads a link, optimizer or trainer from an npz file written by save_npz or by Chainer.");
}

}  // namespace kusari::python
