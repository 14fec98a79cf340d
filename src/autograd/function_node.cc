#include "kusari/autograd/function_node.h"

#include <algorithm>

#include "autograd/graph_access.h"

namespace kusari {

FunctionNode::FunctionNode(const char* name, Inputs inputs, BackwardRule rule)
    : name_(name), inputs_(std::move(inputs)), rule_(std::move(rule)) {}

// Note [Iterative graph teardown]
// Dropping the last reference to a long chain (an RNN unrolled for thousands of steps) would
// otherwise destroy node after node recursively and overflow the stack. A node's destructor
// instead moves its input references onto a thread-local list; only the outermost destructor
// drains that list, so the depth of nested destructors stays bounded.
FunctionNode::~FunctionNode() {
  thread_local std::vector<std::shared_ptr<detail::VariableImpl>> pending;
  thread_local bool draining = false;
  for (auto& in : inputs_) {
    if (in) pending.push_back(std::move(in));
  }
  if (draining) {
    rule_ = nullptr;
    return;
  }
  draining = true;
  rule_ = nullptr;
  while (!pending.empty()) {
    std::shared_ptr<detail::VariableImpl> p = std::move(pending.back());
    pending.pop_back();
    p.reset();
  }
  draining = false;
}

const Variable& BackwardContext::output_grad(int i) {
  Variable& g = (*grad_outputs_)[i];
  if (!g.defined()) {
    const auto& out = node_.outputs_[i];
    g = Variable(Array::zeros(out.shape, out.dtype, out.device));
  }
  return g;
}

Variable BackwardContext::output(int i) {
  auto& out = node_.outputs_[i];
  if (auto impl = out.impl.lock()) return Variable(impl);
  KUSARI_ASSERT(out.retained.defined(), "backward of ", node_.name(), " reads output ", i,
                " which was not retained (record it with kRetainOutput)");
  // The output variable is gone; rebuild it with the same creator so that a double-backprop
  // graph through it still reaches this node.
  auto impl = std::make_shared<detail::VariableImpl>();
  impl->data = out.retained;
  impl->creator = node_.shared_from_this();
  impl->requires_grad = true;
  impl->generation = node_.generation_ + 1;
  out.impl = impl;
  return Variable(impl);
}

void BackwardContext::set_input_grad(int i, Variable grad) {
  KUSARI_ASSERT(i >= 0 && i < num_inputs(), "backward of ", node_.name(), ": input index ", i, " out of range");
  if (grad.defined()) {
    const detail::VariableImpl& in = *node_.inputs_[i];
    KUSARI_CHECK(grad.shape() == in.data.shape(), GradientError, "backward of ", node_.name(),
                 ": the gradient of input ", i, " has shape ", grad.shape(), " but the input has shape ",
                 in.data.shape());
    KUSARI_CHECK(grad.dtype() == in.data.dtype(), GradientError, "backward of ", node_.name(),
                 ": the gradient of input ", i, " has dtype ", dtype_name(grad.dtype()), " but the input has dtype ",
                 dtype_name(in.data.dtype()));
  }
  (*grad_inputs_)[i] = std::move(grad);
}

Array BackwardContext::input_grad_accumulator(int i) const {
  KUSARI_ASSERT(i >= 0 && i < num_inputs(), "backward of ", node_.name(), ": input index ", i, " out of range");
  if (double_backprop_ || !accumulators_ || !node_.inputs_[i]->requires_grad) return Array();
  return accumulators_->find(*node_.inputs_[i]);
}

void BackwardContext::set_input_grad_accumulated(int i) {
  KUSARI_ASSERT(i >= 0 && i < num_inputs(), "backward of ", node_.name(), ": input index ", i, " out of range");
  KUSARI_ASSERT(accumulators_ && accumulated_ && !double_backprop_, "backward of ", node_.name(),
                ": set_input_grad_accumulated without an accumulator");
  (*accumulated_)[static_cast<size_t>(i)] = 1;
  (*grad_inputs_)[i] = Variable();
}

bool needs_recording(std::initializer_list<const Variable*> inputs) {
  if (!is_backprop_enabled()) return false;
  for (const Variable* v : inputs) {
    if (v->defined() && v->requires_grad()) return true;
  }
  return false;
}

bool needs_recording(const std::vector<Variable>& inputs) {
  if (!is_backprop_enabled()) return false;
  for (const Variable& v : inputs) {
    if (v.defined() && v.requires_grad()) return true;
  }
  return false;
}

namespace detail {

namespace {

// Note [Inputs whose data no rule reads]
// A node holds its inputs' VariableImpls (Note [Graph ownership]), and so their data, until
// backward has passed it, whether or not its rule reads them. Most rules do; some never do: the
// batch norm + add + relu takes a residual only to pass it a gradient. In ResNet-50 that kept
// the four downsampling branches' outputs (735 MiB at batch 128 in float32) from the forward to
// the backward, where PyTorch's `out += identity` keeps nothing. A function declares such an
// input after recording (input_data_unread); the pair (input, node) goes on a thread-local list.
// Each later record() looks at the list: an input whose every strong reference is held by live
// nodes of the list, at the slots declared (no Variable of the program, no node that reads it, no
// backward in progress holds it), can never have its data read again, and its data is replaced
// by a one-element array broadcast to the same shape, dtype and device, so that the shape checks
// of backward still see the input's geometry. Only graph introspection (FunctionNode::input) can
// reach such a variable afterwards, and its values are then not the input's. An entry leaves the
// list when its input or node is gone or its data was released.
struct UnreadInput {
  std::weak_ptr<VariableImpl> impl;
  std::weak_ptr<FunctionNode> node;
  int index;
};
thread_local std::vector<UnreadInput> t_unread_inputs;

/// True when entry `e` still names a live node holding `impl` at its slot.
bool holds(const UnreadInput& e, const std::shared_ptr<VariableImpl>& impl) {
  std::shared_ptr<FunctionNode> node = e.node.lock();
  if (!node) return false;
  const auto& in = GraphAccess::inputs(*node);
  return static_cast<size_t>(e.index) < in.size() && in[static_cast<size_t>(e.index)] == impl;
}

void release_unread_inputs() {
  auto& list = t_unread_inputs;
  size_t kept = 0;
  for (size_t a = 0; a < list.size(); ++a) {
    std::shared_ptr<VariableImpl> impl = list[a].impl.lock();
    if (!impl || !holds(list[a], impl)) continue;  // gone, or its node let it go
    // References besides `impl` itself: this slot, and any other declared slot holding it (a
    // variable used as the residual of two blocks), or something that may read the data.
    const long others = impl.use_count() - 1;
    long slots = 1;
    if (others > 1) {
      for (size_t b = 0; b < list.size() && slots < others; ++b) {
        if (b != a && list[b].impl.lock() == impl && holds(list[b], impl)) ++slots;
      }
    }
    if (others == slots) {
      const Array& d = impl->data;
      impl->data = Array::empty({1}, d.dtype(), d.device()).broadcast_to(d.shape());
      continue;
    }
    list[kept++] = list[a];
  }
  list.resize(kept);
}

// Data sources waiting for the next node (DataSource::at_next_node): sharded parameters release
// whole values there, when no function is between reading data and recording itself.
thread_local std::vector<DataSource*> t_at_next_node;
thread_local int t_backward_depth = 0;

void run_at_next_node() {
  std::vector<DataSource*> sources;
  sources.swap(t_at_next_node);
  for (DataSource* s : sources) s->at_next_node();
}

std::shared_ptr<FunctionNode> make_node(const char* name, const Variable* inputs, size_t n, BackwardRule rule) {
  if (!t_unread_inputs.empty()) release_unread_inputs();
  if (!t_at_next_node.empty() && t_backward_depth == 0) [[unlikely]]
    run_at_next_node();
  FunctionNode::Inputs in;
  in.reserve(n);
  int64_t gen = 0;
  for (size_t i = 0; i < n; ++i) {
    KUSARI_ASSERT(inputs[i].defined(), name, ": input ", i, " is undefined");
    gen = std::max(gen, inputs[i].impl().generation);
    in.push_back(inputs[i].impl_ptr());
  }
  auto node = std::make_shared<FunctionNode>(name, std::move(in), std::move(rule));
  GraphAccess::generation(*node) = gen;
  return node;
}

std::shared_ptr<VariableImpl> make_output(const std::shared_ptr<FunctionNode>& node, Array data, bool retain) {
  auto impl = std::make_shared<VariableImpl>();
  impl->creator = node;
  impl->requires_grad = true;
  impl->generation = node->generation() + 1;
  auto& outputs = GraphAccess::outputs(*node);
  auto& out = outputs.emplace_back();
  out.impl = impl;
  if (retain) out.retained = data;
  out.shape = data.shape();
  out.dtype = data.dtype();
  out.device = data.device();
  impl->data = std::move(data);
  return impl;
}

}  // namespace

BackwardScope::BackwardScope() {
  ++t_backward_depth;
}
BackwardScope::~BackwardScope() {
  --t_backward_depth;
}

void call_at_next_node(DataSource* source) {
  if (std::find(t_at_next_node.begin(), t_at_next_node.end(), source) == t_at_next_node.end()) {
    t_at_next_node.push_back(source);
  }
}

void cancel_calls_at_next_node(DataSource* source) {
  std::erase(t_at_next_node, source);
}

void input_data_unread(const Variable& output, int i) {
  if (!output.defined() || !output.impl().creator) return;
  const std::shared_ptr<FunctionNode>& node = output.impl().creator;
  const auto& in = GraphAccess::inputs(*node);
  KUSARI_ASSERT(i >= 0 && static_cast<size_t>(i) < in.size(), node->name(), ": input index ", i, " out of range");
  const std::shared_ptr<VariableImpl>& impl = in[static_cast<size_t>(i)];
  // An input that is also another input of the node is read through that one.
  for (size_t j = 0; j < in.size(); ++j) {
    if (static_cast<int>(j) != i && in[j] == impl) return;
  }
  const Array& d = impl->data;
  if (d.ndim() == 0 || d.size() <= 1) return;  // nothing to gain
  t_unread_inputs.push_back({impl, node, i});
}

Variable record_node1(const char* name, const Variable* inputs, size_t n_inputs, Array output, BackwardRule rule,
                      bool retain_output) {
  auto node = make_node(name, inputs, n_inputs, std::move(rule));
  GraphAccess::outputs(*node).reserve(1);
  return Variable(make_output(node, std::move(output), retain_output));
}

std::vector<Variable> record_node(const char* name, const Variable* inputs, size_t n_inputs,
                                  std::vector<Array> outputs, BackwardRule rule,
                                  const std::vector<int>& retained_outputs) {
  auto node = make_node(name, inputs, n_inputs, std::move(rule));
  GraphAccess::outputs(*node).reserve(outputs.size());
  std::vector<Variable> result;
  result.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    bool retain = std::find(retained_outputs.begin(), retained_outputs.end(), static_cast<int>(i)) !=
                  retained_outputs.end();
    result.emplace_back(make_output(node, std::move(outputs[i]), retain));
  }
  return result;
}

}  // namespace detail
}  // namespace kusari
