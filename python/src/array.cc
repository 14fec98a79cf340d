// Arrays between Python and kusari: NumPy views in both directions, DLPack, kusari.ndarray and
// kusari.Device.
//
// Note [Arrays between NumPy and kusari]
// On the CPU no bytes are copied either way where the layout allows:
//   - a NumPy array given to kusari (a Variable's data, a function's argument) becomes an Array
//     over the same memory, holding a reference to the NumPy array (released under the GIL, from
//     whichever thread drops the last Array copy: GilObject); its strides must be whole elements
//     and its dtype one kusari has, else it is converted (copied) first;
//   - an Array given back to Python (Variable.array, a parameter's .grad) is a NumPy array over
//     the Array's memory, whose base is a capsule holding the Array (so the memory lives as long as
//     either side needs it).
// Writes through either side are seen by the other, as with Chainer's Variable over a NumPy
// array. GPU arrays, and bfloat16 (which NumPy lacks), come back as kusari.ndarray, which
// NumPy reads through the buffer protocol (CPU) and CuPy and PyTorch take through DLPack
// (__dlpack__ / kusari.from_dlpack, no copy on either device).
#include <dlpack/dlpack.h>

#include <cstring>
#include <sstream>

#include "common.h"

namespace kusari::python {

GilObject::~GilObject() {
  if (!Py_IsInitialized()) {
    object.release();  // the interpreter is gone: nothing to release
    return;
  }
  py::gil_scoped_acquire gil;
  object = py::object();
}

// --- dtypes -----------------------------------------------------------------------------------

namespace {

const char* numpy_name(Dtype d) {
  switch (d) {
    case Dtype::kBool:
      return "bool";
    case Dtype::kUInt8:
      return "uint8";
    case Dtype::kInt32:
      return "int32";
    case Dtype::kInt64:
      return "int64";
    case Dtype::kFloat16:
      return "float16";
    case Dtype::kBFloat16:
      return "bfloat16";
    case Dtype::kFloat32:
      return "float32";
    case Dtype::kFloat64:
      return "float64";
  }
  return "?";
}

py::module_& numpy() {
  static auto* np = new py::module_(py::module_::import("numpy"));
  return *np;
}

// (NumPy dtypes are read through their Python attributes, not pybind11's view of the C struct,
// whose layout NumPy 2 changed: one build serves NumPy 1 and 2.)
char kind_of(const py::dtype& dt) { return dt.attr("kind").cast<std::string>()[0]; }
int64_t itemsize_of(const py::dtype& dt) { return dt.attr("itemsize").cast<int64_t>(); }

/// The kusari dtype of a NumPy dtype object, or nullopt when kusari has none.
std::optional<Dtype> dtype_of_numpy(const py::dtype& dt) {
  const char kind = kind_of(dt);
  const auto size = itemsize_of(dt);
  if (kind == 'b') return Dtype::kBool;
  if (kind == 'u' && size == 1) return Dtype::kUInt8;
  if (kind == 'i' && size == 4) return Dtype::kInt32;
  if (kind == 'i' && size == 8) return Dtype::kInt64;
  if (kind == 'f' && size == 2) return Dtype::kFloat16;
  if (kind == 'f' && size == 4) return Dtype::kFloat32;
  if (kind == 'f' && size == 8) return Dtype::kFloat64;
  return std::nullopt;
}

/// The dtype kusari converts a NumPy dtype it lacks to (int8, int16 and uint16 to int32, uint32
/// to int64), or nullopt (complex, strings, objects, uint64).
std::optional<Dtype> widened(const py::dtype& dt) {
  const char kind = kind_of(dt);
  const auto size = itemsize_of(dt);
  if (kind == 'i' && size < 4) return Dtype::kInt32;
  if (kind == 'u' && size <= 2) return Dtype::kInt32;
  if (kind == 'u' && size == 4) return Dtype::kInt64;
  return std::nullopt;
}

}  // namespace

bool numpy_has(Dtype dtype) { return dtype != Dtype::kBFloat16; }

Dtype dtype_from_python(py::handle obj, const char* where) {
  if (obj.is_none()) throw py::type_error(std::string(where) + ": the dtype is None; expected e.g. numpy.float32");
  if (py::isinstance<py::str>(obj)) {
    const std::string name = obj.cast<std::string>();
    if (name == "bfloat16") return Dtype::kBFloat16;
    try {
      return dtype_from_python(numpy().attr("dtype")(obj), where);
    } catch (const py::error_already_set&) {
      throw py::type_error(std::string(where) + ": '" + name +
                           "' is not a dtype; expected one of bool, uint8, int32, int64, float16, "
                           "bfloat16, float32, float64");
    }
  }
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyFloat_Type)) return Dtype::kFloat64;
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyLong_Type)) return Dtype::kInt64;
  if (obj.ptr() == reinterpret_cast<PyObject*>(&PyBool_Type)) return Dtype::kBool;
  py::dtype dt;
  try {
    dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(obj));
  } catch (const py::error_already_set&) {
    throw py::type_error(std::string(where) + ": " + py::str(obj).cast<std::string>() +
                         " is not a dtype; expected e.g. numpy.float32 or 'bfloat16'");
  }
  if (auto d = dtype_of_numpy(dt)) return *d;
  throw py::type_error(std::string(where) + ": kusari has no dtype " + py::str(dt).cast<std::string>() +
                       "; expected one of bool, uint8, int32, int64, float16, bfloat16, float32, float64");
}

py::object dtype_to_python(Dtype dtype) {
  if (dtype == Dtype::kBFloat16) return py::str("bfloat16");
  return numpy().attr("dtype")(numpy_name(dtype));
}

// --- NumPy -> Array ---------------------------------------------------------------------------

namespace {

/// An Array over a NumPy array's memory (the caller checked dtype and strides).
Array wrap_numpy(const py::array& a, Dtype dtype) {
  const int nd = static_cast<int>(a.ndim());
  KUSARI_CHECK(nd <= kMaxNdim, ShapeError, "kusari arrays have at most ", kMaxNdim, " dimensions; got a NumPy array of ",
               nd);
  Shape shape, strides;
  const auto item = static_cast<py::ssize_t>(itemsize(dtype));
  for (int i = 0; i < nd; ++i) {
    shape.push_back(a.shape(i));
    strides.push_back(a.strides(i) / item);
  }
  auto owner = std::make_shared<GilObject>(a);
  return Array::from_blob(std::static_pointer_cast<void>(owner), const_cast<void*>(a.data()), shape, strides, dtype,
                          Device::cpu());
}

/// True when every stride of `a` is a whole number of elements and the data is aligned.
bool wrappable(const py::array& a) {
  const auto item = static_cast<py::ssize_t>(itemsize_of(a.dtype()));
  if (reinterpret_cast<uintptr_t>(a.data()) % static_cast<uintptr_t>(item) != 0) return false;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    if (a.strides(i) % item != 0) return false;
  }
  return a.dtype().attr("isnative").cast<bool>();  // (native byte order)
}

Array from_numpy(py::array a, const char* where, std::optional<Dtype> want) {
  py::dtype dt = a.dtype();
  std::optional<Dtype> have = dtype_of_numpy(dt);
  if (!have) {
    std::optional<Dtype> wide = widened(dt);
    if (!wide) {
      throw py::type_error(std::string(where) + ": kusari cannot hold a NumPy array of dtype " +
                           py::str(dt).cast<std::string>() +
                           "; expected bool, uint8, int32, int64, float16, float32 or float64");
    }
    a = py::array(numpy().attr("ascontiguousarray")(a, numpy_name(*wide)));
    have = wide;
  }
  if (!wrappable(a)) a = py::array(numpy().attr("ascontiguousarray")(a));
  Array out = wrap_numpy(a, *have);
  if (want && *want != *have) out = out.astype(*want);
  return out;
}

// --- DLPack ------------------------------------------------------------------------------------

/// DLPack's type code of booleans (kDLBool, added in DLPack 0.8; older headers lack the name).
constexpr uint8_t kDLBoolCode = 6;

/// What a DLPack capsule of an Array owns: the Array (its memory) and the shape and strides.
struct DlpackExport {
  Array array;
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* t) { delete static_cast<DlpackExport*>(t->manager_ctx); }

DLDataType dl_dtype(Dtype d) {
  DLDataType t{};
  t.lanes = 1;
  t.bits = static_cast<uint8_t>(itemsize(d) * 8);
  switch (d) {
    case Dtype::kBool:
      t.code = kDLBoolCode;
      break;
    case Dtype::kUInt8:
      t.code = kDLUInt;
      break;
    case Dtype::kInt32:
    case Dtype::kInt64:
      t.code = kDLInt;
      break;
    case Dtype::kBFloat16:
      t.code = kDLBfloat;
      break;
    default:
      t.code = kDLFloat;
      break;
  }
  return t;
}

std::optional<Dtype> from_dl_dtype(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLBoolCode && t.bits == 8) return Dtype::kBool;
  if (t.code == kDLUInt && t.bits == 8) return Dtype::kUInt8;
  if (t.code == kDLInt && t.bits == 32) return Dtype::kInt32;
  if (t.code == kDLInt && t.bits == 64) return Dtype::kInt64;
  if (t.code == kDLFloat && t.bits == 16) return Dtype::kFloat16;
  if (t.code == kDLFloat && t.bits == 32) return Dtype::kFloat32;
  if (t.code == kDLFloat && t.bits == 64) return Dtype::kFloat64;
  if (t.code == kDLBfloat && t.bits == 16) return Dtype::kBFloat16;
  return std::nullopt;
}

py::capsule to_dlpack(const Array& a) {
  // GPU work that wrote the array is queued on kusari's stream: the consumer may use another.
  if (!a.device().is_cpu()) a.device().synchronize();
  auto* e = new DlpackExport;
  e->array = a;
  e->shape.assign(a.shape().begin(), a.shape().end());
  e->strides.assign(a.strides().begin(), a.strides().end());
  DLTensor& t = e->managed.dl_tensor;
  t.data = a.raw_data();
  t.device.device_type = a.device().is_cpu() ? kDLCPU : kDLCUDA;
  t.device.device_id = a.device().index();
  t.ndim = a.ndim();
  t.dtype = dl_dtype(a.dtype());
  t.shape = e->shape.data();
  t.strides = e->strides.data();
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_export;
  return py::capsule(&e->managed, "dltensor", [](PyObject* capsule) {
    // Not consumed (still named "dltensor"): the producer frees it.
    if (std::strcmp(PyCapsule_GetName(capsule), "dltensor") != 0) return;
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  });
}

/// Releases a consumed DLManagedTensor (the producer's deleter), from any thread.
struct DlpackImport {
  DLManagedTensor* managed = nullptr;
  DlpackImport() = default;
  DlpackImport(const DlpackImport&) = delete;
  DlpackImport& operator=(const DlpackImport&) = delete;
  ~DlpackImport() {
    if (managed && managed->deleter) {
      if (Py_IsInitialized()) {
        py::gil_scoped_acquire gil;  // (a Python producer's deleter may touch Python objects)
        managed->deleter(managed);
      }
    }
  }
};

Array from_dlpack_capsule(py::capsule capsule, const char* where) {
  if (std::strcmp(capsule.name(), "dltensor") != 0) {
    throw py::value_error(std::string(where) + ": the DLPack capsule was already consumed (named '" +
                          capsule.name() + "'); a DLPack capsule can be used once");
  }
  auto* m = capsule.get_pointer<DLManagedTensor>();
  const DLTensor& t = m->dl_tensor;
  std::optional<Dtype> dtype = from_dl_dtype(t.dtype);
  if (!dtype) {
    throw py::type_error(std::string(where) + ": kusari has no dtype for DLPack type code " +
                         std::to_string(t.dtype.code) + " of " + std::to_string(t.dtype.bits) + " bits");
  }
  Device device;
  if (t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost) {
    device = Device::cpu();
  } else if (t.device.device_type == kDLCUDA) {
    device = Device::cuda(t.device.device_id);
  } else {
    throw py::type_error(std::string(where) + ": kusari cannot use memory of DLPack device type " +
                         std::to_string(static_cast<int>(t.device.device_type)) + " (only the CPU and CUDA)");
  }
  Shape shape, strides;
  for (int i = 0; i < t.ndim; ++i) shape.push_back(t.shape[i]);
  if (t.strides) {
    for (int i = 0; i < t.ndim; ++i) strides.push_back(t.strides[i]);
  } else {
    int64_t s = 1;
    strides.resize(t.ndim);
    for (int i = t.ndim - 1; i >= 0; --i) {
      strides[i] = s;
      s *= t.shape[i];
    }
  }
  void* data = static_cast<char*>(t.data) + t.byte_offset;
  // Consumed: the capsule no longer frees the tensor; the Array's owner does.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  auto owner = std::make_shared<DlpackImport>();
  owner->managed = m;
  return Array::from_blob(std::static_pointer_cast<void>(owner), data, shape, strides, *dtype, device);
}

Array from_dlpack_object(py::handle obj, const char* where) {
  py::object capsule;
  if (py::hasattr(obj, "__dlpack_device__")) {
    const auto dev = obj.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    if (dev.first == kDLCUDA) {
      // The producer's work may be queued on its own stream; kusari then waits for the device.
      capsule = obj.attr("__dlpack__")();
      Array a = from_dlpack_capsule(capsule, where);
      a.device().synchronize();
      return a;
    }
  }
  capsule = obj.attr("__dlpack__")();
  return from_dlpack_capsule(capsule, where);
}

}  // namespace

Array array_from_python(py::handle obj, const char* where, std::optional<Dtype> dtype) {
  if (py::isinstance<Array>(obj)) {
    Array a = obj.cast<Array>();
    return dtype && *dtype != a.dtype() ? a.astype(*dtype) : a;
  }
  if (py::isinstance<Variable>(obj)) {
    Array a = obj.cast<const Variable&>().data();
    return dtype && *dtype != a.dtype() ? a.astype(*dtype) : a;
  }
  if (py::isinstance<py::array>(obj)) return from_numpy(py::reinterpret_borrow<py::array>(obj), where, dtype);
  if (py::hasattr(obj, "__dlpack__") && !py::isinstance<py::array>(obj)) {
    Array a = from_dlpack_object(obj, where);
    return dtype && *dtype != a.dtype() ? a.astype(*dtype) : a;
  }
  if (obj.is_none()) throw py::type_error(std::string(where) + ": expected an array, got None");
  py::object converted;
  try {
    converted = numpy().attr("asarray")(obj);
  } catch (const py::error_already_set& e) {
    throw py::type_error(std::string(where) + ": expected an array (NumPy, kusari, CuPy, PyTorch) or a " +
                         "nested list of numbers, got " + py::str(py::type::of(obj)).cast<std::string>());
  }
  py::array a = py::reinterpret_borrow<py::array>(converted);
  // Python floats are float32 in kusari (as in Chainer's datasets), unless a dtype is asked for.
  if (!dtype && kind_of(a.dtype()) == 'f' && !py::isinstance<py::array>(obj) && itemsize_of(a.dtype()) == 8) {
    dtype = Dtype::kFloat32;
  }
  return from_numpy(a, where, dtype);
}

// --- Array -> NumPy ---------------------------------------------------------------------------

py::array numpy_view(const Array& a) {
  if (!a.device().is_cpu()) {
    throw py::type_error("kusari.ndarray: the array is on " + a.device().str() +
                         "; NumPy sees only CPU arrays: use .get() or to_device('cpu') for a copy");
  }
  if (!numpy_has(a.dtype())) {
    throw py::type_error("kusari.ndarray: NumPy has no bfloat16; convert with .astype(numpy.float32)");
  }
  std::vector<py::ssize_t> shape(a.shape().begin(), a.shape().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : a.strides()) strides.push_back(static_cast<py::ssize_t>(s * a.itemsize()));
  auto* keep = new Array(a);
  py::capsule base(keep, [](void* p) { delete static_cast<Array*>(p); });
  return py::array(py::dtype(numpy_name(a.dtype())), shape, strides, a.raw_data(), base);
}

py::object array_to_python(const Array& a) {
  if (!a.defined()) return py::none();
  if (a.device().is_cpu() && numpy_has(a.dtype())) return numpy_view(a);
  return py::cast(a);
}

// --- devices ----------------------------------------------------------------------------------

Device device_from_python(py::handle obj, const char* where, Device none) {
  if (obj.is_none()) return none;
  if (py::isinstance<Device>(obj)) return obj.cast<Device>();
  if (py::isinstance<py::str>(obj)) {
    std::string s = obj.cast<std::string>();
    if (s == "@numpy" || s == "native" || s == "native:0") return Device::cpu();
    return Device::parse(s);
  }
  if (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr())) {
    const int64_t i = obj.cast<int64_t>();
    if (i < 0) return Device::cpu();
    return Device::cuda(static_cast<int>(i));
  }
  if (py::hasattr(obj, "kusari_device")) return obj.attr("kusari_device").cast<Device>();
  throw py::type_error(std::string(where) + ": expected a device ('cpu', 'cuda:0', kusari.Device, or Chainer's "
                       "integer: -1 for the CPU, n for GPU n), got " + py::str(py::repr(obj)).cast<std::string>());
}

// --- bindings ---------------------------------------------------------------------------------

void init_array(py::module_& m) {
  py::class_<Device>(m, "Device", "A device: the CPU ('cpu') or a GPU ('cuda:N').")
      .def(py::init([](py::handle spec) { return device_from_python(spec, "kusari.Device"); }), py::arg("spec") = "cpu",
           "Device('cpu'), Device('cuda:0'), Device('@cupy:0') or Device(n) (Chainer's integers: -1 the CPU).")
      .def_property_readonly("type", [](Device d) { return d.is_cpu() ? "cpu" : "cuda"; })
      .def_property_readonly("index", &Device::index)
      .def_property_readonly("is_cpu", &Device::is_cpu)
      .def_property_readonly("is_cuda", &Device::is_cuda)
      .def("synchronize", &Device::synchronize, py::call_guard<py::gil_scoped_release>(),
           "Waits until the work queued on the device has finished.")
      .def("use", [](Device d) { return d; }, "Chainer's Device.use(): kusari's devices need no selection (a no-op).")
      .def("__eq__", [](Device a, py::handle b) {
        try {
          return a == device_from_python(b, "Device.__eq__");
        } catch (const std::exception&) {
          return false;
        }
      })
      .def("__hash__", [](Device d) { return static_cast<int>(d.is_cuda()) * 1000 + d.index(); })
      .def("__str__", &Device::str)
      .def("__repr__", [](Device d) { return "kusari.Device('" + d.str() + "')"; });
  py::implicitly_convertible<py::str, Device>();
  py::implicitly_convertible<py::int_, Device>();

  py::class_<Array>(m, "ndarray",
                    "kusari's array: returned for GPU arrays and bfloat16 (CPU arrays come back as NumPy "
                    "arrays over the same memory). numpy.asarray views a CPU one without a copy "
                    "(__array__); CuPy and PyTorch take any through DLPack (__dlpack__), without a copy.")
      .def(py::init([](py::handle obj, py::handle dtype, py::handle device) {
             std::optional<Dtype> d;
             if (!dtype.is_none()) d = dtype_from_python(dtype, "kusari.ndarray");
             Array a = array_from_python(obj, "kusari.ndarray", d);
             return a.to_device(device_from_python(device, "kusari.ndarray", a.device()));
           }),
           py::arg("obj"), py::arg("dtype") = py::none(), py::arg("device") = py::none())
      .def_property_readonly("shape", [](const Array& a) { return a.shape(); })
      .def_property_readonly("dtype", [](const Array& a) { return a.dtype(); })
      .def_property_readonly("device", [](const Array& a) { return a.device(); })
      .def_property_readonly("ndim", &Array::ndim)
      .def_property_readonly("size", &Array::size)
      .def_property_readonly("nbytes", &Array::nbytes)
      .def_property_readonly("itemsize", &Array::itemsize)
      .def_property_readonly("__kusari_array__", [](const Array&) { return true; })
      .def("__len__", [](const Array& a) {
        if (a.ndim() == 0) throw py::type_error("len() of a 0-d array");
        return a.shape()[0];
      })
      .def("get", [](const Array& a) { return numpy_view(a.to_device(Device::cpu()).astype(
                                            numpy_has(a.dtype()) ? a.dtype() : Dtype::kFloat32).copy()); },
           "A NumPy copy on the CPU (bfloat16 becomes float32).")
      .def("__array__", [](const Array& a, py::handle dtype) {
             // A view of a CPU array (no copy); a GPU array is copied, bfloat16 becomes float32.
             py::array v = numpy_view(a.to_device(Device::cpu()).astype(numpy_has(a.dtype()) ? a.dtype() : Dtype::kFloat32));
             if (!dtype.is_none()) return py::array(v.attr("astype")(dtype));
             return v;
           }, py::arg("dtype") = py::none())
      .def("to_device", [](const Array& a, py::handle d) { return a.to_device(device_from_python(d, "to_device")); },
           py::call_guard<>(), py::arg("device"))
      .def("astype", [](const Array& a, py::handle dtype) { return a.astype(dtype_from_python(dtype, "astype")); },
           py::arg("dtype"))
      .def("copy", &Array::copy)
      .def("item", [](const Array& a) -> py::object {
        if (is_floating(a.dtype())) return py::float_(a.item<double>());
        if (a.dtype() == Dtype::kBool) return py::bool_(a.item<bool>());
        return py::int_(a.item<int64_t>());
      })
      // The DLPack protocol of 2023 (NumPy 2, PyTorch 2) asks with max_version, dl_device and copy
      // first and falls back on a TypeError; kusari takes them all and exports a DLPack 0.x capsule
      // ("dltensor"), which every consumer accepts. A copy is made only when asked for.
      .def("__dlpack__", [](const Array& a, py::handle stream, py::handle max_version, py::handle dl_device,
                            py::handle copy) {
             if (!dl_device.is_none()) {
               const auto want = dl_device.cast<std::pair<int, int>>();
               const int type = a.device().is_cpu() ? kDLCPU : kDLCUDA;
               if (want.first != type || want.second != a.device().index()) {
                 throw py::buffer_error("kusari.ndarray.__dlpack__: dl_device (" + std::to_string(want.first) + ", " +
                                        std::to_string(want.second) + ") is not the array's device " +
                                        a.device().str() + "; copy it with to_device first");
               }
             }
             const bool copied = !copy.is_none() && copy.cast<bool>();
             return to_dlpack(copied ? a.copy() : a);
           },
           py::arg("stream") = py::none(), py::kw_only(), py::arg("max_version") = py::none(),
           py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", [](const Array& a) {
        return py::make_tuple(static_cast<int>(a.device().is_cpu() ? kDLCPU : kDLCUDA), a.device().index());
      })
      .def("__repr__", &Array::to_string)
      .def("__str__", &Array::to_string);

  m.def("asarray", [](py::handle obj, py::handle dtype, py::handle device) {
          std::optional<Dtype> d;
          if (!dtype.is_none()) d = dtype_from_python(dtype, "kusari.asarray");
          Array a = array_from_python(obj, "kusari.asarray", d);
          return a.to_device(device_from_python(device, "kusari.asarray", a.device()));
        },
        py::arg("obj"), py::arg("dtype") = py::none(), py::arg("device") = py::none(),
        "A kusari.ndarray of a NumPy array (no copy on the CPU), a CuPy or PyTorch tensor (DLPack, no copy), or a "
        "list; on `device` when given (a copy then).");
  m.def("from_dlpack", [](py::handle obj) {
          if (py::isinstance<py::capsule>(obj)) return from_dlpack_capsule(py::reinterpret_borrow<py::capsule>(obj), "kusari.from_dlpack");
          if (!py::hasattr(obj, "__dlpack__")) {
            throw py::type_error("kusari.from_dlpack: expected an object with __dlpack__ (NumPy >= 1.22, CuPy, "
                                 "PyTorch) or a DLPack capsule, got " + py::str(py::type::of(obj)).cast<std::string>());
          }
          return from_dlpack_object(obj, "kusari.from_dlpack");
        },
        py::arg("x"), "A kusari.ndarray over another library's array (DLPack): the same memory, CPU or GPU.");
  m.def("to_python", [](const Array& a) { return array_to_python(a); },
        "The Python value of a kusari array: a NumPy view on the CPU, else the kusari.ndarray itself.");
  m.def("cuda_available", &cuda_available, "True when this build has CUDA and a GPU can be used.");
  m.def("cuda_device_count", &cuda_device_count, "The number of usable GPUs.");
  m.def("manual_seed", [](uint64_t seed) { manual_seed(seed); }, py::arg("seed"),
        "Seeds kusari's default random generator (initial weights, dropout, shuffling).");
  m.def("set_num_threads", &set_num_threads, py::arg("n"), "Threads of kusari's CPU kernels (not BLAS).");
  m.def("get_num_threads", &get_num_threads);
  m.def("set_blas_num_threads", &set_blas_num_threads, py::arg("n"), "Threads of the CPU matrix products (BLAS).");
  m.def("get_blas_num_threads", &get_blas_num_threads);
  py::implicitly_convertible<py::array, Array>();
}

}  // namespace kusari::python
