// Model parallelism as a link (ChainerMN's MultiNodeChainList): a model cut into pieces that live
// on different processes and pass activations forward and gradients backward.
//
//   // rank 0: x -> first -> (to rank 1)          rank 1: (from rank 0) -> second -> y
//   auto model = std::make_shared<kusari::mn::MultiNodeChainList>(comm);
//   if (comm->rank() == 0) model->add_link(first, std::nullopt, 1);
//   else model->add_link(second, 0, std::nullopt);
//   Variable out = model->forward(x);   // rank 1: y; rank 0: a delegate variable
//   (comm->rank() == 1 ? loss_of(out) : out).backward();  // every rank runs its backward
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "kusari/links/link.h"
#include "kusari/mn/communicator.h"

namespace kusari::mn {

/// A ChainList whose pieces (links) each take their input from the model input or from another
/// rank, and send their output to another rank or return it as the model output. forward() runs
/// the pieces in the order they were added. Every rank builds its own MultiNodeChainList with the
/// pieces it holds; a send on one rank must be matched by a receive on the peer, in the same
/// order (validate() checks this).
///
/// Note [MultiNodeChainList wiring]
/// forward(x) walks the pieces keeping a "delegate": the variable that depends on every
/// communication done so far on this rank (Note [Delegate variables] in functions.h).
///  - Input: rank_in unset -> the piece gets x; rank_in = another rank -> recv(comm, rank_in,
///    delegate); rank_in = this rank -> the oldest output this rank sent to itself.
///  - The piece's output h is tied to the delegate (through recv, or pseudo_connect when the input
///    did not come through it), so h now depends on every earlier communication.
///  - Output: rank_out unset -> h is the model output y; rank_out = another rank -> the delegate
///    becomes send(h, comm, rank_out); rank_out = this rank -> h is queued for a later piece.
///    Each step's result is the new delegate.
/// The result is y when the last piece produced it, pseudo_connect(delegate, y) when an earlier
/// piece did (so backward through y also runs the later pieces' communication, first), and the
/// delegate when this rank produces no output. Either way one backward() on the result runs all
/// of this rank's backward, with its communications in the reverse order of forward, which is the
/// order the peers expect. Unlike ChainerMN, a piece fed by the model input in the middle of the
/// list is also tied to the chain, so no earlier send is left without a backward.
class MultiNodeChainList : public ChainList {
 public:
  /// An empty list that communicates over `comm`.
  explicit MultiNodeChainList(std::shared_ptr<Communicator> comm);

  /// Appends `link` as the next piece: it receives its input from `rank_in` (unset: the model
  /// input) and sends its output to `rank_out` (unset: the output is the model's output; at most
  /// one piece may leave it unset). A rank may be this process's own rank: the output is then
  /// handed to the next piece that receives from this rank. Returns the link, typed.
  template <typename L>
  std::shared_ptr<L> add_link(std::shared_ptr<L> link, std::optional<int> rank_in = std::nullopt,
                              std::optional<int> rank_out = std::nullopt) {
    add_piece(std::static_pointer_cast<Link>(link), rank_in, rank_out);
    return link;
  }
  /// ChainList::append as a piece with neither rank_in nor rank_out.
  template <typename L>
  std::shared_ptr<L> append(std::shared_ptr<L> link) {
    return add_link(std::move(link));
  }

  /// Runs the pieces (Note [MultiNodeChainList wiring]). Returns the model output on the rank
  /// that produces it and a 0-d delegate variable elsewhere; calling backward() on the loss (or on
  /// the delegate) on every rank runs the whole distributed backward. Received inputs land on
  /// the receiving piece's device.
  Variable forward(const Variable& x) override;
  /// forward(batch[0]) (an undefined x for an empty batch). The other arrays (labels) are not
  /// used here: the rank with the loss wraps its list in a links::Classifier, which uses them.
  Variable forward_batch(const std::vector<Variable>& batch) override;

  /// Collective: every rank of the communicator calls it (ranks holding no piece too). Checks
  /// that the pieces of all ranks fit together - for every pair of ranks a != b, a sends to b as
  /// many times as b receives from a, and outputs sent to a rank itself are received later on it -
  /// and throws the same ValueError on every rank otherwise (instead of a hang in forward).
  void validate();

  /// The communicator the pieces talk over.
  Communicator& communicator() const { return *comm_; }
  /// Where piece i receives from (unset: the model input).
  std::optional<int> rank_in(size_t i) const { return pieces_.at(i).rank_in; }
  /// Where piece i sends to (unset: it produces the model output).
  std::optional<int> rank_out(size_t i) const { return pieces_.at(i).rank_out; }

 protected:
  const char* type_name() const override { return "MultiNodeChainList"; }

 private:
  struct Piece {
    std::optional<int> rank_in, rank_out;
  };
  void add_piece(std::shared_ptr<Link> link, std::optional<int> rank_in,
                 std::optional<int> rank_out);

  std::shared_ptr<Communicator> comm_;
  std::vector<Piece> pieces_;
};

}  // namespace kusari::mn
