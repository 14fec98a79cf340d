#include "mn/reduce/host_reducer.h"

#include <map>

#include "kusari/core/routines.h"
#include "mn/comm/mpi_communicator.h"
#include "mn/comm/mpi_util.h"
#include "mn/reduce/reducer.h"

namespace kusari::mn::detail {

HostReducer::HostReducer(MpiCommunicator& comm, HostStrategy strategy)
    : comm_(comm),
      strategy_(strategy),
      set_(comm, [&comm] { return gradient_settings(comm.options()); }) {}

void HostReducer::release() {
  buffer_.release();
  set_.clear();
}

Array pack_gradients(const NamedParams& params, Dtype dtype, Device device) {
  int64_t total = 0;
  for (const auto& [path, p] : params) total += p.size();
  Array buffer = Array::empty({total}, dtype, device);
  int64_t at = 0;
  for (const auto& [path, p] : params) {
    const int64_t n = p.size();
    Array dst = buffer.at({Slice(at, at + n)});
    dst.assign(p.grad().reshape({n}).astype(dtype));
    at += n;
  }
  return buffer;
}

void unpack_gradients(const Array& buffer, const NamedParams& params, double scale) {
  int64_t at = 0;
  for (const auto& [path, p] : params) {
    const int64_t n = p.size();
    Array src = buffer.at({Slice(at, at + n)});
    if (scale != 1.0) {
      // 16-bit values are scaled in float32 (as in Communicator::allreduce_inplace).
      src = (is_half_precision(src.dtype()) ? src.astype(Dtype::kFloat32) : src) * scale;
    }
    Array g = p.grad();
    g.assign(src.astype(g.dtype()).reshape(g.shape()));
    at += n;
  }
}

namespace {

// Groups the gradients by dtype (one packed buffer per dtype).
std::map<Dtype, std::vector<std::pair<std::string, Parameter>>> by_dtype(
    const NamedParams& params) {
  std::map<Dtype, std::vector<std::pair<std::string, Parameter>>> groups;
  for (const auto& e : params) groups[e.second.dtype()].push_back(e);
  return groups;
}

}  // namespace

void HostReducer::mean_grad(Link& model, bool zero_fill) {
  NamedParams& params = set_.select(model, zero_fill, buffer_);
  const int size = comm_.size();
  switch (strategy_) {
    case HostStrategy::kPerParameter:
      for (auto& [path, p] : params) {
        Array g = p.grad();
        comm_.allreduce_inplace(g, ReduceOp::kMean);
      }
      set_.check_finite_after_reduce(params);
      return;
    case HostStrategy::kOneBuffer:
      if (params.empty()) return;
      if (mean_grad_in_buffer(params, /*communicate=*/true)) {
        set_.check_finite_after_reduce(params);
        return;
      }
      for (auto& [dtype, group] : by_dtype(params)) {
        const Dtype wire = comm_.options().allreduce_grad_dtype.value_or(dtype);
        Array buffer = pack_gradients(group, wire, Device::cpu());
        allreduce_host(buffer.raw_data(), buffer.size(), wire, ReduceOp::kSum, comm_.comm());
        unpack_gradients(buffer, group, 1.0 / size);
      }
      set_.check_finite_after_reduce(params);
      return;
    case HostStrategy::kMoveOnly:
      if (params.empty() || mean_grad_in_buffer(params, /*communicate=*/false)) return;
      for (auto& [dtype, group] : by_dtype(params)) {
        const Dtype wire = comm_.options().allreduce_grad_dtype.value_or(dtype);
        Array buffer = pack_gradients(group, wire, Device::cpu());
        unpack_gradients(buffer, group, 1.0);
      }
      return;
  }
}

bool HostReducer::mean_grad_in_buffer(const NamedParams& params, bool communicate) {
  if (!set_.in_place()) {  // (in place: the buffer was bound for these gradients, which are still
                           // in it)
    const std::optional<Dtype> dtype =
        buffer_dtype(buffer_, params, Device::cpu(), comm_.options());
    if (!dtype) return false;
    // Segments on 64-byte (cache line) boundaries; no padding.
    for (size_t i : buffer_.bind(params, *dtype, Device::cpu(), 64, 1)) buffer_.adopt(params, i);
  }
  if (communicate) {
    Array flat = buffer_.flat();
    allreduce_host(flat.raw_data(), flat.size(), buffer_.dtype(), ReduceOp::kSum, comm_.comm());
    multiply_to(flat, 1.0 / comm_.size());
  }
  return true;
}

}  // namespace kusari::mn::detail
