#include "kusari/mn/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "kusari/config.h"
#include "kusari/core/routines.h"
#include "mn/comm/mpi_communicator.h"
#include "mn/comm/mpi_util.h"
#include "mn/comm/op_tracker.h"
#include "mn/nccl_library.h"
#include "mn/object_codec.h"
#include "mn/reduce/gradient_set.h"

namespace kusari::mn {

using detail::OpKind;
using detail::OpScope;
using detail::to_comm;
using detail::tracker_of;

namespace {

MPI_Comm comm_of(const Communicator& c) { return to_comm(c.mpi_comm_handle()); }

// Array metadata on the wire: dtype, ndim, shape.
Bytes encode_meta(const Array& x) {
  detail::Writer w;
  w.put<int32_t>(static_cast<int32_t>(x.dtype()));
  w.put<int32_t>(x.ndim());
  for (int64_t d : x.shape()) w.put<int64_t>(d);
  return w.take();
}

Array decode_meta_alloc(const Bytes& b) {
  detail::Reader r(b);
  Dtype dtype = static_cast<Dtype>(r.get<int32_t>());
  int nd = r.get<int32_t>();
  Shape s;
  for (int i = 0; i < nd; ++i) s.push_back(r.get<int64_t>());
  return Array::empty(s, dtype, Device::cpu());
}

Array host_contiguous(const Array& x) { return x.to_device(Device::cpu()).contiguous(); }

}  // namespace

// --- models ------------------------------------------------------------------------------------

void detail::bcast_parameters_over_mpi(Communicator& comm, const NamedParams& params) {
  for (const auto& [path, p] : params) {
    Array data = p.data();
    Array host = host_contiguous(data);
    detail::bcast_bytes(host.raw_data(), host.nbytes(), 0, comm_of(comm));
    if (comm.rank() != 0) data.assign(host.to_device(data.device()));
  }
}

void Communicator::bcast_data(Link& model) {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "bcast_data");
  auto params = model.namedparams(false);
  std::sort(params.begin(), params.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  detail::check_same_parameters(*this, params, "bcast_data", /*device_kind=*/false);
  detail::bcast_parameters_over_mpi(*this, params);
}

// --- arrays ---------------------------------------------------------------------------------------

void Communicator::send(const Array& x, int dest, int tag) {
  KUSARI_CHECK(dest != rank_, ValueError, "send: rank ", rank_, " cannot send to itself");
  KUSARI_CHECK(dest >= 0 && dest < size_, ValueError, "send: destination rank ", dest, " is outside 0..", size_ - 1);
  OpScope scope(tracker_of(*this), OpKind::kSend, "send", dest);
  send_obj(encode_meta(x), dest, tag);
  Array h = host_contiguous(x);
  detail::send_bytes(h.raw_data(), h.nbytes(), dest, tag, comm_of(*this));
}

Array Communicator::recv(int source, int tag, std::optional<Device> device) {
  KUSARI_CHECK(source != rank_, ValueError, "recv: rank ", rank_, " cannot receive from itself");
  KUSARI_CHECK(source >= 0 && source < size_, ValueError, "recv: source rank ", source, " is outside 0..", size_ - 1);
  OpScope scope(tracker_of(*this), OpKind::kRecv, "recv", source);
  Array h = decode_meta_alloc(recv_obj(source, tag));
  detail::recv_bytes(h.raw_data(), h.nbytes(), source, tag, comm_of(*this));
  return h.to_device(device.value_or(Device::cpu()));
}

Array Communicator::bcast(const Array& x, int root, std::optional<Device> device) {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "bcast");
  Bytes meta = bcast_obj(rank_ == root ? encode_meta(x) : Bytes{}, root);
  Array h = rank_ == root ? host_contiguous(x).copy() : decode_meta_alloc(meta);
  detail::bcast_bytes(h.raw_data(), h.nbytes(), root, comm_of(*this));
  return h.to_device(device.value_or(rank_ == root ? x.device() : Device::cpu()));
}

std::vector<Array> Communicator::gather(const Array& x, int root) {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "gather");
  std::vector<Array> out;
  if (rank_ == root) {
    out.resize(static_cast<size_t>(size_));
    out[static_cast<size_t>(root)] = x.copy();
    for (int r = 0; r < size_; ++r) {
      if (r != root) out[static_cast<size_t>(r)] = recv(r, 7001);
    }
  } else {
    send(x, root, 7001);
  }
  return out;
}

std::vector<Array> Communicator::allgather(const Array& x) {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "allgather");
  std::vector<Array> out;
  out.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) out.push_back(bcast(x, r));
  return out;
}

std::vector<Array> Communicator::alltoall(const std::vector<Array>& xs) {
  KUSARI_CHECK(static_cast<int>(xs.size()) == size_, ValueError, "alltoall: got ", xs.size(),
               " arrays but the communicator has ", size_, " ranks (one array per rank is needed)");
  OpScope scope(tracker_of(*this), OpKind::kCollective, "alltoall");
  std::vector<Array> out(static_cast<size_t>(size_));
  out[static_cast<size_t>(rank_)] = xs[static_cast<size_t>(rank_)].copy();
  // Pairwise exchange in a fixed order so that no two ranks wait on each other.
  for (int step = 1; step < size_; ++step) {
    const int to = (rank_ + step) % size_;
    const int from = (rank_ - step + size_) % size_;
    if (rank_ < to) {
      send(xs[static_cast<size_t>(to)], to, 7002);
      out[static_cast<size_t>(from)] = recv(from, 7002);
    } else {
      out[static_cast<size_t>(from)] = recv(from, 7002);
      send(xs[static_cast<size_t>(to)], to, 7002);
    }
  }
  return out;
}

Array Communicator::scatter(const std::vector<Array>& xs, int root, std::optional<Device> device) {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "scatter");
  if (rank_ == root) {
    KUSARI_CHECK(static_cast<int>(xs.size()) == size_, ValueError, "scatter: the root has ", xs.size(),
                 " arrays for ", size_, " ranks");
    for (int r = 0; r < size_; ++r) {
      if (r != root) send(xs[static_cast<size_t>(r)], r, 7003);
    }
    const Array& mine = xs[static_cast<size_t>(root)];
    return mine.copy().to_device(device.value_or(mine.device()));
  }
  return recv(root, 7003, device);
}

Array Communicator::allreduce(const Array& x, ReduceOp op) {
  OpScope scope(tracker_of(*this), "allreduce", x.size(), static_cast<int>(x.dtype()));
  Array y = x.copy();
  allreduce_inplace(y, op);
  return y;
}

void Communicator::allreduce_inplace(Array& x, ReduceOp op) {
  OpScope scope(tracker_of(*this), "allreduce", x.size(), static_cast<int>(x.dtype()));
  KUSARI_CHECK(x.is_contiguous(), ValueError, "allreduce: the array must be contiguous");
  if (x.device().is_cpu()) {
    detail::allreduce_host(x.raw_data(), x.size(), x.dtype(), op, comm_of(*this));
  } else {
    Array h = x.to_device(Device::cpu());
    detail::allreduce_host(h.raw_data(), h.size(), h.dtype(), op, comm_of(*this));
    x.assign(h.to_device(x.device()));
  }
  if (op == ReduceOp::kMean) {
    KUSARI_CHECK(is_floating(x.dtype()), DtypeError, "allreduce: mean needs a floating dtype, got ",
                 dtype_name(x.dtype()));
    // One process: nothing to divide. 16-bit values are divided in float32, where the CPU
    // converts whole rows at once (Note [Half conversion on the CPU]) and the quotient is
    // rounded once.
    if (size_ == 1) return;
    if (is_half_precision(x.dtype())) {
      x.assign(x.astype(Dtype::kFloat32) * (1.0 / size_));
    } else {
      x.assign(x * (1.0 / size_));
    }
  }
}

namespace {

// The same shape and dtype of x on every rank of `comm`, or a ValueError naming `function`, this
// rank's and the first differing rank's.
void check_same_array_kind(Communicator& comm, const Array& x, const char* function) {
  std::ostringstream mine;
  mine << dtype_name(x.dtype()) << " " << x.shape();
  const std::string me = mine.str();
  const std::vector<Bytes> all = comm.allgather_obj(Bytes(me.begin(), me.end()));
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string other(all[r].begin(), all[r].end());
    KUSARI_CHECK(other == me, ValueError, function, ": every rank must pass the same shape and dtype; rank ",
                 comm.rank(), " has ", me, ", rank ", r, " has ", other);
  }
}

}  // namespace

Array Communicator::reduce_scatter(const Array& x, ReduceOp op) {
  OpScope scope(tracker_of(*this), "reduce_scatter", x.size(), static_cast<int>(x.dtype()));
  KUSARI_CHECK(x.ndim() >= 1 && x.shape()[0] % size_ == 0, ValueError, "reduce_scatter: the first axis must be a ",
               "multiple of the number of processes (", size_, "), got shape ", x.shape());
  KUSARI_CHECK(op != ReduceOp::kMean || is_floating(x.dtype()), DtypeError,
               "reduce_scatter: mean needs a floating dtype, got ", dtype_name(x.dtype()));
  check_same_array_kind(*this, x, "reduce_scatter");
  Shape out_shape = x.shape();
  out_shape[0] /= size_;
  const Array in = host_contiguous(x);
  Array out = Array::empty(out_shape, x.dtype(), Device::cpu());
  const std::vector<int64_t> counts(static_cast<size_t>(size_), out.size());
  detail::reduce_scatter_host(in.raw_data(), out.raw_data(), counts, x.dtype(), op, comm_of(*this));
  if (op == ReduceOp::kMean && size_ > 1) {
    out = (is_half_precision(out.dtype()) ? out.astype(Dtype::kFloat32) : out) * (1.0 / size_);
    out = out.astype(x.dtype());
  }
  return out.to_device(x.device());
}

Array Communicator::all_gather(const Array& x) {
  OpScope scope(tracker_of(*this), "all_gather", x.size(), static_cast<int>(x.dtype()));
  check_same_array_kind(*this, x, "all_gather");
  Shape out_shape = x.shape();
  if (out_shape.empty()) {
    out_shape.push_back(size_);
  } else {
    out_shape[0] *= size_;
  }
  const Array in = host_contiguous(x);
  Array out = Array::empty(out_shape, x.dtype(), Device::cpu());
  const std::vector<int64_t> counts(static_cast<size_t>(size_), x.size());
  detail::allgather_host(in.raw_data(), out.raw_data(), counts, x.dtype(), comm_of(*this));
  return out.to_device(x.device());
}

// --- objects -----------------------------------------------------------------------------------

void Communicator::send_obj(const Bytes& obj, int dest, int tag) {
  OpScope scope(tracker_of(*this), OpKind::kSend, "send_obj", dest);
  const int64_t n = static_cast<int64_t>(obj.size());
  MPI_Request request;
  KUSARI_MPI_CHECK(MPI_Isend(&n, 1, MPI_INT64_T, dest, tag, comm_of(*this), &request));
  detail::wait_requests(&request, 1, "MPI_Isend");
  detail::send_bytes(obj.data(), n, dest, tag, comm_of(*this));
}

Bytes Communicator::recv_obj(int source, int tag) {
  OpScope scope(tracker_of(*this), OpKind::kRecv, "recv_obj", source);
  int64_t n = 0;
  MPI_Request request;
  KUSARI_MPI_CHECK(MPI_Irecv(&n, 1, MPI_INT64_T, source, tag, comm_of(*this), &request));
  detail::wait_requests(&request, 1, "MPI_Irecv");
  Bytes b(static_cast<size_t>(n));
  detail::recv_bytes(b.data(), n, source, tag, comm_of(*this));
  return b;
}

Bytes Communicator::bcast_obj(const Bytes& obj, int root) {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "bcast_obj");
  int64_t n = rank_ == root ? static_cast<int64_t>(obj.size()) : 0;
  MPI_Request request;
  KUSARI_MPI_CHECK(MPI_Ibcast(&n, 1, MPI_INT64_T, root, comm_of(*this), &request));
  detail::wait_requests(&request, 1, "MPI_Ibcast");
  Bytes b = rank_ == root ? obj : Bytes(static_cast<size_t>(n));
  detail::bcast_bytes(b.data(), n, root, comm_of(*this));
  return b;
}

std::vector<Bytes> Communicator::gather_obj(const Bytes& obj, int root) {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "gather_obj");
  std::vector<Bytes> out;
  if (rank_ == root) {
    out.resize(static_cast<size_t>(size_));
    out[static_cast<size_t>(root)] = obj;
    for (int r = 0; r < size_; ++r) {
      if (r != root) out[static_cast<size_t>(r)] = recv_obj(r, 7004);
    }
  } else {
    send_obj(obj, root, 7004);
  }
  return out;
}

std::vector<Bytes> Communicator::allgather_obj(const Bytes& obj) {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "allgather_obj");
  std::vector<Bytes> all = gather_obj(obj, 0);
  detail::Writer w;
  if (rank_ == 0) {
    for (const Bytes& b : all) w.put_bytes(b);
  }
  Bytes packed = bcast_obj(w.take(), 0);
  detail::Reader r(packed);
  std::vector<Bytes> out;
  out.reserve(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) out.push_back(r.get_bytes());
  return out;
}

double Communicator::allreduce_obj(double value, ReduceOp op) {
  OpScope scope(tracker_of(*this), "allreduce_obj", 1, static_cast<int>(Dtype::kFloat64));
  detail::allreduce_host(&value, 1, Dtype::kFloat64, op, comm_of(*this));
  return op == ReduceOp::kMean ? value / size_ : value;
}

int64_t Communicator::allreduce_obj(int64_t value, ReduceOp op) {
  OpScope scope(tracker_of(*this), "allreduce_obj", 1, static_cast<int>(Dtype::kInt64));
  KUSARI_CHECK(op != ReduceOp::kMean, ValueError, "allreduce_obj: mean of integers is not defined; use double");
  detail::allreduce_host(&value, 1, Dtype::kInt64, op, comm_of(*this));
  return value;
}

std::vector<double> Communicator::allreduce_obj(const std::vector<double>& values, ReduceOp op) {
  OpScope scope(tracker_of(*this), "allreduce_obj", static_cast<int64_t>(values.size()),
                static_cast<int>(Dtype::kFloat64));
  std::vector<double> v = values;
  detail::allreduce_host(v.data(), static_cast<int64_t>(v.size()), Dtype::kFloat64, op, comm_of(*this));
  if (op == ReduceOp::kMean) {
    for (double& x : v) x /= size_;
  }
  return v;
}

void Communicator::barrier() {
  OpScope scope(tracker_of(*this), OpKind::kCollective, "barrier");
  detail::barrier(comm_of(*this));
}

std::shared_ptr<Communicator> Communicator::split(int, int) {
  KUSARI_THROW(NotImplementedError, name(), ": split is not implemented for this communicator");
}

void Communicator::finalize() {}

Communicator& detail::communicator_of(const std::shared_ptr<Communicator>& comm, const char* function) {
  KUSARI_CHECK(comm != nullptr, ValueError, function,
               ": the communicator is null; pass the one create_communicator returned");
  return *comm;
}

// --- creation ------------------------------------------------------------------------------------

std::vector<std::string> communicator_names() {
  return {"naive", "flat", "dummy", "pure_nccl", "non_cuda_aware", "hierarchical", "two_dimensional", "single_node"};
}

std::shared_ptr<Communicator> create_communicator(const std::string& name, intptr_t mpi_comm,
                                                  const CommunicatorOptions& options) {
  detail::ensure_mpi_initialized();
  MPI_Comm comm = to_comm(mpi_comm);
  for (const char* host : {"naive", "flat", "dummy"}) {
    if (name == host) return std::make_shared<detail::HostCommunicator>(comm, options, host);
  }
  const std::vector<std::string> gpu = {"pure_nccl", "non_cuda_aware", "hierarchical", "two_dimensional",
                                        "single_node"};
  if (std::find(gpu.begin(), gpu.end(), name) != gpu.end()) {
    std::string why;
    const detail::NcclLibrary* nccl = detail::nccl_library(&why);
    KUSARI_CHECK(nccl != nullptr, CommunicatorError, "create_communicator: '", name,
                 "' needs CUDA and NCCL, but ", why, "; on CPU use 'naive' or 'flat'");
    return nccl->create(name, comm, options);
  }
  std::ostringstream names;
  auto all = communicator_names();
  for (size_t i = 0; i < all.size(); ++i) names << (i ? ", " : "") << all[i];
  KUSARI_THROW(ValueError, "create_communicator: unknown communicator '", name, "'; valid names are: ", names.str());
}

std::shared_ptr<Communicator> create_communicator(const std::string& name, const CommunicatorOptions& options) {
  detail::ensure_mpi_initialized();
  return create_communicator(name, detail::from_comm(MPI_COMM_WORLD), options);
}

}  // namespace kusari::mn
