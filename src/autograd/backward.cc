// The backward engine: walks the graph from the outputs, newest node first.
#include <atomic>
#include <optional>
#include <queue>
#include <unordered_map>
#include <utility>

#include "autograd/graph_access.h"
#include "kusari/core/routines.h"

namespace kusari {
namespace detail {
namespace {

std::atomic<uint64_t> g_visit_counter{0};

// Where gradients go while the engine runs. In the normal mode (Variable::backward) they live in
// each VariableImpl's grad slot and leaves keep theirs; in the functional mode (kusari::grad)
// they live in a map and no variable's grad slot is touched.
class GradStore final : public GradAccumulators {
 public:
  explicit GradStore(bool functional) : functional_(functional) {}

  Variable get(VariableImpl* v) const {
    if (functional_) {
      auto it = map_.find(v);
      return it == map_.end() ? Variable() : it->second;
    }
    return v->grad ? Variable(v->grad) : Variable();
  }

  void set(VariableImpl* v, const Variable& g) {
    if (functional_) {
      map_[v] = g;
    } else {
      v->grad = g.impl_ptr();
    }
  }

  void clear(VariableImpl* v) {
    if (functional_) {
      map_.erase(v);
    } else {
      v->grad.reset();
    }
  }

  void accumulate(VariableImpl* v, const Variable& g) {
    Variable cur = get(v);
    if (!cur.defined()) {
      set(v, (!functional_ && !v->creator) ? adopt_leaf_grad(g) : g);
      return;
    }
    // Differentiable sum when double backprop records; otherwise plain arrays.
    if (is_backprop_enabled() && (cur.requires_grad() || g.requires_grad())) {
      Array sum = add(cur.data(), g.data());
      set(v, record("accumulate_grad", {cur, g}, std::move(sum), [](BackwardContext& ctx) {
            ctx.set_input_grad(0, ctx.output_grad());
            ctx.set_input_grad(1, ctx.output_grad());
          }));
    } else if (!functional_ && !v->creator && v->grad_in_buffer() && fits_grad_buffer(*v, g)) {
      const Array& a = g.data();
      add_to(v->grad_buffer, a.shares_memory_with(v->grad_buffer) && !a.same_view(v->grad_buffer) ? a.copy() : a);
    } else {
      set(v, Variable(add(cur.data(), g.data())));
    }
  }

  bool functional() const { return functional_; }

  // Note [Accumulating into an input's gradient]
  // A variable used by two functions (a residual block's input feeds the shortcut and the first
  // convolution) gets two gradients, which the engine sums with add(): a third pass over
  // memory and a new array, for each block of a ResNet 4 ms of a 39 ms bfloat16 step. A rule
  // that can add its result into an existing array for free (cuDNN's backward-data with
  // beta = 1 reads the old gradient and writes the sum in one pass) asks its context for
  // input_grad_accumulator(i) and, when given one, adds into it and calls
  // set_input_grad_accumulated(i); the engine then skips its own sum. An array is offered only
  // when writing into it cannot be seen by anyone else:
  //   - not while the rule is recorded (double backprop differentiates the sum; a recorded
  //     gradient must keep its value) and never for a leaf (a leaf's gradient may be adopted
  //     from, or be, a persistent buffer: Note [Gradients in a persistent buffer]);
  //   - the gradient variable is held by the store alone and its array is the only reference to
  //     its memory: backward rules pass gradients through unchanged (add gives the same array
  //     to both inputs), so the sum would otherwise also change another variable's gradient,
  //     or the output gradient the rule is reading. With retain_grad the outputs keep their
  //     gradients, which such shared arrays then are, and nothing is offered;
  //   - it is dense in its memory format and has the input's shape, dtype and device.
  // The sum is the same as the engine's (cur + g), up to where the rule rounds.
  Array find(VariableImpl& input) override {
    if (!input.creator) return Array();
    const VariableImpl* g = nullptr;
    if (functional_) {
      auto it = map_.find(&input);
      if (it == map_.end() || it->second.impl_ptr().use_count() != 1) return Array();
      g = &it->second.impl();
    } else {
      if (!input.grad || input.grad.use_count() != 1) return Array();
      g = input.grad.get();
    }
    if (g->requires_grad || g->creator) return Array();
    const Array& a = g->data;
    if (!a.defined() || a.storage().use_count() != 1 || !a.is_contiguous(a.memory_format())) return Array();
    if (a.shape() != input.data.shape() || a.dtype() != input.data.dtype() || a.device() != input.data.device()) {
      return Array();
    }
    return a;
  }

  // Note [Leaf gradients own their memory]
  // Backward rules may pass a gradient through unchanged (add, reshape, broadcast views), so the
  // same array can reach two leaves, or be a stride-0 view. Optimizers, hooks and the multi-node
  // allreduce write into leaf gradients in place, so a leaf adopts a gradient only when nothing
  // else refers to it and it is dense (contiguous or channels-last); otherwise it gets its own copy
  // in its layout. A leaf with a
  // persistent gradient buffer adopts its first gradient the same way
  // (Note [Gradients in a persistent buffer]).
  static Variable adopt_leaf_grad(const Variable& g) {
    if (g.requires_grad()) return g;  // a double-backprop graph: keep it
    const Array& a = g.data();
    // Dense in its own layout: C order, or channels-last (Note [Memory formats]).
    const MemoryFormat format = a.memory_format();
    if (g.impl_ptr().use_count() == 1 && a.storage().use_count() == 1 && a.is_contiguous(format)) return g;
    Array own = Array::empty_like(a);
    own.assign(a);
    return Variable(own);
  }

  // Note [Gradients in a persistent buffer]
  // A parameter may have a gradient buffer bound (Parameter::set_grad_buffer); the multi-node
  // communicators bind every parameter to its view of their flat reduction buffer, so that the
  // allreduce needs no unpack (Note [Gradients in the reduction buffer] in
  // src/mn/gradient_buffer.cc). In the normal (non-functional) mode, for a leaf with a buffer:
  //   - the first gradient of a backward (the leaf has none) is adopted as without a buffer, not
  //     copied into it: a communicator copies every such gradient into its segment with one
  //     batched kernel (the same memory traffic as a copy here, but one launch instead of one per
  //     parameter, which on a GPU cost 1.1 ms per step for ResNet-50's 161 parameters), and then
  //     makes the segment the gradient, so that it never unpacks;
  //   - a gradient arriving when the current gradient is the buffer itself (after zerograd, or
  //     a backward after a reduction without cleargrads: gradient accumulation) is added in place
  //     (add_to), so accumulation allocates nothing;
  //   - a gradient that is part of a double-backprop graph (requires_grad) never goes into the
  //     buffer: the leaf keeps the recorded variable, exactly as without a buffer, since the
  //     graph may be differentiated again and must not see its value change in place. A current
  //     gradient that is not the buffer (set with set_grad, or recorded) is summed into a new
  //     array as before; so is a gradient of another shape, dtype or device (never for a
  //     well-formed rule).
  // cleargrad keeps the binding (the communicator moves the next gradient in again), zerograd fills
  // the buffer, set_grad makes any array the gradient (the binding stays). The price is aliasing:
  // whoever holds the gradient array holds the buffer, and the next backward overwrites it.
  static bool fits_grad_buffer(const VariableImpl& v, const Variable& g) {
    const Array& b = v.grad_buffer;
    if (!b.defined() || g.requires_grad()) return false;
    const Array& a = g.data();
    return a.shape() == b.shape() && a.dtype() == b.dtype() && a.device() == b.device();
  }

 private:
  bool functional_;
  std::unordered_map<VariableImpl*, Variable> map_;
};

// Note [Gradient-ready hooks]
// A leaf's hooks (Variable::add_grad_ready_hook) run once the leaf's gradient for this backward
// is final, so that a data-parallel reducer can send it while backward goes on with the rest of
// the graph (Note [Overlapped gradient reduction] in src/mn/reduce/bucket_reducer.h). The engine
// runs nodes newest generation first, and a node's consumers always have a higher generation, so
// when a node runs every consumer that will ever run already has. But "the last node that uses
// the leaf has run" is not enough: a consumer that never receives a gradient is never queued and
// never runs. So, as PyTorch's engine counts dependencies, a first pass over the graph that
// backward can reach (through inputs with requires_grad, as the walk itself goes) counts the
// edges into each node and into each leaf that has hooks. When a node is done (run, or popped
// without gradients) each of its inputs loses an edge; a node whose count reaches zero without
// ever being queued can no longer get a gradient, so it is done at once (dead) and its inputs lose
// their edges in turn. A leaf whose count reaches zero has had every contribution of this
// backward: its hooks run then, if it received one (a leaf the outputs reach only through
// functions that gave it no gradient is not ready: its hooks do not run). A leaf used twice by one
// node, or by several, counts each edge, so the hooks run after the last one has been summed;
// with enable_double_backprop the summed gradient is a recorded variable, and the hooks see it.
// Only Variable::backward runs hooks: kusari::grad leaves the leaves' gradients alone. While no
// hook exists anywhere (live_grad_ready_hooks() == 0) the first pass is skipped, so backward
// costs what it did.
class ReadyTracker {
 public:
  /// Counts the edges of the graph reachable from `roots`; `mark` must be fresh (the walk's own
  /// marks differ from it).
  void plan(const std::vector<VariableImpl*>& roots, uint64_t mark) {
    std::vector<FunctionNode*> stack;
    auto visit = [&](FunctionNode* node) {
      uint64_t& m = GraphAccess::visit_mark(*node);
      if (m == mark) return;
      m = mark;
      stack.push_back(node);
    };
    for (VariableImpl* r : roots) {
      if (r->creator) visit(r->creator.get());
    }
    while (!stack.empty()) {
      FunctionNode* node = stack.back();
      stack.pop_back();
      for (const auto& in : GraphAccess::inputs(*node)) {
        if (!in->requires_grad) continue;
        if (in->creator) {
          ++node_edges_[in->creator.get()];
          visit(in->creator.get());
        } else if (!in->grad_ready_hooks.list.empty()) {
          Leaf& leaf = leaves_[in.get()];
          leaf.impl = in;
          ++leaf.edges;
        }
      }
    }
  }

  /// `leaf` received a gradient in this backward.
  void received(VariableImpl* leaf) {
    auto it = leaves_.find(leaf);
    if (it != leaves_.end()) it->second.received = true;
  }

  /// `node` is done (its rule ran, or it had no gradient); `queued_mark` is the walk's mark of
  /// queued nodes. Runs the hooks of the leaves this completes, and finishes dead nodes.
  void done(FunctionNode* node, uint64_t queued_mark) {
    std::vector<FunctionNode*> finished{node};
    while (!finished.empty()) {
      FunctionNode* n = finished.back();
      finished.pop_back();
      for (const auto& in : GraphAccess::inputs(*n)) {
        if (!in->requires_grad) continue;
        if (in->creator) {
          FunctionNode* c = in->creator.get();
          auto it = node_edges_.find(c);
          if (it == node_edges_.end() || --it->second > 0) continue;
          node_edges_.erase(it);
          if (GraphAccess::visit_mark(*c) != queued_mark) finished.push_back(c);  // dead
        } else {
          auto it = leaves_.find(in.get());
          if (it == leaves_.end() || --it->second.edges > 0) continue;
          Leaf leaf = std::move(it->second);
          leaves_.erase(it);
          if (leaf.received) run_grad_ready_hooks(leaf.impl);
        }
      }
    }
  }

  /// Runs the hooks of `leaf` (a copy of the list: a hook may remove itself or others).
  static void run_grad_ready_hooks(const std::shared_ptr<VariableImpl>& leaf) {
    if (leaf->grad_ready_hooks.list.empty()) return;
    const auto hooks = leaf->grad_ready_hooks.list;
    const Variable v(leaf);
    for (const auto& [id, hook] : hooks) hook(v);
  }

 private:
  struct Leaf {
    std::shared_ptr<VariableImpl> impl;
    int64_t edges = 0;
    bool received = false;
  };
  std::unordered_map<FunctionNode*, int64_t> node_edges_;
  std::unordered_map<VariableImpl*, Leaf> leaves_;
};

struct QueueEntry {
  int64_t generation;
  uint64_t sequence;
  FunctionNode* node;
  bool operator<(const QueueEntry& o) const {
    if (generation != o.generation) return generation < o.generation;
    return sequence < o.sequence;
  }
};

// Note [Freeing the graph during backward]
// A node's backward rule holds what it saved in the forward (its inputs, retained outputs and
// the arrays its rule captured). Kept until the graph dies, all of them are still alive when
// backward reaches the first layers, whose gradients are the largest: a ResNet-50 step then
// peaked gigabytes above PyTorch, which frees each node's saved tensors once it has run. With
// BackwardOptions::retain_graph = false the engine does the same: after a node's rule ran and
// its input gradients were handed on, the node drops its rule (and so the captured arrays), its
// retained outputs and its inputs. An input made by a node that has not run yet must stay alive
// until then, because its gradient travels in it (GradStore keeps gradients in the variables),
// so the engine holds it, keyed by that creator, and lets it go once the creator has run; an
// activation is then freed as soon as the last node that needs it is done. The functional mode
// (kusari::grad) keys gradients by the variables' addresses and double backprop records a graph
// that refers to the old one, so neither frees. A freed node that is reached again raises
// GradientError.

void run_backward(const std::vector<VariableImpl*>& roots, GradStore& store, bool retain_grad, bool double_backprop,
                  double loss_scale, const std::vector<VariableImpl*>& keep, bool free_graph = false) {
  const BackwardScope scope;
  std::optional<ReadyTracker> ready;
  if (!store.functional() && live_grad_ready_hooks() > 0) {
    ready.emplace();
    ready->plan(roots, ++g_visit_counter);
  }
  const uint64_t mark = ++g_visit_counter;
  std::priority_queue<QueueEntry> queue;
  uint64_t sequence = 0;
  auto push = [&](FunctionNode* node) {
    uint64_t& m = GraphAccess::visit_mark(*node);
    if (m == mark) return;
    m = mark;
    queue.push({node->generation(), sequence++, node});
  };
  for (VariableImpl* r : roots) {
    if (r->creator) push(r->creator.get());
  }
  auto is_kept = [&](VariableImpl* v) {
    for (VariableImpl* k : keep) {
      if (k == v) return true;
    }
    return false;
  };

  // Inputs of freed nodes whose creators have not run yet (Note [Freeing the graph during
  // backward]).
  std::unordered_map<FunctionNode*, std::vector<std::shared_ptr<VariableImpl>>> held;
  std::vector<Variable> gys, gxs;
  std::vector<uint8_t> accumulated;
  while (!queue.empty()) {
    FunctionNode* node = queue.top().node;
    queue.pop();
    auto& outputs = GraphAccess::outputs(*node);
    auto& inputs = GraphAccess::inputs(*node);
    gys.assign(outputs.size(), Variable());
    bool any = false;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (auto impl = outputs[i].impl.lock()) {
        gys[i] = store.get(impl.get());
        any = any || gys[i].defined();
      }
    }
    if (!any) {
      if (ready) ready->done(node, mark);
      continue;
    }
    KUSARI_CHECK(GraphAccess::rule(*node), GradientError, "backward: the graph through '",
                 node->name(),
                 "' was freed by an earlier backward with BackwardOptions::retain_graph = false; "
                 "keep it (retain_graph = true) to differentiate it again");
    gxs.assign(inputs.size(), Variable());
    accumulated.assign(inputs.size(), 0);
    {
      BackwardContext ctx(*node, gys, gxs, double_backprop, &store, &accumulated);
      if (double_backprop) {
        ForceBackpropMode mode;
        GraphAccess::rule(*node)(ctx);
      } else {
        NoBackpropMode mode;
        GraphAccess::rule(*node)(ctx);
      }
    }
    if (!retain_grad) {
      for (auto& out : outputs) {
        if (auto impl = out.impl.lock()) {
          if (!is_kept(impl.get())) store.clear(impl.get());
        }
      }
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!gxs[i].defined() && !accumulated[i]) continue;
      VariableImpl* in = inputs[i].get();
      if (!in->requires_grad) continue;
      if (!accumulated[i]) store.accumulate(in, gxs[i]);  // else the rule added it in place
      if (in->creator) {
        push(in->creator.get());
      } else if (!store.functional()) {
        in->loss_scale = loss_scale;
        if (ready) ready->received(in);
      }
    }
    if (ready) ready->done(node, mark);  // (before the inputs are freed: it reads them)
    if (free_graph) {
      GraphAccess::rule(*node) = nullptr;
      for (auto& out : outputs) out.retained = Array();
      for (auto& in : inputs) {
        if (in && in->creator) held[in->creator.get()].push_back(std::move(in));
      }
      inputs.clear();
      held.erase(node);  // its outputs' gradients were read and cleared above
    }
  }
}

}  // namespace
}  // namespace detail

void Variable::backward(const BackwardOptions& options) const {
  detail::VariableImpl& self = impl();
  detail::GradStore store(false);
  const double scale = options.loss_scale.value_or(1.0);
  if (!self.grad) {
    KUSARI_CHECK(self.data.size() == 1, GradientError, "backward: the variable has shape ", self.data.shape(),
                 "; backward() starts from a scalar, or from a variable whose grad was set first");
    Array ones = Array::full(self.data.shape(), scale, self.data.dtype(), self.data.device());
    self.grad = Variable(ones).impl_ptr();
  } else if (options.loss_scale) {
    self.grad = Variable(Variable(self.grad).data() * scale).impl_ptr();
  }
  if (!self.creator) {
    // A leaf's backward: its gradient is the initial one, final at once.
    if (self.requires_grad) detail::ReadyTracker::run_grad_ready_hooks(impl_);
    return;
  }
  detail::run_backward({&self}, store, options.retain_grad, options.enable_double_backprop, scale, {&self},
                       !options.retain_graph && !options.enable_double_backprop);
}

std::vector<Variable> grad(const std::vector<Variable>& outputs, const std::vector<Variable>& inputs,
                           const std::vector<Variable>& grad_outputs, bool enable_double_backprop) {
  KUSARI_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(), ValueError, "grad: ", outputs.size(),
               " outputs but ", grad_outputs.size(), " grad_outputs");
  detail::GradStore store(true);
  std::vector<detail::VariableImpl*> roots, keep;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Variable& y = outputs[i];
    Variable gy;
    if (!grad_outputs.empty() && grad_outputs[i].defined()) {
      gy = grad_outputs[i];
      KUSARI_CHECK(gy.shape() == y.shape(), ShapeError, "grad: grad_outputs[", i, "] has shape ", gy.shape(),
                   " but outputs[", i, "] has shape ", y.shape());
    } else {
      KUSARI_CHECK(y.size() == 1, GradientError, "grad: outputs[", i, "] has shape ", y.shape(),
                   "; give its gradient in grad_outputs");
      gy = Variable(Array::ones_like(y.data()));
    }
    store.accumulate(&y.impl(), gy);
    roots.push_back(&y.impl());
  }
  for (const Variable& x : inputs) keep.push_back(&x.impl());
  for (auto* r : roots) keep.push_back(r);
  detail::run_backward(roots, store, false, enable_double_backprop, 1.0, keep);
  std::vector<Variable> result;
  result.reserve(inputs.size());
  for (const Variable& x : inputs) result.push_back(store.get(&x.impl()));
  return result;
}

}  // namespace kusari
