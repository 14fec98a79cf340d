// What every file of the Python front end shares: the conversions between Python objects and
// kusari's values (arrays, shapes, dtypes, devices), and a holder of Python objects that C++ may
// release without the GIL. See Note [The Python front end] in module.cc.
#pragma once

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kusari/kusari.h"
#include "kusari/datasets/dataset.h"

namespace py = pybind11;

namespace kusari::python {

// --- Python objects held by C++ ---------------------------------------------------------------

/// Releases a Python reference from any thread: C++ may drop the last copy of a graph node, a
/// dataset or a callback while the GIL is released (inside a kernel, a collective, the training
/// loop), and a py::object must only be destroyed with the GIL held.
struct GilObject {
  py::object object;
  explicit GilObject(py::object o) : object(std::move(o)) {}
  ~GilObject();
  GilObject(const GilObject&) = delete;
  GilObject& operator=(const GilObject&) = delete;
};

/// A shared holder of a Python object whose last owner may be any thread.
inline std::shared_ptr<GilObject> hold(py::object o) { return std::make_shared<GilObject>(std::move(o)); }

// --- arrays -----------------------------------------------------------------------------------

/// The kusari dtype of a NumPy dtype, a Python type (float, int, bool), a name ("float32",
/// "bfloat16") or a numpy scalar type; TypeError naming `where` otherwise.
Dtype dtype_from_python(py::handle obj, const char* where);
/// The NumPy dtype of `dtype`; bfloat16, which NumPy lacks, is the string "bfloat16".
py::object dtype_to_python(Dtype dtype);
/// True when NumPy has `dtype` (all but bfloat16).
bool numpy_has(Dtype dtype);

/// An Array of a Python value: a kusari array (kusari.ndarray), a Variable (its data), an object
/// with __dlpack__ (a CuPy or PyTorch tensor: no copy), a NumPy array (no copy when its dtype is
/// one kusari has and its strides are whole elements; a copy otherwise), or anything
/// numpy.asarray accepts (a list, a scalar: copied). `dtype` converts when given. `where` names
/// the calling function in errors.
Array array_from_python(py::handle obj, const char* where, std::optional<Dtype> dtype = std::nullopt);

/// The Python value of an Array: on the CPU, a NumPy array that views the same memory (no copy;
/// it keeps the memory alive) when NumPy has the dtype; otherwise (a GPU array, bfloat16) a
/// kusari.ndarray, which NumPy, CuPy and PyTorch can take through DLPack or the buffer protocol.
py::object array_to_python(const Array& a);

/// A NumPy view of a CPU array (TypeError for other devices or bfloat16).
py::array numpy_view(const Array& a);

// --- small values -----------------------------------------------------------------------------

/// A Device from a kusari.Device, a string ("cpu", "cuda:1", "@cupy:0", "@numpy"), an integer
/// (Chainer's: -1 the CPU, n >= 0 GPU n), or None (`none`).
Device device_from_python(py::handle obj, const char* where, Device none = Device::cpu());

/// A Variable argument of a bound function: a Variable as it is, anything else array-like
/// (NumPy, kusari.ndarray, DLPack, a list, a number) wrapped as a constant (requires_grad false,
/// as Chainer's as_variable). Python numbers match only when no overload takes them as they are.
struct VarArg {
  Variable v;
};
/// An Array argument of a bound function: a Variable's data or anything array_from_python takes.
struct ArrArg {
  Array a;
};

/// A Variable of a Python value: a Variable itself, else its array wrapped (requires_grad as given).
Variable variable_from_python(py::handle obj, bool requires_grad, const char* where);

/// A C++ dataset of a Python value: a kusari dataset as it is, a sequence wrapped (Note [Python
/// datasets] in data.cc); None gives null.
std::shared_ptr<Dataset> dataset_from_python(py::handle obj, const char* where);
/// The Python value of a dataset (the Python sequence itself for a wrapped one).
py::object dataset_to_python(const std::shared_ptr<Dataset>& d);

/// Registers the submodules' classes and functions.
/// The Serializable of a link, optimizer, trainer, updater, iterator or extension (TypeError naming
/// `where` for anything else).
Serializable& serializable_of(py::handle obj, const char* where);

void init_array(py::module_& m);
void init_autograd(py::module_& m);
void init_functions(py::module_& m);
void init_links(py::module_& m);
void init_optimizers(py::module_& m);
void init_data(py::module_& m);
void init_training(py::module_& m);
void init_serializers(py::module_& m);
void init_mn(py::module_& m);
/// Detection (after init_links and init_data: it adds to kusari.links.models and kusari.data).
void init_detection(py::module_& m);

}  // namespace kusari::python

// --- type casters: shapes, axes and strides; pairs of integers; scalars; dtypes ------------------

namespace pybind11::detail {

/// True for NumPy's scalar types (numpy.float32(1.0), ...).
inline bool PyArray_IsScalar_Generic(handle h) {
  static auto* generic = new object(module_::import("numpy").attr("generic"));
  return isinstance(h, *generic);
}

/// kusari::Shape (also Axes and Strides) from an int, a sequence of ints, or None (empty);
/// to a tuple.
template <>
struct type_caster<kusari::Shape> {
  PYBIND11_TYPE_CASTER(kusari::Shape, const_name("tuple[int, ...]"));
  bool load(handle src, bool) {
    if (src.is_none()) {
      value = kusari::Shape();
      return true;
    }
    if (PyLong_Check(src.ptr()) && !PyBool_Check(src.ptr())) {
      value = kusari::Shape{src.cast<int64_t>()};
      return true;
    }
    if (!PySequence_Check(src.ptr()) || PyUnicode_Check(src.ptr())) return false;
    kusari::Shape s;
    for (handle item : reinterpret_borrow<sequence>(src)) {
      if (!PyLong_Check(item.ptr()) && !PyIndex_Check(item.ptr())) return false;
      if (s.size() >= kusari::kMaxNdim) return false;
      s.push_back(item.cast<int64_t>());
    }
    value = s;
    return true;
  }
  static handle cast(const kusari::Shape& s, return_value_policy, handle) {
    tuple t(s.size());
    for (int i = 0; i < s.size(); ++i) t[static_cast<size_t>(i)] = int_(s[i]);
    return t.release();
  }
};

/// kusari::functions::IntPair from an int or an (h, w) pair.
template <>
struct type_caster<kusari::functions::IntPair> {
  PYBIND11_TYPE_CASTER(kusari::functions::IntPair, const_name("int | tuple[int, int]"));
  type_caster() : value(0) {}
  bool load(handle src, bool) {
    if (PyLong_Check(src.ptr()) && !PyBool_Check(src.ptr())) {
      value = kusari::functions::IntPair(src.cast<int64_t>());
      return true;
    }
    if (!PySequence_Check(src.ptr()) || PyUnicode_Check(src.ptr())) return false;
    sequence seq = reinterpret_borrow<sequence>(src);
    if (seq.size() != 2) return false;
    value = kusari::functions::IntPair(seq[0].cast<int64_t>(), seq[1].cast<int64_t>());
    return true;
  }
  static handle cast(const kusari::functions::IntPair& p, return_value_policy, handle) {
    return make_tuple(p.h, p.w).release();
  }
};

/// kusari::Scalar from a Python bool, int or float (or a NumPy scalar of one).
template <>
struct type_caster<kusari::Scalar> {
  PYBIND11_TYPE_CASTER(kusari::Scalar, const_name("bool | int | float"));
  bool load(handle src, bool convert) {
    if (PyBool_Check(src.ptr())) {
      value = kusari::Scalar(src.ptr() == Py_True);
      return true;
    }
    if (PyLong_Check(src.ptr())) {
      value = kusari::Scalar(src.cast<int64_t>());
      return true;
    }
    if (PyFloat_Check(src.ptr())) {
      value = kusari::Scalar(PyFloat_AsDouble(src.ptr()));
      return true;
    }
    if (!convert) return false;
    // NumPy scalars (numpy.float32(2), numpy.int64(3)) and 0-d NumPy arrays.
    if (isinstance<array>(src) || PyArray_IsScalar_Generic(src)) {
      object a = reinterpret_borrow<object>(src);
      if (a.attr("ndim").cast<int>() != 0) return false;
      return load(a.attr("item")(), false);
    }
    return false;
  }
  static handle cast(const kusari::Scalar& s, return_value_policy, handle) {
    if (s.is_float()) return float_(s.to<double>()).release();
    if (s.kind() == kusari::Scalar::Kind::kBool) return bool_(s.to<int64_t>() != 0).release();
    return int_(s.to<int64_t>()).release();
  }
};

template <>
struct type_caster<kusari::python::VarArg> {
  PYBIND11_TYPE_CASTER(kusari::python::VarArg, const_name("Variable | array"));
  bool load(handle src, bool convert) {
    type_caster_base<kusari::Variable> base;
    if (base.load(src, false)) {
      value.v = static_cast<kusari::Variable&>(base);
      return true;
    }
    const bool number = PyFloat_Check(src.ptr()) || PyLong_Check(src.ptr()) || PyBool_Check(src.ptr());
    if (src.is_none() || (number && !convert)) return false;
    try {
      value.v = kusari::Variable(kusari::python::array_from_python(src, "argument"), false);
      return true;
    } catch (const std::exception&) {
      PyErr_Clear();
      return false;
    }
  }
  static handle cast(const kusari::python::VarArg& a, return_value_policy p, handle parent) {
    return type_caster_base<kusari::Variable>::cast(a.v, p, parent);
  }
};

template <>
struct type_caster<kusari::python::ArrArg> {
  PYBIND11_TYPE_CASTER(kusari::python::ArrArg, const_name("array"));
  bool load(handle src, bool convert) {
    if (src.is_none()) return false;
    try {
      value.a = kusari::python::array_from_python(src, "argument");
      return true;
    } catch (const std::exception&) {
      PyErr_Clear();
      return false;
    }
  }
  static handle cast(const kusari::python::ArrArg& a, return_value_policy p, handle parent) {
    return type_caster_base<kusari::Array>::cast(a.a, p, parent);
  }
};

/// kusari::Dtype from anything dtype_from_python accepts; to a NumPy dtype ("bfloat16" for it).
template <>
struct type_caster<kusari::Dtype> {
  PYBIND11_TYPE_CASTER(kusari::Dtype, const_name("numpy.dtype"));
  bool load(handle src, bool) {
    try {
      value = kusari::python::dtype_from_python(src, "dtype");
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  static handle cast(kusari::Dtype d, return_value_policy, handle) {
    return kusari::python::dtype_to_python(d).release();
  }
};

}  // namespace pybind11::detail
