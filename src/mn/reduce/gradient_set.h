// Which gradients a reduction sends: the model's parameters in sorted path order, zero_fill
// applied, checked across ranks (Note [Gradient sets]); and the check that every rank holds the
// same model (Note [Same model]). Part of the gradient reducer (Note [Gradient reducer] in
// reducer.h). Plain C++ and MPI (no CUDA).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kusari/mn/communicator.h"
#include "mn/reduce/gradient_buffer.h"

namespace kusari::mn::detail {

class MpiCommunicator;

/// The gradients a reducer sends each step, and the check across the ranks of its communicator
/// that they agree (one small allreduce per step). The lists are kept between steps while the
/// model lists the same parameters.
class GradientSet {
 public:
  /// `settings`: the reducer's settings that decide how gradients are laid out and sent (e.g.
  /// "gradients_in_buffer on, allreduce_grad_dtype unset"); every rank must have the same, so
  /// they are part of the check; asked once, and again only to report a disagreement.
  /// `check_here`: this rank's own checks of the gradients (NCCL: all on one GPU), run before the
  /// check across ranks so that what they raise on one rank is raised on every rank
  /// (Note [A failure on one rank]); not run while the gradients are in place.
  GradientSet(MpiCommunicator& comm, std::function<std::string()> settings,
              std::function<void(const NamedParams&)> check_here = {});

  /// The parameters to reduce in sorted path order, with zero_fill applied, checked across ranks
  /// (Note [Gradient sets]). The list is this set's own and stays valid until the next call;
  /// copy it to keep it longer. `buffer` is the reducer's gradient buffer: when every gradient
  /// is still its segment there (GradientBuffer::in_place), nothing is looked at again.
  NamedParams& select(Link& model, bool zero_fill, const GradientBuffer& buffer);
  /// True when the last select() found every gradient still in its segment of the buffer, as
  /// the last reduction left it: the layout, dtype and device of the buffer hold, and the
  /// reduction need not look at the arrays.
  bool in_place() const { return in_place_; }
  /// In debug mode, raises "parameters diverged" when a reduced gradient is not finite.
  void check_finite_after_reduce(const NamedParams& params) const;
  /// Forgets the lists (and the parameters they hold): the next select() starts afresh.
  void clear();

 private:
  /// What the check across ranks compares for reduce_list_ (Note [Gradient sets]).
  struct Checked {
    int64_t count = 0, elements = 0, hash = 0;
    bool valid = false;
  };
  /// Applies zero_fill to all_params_, makes reduce_list_ those with a gradient, and returns what
  /// the check compares for it.
  Checked check_gradients(bool zero_fill);
  /// Every rank's part when some rank's `failure` joined the check: raises that rank's error on
  /// it and a CommunicatorError quoting it on the others (Note [A failure on one rank]).
  [[noreturn]] void raise_failure_of_a_rank(std::exception_ptr failure, const char* what);

  MpiCommunicator& comm_;
  std::function<std::string()> settings_;
  std::function<void(const NamedParams&)> check_here_;
  /// select's lists, kept while the model lists the same parameters: the model's parameters
  /// (their states, in traversal order) the sorted list was made from, that list, and the list
  /// of those with a gradient it last handed out (with its mask over the sorted list).
  std::vector<const void*> walk_, walk_key_;
  NamedParams all_params_, reduce_list_;
  std::vector<char> mask_, reduce_mask_;
  Checked checked_;
  bool in_place_ = false;
  /// A hash of settings_(), made at the first check.
  std::optional<uint64_t> settings_hash_;
};

/// FNV-1a of `text`: the hashes the ranks compare instead of whole lists.
uint64_t fnv1a(std::string_view text);

/// True on every rank when every rank passed the same hash, false on every rank otherwise (one
/// allreduce of two integers).
bool same_hash_everywhere(Communicator& comm, uint64_t hash);

/// The line where `other` first differs from `ref` (both one item per line): its index and the
/// two lines, "(nothing)" past an end; nullopt when they are equal.
struct LineDifference {
  int line = 0;
  std::string ref, other;
};
std::optional<LineDifference> first_line_difference(const std::string& ref,
                                                    const std::string& other);

/// Checks that every rank gives `what` the same parameters: paths, shapes and dtypes in order
/// and, with `device_kind`, whether each is on the CPU or a GPU, plus the line `extra` (how this
/// rank will send them). One small allreduce when they agree; otherwise every rank raises a
/// CommunicatorError naming the first difference and the ranks (Note [Same model]).
void check_same_parameters(Communicator& comm, const NamedParams& params, const char* what,
                           bool device_kind, const std::string& extra = "");

}  // namespace kusari::mn::detail
