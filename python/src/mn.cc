// kusari.mn (ChainerMN's chainermn): communicators, the multi-node optimizer, evaluator, batch
// normalization, checkpointer and iterators, the differentiable communication functions, and the
// collectives of arrays and of picklable Python objects. Every collective releases the GIL.
//
// Note [A Python rank that fails]
// An exception that escapes a Python script is not a C++ exception: Python prints it and exits,
// and the other ranks would learn only that this one finished early. So kusari.mn installs a
// sys.excepthook once a communicator exists: it hands the traceback to kusari's own failure path
// (Note [One report of a failure] in src/mn/comm/op_tracker.cc), which reports it once for the
// ranks that failed alike, ends the waiting ranks quietly, and ends the job with status 1, as an
// uncaught C++ exception does.
#include "common.h"

#if KUSARI_PYTHON_MN
#include "kusari/mn.h"

namespace kusari::mn::detail {
// kusari_mn's failure path (src/mn/comm/mpi_util.h, which needs MPI's header).
void report_failure_and_abort(const std::string& what) noexcept;
}  // namespace kusari::mn::detail
#endif

namespace kusari::python {

#if KUSARI_PYTHON_MN

std::shared_ptr<training::Trigger> trigger_from_python(py::handle h, const char* where);

namespace {

namespace MN = kusari::mn;
namespace T = kusari::training;
using CommPtr = std::shared_ptr<MN::Communicator>;
using R = py::call_guard<py::gil_scoped_release>;

MN::Bytes bytes_of(const py::bytes& b) {
  std::string_view v(PyBytes_AS_STRING(b.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(b.ptr())));
  return MN::Bytes(v.begin(), v.end());
}

py::bytes to_bytes(const MN::Bytes& b) {
  return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
}

py::module_& pickle() {
  static auto* p = new py::module_(py::module_::import("pickle"));
  return *p;
}

py::bytes dumps(py::handle obj) { return pickle().attr("dumps")(obj, -1); }
py::object loads(const MN::Bytes& b) { return pickle().attr("loads")(to_bytes(b)); }

MN::ReduceOp op_of(const std::string& op) {
  if (op == "sum") return MN::ReduceOp::kSum;
  if (op == "max") return MN::ReduceOp::kMax;
  if (op == "min") return MN::ReduceOp::kMin;
  if (op == "mean") return MN::ReduceOp::kMean;
  throw py::value_error("allreduce: op must be 'sum', 'max', 'min' or 'mean', got '" + op + "'");
}

std::optional<Device> optional_device(py::handle h) {
  if (h.is_none()) return std::nullopt;
  return device_from_python(h, "communicator");
}

py::list arrays_to_python(const std::vector<Array>& v) {
  py::list out;
  for (const Array& a : v) out.append(array_to_python(a));
  return out;
}

std::vector<Array> arrays_of(py::handle seq, const char* where) {
  std::vector<Array> out;
  for (py::handle h : seq) out.push_back(array_from_python(h, where));
  return out;
}

void install_excepthook() {
  static bool installed = false;
  if (installed) return;
  installed = true;
  py::module_::import("kusari.mn._failure").attr("install")();
}

}  // namespace

void init_mn(py::module_& m) {
  m.def("communicator_names", &MN::communicator_names);

  py::class_<MN::Communicator, CommPtr>(m, "Communicator", py::dynamic_attr(),
                                        "A communicator over the job's processes (ChainerMN's CommunicatorBase).")
      .def_property_readonly("rank", &MN::Communicator::rank)
      .def_property_readonly("size", &MN::Communicator::size)
      .def_property_readonly("intra_rank", &MN::Communicator::intra_rank)
      .def_property_readonly("intra_size", &MN::Communicator::intra_size)
      .def_property_readonly("inter_rank", &MN::Communicator::inter_rank)
      .def_property_readonly("inter_size", &MN::Communicator::inter_size)
      .def_property_readonly("name", [](const MN::Communicator& c) { return std::string(c.name()); })
      .def("bcast_data", &MN::Communicator::bcast_data, py::arg("model"), R(),
           "Rank 0's parameters to every rank.")
      .def("multi_node_mean_grad", &MN::Communicator::multi_node_mean_grad, py::arg("model"),
           py::arg("zero_fill") = false, R(), "Averages the model's gradients over the ranks.")
      .def("allreduce_grad", &MN::Communicator::multi_node_mean_grad, py::arg("model"), py::arg("zero_fill") = false,
           R(), "ChainerMN v6's name of multi_node_mean_grad.")
      .def("send", [](MN::Communicator& c, const ArrArg& x, int dest, int tag) {
        py::gil_scoped_release r;
        c.send(x.a, dest, tag);
      }, py::arg("data"), py::arg("dest"), py::arg("tag") = 0)
      .def("recv", [](MN::Communicator& c, int source, int tag, py::handle device) {
        const std::optional<Device> d = optional_device(device);
        Array a;
        {
          py::gil_scoped_release r;
          a = c.recv(source, tag, d);
        }
        return array_to_python(a);
      }, py::arg("source"), py::arg("tag") = 0, py::arg("device") = py::none())
      .def("bcast", [](MN::Communicator& c, py::handle x, int root, py::handle device) {
        Array a = x.is_none() ? Array() : array_from_python(x, "bcast");
        const std::optional<Device> d = optional_device(device);
        Array out;
        {
          py::gil_scoped_release r;
          out = c.bcast(a, root, d);
        }
        return array_to_python(out);
      }, py::arg("data"), py::arg("root") = 0, py::arg("device") = py::none())
      .def("gather", [](MN::Communicator& c, const ArrArg& x, int root) -> py::object {
        std::vector<Array> out;
        {
          py::gil_scoped_release r;
          out = c.gather(x.a, root);
        }
        if (out.empty()) return py::none();
        return arrays_to_python(out);
      }, py::arg("data"), py::arg("root") = 0)
      .def("allgather", [](MN::Communicator& c, const ArrArg& x) {
        std::vector<Array> out;
        {
          py::gil_scoped_release r;
          out = c.allgather(x.a);
        }
        return arrays_to_python(out);
      }, py::arg("x"))
      .def("alltoall", [](MN::Communicator& c, py::handle xs) {
        std::vector<Array> in = arrays_of(xs, "alltoall"), out;
        {
          py::gil_scoped_release r;
          out = c.alltoall(in);
        }
        return arrays_to_python(out);
      }, py::arg("xs"))
      .def("scatter", [](MN::Communicator& c, py::handle xs, int root, py::handle device) {
        std::vector<Array> in = xs.is_none() ? std::vector<Array>{} : arrays_of(xs, "scatter");
        const std::optional<Device> d = optional_device(device);
        Array out;
        {
          py::gil_scoped_release r;
          out = c.scatter(in, root, d);
        }
        return array_to_python(out);
      }, py::arg("xs"), py::arg("root") = 0, py::arg("device") = py::none())
      .def("reduce_scatter", [](MN::Communicator& c, const ArrArg& x, const std::string& op) {
        const MN::ReduceOp o = op_of(op);
        Array out;
        {
          py::gil_scoped_release r;
          out = c.reduce_scatter(x.a, o);
        }
        return array_to_python(out);
      }, py::arg("data"), py::arg("op") = "sum",
         "Reduces data over the ranks and gives rank r block r of the first axis (which the number of "
         "processes must divide).")
      .def("all_gather", [](MN::Communicator& c, const ArrArg& x) {
        Array out;
        {
          py::gil_scoped_release r;
          out = c.all_gather(x.a);
        }
        return array_to_python(out);
      }, py::arg("data"), "Every rank's array concatenated along the first axis, in rank order.")
      .def("allreduce", [](MN::Communicator& c, const ArrArg& x, const std::string& op) {
        const MN::ReduceOp o = op_of(op);
        Array out;
        {
          py::gil_scoped_release r;
          out = c.allreduce(x.a, o);
        }
        return array_to_python(out);
      }, py::arg("data"), py::arg("op") = "sum")
      .def("send_obj", [](MN::Communicator& c, py::handle obj, int dest, int tag) {
        MN::Bytes b = bytes_of(dumps(obj));
        py::gil_scoped_release r;
        c.send_obj(b, dest, tag);
      }, py::arg("obj"), py::arg("dest"), py::arg("tag") = 0, "Sends a picklable object.")
      .def("recv_obj", [](MN::Communicator& c, int source, int tag) {
        MN::Bytes b;
        {
          py::gil_scoped_release r;
          b = c.recv_obj(source, tag);
        }
        return loads(b);
      }, py::arg("source"), py::arg("tag") = 0)
      .def("bcast_obj", [](MN::Communicator& c, py::handle obj, int root) {
        MN::Bytes b = c.rank() == root ? bytes_of(dumps(obj)) : MN::Bytes{};
        {
          py::gil_scoped_release r;
          b = c.bcast_obj(b, root);
        }
        return loads(b);
      }, py::arg("obj"), py::arg("root") = 0, "The root's picklable object on every rank.")
      .def("gather_obj", [](MN::Communicator& c, py::handle obj, int root) -> py::object {
        MN::Bytes b = bytes_of(dumps(obj));
        std::vector<MN::Bytes> all;
        {
          py::gil_scoped_release r;
          all = c.gather_obj(b, root);
        }
        if (c.rank() != root) return py::none();
        py::list out;
        for (const MN::Bytes& x : all) out.append(loads(x));
        return out;
      }, py::arg("obj"), py::arg("root") = 0, "At the root, every rank's object (a list); None elsewhere.")
      .def("allgather_obj", [](MN::Communicator& c, py::handle obj) {
        MN::Bytes b = bytes_of(dumps(obj));
        std::vector<MN::Bytes> all;
        {
          py::gil_scoped_release r;
          all = c.allgather_obj(b);
        }
        py::list out;
        for (const MN::Bytes& x : all) out.append(loads(x));
        return out;
      }, py::arg("obj"))
      .def("barrier", &MN::Communicator::barrier, R())
      .def("split", &MN::Communicator::split, py::arg("color"), py::arg("key"), R())
      .def("finalize", &MN::Communicator::finalize, R())
      .def("__repr__", [](const MN::Communicator& c) {
        return std::string("<kusari.mn communicator '") + c.name() + "' rank " + std::to_string(c.rank()) + " of " +
               std::to_string(c.size()) + ">";
      });

  m.def("create_communicator",
        [](const std::string& name, py::handle mpi_comm, py::handle allreduce_grad_dtype, bool debug,
           py::handle timeout, py::handle gradients_in_buffer) {
          if (!mpi_comm.is_none()) {
            throw py::value_error("create_communicator: mpi_comm is not supported (kusari makes its communicators "
                                  "over all the job's processes; split() makes sub-communicators)");
          }
          MN::CommunicatorOptions o;
          if (!allreduce_grad_dtype.is_none()) o.allreduce_grad_dtype = dtype_from_python(allreduce_grad_dtype, "create_communicator");
          o.debug = debug;
          if (!timeout.is_none()) o.timeout_seconds = timeout.cast<double>();
          if (!gradients_in_buffer.is_none()) o.gradients_in_buffer = gradients_in_buffer.cast<bool>();
          CommPtr c;
          {
            py::gil_scoped_release r;
            c = MN::create_communicator(name, o);
          }
          install_excepthook();
          return c;
        },
        py::arg("communicator_name") = "pure_nccl", py::arg("mpi_comm") = py::none(),
        py::arg("allreduce_grad_dtype") = py::none(), py::arg("debug") = false, py::arg("timeout") = py::none(),
        py::arg("gradients_in_buffer") = py::none(),
        "A communicator over all the job's processes: 'naive', 'flat' or 'dummy' on CPUs, 'pure_nccl' (the default), "
        "'hierarchical', 'two_dimensional', 'non_cuda_aware' or 'single_node' on GPUs.");

  m.def("create_multi_node_optimizer",
        [](std::shared_ptr<Optimizer> actual, CommPtr comm, bool double_buffering, bool zero_fill, bool overlap,
           py::handle bucket_mb, int zero_stage, int powersgd_rank, int64_t powersgd_start_step) {
          MN::MultiNodeOptimizerOptions o;
          o.double_buffering = double_buffering;
          o.zero_fill = zero_fill;
          o.overlap = overlap;
          o.zero_stage = zero_stage;
          o.powersgd_rank = powersgd_rank;
          o.powersgd_start_step = powersgd_start_step;
          if (!bucket_mb.is_none()) o.bucket_bytes = static_cast<int64_t>(bucket_mb.cast<double>() * (1 << 20));
          py::gil_scoped_release r;
          return MN::create_multi_node_optimizer(std::move(actual), std::move(comm), o);
        },
        py::arg("actual_optimizer"), py::arg("communicator"), py::arg("double_buffering") = false,
        py::arg("zero_fill") = true, py::kw_only(), py::arg("overlap") = false, py::arg("bucket_mb") = py::none(),
        py::arg("zero_stage") = 0, py::arg("powersgd_rank") = 0, py::arg("powersgd_start_step") = 0,
        py::keep_alive<0, 1>(),
        "Wraps an optimizer so that each update averages the gradients over the ranks first; with overlap=True "
        "the averaging runs in buckets while backward runs; zero_stage=1 shards the optimizer's state over the "
        "ranks, zero_stage=2 the gradients too, zero_stage=3 the parameters too (gathered while used; "
        "summon_full_parameters before one rank alone reads them); powersgd_rank=r averages the gradient matrices "
        "as rank-r approximations with error feedback (docs/sharding.md).");

  auto multi_node = [](const std::shared_ptr<Optimizer>& o, const char* fn) {
    auto mn = std::dynamic_pointer_cast<MN::MultiNodeOptimizer>(o);
    if (!mn) throw py::type_error(std::string(fn) + ": expected a multi-node optimizer (create_multi_node_optimizer)");
    return mn;
  };
  m.def("summon_full_parameters",
        [multi_node](std::shared_ptr<Optimizer> optimizer) {
          auto mn = multi_node(optimizer, "summon_full_parameters");
          py::gil_scoped_release r;
          mn->summon_full_parameters();
        },
        py::arg("optimizer"),
        "zero_stage=3: gathers every parameter whole on every rank (collective) and keeps them whole until the next "
        "update, so that one rank alone may read them (save the model, generate, evaluate). Otherwise nothing.");
  m.def("shard_stats",
        [multi_node](std::shared_ptr<Optimizer> optimizer) {
          const MN::ShardStats s = multi_node(optimizer, "shard_stats")->shard_stats();
          py::dict d;
          d["stage"] = s.stage;
          d["shard_elements"] = s.shard_elements;
          d["total_elements"] = s.total_elements;
          d["split_parameters"] = s.split_parameters;
          d["whole_elements"] = s.whole_elements;
          d["gathers"] = s.gathers;
          d["prefetched"] = s.prefetched;
          d["units"] = s.units;
          return d;
        },
        py::arg("optimizer"), "The layout of a sharded multi-node optimizer, as a dict (ShardStats in C++).");

  py::class_<MN::Join>(m, "Join", "Uneven inputs: `with kusari.mn.Join(optimizer):` around a loop whose number of "
                     "steps differs between processes; at the end of the block this process takes part in the "
                     "others' steps (with no gradient of its own) until every process is done.")
      .def(py::init<std::shared_ptr<Optimizer>>(), py::arg("optimizer"))
      .def("finish", [](MN::Join& j) {
        py::gil_scoped_release r;
        j.finish();
      })
      .def("__enter__", [](MN::Join& j) -> MN::Join& { return j; }, py::return_value_policy::reference)
      .def("__exit__", [](MN::Join& j, py::handle type, py::handle, py::handle) {
        if (!type.is_none()) {
          j.abandon();
          return false;
        }
        py::gil_scoped_release r;
        j.finish();
        return false;
      })
      .def_property_readonly("shadow_steps", &MN::Join::shadow_steps);

  m.def("scatter_dataset",
        [](py::handle dataset, CommPtr comm, int root, bool shuffle, py::handle seed, py::handle max_buf_len,
           bool force_equal_length) {
          std::optional<uint64_t> s;
          if (!seed.is_none()) s = seed.cast<uint64_t>();
          std::shared_ptr<Dataset> d = dataset_from_python(dataset, "scatter_dataset");
          std::shared_ptr<Dataset> part;
          {
            py::gil_scoped_release r;
            part = MN::scatter_dataset(d, comm, root, shuffle, s, force_equal_length);
          }
          return part;
        },
        py::arg("dataset"), py::arg("comm"), py::arg("root") = 0, py::arg("shuffle") = false,
        py::arg("seed") = py::none(), py::arg("max_buf_len") = py::none(), py::arg("force_equal_length") = true,
        "This rank's part of the dataset (a kusari dataset or any sequence; None on ranks other than the root, "
        "which then sends them their examples).");
  py::class_<MN::DistributedIterator, Iterator, std::shared_ptr<MN::DistributedIterator>>(m, "DistributedIterator")
      .def(py::init([](py::handle dataset, int64_t batch_size, CommPtr comm, bool shuffle, py::handle seed,
                       const std::string& resize) {
             MN::DistributedIteratorOptions o;
             o.shuffle = shuffle;
             if (!seed.is_none()) o.seed = seed.cast<uint64_t>();
             KUSARI_CHECK(resize == "global" || resize == "process", ValueError,
                          "DistributedIterator: resize is '", resize, "'; expected 'global' (keep the global batch) "
                          "or 'process' (keep each process's batch)");
             o.resize = resize == "global" ? MN::ElasticBatch::kKeepGlobal : MN::ElasticBatch::kKeepPerProcess;
             std::shared_ptr<Dataset> d = dataset_from_python(dataset, "DistributedIterator");
             py::gil_scoped_release r;
             return std::make_shared<MN::DistributedIterator>(d, batch_size, comm, o);
           }),
           py::arg("dataset"), py::arg("batch_size"), py::arg("comm"), py::kw_only(), py::arg("shuffle") = true,
           py::arg("seed") = py::none(), py::arg("resize") = "global",
           "Batches of one order of the whole dataset shared by every process, each taking its part of every global "
           "batch; its snapshot resumes on another number of processes (docs/elastic.md).")
      .def("next_indices", &MN::DistributedIterator::next_indices,
           "This process's part of the next global batch, as dataset indices.")
      .def_property_readonly("global_batch_size", &MN::DistributedIterator::global_batch_size)
      .def_property_readonly("initial_global_batch_size", &MN::DistributedIterator::initial_global_batch_size)
      .def_property_readonly("learning_rate_factor", &MN::DistributedIterator::learning_rate_factor)
      .def_property_readonly("loaded_size", &MN::DistributedIterator::loaded_size)
      .def_property_readonly("current_position", &MN::DistributedIterator::current_position);
  m.def("scatter_index", [](int64_t n, CommPtr comm, int root, bool force_equal_length) {
          return MN::scatter_index(n, comm, root, force_equal_length);
        }, py::arg("n_total_samples"), py::arg("comm"), py::arg("root") = 0, py::arg("force_equal_length") = true, R());

  py::class_<MN::MultiNodeEvaluator, T::Extension, std::shared_ptr<MN::MultiNodeEvaluator>>(m, "MultiNodeEvaluator")
      .def("evaluate", [](MN::MultiNodeEvaluator& e) {
        std::map<std::string, double> r;
        {
          py::gil_scoped_release g;
          r = e.evaluate();
        }
        return r;
      }, "Evaluates this rank's part and averages over the ranks (weighted by their examples).");
  m.def("create_multi_node_evaluator",
        [](std::shared_ptr<T::extensions::Evaluator> actual, CommPtr comm) {
          return MN::create_multi_node_evaluator(std::move(actual), std::move(comm));
        },
        py::arg("actual_evaluator"), py::arg("communicator"), py::keep_alive<0, 1>(),
        "An evaluator whose results are averaged over the ranks, weighted by the examples each evaluated.");

  py::class_<MN::MultiNodeBatchNormalization, links::BatchNormalization,
             std::shared_ptr<MN::MultiNodeBatchNormalization>>(m, "MultiNodeBatchNormalization", py::dynamic_attr())
      .def(py::init<int64_t, CommPtr, double, double, Dtype, bool, bool>(), py::arg("size"), py::arg("comm"),
           py::arg("decay") = 0.9, py::arg("eps") = 2e-5, py::arg("dtype") = Dtype::kFloat32,
           py::arg("use_gamma") = true, py::arg("use_beta") = true);
  m.def("create_mnbn_model", &MN::create_mnbn_model, py::arg("link"), py::arg("comm"),
        "A copy of the model with every BatchNormalization replaced by the multi-node one.");

  py::class_<MN::MultiNodeCheckpointer, T::Extension, std::shared_ptr<MN::MultiNodeCheckpointer>>(m,
                                                                                                 "MultiNodeCheckpointer")
      .def("maybe_load", [](MN::MultiNodeCheckpointer& c, py::handle target, py::handle optimizer) -> py::object {
        Optimizer* o = optimizer.is_none() ? nullptr : &optimizer.cast<Optimizer&>();
        std::optional<int64_t> it;
        if (py::isinstance<T::Trainer>(target)) {
          T::Trainer& t = target.cast<T::Trainer&>();
          py::gil_scoped_release r;
          it = c.maybe_load(t, o);
        } else {
          Link& l = target.cast<Link&>();
          py::gil_scoped_release r;
          it = c.maybe_load(l, o);
        }
        return it ? py::object(py::int_(*it)) : py::object(py::none());
      }, py::arg("trainer"), py::arg("optimizer") = py::none())
      .def("get_stats", &MN::MultiNodeCheckpointer::get_stats);
  m.def("create_multi_node_checkpointer",
        [](const std::string& name, CommPtr comm, int cp_interval, int gc_interval, py::handle path) {
          return MN::create_multi_node_checkpointer(name, std::move(comm), cp_interval, gc_interval,
                                                    path.is_none() ? std::string() : path.cast<std::string>());
        },
        py::arg("name"), py::arg("comm"), py::arg("cp_interval") = 5, py::arg("gc_interval") = 5,
        py::arg("path") = py::none());
  py::class_<MN::MultiNodeSnapshot, T::Extension, std::shared_ptr<MN::MultiNodeSnapshot>>(m, "MultiNodeSnapshot");
  m.def("multi_node_snapshot",
        [](CommPtr comm, std::shared_ptr<T::extensions::Snapshot> snapshot) {
          return MN::multi_node_snapshot(std::move(comm), std::move(snapshot));
        },
        py::arg("comm"), py::arg("snapshot"));
  m.def("load_snapshot_of_each_rank", [](const std::string& path, T::Trainer& trainer, CommPtr comm) {
          return MN::load_snapshot_of_each_rank(path, trainer, comm);
        }, py::arg("path"), py::arg("trainer"), py::arg("comm"), R());

  m.def("newest_complete_snapshot_set",
        [](const std::string& folder, const std::string& prefix) -> py::object {
          auto set = MN::newest_complete_snapshot_set(folder, prefix);
          if (!set) return py::none();
          py::dict d;
          d["iteration"] = set->iteration;
          d["size"] = set->size;
          d["files"] = set->files;
          return d;
        },
        py::arg("folder"), py::arg("prefix") = "snapshot_iter_",
        "The newest complete snapshot set in the folder, of any number of processes, as a dict (iteration, size: the "
        "processes that wrote it, files: by rank), or None.");
  m.def("load_snapshot_files",
        [](const std::vector<std::string>& files, py::handle target, int own, const std::string& path, bool strict) {
          Serializable& s = serializable_of(target, "load_snapshot_files");
          py::gil_scoped_release r;
          MN::load_snapshot_files(files, s, own, path, strict);
        },
        py::arg("files"), py::arg("target"), py::arg("own") = 0, py::arg("path") = "", py::arg("strict") = true,
        "Loads the target from the files that the processes of one job wrote at one save (files[r] by rank r) as "
        "from one unsharded snapshot: a sharded optimizer's state is put together from its pieces; the rest comes "
        "from files[own]. Local (no communication).");
  m.def("merge_snapshot_files",
        [](const std::vector<std::string>& files, const std::string& out, bool compression) {
          py::gil_scoped_release r;
          MN::merge_snapshot_files(files, out, compression);
        },
        py::arg("files"), py::arg("out"), py::arg("compression") = true,
        "Writes the files of one save as one unsharded npz file (atomically) that load_npz and NumPy read.");
  m.def("names_snapshot_folder", &MN::names_snapshot_folder, py::arg("resume"), py::arg("out"),
        "True when a --resume value names a folder to resume from with load_newest_snapshot_set (an existing "
        "folder, or the output folder even before it exists).");
  m.def("load_newest_snapshot_set",
        [](const std::string& folder, T::Trainer& trainer, CommPtr comm, const std::string& prefix) -> py::object {
          std::optional<int64_t> it;
          {
            py::gil_scoped_release r;
            it = MN::load_newest_snapshot_set(folder, trainer, comm, prefix);
          }
          return it ? py::object(py::int_(*it)) : py::object(py::none());
        },
        py::arg("folder"), py::arg("trainer"), py::arg("comm"), py::arg("prefix") = "snapshot_iter_",
        "Resumes the trainer from the newest complete snapshot set in the folder, of any number of processes; "
        "returns its iteration, or None (nothing loaded) when there is none.");

  py::class_<MN::AllreducePersistent, T::Extension, std::shared_ptr<MN::AllreducePersistent>>(m, "AllreducePersistent")
      .def(py::init<std::shared_ptr<Link>, CommPtr>(), py::arg("model"), py::arg("comm"), py::keep_alive<1, 2>());
  py::class_<MN::ObservationAggregator, T::Extension, std::shared_ptr<MN::ObservationAggregator>>(
      m, "ObservationAggregator")
      .def(py::init([](CommPtr comm, const std::string& original_key, py::handle aggregated_key, py::handle comm_trigger,
                       py::handle aggregator) {
             MN::ObservationAggregator::Aggregator agg;
             if (!aggregator.is_none()) {
               auto f = hold(py::reinterpret_borrow<py::object>(aggregator));
               agg = [f](const std::vector<double>& xs) {
                 py::gil_scoped_acquire gil;
                 return f->object(xs).cast<double>();
               };
             }
             return std::make_shared<MN::ObservationAggregator>(
                 std::move(comm), original_key, aggregated_key.is_none() ? std::string() : aggregated_key.cast<std::string>(),
                 trigger_from_python(comm_trigger, "ObservationAggregator"), agg);
           }),
           py::arg("comm"), py::arg("original_key"), py::arg("aggregated_key") = py::none(),
           py::arg("comm_trigger") = py::make_tuple(1, "iteration"), py::arg("aggregator") = py::none());
  py::class_<MN::MultiNodeEarlyStoppingTrigger, T::EarlyStoppingTrigger,
             std::shared_ptr<MN::MultiNodeEarlyStoppingTrigger>>(m, "MultiNodeEarlyStoppingTrigger")
      .def(py::init([](CommPtr comm, py::handle check_trigger, const std::string& monitor, int patience,
                       const std::string& mode, bool verbose, py::handle max_trigger) {
             return std::make_shared<MN::MultiNodeEarlyStoppingTrigger>(
                 std::move(comm), trigger_from_python(check_trigger, "MultiNodeEarlyStoppingTrigger"), monitor, patience,
                 mode, verbose, trigger_from_python(max_trigger, "MultiNodeEarlyStoppingTrigger"));
           }),
           py::arg("comm"), py::arg("check_trigger") = py::make_tuple(1, "epoch"), py::arg("monitor") = "main/loss",
           py::arg("patience") = 3, py::arg("mode") = "auto", py::arg("verbose") = false,
           py::arg("max_trigger") = py::make_tuple(100, "epoch"));
  m.def("create_synchronized_iterator", [](std::shared_ptr<Iterator> it, CommPtr comm) {
          return MN::create_synchronized_iterator(std::move(it), comm);
        }, py::arg("actual_iterator"), py::arg("communicator"), R());
  m.def("create_multi_node_iterator", [](py::handle it, CommPtr comm, int rank_master) {
          std::shared_ptr<Iterator> i = it.is_none() ? nullptr : it.cast<std::shared_ptr<Iterator>>();
          py::gil_scoped_release r;
          return MN::create_multi_node_iterator(i, std::move(comm), rank_master);
        }, py::arg("actual_iterator"), py::arg("communicator"), py::arg("rank_master") = 0);

  // Differentiable communication (chainermn.functions).
  py::module_ f = m.def_submodule("functions", "Differentiable communication (ChainerMN's chainermn.functions)");
  f.def("send", [](const VarArg& x, CommPtr comm, int rank, int tag) { return MN::send(x.v, comm, rank, tag); },
        py::arg("x"), py::arg("communicator"), py::arg("rank"), py::arg("tag") = 0, R());
  f.def("recv", [](CommPtr comm, int rank, py::handle delegate, int tag, py::handle device) {
          Variable d = delegate.is_none() ? Variable() : variable_from_python(delegate, false, "recv");
          const std::optional<Device> dev = optional_device(device);
          py::gil_scoped_release r;
          return MN::recv(comm, rank, d, tag, dev);
        }, py::arg("communicator"), py::arg("rank"), py::arg("delegate_variable") = py::none(), py::arg("tag") = 0,
        py::arg("device") = py::none());
  f.def("pseudo_connect", [](const VarArg& delegate, py::args actual) -> py::object {
          if (actual.size() == 1) return py::cast(MN::pseudo_connect(delegate.v, variable_from_python(actual[0], false, "pseudo_connect")));
          std::vector<Variable> xs;
          for (py::handle h : actual) xs.push_back(variable_from_python(h, false, "pseudo_connect"));
          auto out = MN::pseudo_connect(delegate.v, xs);
          py::tuple t(out.size());
          for (size_t i = 0; i < out.size(); ++i) t[i] = py::cast(out[i]);
          return t;
        }, py::arg("delegate_variable"));
  f.def("allgather", [](CommPtr comm, const VarArg& x) { return MN::allgather(comm, x.v); }, py::arg("comm"),
        py::arg("x"), R());
  f.def("alltoall", [](CommPtr comm, const std::vector<VarArg>& xs) {
          std::vector<Variable> v;
          for (const VarArg& a : xs) v.push_back(a.v);
          py::gil_scoped_release r;
          return MN::alltoall(comm, v);
        }, py::arg("comm"), py::arg("xs"));
  f.def("bcast", [](CommPtr comm, py::handle x, int root, py::handle device) {
          Variable v = x.is_none() ? Variable() : variable_from_python(x, false, "bcast");
          const std::optional<Device> dev = optional_device(device);
          py::gil_scoped_release r;
          return MN::bcast(comm, v, root, dev);
        }, py::arg("comm"), py::arg("x"), py::arg("root") = 0, py::arg("device") = py::none());
  f.def("gather", [](CommPtr comm, const VarArg& x, int root) { return MN::gather(comm, x.v, root); }, py::arg("comm"),
        py::arg("x"), py::arg("root") = 0, R());
  f.def("scatter", [](CommPtr comm, py::handle xs, int root, py::handle device) {
          std::vector<Variable> v;
          if (!xs.is_none()) {
            for (py::handle h : xs) v.push_back(variable_from_python(h, false, "scatter"));
          }
          const std::optional<Device> dev = optional_device(device);
          py::gil_scoped_release r;
          return MN::scatter(comm, v, root, dev);
        }, py::arg("comm"), py::arg("xs"), py::arg("root") = 0, py::arg("device") = py::none());

  m.def("_report_failure_and_exit", [](const std::string& what) {
          py::module_::import("sys").attr("stdout").attr("flush")();
          py::module_::import("sys").attr("stderr").attr("flush")();
          py::gil_scoped_release r;
          MN::detail::report_failure_and_abort(what);
        }, py::arg("what"), "Reports this rank's failure once for the job and ends it (Note [A Python rank that fails]).");
}

#else

void init_mn(py::module_& m) {
  m.def("create_communicator", [](py::args, py::kwargs) {
    throw py::value_error("kusari.mn: this build of kusari has no MPI (the multi-node library was not built)");
  });
}

#endif

}  // namespace kusari::python
