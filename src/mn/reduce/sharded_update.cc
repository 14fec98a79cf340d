#include "mn/reduce/sharded_update.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "kusari/core/routines.h"
#include "kusari/mn/object.h"
#include "mn/comm/mpi_util.h"
#include "mn/snapshot_set.h"

namespace kusari::mn::detail {

// Note [Sharded optimizer]
// ZeRO's first two stages (Rajbhandari et al., 2020), as a strategy of the multi-node optimizer:
// each process keeps the optimizer's state (moments, float32 master copies) of a 1/N part of the
// parameters only, its shard, and every process still holds all parameters.
//
// Layout. The model's initialised parameters, in the reverse of the order the model registers
// them (about the order backward finishes them), are grouped by dtype; each group is one flat
// space (parameter after parameter, each in C order) cut into N shards of nearly equal size
// (shard_bounds). A parameter may be cut between shards when the wrapped optimizer
// steps elementwise (Optimizer::steps_elementwise: SGD, MomentumSGD, Adam, RMSprop, ...) and its
// data is C-contiguous; otherwise it lies whole in one shard (LARS's and LAMB's trust ratios
// need the whole parameter; a channels-last filter is kept whole). Every process computes the
// same layout from the same parameters in the same order.
//
// The wrapped optimizer is attached (Optimizer::retarget) to a link of this process's pieces:
// the parameter itself when it is whole in the shard, else a view of its part, shaped
// (1, ..., 1, n) with the parameter's number of axes and registered under the parameter's path,
// so that set_hyperparam_where selectors and hook predicates by path or by number of axes
// (is_bias_or_norm) choose as they would for the whole parameter. Steps write the views, i.e.
// the model's parameters, in place.
//
// A step (the gradients are those backward left in the model):
//   stage 1  the communicator's multi_node_mean_grad averages the whole gradients (the same
//            path and bits as without sharding); each piece's gradient is a view of its part;
//   stage 2  per group, the gradients are packed (in the wire dtype: allreduce_grad_dtype, else
//            the group's) and reduce-scattered: each process receives the sum of its shard only,
//            scaled by 1/N as the unsharded reducers scale, and the model's gradients are then
//            dropped (after update() they are gone, as in ZeRO-2);
// then the wrapped optimizer steps the pieces, and per group the shards are all-gathered into
// every process's parameters. Numbers over the whole gradient go through the shard sum
// (Optimizer::set_shard_sum: GradientClipping's global norm, dynamic loss scaling's overflow
// count), so every process clips by the same factor and skips the same steps.
//
// Equality with the unsharded optimizer: stage 1 averages exactly as the unsharded run, and
// elementwise steps of a part equal those of the whole, so the parameters are equal bit for bit.
// Stage 2 sums with MPI_Reduce_scatter, whose order of summation over 3 or more processes may
// differ from MPI_Allreduce's: the averages then differ in the last bits (2 processes: equal).
// A global gradient norm is summed per shard, then over the shards: within rounding of the
// unsharded sum.
//
// Snapshots: serialize() writes this process's pieces and the layout, and reads its pieces from
// the files of every process of a save, from an unsharded snapshot, or from its own file of a save
// cut alike (Note [Sharded snapshot files] in snapshot_set.cc): a snapshot loads on any number of
// processes, sharded or not, and an unsharded snapshot loads into a sharded run. State loaded
// before the layout exists (a snapshot read before the first update, before the parameters are
// initialised) is held by the wrapped optimizer for the whole parameters and cut into the pieces
// by plan().
//
// Stage 2 with the optimizer's `overlap` reduce-scatters during backward (the paragraph
// "Overlap" below). Not yet: parameters kept in one flat buffer per group (the step packs and
// unpacks, in chunks of bucket_bytes), the NCCL collectives (GPU gradients are staged through host
// memory), and stage 3.

std::vector<int64_t> shard_bounds(const std::vector<int64_t>& sizes, const std::vector<bool>& splittable,
                                  int processes) {
  KUSARI_CHECK(processes >= 1, ValueError, "shard_bounds: the number of processes must be positive, got ", processes);
  KUSARI_CHECK(sizes.size() == splittable.size(), ValueError, "shard_bounds: ", sizes.size(), " sizes but ",
               splittable.size(), " splittable flags");
  std::vector<int64_t> offsets(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offsets[i + 1] = offsets[i] + sizes[i];
  const int64_t total = offsets.back();
  std::vector<int64_t> bounds(static_cast<size_t>(processes) + 1, 0);
  bounds.back() = total;
  size_t i = 0;  // the parameter the bound falls in
  for (int r = 1; r < processes; ++r) {
    // The even cut (r * total / N, without overflow), moved to the nearer edge of a parameter
    // that cannot be cut; never before the previous bound.
    int64_t b = total / processes * r + total % processes * r / processes;
    while (i < sizes.size() && offsets[i + 1] <= b) ++i;
    if (i < sizes.size() && b > offsets[i] && !splittable[i]) {
      b = (b - offsets[i] <= offsets[i + 1] - b) ? offsets[i] : offsets[i + 1];
    }
    bounds[static_cast<size_t>(r)] = std::max(b, bounds[static_cast<size_t>(r) - 1]);
  }
  return bounds;
}

namespace {

/// A link that holds this process's pieces under the parameters' paths (child links made as the
/// paths need them).
class ShardLink : public Link {
 public:
  void add_at(const std::string& path, const Parameter& p) {
    const size_t slash = path.find('/', 1);
    if (slash == std::string::npos) {
      add_param(path.substr(1), p);
      return;
    }
    const std::string name = path.substr(1, slash - 1);
    std::shared_ptr<ShardLink> child;
    for (const auto& [n, c] : children()) {
      if (n == name) child = std::static_pointer_cast<ShardLink>(c);
    }
    if (!child) child = add_link(name, std::make_shared<ShardLink>());
    child->add_at(path.substr(slash), p);
  }
  const char* type_name() const override { return "ShardLink"; }
};

/// The shape of a part of n elements of a parameter of `ndim` axes: (1, ..., 1, n).
Shape piece_shape(int ndim, int64_t n) {
  Shape s;
  for (int i = 0; i + 1 < ndim; ++i) s.push_back(1);
  s.push_back(n);
  return s;
}

/// Elements [lo, hi) of a C-contiguous array, as a view shaped `shape`.
Array part_of(const Array& a, int64_t lo, int64_t hi, const Shape& shape) {
  return a.reshape({a.size()}).at({Slice(lo, hi)}).reshape(shape);
}

/// True when `named` has a parameter `path` of shape `shape`.
bool same_shape_in(const std::vector<std::pair<std::string, Parameter>>& named, const std::string& path,
                   const Shape& shape) {
  for (const auto& [p, param] : named) {
    if (p == path) return param.shape() == shape;
  }
  return false;
}

}  // namespace

ShardedUpdate::ShardedUpdate(std::shared_ptr<Communicator> comm, int stage, int64_t chunk_bytes, bool overlap)
    : comm_(std::move(comm)), stage_(stage), chunk_bytes_(chunk_bytes), overlap_(overlap) {
  KUSARI_CHECK(stage_ >= 1 && stage_ <= 3, ValueError, "ShardedUpdate: stage must be 1, 2 or 3, got ", stage_);
  if (stage_ == 3) overlap_ = true;  // (its gradients are reduce-scattered during backward)
  KUSARI_CHECK(chunk_bytes_ > 0, ValueError, "create_multi_node_optimizer: bucket_bytes (the chunk of the sharded "
               "step) must be positive, got ", chunk_bytes_);
  KUSARI_CHECK(!overlap_ || stage_ >= 2, NotImplementedError, "create_multi_node_optimizer: zero_stage 1 cannot be "
               "combined with overlap (its gradients are averaged whole); zero_stage 2 overlaps its reduce-scatter");
  // The chunks' collectives get a communicator of their own: a model may run collectives of its
  // own during backward, which must not interleave with them in another order on another process.
  if (overlap_) KUSARI_MPI_CHECK(MPI_Comm_dup(to_comm(comm_->mpi_comm_handle()), &dup_));
  if (stage_ == 3) KUSARI_MPI_CHECK(MPI_Comm_dup(to_comm(comm_->mpi_comm_handle()), &gather_dup_));
}

namespace {

/// What a released parameter reads once its sharded optimizer is gone.
class Orphaned final : public ::kusari::detail::DataSource {
 public:
  void materialize(::kusari::detail::VariableImpl& impl) override {
    KUSARI_THROW(ValueError, "the parameter ", impl.name.empty() ? std::string() : impl.name + " ",
                 "was sharded over the processes by a multi-node optimizer (zero_stage 3) that no longer exists, "
                 "and its values went with it; call summon_full_parameters() on that optimizer before dropping it");
  }
};

Orphaned& orphaned() {
  static Orphaned o;
  return o;
}

}  // namespace

ShardedUpdate::~ShardedUpdate() {
  detach_hooks();
  ::kusari::detail::cancel_calls_at_next_node(this);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (prefetch_ && !finalized) {
    try {
      wait_prefetch(false);
    } catch (...) {
      // (the communicator failed: the job ends with its report)
    }
  }
  for (Group& g : groups_) {
    for (Entry& e : g.entries) {
      if (e.param.defined() && e.param.impl().source == this) e.param.impl().source = &orphaned();
    }
  }
  // Chunks a backward launched without an update after it: MPI still writes into their buffers.
  if (!finalized && next_chunk_ > 0) {
    try {
      drain();
    } catch (...) {
      // (the communicator failed: the job ends with its report)
    }
  }
  if (dup_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&dup_);
  if (gather_dup_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&gather_dup_);
}

std::vector<int64_t> ShardedUpdate::Group::counts() const {
  std::vector<int64_t> c(bounds.size() - 1);
  for (size_t r = 0; r + 1 < bounds.size(); ++r) c[r] = bounds[r + 1] - bounds[r];
  return c;
}

void ShardedUpdate::plan(Link& model, Optimizer& actual) {
  // The flat space follows the parameters in the reverse of the order the model registers them,
  // which is about the order backward finishes their gradients: the overlapped reduce-scatter
  // launches its chunks in this order (every process computes the same order).
  auto named = model.namedparams(false);
  std::reverse(named.begin(), named.end());

  // The state the optimizer holds for whole parameters (loaded, or from an unsharded start).
  // The state of a piece of the layout before (forget() keeps it until now) is kept when the new
  // layout cuts the same piece (the parameters were loaded, or broadcast, in place); a piece cut
  // otherwise cannot be cut again, and starts afresh.
  struct Held {
    int64_t t = 0;
    std::vector<std::pair<std::string, Array>> arrays;
    bool piece = false;  // of an earlier layout's piece [lo, hi)
    int64_t lo = 0, hi = 0;
  };
  std::map<std::string, Held> held;
  if (actual.target()) {
    for (ParamState& s : actual.param_states()) {
      if (!s.initialized) continue;
      if (same_shape_in(named, s.path, s.param.shape())) {
        held[s.path] = Held{s.t, s.arrays};
      } else if (const Piece* old = piece_of(s.path); old != nullptr && !old->whole &&
                 old->shard.shape() == s.param.shape()) {
        held[s.path] = Held{s.t, s.arrays, true, old->lo, old->hi};
      }
    }
  }

  groups_.clear();
  std::map<Dtype, size_t> group_of;
  for (auto& [path, p] : named) {
    auto [it, fresh] = group_of.emplace(p.dtype(), groups_.size());
    if (fresh) {
      groups_.emplace_back();
      groups_.back().dtype = p.dtype();
    }
    Group& g = groups_[it->second];
    const int64_t offset = g.entries.empty() ? 0 : g.entries.back().offset + g.entries.back().size;
    Entry e{path, p, offset, p.size()};
    e.shape = p.shape();
    e.device = p.device();
    e.format = p.data().memory_format();
    if (stage_ == 3)
      e.placeholder = Array::empty({1}, p.dtype(), p.device()).broadcast_to(p.shape());
    g.entries.push_back(std::move(e));
  }
  const int rank = comm_->rank();
  auto link = std::make_shared<ShardLink>();
  const bool elementwise = actual.steps_elementwise();
  for (Group& g : groups_) {
    std::vector<int64_t> sizes;
    std::vector<bool> splittable;
    for (const Entry& e : g.entries) {
      sizes.push_back(e.size);
      splittable.push_back(elementwise && e.param.data().is_contiguous());
    }
    g.bounds = shard_bounds(sizes, splittable, comm_->size());
    const int64_t begin = g.bounds[static_cast<size_t>(rank)];
    const int64_t end = g.bounds[static_cast<size_t>(rank) + 1];
    for (const Entry& e : g.entries) {
      const int64_t lo = std::max(begin, e.offset) - e.offset;
      const int64_t hi = std::min(end, e.offset + e.size) - e.offset;
      if (hi <= lo) continue;
      Piece piece;
      piece.path = e.path;
      piece.param = e.param;
      piece.lo = lo;
      piece.hi = hi;
      piece.flat = e.offset + lo;
      piece.whole = lo == 0 && hi == e.size;
      if (stage_ == 3) {
        // The shard owns its values: the model's whole parameters are released after the step.
        const Array& data = e.param.data();
        piece.shard = Parameter(
            piece.whole
                ? data.copy()
                : part_of(data.contiguous(), lo, hi, piece_shape(data.ndim(), hi - lo)).copy());
      } else {
        piece.shard =
            piece.whole
                ? Parameter(e.param.data())
                : Parameter(part_of(e.param.data(), lo, hi, piece_shape(e.param.ndim(), hi - lo)));
      }
      link->add_at(e.path, piece.shard);
      g.pieces.push_back(std::move(piece));
    }
  }
  shard_link_ = link;
  actual.retarget(shard_link_);
  auto shard_sum = [comm = comm_](double local) { return comm->allreduce_obj(local, ReduceOp::kSum); };
  actual.set_shard_sum(shard_sum);

  // Cut the held states into the pieces.
  if (!held.empty()) {
    for (ParamState& s : actual.param_states()) {
      auto it = held.find(s.path);
      if (it == held.end()) continue;
      const Piece* piece = piece_of(s.path);
      if (it->second.piece && (piece->whole || piece->lo != it->second.lo || piece->hi != it->second.hi)) continue;
      s.t = it->second.t;
      s.arrays.clear();
      if (it->second.piece) {
        s.arrays = it->second.arrays;
        s.initialized = true;
        continue;
      }
      for (auto& [name, a] : it->second.arrays) {
        if (!a.defined() || piece->whole || a.size() != piece->param.size()) {
          s.arrays.emplace_back(name, a);
        } else {
          s.arrays.emplace_back(name, part_of(a.contiguous(), piece->lo, piece->hi, s.param.shape()).copy());
        }
      }
      s.initialized = true;
    }
  }
  planned_ = true;
  if (overlap_) {
    make_chunks();
    attach_hooks();
  }
  if (stage_ == 3) {
    make_units();
    for (Unit& u : units_) u.live = true;
    release_all();
  }
}

void ShardedUpdate::forget() {
  if (stage_ == 3 && planned_) {
    // The parameters become whole again (collective): a new layout is cut from them.
    gather_all();
    units_.clear();
    where_.clear();
    entry_unit_.clear();
    trace_.clear();
    last_trace_.clear();
    ::kusari::detail::cancel_calls_at_next_node(this);
  }
  if (overlap_) {
    detach_hooks();
    if (next_chunk_ > 0) drain();  // (a backward launched chunks before the parameter set changed)
    chunks_.clear();
    requests_.clear();
  }
  planned_ = false;  // (groups_ stays for the next plan(), which keeps the pieces it cuts alike)
  shard_link_.reset();
}

const ShardedUpdate::Piece* ShardedUpdate::piece_of(const std::string& path) const {
  for (const Group& g : groups_) {
    for (const Piece& p : g.pieces) {
      if (p.path == path) return &p;
    }
  }
  return nullptr;
}

int64_t ShardedUpdate::shard_elements() const {
  int64_t n = 0;
  for (const Group& g : groups_) n += g.bounds[static_cast<size_t>(comm_->rank()) + 1] - g.bounds[static_cast<size_t>(comm_->rank())];
  return n;
}

int64_t ShardedUpdate::total_elements() const {
  int64_t n = 0;
  for (const Group& g : groups_) n += g.bounds.back();
  return n;
}

int64_t ShardedUpdate::split_parameters() const {
  int64_t n = 0;
  for (const Group& g : groups_) {
    for (size_t r = 1; r + 1 < g.bounds.size(); ++r) {
      const int64_t b = g.bounds[r];
      for (const Entry& e : g.entries) {
        if (b > e.offset && b < e.offset + e.size) {
          ++n;
          break;
        }
      }
    }
  }
  return n;
}

void ShardedUpdate::shard_grads_from_model(Group& g, double scale) {
  for (Piece& piece : g.pieces) {
    Array grad = piece.param.grad();
    if (grad.defined() && scale != 1.0) multiply_to(grad, scale);
    if (!grad.defined()) {
      piece.shard.set_grad(Array());
    } else if (piece.whole) {
      piece.shard.set_grad(grad);
    } else {
      piece.shard.set_grad(part_of(grad.is_contiguous() ? grad : grad.contiguous(), piece.lo, piece.hi,
                                   piece.shard.shape()));
    }
  }
}

namespace {

/// The elements of [a, b) in each process's shard.
std::vector<int64_t> counts_within(const std::vector<int64_t>& bounds, int64_t a, int64_t b) {
  std::vector<int64_t> c(bounds.size() - 1);
  for (size_t r = 0; r + 1 < bounds.size(); ++r) c[r] = std::max<int64_t>(0, std::min(b, bounds[r + 1]) - std::max(a, bounds[r]));
  return c;
}

/// A parameter's values (or gradient) as a flat host array in C order: a view on the CPU when
/// the array is C-contiguous, else a copy.
Array host_flat(const Array& a) { return a.to_device(Device::cpu()).reshape({a.size()}); }

}  // namespace

// The flat space of a group is reduced and gathered in chunks of chunk_elements_ (the
// optimizer's bucket_bytes): MPI's reduce-scatter and all-gather take a count per process, so a
// chunk may cover any part of any shards, and the step needs one chunk of host memory, not a copy
// of the whole group.
void ShardedUpdate::reduce_scatter_grads(Group& g, bool zero_fill, double scale) {
  const int rank = comm_->rank();
  const Dtype wire = comm_->options().allreduce_grad_dtype.value_or(g.dtype);
  const int64_t begin = g.bounds[static_cast<size_t>(rank)];
  const int64_t end = g.bounds[static_cast<size_t>(rank) + 1];
  const int64_t total = g.bounds.back();
  const int64_t item = static_cast<int64_t>(itemsize(wire));
  const int64_t chunk = std::max<int64_t>(1, chunk_bytes_ / item);
  std::vector<Array> grads(g.entries.size());  // host views, made when a chunk first needs them
  std::vector<bool> present(g.entries.size());
  for (size_t i = 0; i < g.entries.size(); ++i) present[i] = g.entries[i].param.grad().defined();
  Array shard = Array::empty({end - begin}, wire, Device::cpu());
  Array buffer = Array::empty({std::min(chunk, total)}, wire, Device::cpu());
  size_t first = 0;  // the first entry that reaches into the chunk
  for (int64_t a = 0; a < total; a += chunk) {
    const int64_t b = std::min(total, a + chunk);
    while (g.entries[first].offset + g.entries[first].size <= a) ++first;
    for (size_t i = first; i < g.entries.size() && g.entries[i].offset < b; ++i) {
      const Entry& e = g.entries[i];
      const int64_t lo = std::max(a, e.offset) - e.offset;
      const int64_t hi = std::min(b, e.offset + e.size) - e.offset;
      Array dst = buffer.at({Slice(e.offset + lo - a, e.offset + hi - a)});
      if (!present[i]) {
        dst.fill(0.0);
        continue;
      }
      if (!grads[i].defined()) grads[i] = host_flat(e.param.grad());
      dst.assign(grads[i].at({Slice(lo, hi)}).astype(wire));
      if (hi == e.size) grads[i] = Array();  // (done with it: a copy is freed at once)
    }
    char* out = static_cast<char*>(shard.raw_data()) + std::max<int64_t>(0, std::min(std::max(a, begin), end) - begin) * item;
    reduce_scatter_host(buffer.raw_data(), out, counts_within(g.bounds, a, b), wire, ReduceOp::kSum,
                        to_comm(comm_->mpi_comm_handle()));
  }
  buffer = Array();
  pieces_from_shard(g, shard, present, zero_fill, scale);
}

void ShardedUpdate::pieces_from_shard(Group& g, Array shard, const std::vector<bool>& present, bool zero_fill,
                                      double scale) {
  const int64_t begin = g.bounds[static_cast<size_t>(comm_->rank())];
  // Scaled as the unsharded reducers scale (16-bit values in float32, rounded once); in place
  // where the shard's dtype allows, so that the pieces' gradients can be views of it.
  if (is_half_precision(shard.dtype()) && (comm_->size() > 1 || scale != 1.0)) shard = shard.astype(Dtype::kFloat32);
  if (comm_->size() > 1) multiply_to(shard, 1.0 / comm_->size());
  if (scale != 1.0) multiply_to(shard, scale);
  size_t i = 0;
  for (Piece& piece : g.pieces) {
    while (g.entries[i].path != piece.path) ++i;
    if (!present[i] && !zero_fill) {
      piece.shard.set_grad(Array());  // (every process agrees that it has none)
      continue;
    }
    const Array part = shard.at({Slice(piece.flat - begin, piece.flat - begin + (piece.hi - piece.lo))});
    const Array& data = piece.shard.data();
    if (data.device().is_cpu() && data.dtype() == part.dtype() && data.is_contiguous()) {
      piece.shard.set_grad(part.reshape(data.shape()));  // (a view of the shard: no copy)
      continue;
    }
    Array grad = Array::empty_like(data);
    grad.assign(part.astype(data.dtype()).reshape(data.shape()).to_device(data.device()));
    piece.shard.set_grad(grad);
  }
}

void ShardedUpdate::all_gather_params(Group& g) {
  const int rank = comm_->rank();
  const int64_t begin = g.bounds[static_cast<size_t>(rank)];
  const int64_t end = g.bounds[static_cast<size_t>(rank) + 1];
  const int64_t total = g.bounds.back();
  const int64_t item = static_cast<int64_t>(itemsize(g.dtype));
  const int64_t chunk = std::max<int64_t>(1, chunk_bytes_ / item);
  // Where the gathered values go: the parameter's own memory when it is a C-contiguous CPU array,
  // else a host copy assigned once its last chunk came.
  std::vector<Array> targets(g.entries.size());
  Array buffer = Array::empty({std::min(chunk, total)}, g.dtype, Device::cpu());
  size_t first = 0;
  size_t piece = 0;
  for (int64_t a = 0; a < total; a += chunk) {
    const int64_t b = std::min(total, a + chunk);
    // This process's part of the chunk, from its pieces (stepped in place).
    for (; piece < g.pieces.size() && g.pieces[piece].flat < b; ++piece) {
      const Piece& p = g.pieces[piece];
      const int64_t len = p.hi - p.lo;
      const int64_t lo = std::max(a, p.flat) - p.flat;
      const int64_t hi = std::min(b, p.flat + len) - p.flat;
      buffer.at({Slice(p.flat + lo - a, p.flat + hi - a)}).assign(host_flat(p.shard.data()).at({Slice(lo, hi)}));
      if (p.flat + len > b) break;  // (it goes on in the next chunk)
    }
    const int64_t mine = std::min(std::max(a, begin), b);
    allgather_host(static_cast<char*>(buffer.raw_data()) + (mine - a) * item, buffer.raw_data(),
                   counts_within(g.bounds, a, b), g.dtype, to_comm(comm_->mpi_comm_handle()));
    while (g.entries[first].offset + g.entries[first].size <= a) ++first;
    for (size_t i = first; i < g.entries.size() && g.entries[i].offset < b; ++i) {
      const Entry& e = g.entries[i];
      if (e.offset >= begin && e.offset + e.size <= end) continue;  // stepped here, in place
      Array data = e.param.data();
      if (!targets[i].defined()) {
        const bool direct = data.device().is_cpu() && data.is_contiguous();
        targets[i] = direct ? data.reshape({e.size}) : Array::empty({e.size}, g.dtype, Device::cpu());
      }
      const int64_t lo = std::max(a, e.offset) - e.offset;
      const int64_t hi = std::min(b, e.offset + e.size) - e.offset;
      targets[i].at({Slice(lo, hi)}).assign(buffer.at({Slice(e.offset + lo - a, e.offset + hi - a)}));
      if (hi == e.size) {
        if (!targets[i].same_view(data.reshape({e.size}))) data.assign(targets[i].reshape(data.shape()).to_device(data.device()));
        targets[i] = Array();
      }
    }
  }
}

void ShardedUpdate::step(Link& model, Optimizer& actual, bool zero_fill, double scale) {
  KUSARI_CHECK(planned_, ValueError, "ShardedUpdate::step: plan() first");
  if (stage_ == 1) {
    comm_->multi_node_mean_grad(model, zero_fill);
    for (Group& g : groups_) shard_grads_from_model(g, scale);
  } else if (overlap_) {
    finish_overlapped(zero_fill, scale);
    model.cleargrads();
    if (stage_ == 3) {
      // Whole values set in place since they were gathered go back into the pieces before the
      // step; the next forward gathers the stepped values.
      wait_prefetch(false);
      release_all();
      last_trace_ = std::move(trace_);
      trace_.clear();
    }
  } else {
    for (Group& g : groups_) reduce_scatter_grads(g, zero_fill, scale);
    model.cleargrads();
  }
  for (Group& g : groups_) {
    for (Piece& piece : g.pieces) {
      piece.shard.impl().update_enabled = piece.param.impl().update_enabled;
      // The loss scale the gradient was computed with, which update() undoes (Note [Optimizer
      // step order]): backward put it on the model's parameter, the pieces carry it.
      piece.shard.impl().loss_scale = piece.param.impl().loss_scale;
    }
  }
  model.for_each_param([](const Parameter& p) { p.impl().loss_scale = 1.0; });
  actual.update();
  if (stage_ != 3) {
    for (Group& g : groups_) all_gather_params(g);
  }
  for (Group& g : groups_) {
    for (Piece& piece : g.pieces) {
      // Stage 1: views of the model's gradients; stage 2: of the shard (its buffer is reused).
      if (stage_ >= 2 || !piece.whole) piece.shard.set_grad(Array());
    }
  }
}

// Overlap (stage 2 with the optimizer's `overlap`; Note [Sharded optimizer]): the chunks of the flat space (bucket_bytes
// each, in the order of the flat space, which follows the reverse of the model's registration
// order: about the order backward finishes the gradients) are reduce-scattered while backward
// runs. Every parameter has a gradient-ready hook; when the last gradient a chunk covers is
// final, the chunk is packed (the wire dtype, as the step after backward packs it) and launched
// with MPI_Ireduce_scatter on a duplicate of the communicator, but only after every chunk before
// it: the chunks go out strictly in order on every process, so the collectives match even where
// backward finishes the gradients in another order (a process then only launches later). A
// gradient whose chunks are all packed is dropped at once, so that the model's gradients do not
// live whole until the step: what stays is this process's shard of them and the chunks in
// flight (at most kChunksInFlight, 8: a process whose peers lag would otherwise hold every chunk's
// buffer, host memory for a device gradient; on the CPU a packed chunk only replaces the gradients
// it frees. Two were too few: with 4 processes on 2 cores the gradients waiting behind them were
// half the model's at the end of backward, bench_mn_sharding; a ready chunk beyond the limit waits,
// unpacked, for a later hook or the update - a hook
// never blocks, since a peer may be in a collective of the model's own, or of a Join, that this
// process has yet to reach). The hooks also test the requests in flight, which moves MPI on
// while backward runs.
// The update packs and launches the chunks not launched yet (a parameter without a gradient
// sends zeros), waits for all, and gives the pieces their means as the step after backward does.
// Gradient accumulation holds the hooks (hold()) for every backward but the last; a gradient
// finished again after its chunk went out is an error, as in the bucketed overlap.

void ShardedUpdate::make_chunks() {
  chunks_.clear();
  shard_grads_.clear();
  ready_.assign(groups_.size(), {});
  present_.assign(groups_.size(), {});
  unpacked_.assign(groups_.size(), {});
  entry_chunks_.assign(groups_.size(), {});
  host_grads_.assign(groups_.size(), {});
  const int rank = comm_->rank();
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    const Dtype wire = comm_->options().allreduce_grad_dtype.value_or(g.dtype);
    const int64_t item = static_cast<int64_t>(itemsize(wire));
    const int64_t chunk = std::max<int64_t>(1, std::min(chunk_bytes_ / item, max_chunk_elements()));
    shard_grads_.push_back(Array::empty({g.bounds[static_cast<size_t>(rank) + 1] - g.bounds[static_cast<size_t>(rank)]},
                                        wire, Device::cpu()));
    ready_[gi].assign(g.entries.size(), 0);
    present_[gi].assign(g.entries.size(), 0);
    unpacked_[gi].assign(g.entries.size(), 0);
    entry_chunks_[gi].assign(g.entries.size(), {0, 0});
    host_grads_[gi].assign(g.entries.size(), Array());
    size_t first = 0;
    for (int64_t a = 0; a < g.bounds.back(); a += chunk) {
      Chunk c;
      c.group = gi;
      c.a = a;
      c.b = std::min(g.bounds.back(), a + chunk);
      while (g.entries[first].offset + g.entries[first].size <= a) ++first;
      c.first = first;
      c.last = first;
      while (c.last < g.entries.size() && g.entries[c.last].offset < c.b) ++unpacked_[gi][c.last++];
      for (size_t i = c.first; i < c.last; ++i) {
        auto& range = entry_chunks_[gi][i];
        if (range.second == 0) range.first = chunks_.size();
        range.second = chunks_.size() + 1;
      }
      chunks_.push_back(std::move(c));
    }
  }
  requests_.assign(chunks_.size(), MPI_REQUEST_NULL);
  reset_overlap();
}

void ShardedUpdate::reset_overlap() {
  next_chunk_ = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    std::fill(ready_[gi].begin(), ready_[gi].end(), 0);
    std::fill(present_[gi].begin(), present_[gi].end(), 0);
    std::fill(unpacked_[gi].begin(), unpacked_[gi].end(), 0);
    std::fill(host_grads_[gi].begin(), host_grads_[gi].end(), Array());
  }
  for (Chunk& c : chunks_) {
    c.launched = false;
    c.send = Array();
    c.pending = static_cast<int>(c.last - c.first);
    for (size_t i = c.first; i < c.last; ++i) ++unpacked_[c.group][i];
  }
}

void ShardedUpdate::attach_hooks() {
  detach_hooks();
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (size_t i = 0; i < groups_[gi].entries.size(); ++i) {
      Parameter p = groups_[gi].entries[i].param;
      const int64_t id = p.add_grad_ready_hook([this, gi, i](const Variable&) { on_ready(gi, i); });
      hooks_.emplace_back(p, id);
    }
  }
}

void ShardedUpdate::detach_hooks() {
  for (auto& [p, id] : hooks_) p.remove_grad_ready_hook(id);
  hooks_.clear();
}

void ShardedUpdate::on_ready(size_t gi, size_t i) {
  if (stage_ == 3) note_ready(gi, i);
  if (holding_) return;
  const Entry& e = groups_[gi].entries[i];
  const auto [from, to] = entry_chunks_[gi][i];
  if (ready_[gi][i]) {
    KUSARI_CHECK(unpacked_[gi][i] > 0 && std::none_of(chunks_.begin() + static_cast<std::ptrdiff_t>(from),
                                                      chunks_.begin() + static_cast<std::ptrdiff_t>(to),
                                                      [](const Chunk& c) { return c.launched; }),
                 ValueError, "MultiNodeOptimizer (zero_stage 2, overlap): the gradient of ", e.path,
                 " was finished again after it was sent; accumulate gradients with update_accumulated (or "
                 "hold the overlap for every backward but the last)");
    return;
  }
  ready_[gi][i] = 1;
  for (size_t k = from; k < to; ++k) --chunks_[k].pending;
  // Move the chunks in flight on while backward runs, free the buffers of those done, and launch
  // what is ready within the limit. A hook never waits: a peer may be in a collective of the
  // model's own (or of a Join) that this process has yet to reach.
  // (MPI_Testsome frees each request that completed; MPI_Testall frees none until all have, which
  // kept a finished chunk counted in flight, and the ready chunks after it waiting, with their
  // gradients, while an earlier one was still out.)
  int done = 0;
  std::vector<int> indices(next_chunk_);
  KUSARI_MPI_CHECK(MPI_Testsome(static_cast<int>(next_chunk_), requests_.data(), &done, indices.data(),
                                MPI_STATUSES_IGNORE));
  for (size_t k = 0; k < next_chunk_; ++k) {
    if (requests_[k] == MPI_REQUEST_NULL) chunks_[k].send = Array();
  }
  while (next_chunk_ < chunks_.size() && chunks_[next_chunk_].pending == 0 && chunks_in_flight() < kChunksInFlight) {
    launch(next_chunk_++);
  }
}

void ShardedUpdate::drain() {
  // The processes may have launched different numbers of chunks (a chunk beyond the limit waits
  // for a later hook): every process launches the rest, so that every collective matches.
  while (next_chunk_ < chunks_.size()) launch(next_chunk_++);
  wait_requests(requests_.data(), static_cast<int>(requests_.size()), "MPI_Ireduce_scatter (the sharded gradients)");
  reset_overlap();
}

size_t ShardedUpdate::chunks_in_flight() const {
  size_t n = 0;
  for (size_t j = 0; j < next_chunk_; ++j) n += requests_[j] != MPI_REQUEST_NULL ? 1 : 0;
  return n;
}

void ShardedUpdate::launch(size_t k) {
  Chunk& c = chunks_[k];
  Group& g = groups_[c.group];
  const int rank = comm_->rank();
  const Dtype wire = shard_grads_[c.group].dtype();
  const int64_t item = static_cast<int64_t>(itemsize(wire));
  const int64_t begin = g.bounds[static_cast<size_t>(rank)];
  const int64_t end = g.bounds[static_cast<size_t>(rank) + 1];
  c.send = Array::empty({c.b - c.a}, wire, Device::cpu());
  for (size_t i = c.first; i < c.last; ++i) {
    const Entry& e = g.entries[i];
    const int64_t lo = std::max(c.a, e.offset) - e.offset;
    const int64_t hi = std::min(c.b, e.offset + e.size) - e.offset;
    Array dst = c.send.at({Slice(e.offset + lo - c.a, e.offset + hi - c.a)});
    // One host copy of a device gradient for all of its chunks (a host gradient is its own view).
    Array& host = host_grads_[c.group][i];
    if (!host.defined() && e.param.grad().defined()) host = host_flat(e.param.grad());
    if (host.defined()) {
      dst.assign(host.at({Slice(lo, hi)}).astype(wire));
      present_[c.group][i] = 1;
    } else {
      dst.fill(0.0);
    }
    if (--unpacked_[c.group][i] == 0) {
      host = Array();
      Parameter(e.param).cleargrad();  // (sent: this process keeps its shard only)
    }
  }
  const std::vector<int64_t> counts = counts_within(g.bounds, c.a, c.b);
  std::vector<int> counts32(counts.begin(), counts.end());
  char* out = static_cast<char*>(shard_grads_[c.group].raw_data()) +
              std::max<int64_t>(0, std::min(std::max(c.a, begin), end) - begin) * item;
  KUSARI_MPI_CHECK(MPI_Ireduce_scatter(c.send.raw_data(), out, counts32.data(), mpi_datatype(wire),
                                       mpi_op(ReduceOp::kSum, wire), dup_, &requests_[k]));
  c.launched = true;
}

void ShardedUpdate::finish_overlapped(bool zero_fill, double scale) {
  // The rest, still at most kChunksInFlight at once (the update may wait).
  while (next_chunk_ < chunks_.size()) {
    for (size_t j = 0; j < next_chunk_ && chunks_in_flight() >= kChunksInFlight; ++j) {
      if (requests_[j] == MPI_REQUEST_NULL) continue;
      wait_requests(&requests_[j], 1, "MPI_Ireduce_scatter (the sharded gradients)");
      chunks_[j].send = Array();
    }
    launch(next_chunk_++);
  }
  wait_requests(requests_.data(), static_cast<int>(requests_.size()), "MPI_Ireduce_scatter (the sharded gradients)");
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    std::vector<bool> present(present_[gi].begin(), present_[gi].end());
    pieces_from_shard(groups_[gi], shard_grads_[gi], present, zero_fill, scale);
  }
  for (Chunk& c : chunks_) c.send = Array();
  reset_overlap();
}

ShardLayout ShardedUpdate::layout() const {
  ShardLayout layout;
  layout.processes = comm_->size();
  layout.rank = comm_->rank();
  layout.stage = stage_;
  for (const Group& g : groups_) {
    ShardLayout::Group out;
    out.dtype = dtype_name(g.dtype);
    out.bounds = g.bounds;
    for (const Entry& e : g.entries) {
      out.params.push_back(ShardLayout::Param{e.path.substr(1), e.offset, e.size, e.param.shape()});
    }
    layout.groups.push_back(std::move(out));
  }
  return layout;
}

void ShardedUpdate::serialize(Serializer& s, Optimizer& actual) {
  if (!s.is_loading()) {
    // This process's pieces under the parameters' keys, and the layout (Note [Sharded snapshot
    // files]): nothing gathered.
    actual.serialize(s);
    Array layout = this->layout().encode();
    s(kShardLayoutKey, layout);
    return;
  }
  // Loading: each process reads its pieces, from a set of sharded files (SnapshotSetReader), from
  // an unsharded snapshot (cut out of the whole arrays), or from this process's own file of a
  // save cut exactly as now.
  bool direct = false;
  if (dynamic_cast<SnapshotSetReader*>(&s) == nullptr && s.contains(kShardLayoutKey)) {
    Array encoded;
    s(kShardLayoutKey, encoded);
    const ShardLayout saved = ShardLayout::decode(encoded, "MultiNodeOptimizer: " + s.path() + kShardLayoutKey);
    const ShardLayout now = layout();
    KUSARI_CHECK(saved.same_cut(now) && saved.rank == now.rank, IOError, "MultiNodeOptimizer: the snapshot at '",
                 s.path(), "' holds the part of rank ", saved.rank, " of an optimizer state that ", saved.processes,
                 " processes sharded (zero_stage ", saved.stage, "); this is rank ", now.rank, " of ", now.processes,
                 saved.same_cut(now) ? "" : ", cut otherwise",
                 ". Load the files of all the processes of that save together: kusari::mn::load_newest_snapshot_set "
                 "or load_snapshot_files (Note [Sharded snapshot files])");
    direct = true;
  }
  class Slicer : public Serializer {
   public:
    Slicer(Serializer& real, std::unique_ptr<Serializer> owned, const ShardedUpdate& self, std::string prefix,
           bool direct)
        : real_(real), owned_(std::move(owned)), self_(self), prefix_(std::move(prefix)), direct_(direct) {}
    bool is_loading() const override { return true; }
    std::unique_ptr<Serializer> child(const std::string& name) override {
      auto c = real_.child(name);
      Serializer& ref = *c;
      return std::make_unique<Slicer>(ref, std::move(c), self_, prefix_ + "/" + name, direct_);
    }
    void operator()(const std::string& key, Array& value) override {
      const Piece* piece = self_.piece_of(prefix_);
      if (piece == nullptr || piece->whole || key == "t" || direct_) {
        real_(key, value);
        return;
      }
      const Shape shape = piece_shape(piece->param.ndim(), piece->hi - piece->lo);
      Array part;
      if (auto* set = dynamic_cast<SnapshotSetReader*>(&real_)) {
        if (auto p = set->read_part(key, piece->lo, piece->hi)) part = p->reshape(shape);
      }
      if (!part.defined()) {
        Array whole;
        real_(key, whole);
        if (!whole.defined()) return;
        KUSARI_CHECK(whole.size() == piece->param.size(), IOError, "MultiNodeOptimizer: the snapshot entry '",
                     real_.path(), key, "' has shape ", whole.shape(), ", expected the shape of the parameter ",
                     piece->path, " ", piece->param.shape());
        part = part_of(whole.contiguous(), piece->lo, piece->hi, shape);
      }
      if (value.defined()) {
        value.assign(part.astype(value.dtype()).to_device(value.device()));
      } else {
        value = part.copy();
      }
    }
    bool contains(const std::string& key) const override {
      return key != kShardLayoutKey && real_.contains(key);
    }
    std::string path() const override { return real_.path(); }

   private:
    Serializer& real_;
    std::unique_ptr<Serializer> owned_;
    const ShardedUpdate& self_;
    std::string prefix_;  // the parameter path this serializer stands at ("" at the top)
    bool direct_;
  };
  Slicer slicer(s, nullptr, *this, "", direct);
  actual.serialize(slicer);
}

// Note [Sharded parameters]
// ZeRO's stage 3 (FSDP's full sharding): besides the optimizer's state and the averaged
// gradients, the parameters' values live in the shards only. The pieces own their values (a copy
// made by plan()); each model parameter's data is a placeholder of its shape, dtype and device
// (one element broadcast) whose VariableImpl names this object as its DataSource.
//
// Units. The flat space of each group is cut into units of whole parameters, consecutive in the
// flat order, of at least bucket_bytes each (a larger parameter is a unit alone): FSDP's
// size-based wrapping, without asking the user to wrap anything. A unit is gathered whole
// (MPI_Iallgatherv of its part of each shard, on a communicator of its own) when any of its
// parameters' data is read: Variable::data() calls materialize(). A model is ordinary code, so
// whatever reads a parameter - a link's forward, a backward rule, a serializer, a user's print -
// gets its values, on every process alike (the reads are collective: every process runs the same
// model code; a read on one process alone waits for the others until the deadline, whose message
// names the gather). CPU parameters of the unit are views of the gathered buffer (no copy).
//
// Release. In forward a unit's whole values are dropped at the next node recorded after another
// unit was gathered (DataSource::at_next_node): at that moment no function is between reading its
// inputs' data and recording itself, so no reference to a placeholder-to-be is in use. So forward
// holds about one or two units at a time. A backward rule that reads a released parameter gathers
// it again; the gradient-ready hooks release a unit once all its parameters' gradients are final
// (their reduce-scatter is stage 2's). Nodes that backward rules record (double backprop) do not
// release (detail::BackwardScope: a rule may hold data it read), so backward releases only there;
// evaluation without recording (no_backprop_mode) keeps what it gathered until the next step.
// A release first writes this process's parts of the whole values back into its pieces, so that
// values set in place while whole (a loaded snapshot, a user's assignment on every process) are
// kept; the step releases everything before the optimizer steps the pieces.
//
// Prefetch. The units gathered in a step are recorded; in the next step, when the k-th gather of
// the step is of the same unit as the last step's k-th, the last step's (k+1)-th unit is gathered
// in the background (one at a time). Every process runs the same code, so every process predicts
// alike and the collectives match; a wrong prediction is waited for and kept (whole) like any
// gathered unit.
//
// Snapshots hold the pieces' states as in stage 2, and the model's parameters whole: a save reads
// them (gathering unit after unit on every process); summon_full_parameters() gathers them all
// before work that one process does alone. Equality: the pieces are stepped exactly as stage 2's,
// and a gather copies values, so stage 3 equals stage 2 bit for bit.

void ShardedUpdate::make_units() {
  units_.clear();
  where_.clear();
  entry_unit_.assign(groups_.size(), {});
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    Group& g = groups_[gi];
    const int64_t item = static_cast<int64_t>(itemsize(g.dtype));
    const int64_t target = std::max<int64_t>(1, chunk_bytes_ / item);
    entry_unit_[gi].assign(g.entries.size(), 0);
    for (size_t i = 0; i < g.entries.size(); ++i) {
      Entry& e = g.entries[i];
      if (units_.empty() || units_.back().group != gi ||
          units_.back().b - units_.back().a >= target) {
        Unit u;
        u.group = gi;
        u.first = i;
        u.a = e.offset;
        units_.push_back(u);
      }
      Unit& u = units_.back();
      u.last = i + 1;
      u.b = e.offset + e.size;
      entry_unit_[gi][i] = units_.size() - 1;
      where_[e.param.impl_ptr().get()] = {gi, i};
    }
  }
}

ShardedUpdate::Gather ShardedUpdate::start_gather(size_t k) {
  const Unit& u = units_[k];
  const Group& g = groups_[u.group];
  const int rank = comm_->rank();
  const int64_t item = static_cast<int64_t>(itemsize(g.dtype));
  Gather gather;
  gather.unit = k;
  gather.buffer = Array::empty({u.b - u.a}, g.dtype, Device::cpu());
  char* buffer = static_cast<char*>(gather.buffer.raw_data());
  // This process's part of the unit, from its pieces, where the result puts it.
  for (const Piece& p : g.pieces) {
    const int64_t len = p.hi - p.lo;
    if (p.flat + len <= u.a || p.flat >= u.b) continue;
    const Array values = host_flat(p.shard.data());
    std::memcpy(buffer + (p.flat - u.a) * item, values.raw_data(), static_cast<size_t>(len * item));
  }
  const std::vector<int64_t> counts = counts_within(g.bounds, u.a, u.b);
  if (u.b - u.a > max_chunk_elements()) {
    // (more than one message takes: gathered at once, in pieces)
    const int64_t mine = std::min(std::max(u.a, g.bounds[static_cast<size_t>(rank)]), u.b) - u.a;
    allgather_host(buffer + mine * item, buffer, counts, g.dtype, gather_dup_);
    return gather;
  }
  std::vector<int> counts32(counts.size()), displs(counts.size());
  int64_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    counts32[r] = static_cast<int>(counts[r]);
    displs[r] = static_cast<int>(at);
    at += counts[r];
  }
  KUSARI_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, mpi_datatype(g.dtype), buffer, counts32.data(),
                                   displs.data(), mpi_datatype(g.dtype), gather_dup_,
                                   &gather.request));
  return gather;
}

void ShardedUpdate::finish_gather(Gather& gather) {
  if (gather.request != MPI_REQUEST_NULL) {
    wait_requests(&gather.request, 1, "MPI_Iallgatherv (the sharded parameters, zero_stage 3)");
  }
  Unit& u = units_[gather.unit];
  Group& g = groups_[u.group];
  for (size_t i = u.first; i < u.last; ++i) {
    Entry& e = g.entries[i];
    Array flat = gather.buffer.at({Slice(e.offset - u.a, e.offset - u.a + e.size)});
    Array whole;
    if (e.device.is_cpu() && e.format == MemoryFormat::kContiguous) {
      whole = flat.reshape(e.shape);  // (a view of the gathered buffer)
    } else {
      whole = Array::empty(e.shape, g.dtype, e.device, e.format);
      whole.assign(flat.reshape(e.shape).to_device(e.device));
    }
    ::kusari::detail::VariableImpl& impl = e.param.impl();
    impl.data = std::move(whole);
    impl.source = nullptr;
  }
  u.live = true;
  u.ready = 0;
  u.used = ++clock_;
  ++gathers_;
  trace_.push_back(gather.unit);
  // Other units whole since before this one are released at the next node recorded.
  for (const Unit& other : units_) {
    if (other.live && &other != &u) {
      ::kusari::detail::call_at_next_node(this);
      break;
    }
  }
}

void ShardedUpdate::wait_prefetch(bool install) {
  if (!prefetch_) return;
  Gather gather = std::move(*prefetch_);
  prefetch_.reset();
  if (install) {
    finish_gather(gather);
    ++prefetched_;
  } else if (gather.request != MPI_REQUEST_NULL) {
    wait_requests(&gather.request, 1, "MPI_Iallgatherv (the sharded parameters, zero_stage 3)");
  }
}

void ShardedUpdate::gather_unit(size_t k) {
  if (units_[k].live) return;
  if (prefetch_ && prefetch_->unit == k) {
    wait_prefetch(true);
  } else {
    wait_prefetch(true);  // (a unit predicted wrongly: every process waits for it alike)
    Gather gather = start_gather(k);
    finish_gather(gather);
  }
  // The next unit as the last step went on, gathered in the background.
  const size_t at = trace_.size() - 1;
  if (at + 1 < last_trace_.size() && last_trace_[at] == k) {
    const size_t next = last_trace_[at + 1];
    const Unit& n = units_[next];
    if (!n.live && n.b - n.a <= max_chunk_elements()) prefetch_ = start_gather(next);
  }
}

void ShardedUpdate::materialize(::kusari::detail::VariableImpl& impl) {
  const auto it = where_.find(&impl);
  KUSARI_CHECK(it != where_.end(), ValueError, "MultiNodeOptimizer (zero_stage 3): the parameter ",
               impl.name, " is not one of the sharded model's");
  gather_unit(entry_unit_[it->second.first][it->second.second]);
}

void ShardedUpdate::release_unit(size_t k) {
  Unit& u = units_[k];
  if (!u.live) return;
  Group& g = groups_[u.group];
  for (const Piece& p : g.pieces) {
    const int64_t len = p.hi - p.lo;
    if (p.flat + len <= u.a || p.flat >= u.b) continue;
    size_t i = u.first;
    while (g.entries[i].path != p.path) ++i;
    const Array& whole = g.entries[i].param.impl().data;
    Array shard = p.shard.data();
    const Array flat = (whole.is_contiguous() ? whole : whole.contiguous()).reshape({whole.size()});
    shard.assign(flat.at({Slice(p.lo, p.hi)}).reshape(shard.shape()).to_device(shard.device()));
  }
  for (size_t i = u.first; i < u.last; ++i) {
    Entry& e = g.entries[i];
    ::kusari::detail::VariableImpl& impl = e.param.impl();
    impl.data = e.placeholder;
    impl.source = this;
  }
  u.live = false;
}

void ShardedUpdate::release_all() {
  for (size_t k = 0; k < units_.size(); ++k) release_unit(k);
}

void ShardedUpdate::at_next_node() {
  // Keep the unit gathered last (a function may be about to read more of it); release the rest.
  size_t newest = units_.size();
  for (size_t k = 0; k < units_.size(); ++k) {
    if (units_[k].live && (newest == units_.size() || units_[k].used > units_[newest].used))
      newest = k;
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    if (k != newest) release_unit(k);
  }
}

void ShardedUpdate::note_ready(size_t gi, size_t i) {
  Unit& u = units_[entry_unit_[gi][i]];
  if (u.live && ++u.ready == static_cast<int>(u.last - u.first)) release_unit(entry_unit_[gi][i]);
}

void ShardedUpdate::gather_all() {
  if (stage_ != 3 || !planned_) return;
  wait_prefetch(true);
  for (size_t k = 0; k < units_.size(); ++k) {
    if (units_[k].live) continue;
    Gather gather = start_gather(k);
    finish_gather(gather);
  }
  ::kusari::detail::cancel_calls_at_next_node(this);  // (kept whole until the step or backward)
}

int64_t ShardedUpdate::whole_elements() const {
  if (stage_ != 3 || !planned_) return total_elements();
  int64_t n = 0;
  for (const Unit& u : units_) n += u.live ? u.b - u.a : 0;
  return n;
}

}  // namespace kusari::mn::detail
