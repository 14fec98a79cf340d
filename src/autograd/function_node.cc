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

std::shared_ptr<FunctionNode> make_node(const char* name, const Variable* inputs, size_t n, BackwardRule rule) {
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
