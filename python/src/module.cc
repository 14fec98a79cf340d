// The extension module kusari._kusari.
//
// Note [The Python front end]
// The Python package is a front end over the C++ objects: every array, variable, function, link,
// optimizer, iterator, updater, trainer, extension and communicator is the C++ one, reached
// through pybind11; the package's .py files only arrange the names (kusari.functions,
// kusari.links, ...), add what Python users write by habit (init_scope, __call__, duck-typed
// extensions and datasets) and the Chainer compatibility modules. Nothing is computed twice.
//   - Values: NumPy arrays in and out on the CPU without copies (Note [Arrays between NumPy and
//     kusari] in array.cc); DLPack for CuPy and PyTorch on both devices.
//   - Subclasses: a Chain, a FunctionNode, an Extension or a Dataset written in Python is a C++
//     object whose virtual functions call back into Python (pybind11 trampolines), so the C++
//     training loop runs Python code where the user wrote some, and C++ everywhere else.
//   - The GIL: every call that may take long (kernels, backward, collectives, iterator waits,
//     the trainer's run) releases it, and every call back into Python takes it again, so Python
//     threads and kusari's thread pools do not wait for each other. Python objects that C++ holds
//     are released under the GIL from whichever thread drops them (GilObject).
//   - Errors: kusari's exceptions become Python's (ValueError, TypeError, IndexError,
//     NotImplementedError, OSError, RuntimeError), with kusari.mn.CommunicatorError for the
//     communicators; each keeps the C++ message, which names the function and the values.
#include "common.h"

namespace kusari::python {
namespace {

void register_errors(py::module_& m) {
  static auto* kusari_error = new py::exception<Error>(m, "KusariError", PyExc_RuntimeError);
  static auto* communicator_error =
      new py::exception<CommunicatorError>(m, "CommunicatorError", kusari_error->ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CommunicatorError& e) {
      communicator_error->operator()(e.what());
    } catch (const ShapeError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const DtypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const IOError& e) {
      PyErr_SetString(PyExc_OSError, e.what());
    } catch (const DeviceError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const GradientError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const Error& e) {
      kusari_error->operator()(e.what());
    }
  });
}

}  // namespace
}  // namespace kusari::python

PYBIND11_MODULE(_kusari, m) {
  using namespace kusari::python;
  m.doc() = "kusari's C++ core (see the package kusari)";
  register_errors(m);
  init_array(m);
  init_autograd(m);
  py::module_ f = m.def_submodule("functions", "Differentiable functions (Chainer's chainer.functions)");
  init_functions(f);
  py::module_ l = m.def_submodule("links", "Links (Chainer's chainer.links)");
  init_links(l);
  py::module_ o = m.def_submodule("optimizers", "Optimizers and their hooks");
  init_optimizers(o);
  py::module_ d = m.def_submodule("data", "Datasets and iterators");
  init_data(d);
  init_detection(m);
  py::module_ t = m.def_submodule("training", "The trainer, updaters, triggers and extensions");
  init_training(t);
  py::module_ s = m.def_submodule("serializers", "npz files (Chainer's key layout)");
  init_serializers(s);
  py::module_ mn = m.def_submodule("mn", "Multi-node training (ChainerMN)");
  init_mn(mn);
  mn.attr("CommunicatorError") = m.attr("CommunicatorError");
  m.attr("__version__") = kusari::build_info().version;
  m.def("build_info", [] {
    const kusari::BuildInfo& b = kusari::build_info();
    py::dict d;
    d["version"] = b.version;
    d["cuda"] = b.cuda;
    d["nccl"] = b.nccl;
    d["dnnl"] = b.dnnl;
    d["openmp"] = b.openmp;
    d["mpi"] = b.mpi;
    d["cairo"] = b.cairo;
    d["blas"] = b.blas;
    return d;
  }, "What the C++ library was built with.");
  m.def("only_check_arguments", [](std::optional<std::string> program) {
    if (!program) {
      py::list argv = py::module_::import("sys").attr("argv");
      std::string path = argv.empty() ? std::string("python") : py::str(argv[0]).cast<std::string>();
      program = path.substr(path.find_last_of('/') + 1);
    }
    return kusari::only_check_arguments(*program);
  }, py::arg("program") = py::none(),
  "True when the script was started only to check its arguments (KUSARI_CHECK_ARGS set): it has\n"
  "printed '<program>: arguments accepted' and the script should end without reading data,\n"
  "training or writing anything. Call it once the arguments are parsed and checked.");
}
