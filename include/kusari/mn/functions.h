// Differentiable communication for model parallelism (ChainerMN's chainermn.functions): point-to-
// point send/recv with delegate variables, pseudo_connect, and the differentiable collectives.
//
// Note [Delegate variables]
// A process whose part of the model ends in a send() has no loss of its own, yet its backward
// must run: it has to receive the gradient of what it sent and push it into its parameters. So
// send() returns a *delegate variable*: a 0-d float32 placeholder (value 0) whose creator's
// backward blocks until the gradient arrives from the peer, then hands it to x. Calling
// `delegate.backward()` (it is 0-d, so backward starts from 1 like a loss) runs this rank's
// whole backward, exactly as `loss.backward()` does on the rank that has the loss.
//
// When a rank communicates several times in one forward, the backward of those communications
// must run in the reverse order (a recv in forward is a send in backward, and vice versa), or
// two ranks wait for each other. Delegates give that order: recv(comm, rank, delegate) and
// pseudo_connect(delegate, y) make their result depend on `delegate` in the graph, so the
// result's backward runs first, then (the engine visits newer nodes first) the delegate's. The
// delegate receives a zero gradient; what it carries is the ordering, not a value. One
// backward() through the last variable of the chain thus runs every communication of the rank,
// newest first. MultiNodeChainList (links.h) threads this chain for you.
//
// Note [Communication is always recorded]
// Which rank records a node must not depend on local details: if rank 0 recorded a send but rank
// 1 did not record the matching recv (say its received x needed no gradient), rank 0 would wait
// forever in backward. So every function here records its node whenever backprop is enabled,
// even when no input requires a gradient (an internal placeholder input requires one), and records
// nothing in NoBackpropMode, where no backward will follow. The usual SPMD rule applies to
// backward as to forward: every rank runs backward through every communication node it created,
// in the same order as its peers (the delegate chain above ensures the order).
//
// Note [Communication gradients are first order]
// The backward rules exchange plain arrays (as ChainerMN's do), so a gradient that crossed a
// process boundary is a constant: it carries no graph back to the peer. Differentiating it again
// would silently drop terms, so a backward with enable_double_backprop through any of these
// functions raises NotImplementedError.
//
// Every function takes the communicator by reference and keeps a pointer to it in the graph:
// the communicator must outlive the graph (in practice, hold it in a shared_ptr for the whole
// program).
#pragma once

#include <optional>
#include <vector>

#include "kusari/autograd/variable.h"
#include "kusari/mn/communicator.h"

namespace kusari::mn {

// --- point to point ------------------------------------------------------------------------------

/// Sends x.data() to `rank` (with `tag`) and returns a delegate variable: a 0-d placeholder whose
/// backward receives x's gradient from `rank` (blocking) and passes it to x. See Note [Delegate
/// variables]. Sending to one's own rank is a ValueError (it would deadlock).
Variable send(const Variable& x, Communicator& comm, int rank, int tag = 0);

/// Receives an array sent by send() on `rank` (with `tag`) and returns it as a variable whose
/// backward sends its gradient back to `rank`. With `delegate` (usually the delegate of this
/// rank's previous send), the result is connected to it in the graph: backward through the result
/// then also runs the delegate's backward, after its own. The array lands on `device` (default
/// the CPU). Receiving from one's own rank is a ValueError.
Variable recv(Communicator& comm, int rank, const Variable& delegate = Variable(), int tag = 0,
              std::optional<Device> device = std::nullopt);

/// Returns a variable equal to `actual` whose backward passes the gradient to `actual` and also
/// runs `delegate`'s backward (giving it a zero gradient), after its own. An undefined delegate
/// returns `actual` as it is.
Variable pseudo_connect(const Variable& delegate, const Variable& actual);

/// pseudo_connect for several variables at once: one node, so the delegate's backward runs once.
std::vector<Variable> pseudo_connect(const Variable& delegate, const std::vector<Variable>& actual);

// --- collectives ---------------------------------------------------------------------------------
// Every rank of `comm` calls them in the same order, in forward and (through backward()) in
// backward; see Note [Communication is always recorded].

/// Every rank's x, on every rank (ys[i] is rank i's x, on x's device; shapes may differ per rank).
/// Backward: the gradients of ys go back to their ranks (an alltoall) and each rank sums what it
/// receives into the gradient of its x.
std::vector<Variable> allgather(Communicator& comm, const Variable& x);

/// xs[j] goes to rank j; returns ys with ys[i] = what rank i sent here (on the device of
/// xs[0]). xs must have one variable per rank. Backward: the gradients go back by another
/// alltoall.
std::vector<Variable> alltoall(Communicator& comm, const std::vector<Variable>& xs);

/// The root's x on every rank (x is ignored elsewhere and may be undefined). The result is on x's
/// device at the root and on `device` (default the CPU) elsewhere. Backward: the gradients of all
/// ranks are gathered to the root and summed into the gradient of x.
Variable bcast(Communicator& comm, const Variable& x, int root = 0,
               std::optional<Device> device = std::nullopt);

/// At the root: every rank's x (ys[i] is rank i's x, on the root's x's device). Elsewhere: one
/// delegate variable, {d}; call d.backward() (or pseudo_connect it into the loss) so that this
/// rank joins the backward. Backward: the root scatters the gradients of ys back to the ranks.
std::vector<Variable> gather(Communicator& comm, const Variable& x, int root = 0);

/// The root's xs[j] on rank j (xs is ignored elsewhere and may be empty; at the root it has one
/// variable per rank). The result is on xs[root]'s device at the root and on `device` (default
/// the CPU) elsewhere. Backward: the gradients are gathered to the root, into the gradients of xs.
Variable scatter(Communicator& comm, const std::vector<Variable>& xs, int root = 0,
                 std::optional<Device> device = std::nullopt);

// --- the same, with the communicator as create_communicator returns it --------------------------
// (Note [Communicator arguments] in kusari/mn/communicator.h)

/// send(x, *comm, rank, tag).
inline Variable send(const Variable& x, const std::shared_ptr<Communicator>& comm, int rank, int tag = 0) {
  return send(x, detail::communicator_of(comm, "send"), rank, tag);
}
/// recv(*comm, rank, delegate, tag, device).
inline Variable recv(const std::shared_ptr<Communicator>& comm, int rank, const Variable& delegate = Variable(),
                     int tag = 0, std::optional<Device> device = std::nullopt) {
  return recv(detail::communicator_of(comm, "recv"), rank, delegate, tag, device);
}
/// allgather(*comm, x).
inline std::vector<Variable> allgather(const std::shared_ptr<Communicator>& comm, const Variable& x) {
  return allgather(detail::communicator_of(comm, "allgather"), x);
}
/// alltoall(*comm, xs).
inline std::vector<Variable> alltoall(const std::shared_ptr<Communicator>& comm, const std::vector<Variable>& xs) {
  return alltoall(detail::communicator_of(comm, "alltoall"), xs);
}
/// bcast(*comm, x, root, device).
inline Variable bcast(const std::shared_ptr<Communicator>& comm, const Variable& x, int root = 0,
                      std::optional<Device> device = std::nullopt) {
  return bcast(detail::communicator_of(comm, "bcast"), x, root, device);
}
/// gather(*comm, x, root).
inline std::vector<Variable> gather(const std::shared_ptr<Communicator>& comm, const Variable& x, int root = 0) {
  return gather(detail::communicator_of(comm, "gather"), x, root);
}
/// scatter(*comm, xs, root, device).
inline Variable scatter(const std::shared_ptr<Communicator>& comm, const std::vector<Variable>& xs, int root = 0,
                        std::optional<Device> device = std::nullopt) {
  return scatter(detail::communicator_of(comm, "scatter"), xs, root, device);
}

}  // namespace kusari::mn
