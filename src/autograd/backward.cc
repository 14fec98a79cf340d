// The backward engine: walks the graph from the outputs, newest node first.
#include <atomic>
#include <optional>
#include <queue>
#include <unordered_map>

#include "autograd/graph_access.h"
#include "kusari/core/routines.h"

namespace kusari {
namespace detail {
namespace {

std::atomic<uint64_t> g_visit_counter{0};

// Where gradients go while the engine runs. In the normal mode (Variable::backward) they live in
// each VariableImpl's grad slot and leaves keep theirs; in the functional mode (kusari::grad)
// they live in a map and no variable's grad slot is touched.
class GradStore {
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
    if (!any) continue;
    KUSARI_CHECK(GraphAccess::rule(*node), GradientError, "backward: the graph through '",
                 node->name(),
                 "' was freed by an earlier backward with BackwardOptions::retain_graph = false; "
                 "keep it (retain_graph = true) to differentiate it again");
    gxs.assign(inputs.size(), Variable());
    {
      BackwardContext ctx(*node, gys, gxs, double_backprop);
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
      if (!gxs[i].defined()) continue;
      VariableImpl* in = inputs[i].get();
      if (!in->requires_grad) continue;
      store.accumulate(in, gxs[i]);
      if (in->creator) {
        push(in->creator.get());
      } else if (!store.functional()) {
        in->loss_scale = loss_scale;
      }
    }
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
  if (!self.creator) return;
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
