// Which gradients a reduction sends, and the check that every rank sends the same ones
// (Note [Gradient sets], Note [A failure on one rank], Note [Same model]). Part of the gradient
// reducer (Note [Gradient reducer] in reducer.h); plain C++ and MPI, no CUDA.
#include "mn/reduce/gradient_set.h"

#include <algorithm>
#include <exception>
#include <sstream>
#include <string_view>

#include "kusari/core/routines.h"
#include "mn/comm/mpi_communicator.h"
#include "mn/comm/mpi_util.h"
#include "mn/object_codec.h"

namespace kusari::mn::detail {

namespace {
// FNV-1a, for the hashes the ranks compare (one allreduce instead of whole lists).
constexpr uint64_t kFnvBasis = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;
}  // namespace

uint64_t fnv1a(std::string_view text) {
  uint64_t hash = kFnvBasis;
  for (char ch : text) hash = (hash ^ static_cast<unsigned char>(ch)) * kFnvPrime;
  return hash;
}

bool same_hash_everywhere(Communicator& comm, uint64_t hash) {
  // max(h) == min(h) as max(h) == -max(-h); 62 bits keep both in the int64 range.
  int64_t check[2] = {static_cast<int64_t>(hash >> 2), -static_cast<int64_t>(hash >> 2)};
  allreduce_host(check, 2, Dtype::kInt64, ReduceOp::kMax, to_comm(comm.mpi_comm_handle()));
  return check[0] == -check[1];
}

GradientSet::GradientSet(MpiCommunicator& comm, std::function<std::string()> settings,
                         std::function<void(const NamedParams&)> check_here)
    : comm_(comm), settings_(std::move(settings)), check_here_(std::move(check_here)) {}

void GradientSet::clear() {
  walk_key_.clear();
  all_params_.clear();
  reduce_list_.clear();
  reduce_mask_.clear();
  checked_ = Checked();
  in_place_ = false;
}

// Note [Gradient sets]
// Every rank must reduce the same parameters, in the same order, with the same shapes; a rank
// whose model differs (a parameter without a gradient, another shape) would make the collective
// mix unrelated numbers or wait forever. Parameters go in sorted path order; with zero_fill a
// missing gradient becomes zeros. This runs every step, so the sorted list (paths included) is
// kept while a walk of the model without paths finds the same parameters in the same order, and
// the list handed out is kept while the same ones have gradients: a step costs a walk, a look at
// each gradient, the hash below and the check's allreduce, and makes no string or list; when
// every gradient is still its segment of the reduction buffer, even the look and the hash are
// skipped (Note [Gradients in the reduction buffer], "Every step"). The communicator holds the
// parameters of that list until a reduction of another model, or finalize(). Each reduction
// first checks, with one small allreduce, that all ranks agree on the number of gradients and
// elements and on a hash of their shapes and dtypes in order and of the gradients_in_buffer
// option (the gradients in the reduction buffer lay out aligned segments, so two ranks whose
// gradients merely add up to the same number of elements would reduce buffers of different
// lengths); debug mode, or a disagreement, compares every parameter's path, shape and
// dtype against rank 0 and names the first difference. All ranks reach the same verdict, so all
// raise together instead of one hanging.
NamedParams& GradientSet::select(Link& model, bool zero_fill, const GradientBuffer& buffer) {
  // The model's parameters in traversal order, without paths; the sorted list (with paths) is
  // made again only when they are not the ones it was made from. all_params_ holds the
  // parameters, so an address in walk_key_ cannot belong to another parameter meanwhile.
  walk_.clear();
  model.for_each_param([&](const Parameter& p) { walk_.push_back(p.impl_ptr().get()); }, false);
  if (walk_ != walk_key_) {
    all_params_ = model.namedparams(false);
    std::sort(all_params_.begin(), all_params_.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    walk_key_ = walk_;
    reduce_list_.clear();
    reduce_mask_.clear();
    checked_ = Checked();
  }
  // Every gradient still the segment of the reduction buffer that the last reduction installed:
  // the list, sizes and hash of that reduction hold, and no array is looked at (Note [Gradients
  // in the reduction buffer], "Every step"). The check with the other ranks still runs.
  in_place_ = !comm_.debug() && checked_.valid && reduce_list_.size() == all_params_.size() &&
              buffer.in_place(reduce_list_);
  // A failure here joins the check (Note [A failure on one rank]): 2 when the list could not
  // be made, 1 when it was made (and can still be compared) but this rank's own checks failed.
  std::exception_ptr failure;
  int64_t failed = 0;
  Checked mine = in_place_ ? checked_ : Checked();
  if (!in_place_) {
    try {
      mine = check_gradients(zero_fill);
      if (check_here_) check_here_(reduce_list_);
    } catch (...) {
      failure = std::current_exception();
      failed = mine.valid ? 1 : 2;
    }
    checked_ = failure ? Checked() : mine;  // (checked afresh next time)
  }
  NamedParams& out = reduce_list_;
  int64_t check[7] = {mine.count, -mine.count, mine.elements, -mine.elements,
                      mine.hash,  -mine.hash,  failed};
  allreduce_host(check, 7, Dtype::kInt64, ReduceOp::kMax, comm_.comm());
  const bool agree = check[0] == -check[1] && check[2] == -check[3] && check[4] == -check[5];
  // Ranks whose models or settings differ are told so first; that may be the cause.
  if (check[6] == 2 || (check[6] == 1 && agree)) {
    raise_failure_of_a_rank(failure, "multi_node_mean_grad");
  }
  if (comm_.debug() || !agree) {
    std::ostringstream sig;
    for (auto& [path, p] : out)
      sig << path << " " << p.shape() << " " << dtype_name(p.dtype()) << "\n";
    Writer w;
    w.put_string(sig.str());
    w.put_string(settings_());
    std::vector<Bytes> all = comm_.allgather_obj(w.take());
    Reader first(all[0]);
    const std::string ref = first.get_string(), ref_settings = first.get_string();
    for (int r = 1; r < comm_.size(); ++r) {
      Reader from(all[static_cast<size_t>(r)]);
      const std::string other = from.get_string(), other_settings = from.get_string();
      if (const auto d = first_line_difference(ref, other)) {
        KUSARI_THROW(CommunicatorError,
                     "multi_node_mean_grad: the ranks disagree on the gradients to reduce; ",
                     "gradient #", d->line, " is '", d->ref, "' on rank 0 but '", d->other,
                     "' on rank ", r,
                     " (models must have the same parameters with the same shapes on every rank; "
                     "parameters ",
                     "without a gradient need zero_fill=true)");
      }
      if (other_settings != ref_settings) {
        KUSARI_THROW(CommunicatorError, comm_.name(),
                     ": multi_node_mean_grad: the ranks' parameters match, but their ",
                     "communicator settings differ, so they would send gradients of different "
                     "layouts: rank 0 has '",
                     ref_settings, "' but rank ", r, " has '", other_settings,
                     "' (give every process the same options and environment: "
                     "KUSARI_MN_GRADIENTS_IN_BUFFER and ",
                     "KUSARI_MN_CHUNK_BYTES included)");
      }
    }
    // (Not reached while the hash covers only what the signatures and settings above compare.)
    KUSARI_CHECK(agree, CommunicatorError, comm_.name(),
                 ": multi_node_mean_grad: the ranks disagree on the gradients to ",
                 "reduce, but their parameters and settings match");
  }
  return out;
}

// Note [A failure on one rank]
// Work that one rank does alone before a collective can fail on that rank only: zero_fill's
// zeros or a gradient's contiguous copy running out of memory, a gradient on the wrong device.
// Were that rank to raise at once, the others would wait in the collective forever (MPI has no
// timeout), and a program that catches the error would hang instead of ending. So the failure
// joins the collective the other ranks are already in: GradientSet::select's check carries a
// "failed" flag; when any rank set it, every rank gathers the failures' messages, the failing
// ranks raise their own error (type and message kept) and the others a CommunicatorError naming
// the first failing rank and quoting its message. When the failure came after the list was
// made (the reducer's own check, check_here) and the ranks' lists or settings disagree, the
// disagreement is reported instead: it is the likelier cause, and its report names both ranks.
// The communicator stays usable: nothing was queued, and the next reduction checks afresh.
void GradientSet::raise_failure_of_a_rank(std::exception_ptr failure, const char* what) {
  std::string message;
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
      message = "an exception that is not a std::exception";
    }
  }
  Writer w;
  w.put_string(message);
  std::vector<Bytes> all = comm_.allgather_obj(w.take());  // (every rank: the flag told them all)
  if (failure) std::rethrow_exception(failure);
  for (int r = 0; r < comm_.size(); ++r) {
    const std::string theirs = Reader(all[static_cast<size_t>(r)]).get_string();
    if (theirs.empty()) continue;
    KUSARI_THROW(CommunicatorError, comm_.name(), ": ", what, ": rank ", r,
                 " failed while preparing its gradients, so no rank reduces them: ", theirs);
  }
  KUSARI_THROW(CommunicatorError, comm_.name(), ": ", what,
               ": a rank failed while preparing its gradients, but did not say why");
}

std::optional<LineDifference> first_line_difference(const std::string& ref,
                                                    const std::string& other) {
  if (ref == other) return std::nullopt;
  std::istringstream a(ref), b(other);
  LineDifference d;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(a, d.ref));
    const bool gb = static_cast<bool>(std::getline(b, d.other));
    if (!ga) d.ref = "(nothing)";
    if (!gb) d.other = "(nothing)";
    if (d.ref != d.other || (!ga && !gb)) return d;
    ++d.line;
  }
}

// Note [Same model]
// bcast_data sends rank 0's parameters one by one (MPI) or packed in one buffer (NCCL) to the
// other ranks, which receive into their own parameters. If a rank built another model (another
// layer size from a mistyped option, a lazily initialized layer that has not run there, the model
// left on the CPU on one rank only), the receives would not match the sends: MPI reports a
// truncation at best, and at worst a rank waits forever or takes wrong values silently. So first
// the ranks compare what they will send or receive, as PyTorch's DistributedDataParallel checks
// the parameter shapes when it is made: one allreduce of a hash of the parameter list, and, only
// when the hashes differ, a gather of the lists, so that every rank raises the same error naming
// the first parameter that differs, on which ranks. multi_node_mean_grad makes the same check
// every step in its own, cheaper way (Note [Gradient sets]).
void check_same_parameters(Communicator& comm, const NamedParams& params, const char* what,
                           bool device_kind, const std::string& extra) {
  std::ostringstream sig;
  for (const auto& [path, p] : params) {
    sig << path << " " << p.shape() << " " << dtype_name(p.dtype());
    if (device_kind) sig << " on " << (p.data().device().is_cuda() ? "a GPU" : "the CPU");
    sig << "\n";
  }
  if (!extra.empty()) sig << extra << "\n";
  const std::string mine = sig.str();
  if (same_hash_everywhere(comm, fnv1a(mine))) return;
  Writer w;
  w.put_string(mine);
  const std::vector<Bytes> all = comm.allgather_obj(w.take());
  const std::string ref = Reader(all[0]).get_string();
  for (int r = 1; r < comm.size(); ++r) {
    if (const auto d =
            first_line_difference(ref, Reader(all[static_cast<size_t>(r)]).get_string())) {
      KUSARI_THROW(CommunicatorError, comm.name(), ": ", what, ": the ranks' models differ: item #",
                   d->line, " is '", d->ref, "' on rank 0 but '", d->other, "' on rank ", r,
                   " (build the same model on every rank, on the same kind of device, and run a "
                   "lazily initialized layer on every rank before this)");
    }
  }
  KUSARI_THROW(CommunicatorError, comm.name(), ": ", what,
               ": the ranks' parameter lists hash differently but read the same");
}

GradientSet::Checked GradientSet::check_gradients(bool zero_fill) {
  // Which parameters of all_params_ have a gradient (zero_fill gives the others zeros); the list
  // handed out (reduce_list_) is made again only when that set changes.
  mask_.assign(all_params_.size(), 0);
  for (size_t i = 0; i < all_params_.size(); ++i) {
    Parameter& p = all_params_[i].second;
    // (Through the impl: this runs every step, and Variable::grad() copies the array handle.)
    const auto& grad = p.impl().grad;
    if (!grad || !grad->data.defined()) {
      if (!zero_fill) continue;
      p.zerograd();
    } else if (!grad->data.is_contiguous()) {
      p.set_grad(grad->data.copy());
    }
    mask_[i] = 1;
  }
  if (mask_ != reduce_mask_ || reduce_list_.empty()) {
    reduce_list_.clear();
    for (size_t i = 0; i < all_params_.size(); ++i) {
      if (mask_[i]) reduce_list_.push_back(all_params_[i]);
    }
    reduce_mask_ = mask_;
  }
  const NamedParams& out = reduce_list_;
  int64_t elements = 0;
  uint64_t hash = kFnvBasis;  // FNV-1a over (ndim, dims..., dtype) of each gradient
  auto mix = [&](int64_t v) {
    hash ^= static_cast<uint64_t>(v);
    hash *= kFnvPrime;
  };
  for (const auto& [path, p] : out) {
    const kusari::detail::VariableImpl& im = p.impl();
    const Shape& shape = im.data.shape();
    elements += im.data.size();
    mix(static_cast<int64_t>(shape.size()));
    for (int64_t d : shape) mix(d);
    mix(static_cast<int64_t>(im.grad->data.dtype()));
  }
  // Ranks whose settings lay the gradients out or send them differently (gradients_in_buffer on
  // some ranks only, e.g. KUSARI_MN_GRADIENTS_IN_BUFFER set for some processes; another wire dtype;
  // another chunk size on NCCL) would reduce buffers of different lengths or types, which hangs:
  // that is a disagreement too.
  if (!settings_hash_) {  // (constant for the communicator: hashed once, not every step)
    settings_hash_ = fnv1a(settings_());
  }
  mix(static_cast<int64_t>(*settings_hash_));
  Checked c;
  c.count = static_cast<int64_t>(out.size());
  c.elements = elements;
  c.hash = static_cast<int64_t>(hash >> 2);  // non-negative, so that -hash does not overflow
  c.valid = true;
  return c;
}

void GradientSet::check_finite_after_reduce(const NamedParams& params) const {
  if (!comm_.debug()) return;
  for (const auto& [path, p] : params) {
    if (!all(isfinite(p.grad())).item<bool>()) {
      KUSARI_THROW(CommunicatorError,
                   "multi_node_mean_grad: parameters diverged: the averaged gradient of ", path,
                   " contains NaN or infinity");
    }
  }
}

}  // namespace kusari::mn::detail
