#include "kusari/mn/functions.h"

#include <utility>

#include "kusari/autograd/function_node.h"
#include "kusari/core/routines.h"

namespace kusari::mn {

namespace {

// The array of a delegate variable (Note [Delegate variables]).
Array delegate_array() {
  return Array::zeros({}, float32, Device::cpu());
}

// A leaf that requires a gradient, added to a node's inputs so that the node is recorded even
// when no real input requires a gradient (Note [Communication is always recorded]). It never
// receives a gradient.
Variable placeholder() {
  return Variable(delegate_array(), true);
}

void check_peer(const Communicator& comm, int rank, const char* fn) {
  KUSARI_CHECK(rank != comm.rank(), ValueError, "mn::", fn, ": rank ", rank,
               " is this process's own rank; a process cannot ", fn,
               " to itself (it would deadlock)");
  KUSARI_CHECK(rank >= 0 && rank < comm.size(), ValueError, "mn::", fn, ": rank ", rank,
               " is outside 0..", comm.size() - 1);
}

void check_root(const Communicator& comm, int root, const char* fn) {
  KUSARI_CHECK(root >= 0 && root < comm.size(), ValueError, "mn::", fn, ": root ", root,
               " is outside 0..", comm.size() - 1);
}

// See Note [Communication gradients are first order].
void check_first_order(const BackwardContext& ctx) {
  KUSARI_CHECK(!ctx.is_double_backprop(), NotImplementedError, "backward of ", ctx.function_name(),
               ": gradients that cross processes are first order only; backward with "
               "enable_double_backprop through model-parallel communication is not supported");
}

// The gradient of output i as an array (zeros when it received none: the peers expect one).
Array output_grad_array(BackwardContext& ctx, int i) {
  return ctx.output_grad(i).data();
}

// Sets input i's gradient from an array that arrived from another process (on the CPU).
void set_received_grad(BackwardContext& ctx, int i, const Array& g) {
  if (!ctx.needs_input_grad(i)) return;
  const Variable x = ctx.input(i);
  KUSARI_CHECK(g.shape() == x.shape() && g.dtype() == x.dtype(), GradientError, "backward of ",
               ctx.function_name(), ": received a gradient of shape ", g.shape(), " and dtype ",
               dtype_name(g.dtype()), " for input ", i, " of shape ", x.shape(), " and dtype ",
               dtype_name(x.dtype()), "; the peers' graphs do not match");
  ctx.set_input_grad(i, Variable(g.to_device(x.device())));
}

// Elementwise sum of equally shaped arrays, on `device`.
Array sum_on(const std::vector<Array>& xs, Device device) {
  Array acc = xs[0].to_device(device).copy();
  for (size_t i = 1; i < xs.size(); ++i) acc = acc + xs[i].to_device(device);
  return acc;
}

std::vector<Array> data_of(const std::vector<Variable>& xs) {
  std::vector<Array> out;
  out.reserve(xs.size());
  for (const Variable& x : xs) out.push_back(x.data());
  return out;
}

}  // namespace

// --- point to point ------------------------------------------------------------------------------

Variable send(const Variable& x, Communicator& comm, int rank, int tag) {
  KUSARI_CHECK(x.defined(), ValueError, "mn::send: x is undefined");
  check_peer(comm, rank, "send");
  comm.send(x.data(), rank, tag);
  Communicator* c = &comm;
  return record("mn_send", {x, placeholder()}, delegate_array(),
                [c, rank, tag](BackwardContext& ctx) {
                  check_first_order(ctx);
                  const Variable x = ctx.input(0);
                  set_received_grad(ctx, 0, c->recv(rank, tag, x.device()));
                });
}

Variable recv(Communicator& comm, int rank, const Variable& delegate, int tag,
              std::optional<Device> device) {
  check_peer(comm, rank, "recv");
  Array y = comm.recv(rank, tag, device);
  std::vector<Variable> inputs{placeholder()};
  if (delegate.defined()) inputs.push_back(delegate);
  Communicator* c = &comm;
  std::vector<Array> outputs;
  outputs.push_back(std::move(y));
  auto ys =
      record_multi("mn_recv", inputs, std::move(outputs), [c, rank, tag](BackwardContext& ctx) {
        check_first_order(ctx);
        c->send(output_grad_array(ctx, 0), rank, tag);
        // The delegate carries the order, not a value (Note [Delegate variables]).
        if (ctx.num_inputs() == 2 && ctx.needs_input_grad(1)) {
          ctx.set_input_grad(1, Variable(Array::zeros_like(ctx.input(1).data())));
        }
      });
  return ys[0];
}

Variable pseudo_connect(const Variable& delegate, const Variable& actual) {
  return pseudo_connect(delegate, std::vector<Variable>{actual})[0];
}

std::vector<Variable> pseudo_connect(const Variable& delegate,
                                     const std::vector<Variable>& actual) {
  for (size_t i = 0; i < actual.size(); ++i) {
    KUSARI_CHECK(actual[i].defined(), ValueError, "mn::pseudo_connect: actual[", i,
                 "] is undefined");
  }
  if (!delegate.defined()) return actual;
  std::vector<Variable> inputs{delegate};
  inputs.insert(inputs.end(), actual.begin(), actual.end());
  return record_multi("mn_pseudo_connect", inputs, data_of(actual), [](BackwardContext& ctx) {
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      if (ctx.has_output_grad(i) && ctx.needs_input_grad(i + 1))
        ctx.set_input_grad(i + 1, ctx.output_grad(i));
    }
    if (ctx.needs_input_grad(0))
      ctx.set_input_grad(0, Variable(Array::zeros_like(ctx.input(0).data())));
  });
}

// --- collectives ---------------------------------------------------------------------------------

std::vector<Variable> allgather(Communicator& comm, const Variable& x) {
  KUSARI_CHECK(x.defined(), ValueError, "mn::allgather: x is undefined");
  std::vector<Array> ys = comm.allgather(x.data());
  for (Array& y : ys) y = y.to_device(x.device());
  Communicator* c = &comm;
  return record_multi("mn_allgather", {x, placeholder()}, std::move(ys), [c](BackwardContext& ctx) {
    check_first_order(ctx);
    std::vector<Array> gys;
    for (int i = 0; i < ctx.num_outputs(); ++i) gys.push_back(output_grad_array(ctx, i));
    // gys[j] is the gradient of rank j's x as seen here: send it home, sum what comes back.
    std::vector<Array> gxs = c->alltoall(gys);
    set_received_grad(ctx, 0, sum_on(gxs, ctx.input(0).device()));
  });
}

std::vector<Variable> alltoall(Communicator& comm, const std::vector<Variable>& xs) {
  KUSARI_CHECK(static_cast<int>(xs.size()) == comm.size(), ValueError, "mn::alltoall: got ",
               xs.size(), " variables but the communicator has ", comm.size(),
               " ranks (one variable per rank is needed)");
  for (size_t j = 0; j < xs.size(); ++j) {
    KUSARI_CHECK(xs[j].defined(), ValueError, "mn::alltoall: xs[", j, "] is undefined");
  }
  std::vector<Array> ys = comm.alltoall(data_of(xs));
  for (Array& y : ys) y = y.to_device(xs[0].device());
  std::vector<Variable> inputs = xs;
  inputs.push_back(placeholder());
  Communicator* c = &comm;
  return record_multi("mn_alltoall", inputs, std::move(ys), [c](BackwardContext& ctx) {
    check_first_order(ctx);
    std::vector<Array> gys;
    for (int i = 0; i < ctx.num_outputs(); ++i) gys.push_back(output_grad_array(ctx, i));
    // ys[i] came from rank i's xs[me]: its gradient goes back to rank i, and rank j returns the
    // gradient of this rank's xs[j].
    std::vector<Array> gxs = c->alltoall(gys);
    for (int j = 0; j < ctx.num_outputs(); ++j)
      set_received_grad(ctx, j, gxs[static_cast<size_t>(j)]);
  });
}

Variable bcast(Communicator& comm, const Variable& x, int root, std::optional<Device> device) {
  check_root(comm, root, "bcast");
  const bool is_root = comm.rank() == root;
  KUSARI_CHECK(!is_root || x.defined(), ValueError, "mn::bcast: x is undefined at the root (rank ",
               root, ")");
  Array y = comm.bcast(is_root ? x.data() : Array(), root,
                       is_root ? std::optional<Device>(x.device()) : device);
  std::vector<Variable> inputs;
  if (is_root) inputs.push_back(x);
  inputs.push_back(placeholder());
  Communicator* c = &comm;
  std::vector<Array> outputs;
  outputs.push_back(std::move(y));
  auto ys = record_multi("mn_bcast", inputs, std::move(outputs), [c, root](BackwardContext& ctx) {
    check_first_order(ctx);
    std::vector<Array> gys = c->gather(output_grad_array(ctx, 0), root);
    if (c->rank() == root) set_received_grad(ctx, 0, sum_on(gys, ctx.input(0).device()));
  });
  return ys[0];
}

std::vector<Variable> gather(Communicator& comm, const Variable& x, int root) {
  check_root(comm, root, "gather");
  KUSARI_CHECK(x.defined(), ValueError, "mn::gather: x is undefined");
  const bool is_root = comm.rank() == root;
  std::vector<Array> ys = comm.gather(x.data(), root);
  if (is_root) {
    for (Array& y : ys) y = y.to_device(x.device());
  } else {
    ys.push_back(delegate_array());  // Note [Delegate variables]
  }
  Communicator* c = &comm;
  return record_multi("mn_gather", {x, placeholder()}, std::move(ys),
                      [c, root](BackwardContext& ctx) {
                        check_first_order(ctx);
                        std::vector<Array> gys;
                        if (c->rank() == root) {
                          for (int i = 0; i < ctx.num_outputs(); ++i)
                            gys.push_back(output_grad_array(ctx, i));
                        }
                        set_received_grad(ctx, 0, c->scatter(gys, root));
                      });
}

Variable scatter(Communicator& comm, const std::vector<Variable>& xs, int root,
                 std::optional<Device> device) {
  check_root(comm, root, "scatter");
  const bool is_root = comm.rank() == root;
  std::vector<Variable> inputs;
  if (is_root) {
    KUSARI_CHECK(static_cast<int>(xs.size()) == comm.size(), ValueError,
                 "mn::scatter: the root has ", xs.size(), " variables for ", comm.size(),
                 " ranks (one variable per rank is needed)");
    for (size_t j = 0; j < xs.size(); ++j) {
      KUSARI_CHECK(xs[j].defined(), ValueError, "mn::scatter: xs[", j, "] is undefined");
    }
    inputs = xs;
  }
  Array y = is_root ? comm.scatter(data_of(xs), root) : comm.scatter({}, root, device);
  inputs.push_back(placeholder());
  Communicator* c = &comm;
  std::vector<Array> outputs;
  outputs.push_back(std::move(y));
  auto ys = record_multi("mn_scatter", inputs, std::move(outputs), [c, root](BackwardContext& ctx) {
    check_first_order(ctx);
    std::vector<Array> gys = c->gather(output_grad_array(ctx, 0), root);
    if (c->rank() == root) {
      for (size_t j = 0; j < gys.size(); ++j) set_received_grad(ctx, static_cast<int>(j), gys[j]);
    }
  });
  return ys[0];
}

}  // namespace kusari::mn
