// FunctionNode and the recording API used by every differentiable function.
//
// Note [Writing a differentiable function]
// A function computes its outputs on Arrays, then records itself with its backward rule beside
// it, written with differentiable functions on Variables:
//
//   Variable exp(const Variable& x) {
//     Array y = kusari::exp(x.data());
//     return record("exp", {x}, y, [](BackwardContext& ctx) {
//       ctx.set_input_grad(0, ctx.output_grad() * ctx.output());
//     }, kRetainOutput);
//   }
//
// Inputs are always available to the rule (ctx.input(i)); an output is available only when
// retained. When no input requires a gradient, or inside NoBackpropMode, record() just wraps the
// arrays and the rule is dropped unseen. The rule runs in NoBackpropMode unless backward was
// asked for enable_double_backprop, in which case its own operations are recorded and the
// gradient can be differentiated again. A rule whose kernel can add its result into an existing
// array for free (cuDNN's beta = 1) may ask for input_grad_accumulator(i) and add into it
// instead of setting a gradient (Note [Accumulating into an input's gradient]).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "kusari/autograd/mode.h"
#include "kusari/autograd/variable.h"
#include "kusari/core/small_vector.h"

namespace kusari {

class BackwardContext;
namespace detail {
struct GraphAccess;

/// The engine's side of BackwardContext::input_grad_accumulator (Note [Accumulating into an
/// input's gradient] in src/autograd/backward.cc).
class GradAccumulators {
 public:
  /// The gradient `input` has received so far in this backward, when a rule may add into it in
  /// place; undefined otherwise.
  virtual Array find(VariableImpl& input) = 0;

 protected:
  ~GradAccumulators() = default;
};
}  // namespace detail

/// A backward rule: reads output gradients from the context, writes input gradients into it.
using BackwardRule = std::function<void(BackwardContext&)>;

/// One application of a function in the graph. See Note [Graph ownership].
class FunctionNode : public std::enable_shared_from_this<FunctionNode> {
 public:
  /// Inputs as the graph stores them: most functions have at most three.
  using Inputs = SmallVector<std::shared_ptr<detail::VariableImpl>, 3>;
  FunctionNode(const char* name, Inputs inputs, BackwardRule rule);
  ~FunctionNode();
  FunctionNode(const FunctionNode&) = delete;
  FunctionNode& operator=(const FunctionNode&) = delete;

  /// The function's name, e.g. "linear".
  const char* name() const { return name_; }
  int64_t generation() const { return generation_; }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  /// The input variables (the graph's edges).
  Variable input(int i) const { return Variable(inputs_[i]); }
  /// The output variable if it is still alive (undefined otherwise).
  Variable output(int i) const { return Variable(outputs_[i].impl.lock()); }

 private:
  friend class BackwardContext;
  friend struct detail::GraphAccess;
  struct Output {
    std::weak_ptr<detail::VariableImpl> impl;
    Array retained;  // defined only when the output was retained
    Shape shape;
    Dtype dtype = Dtype::kFloat32;
    Device device;
  };

  const char* name_;
  Inputs inputs_;
  SmallVector<Output, 1> outputs_;
  BackwardRule rule_;
  int64_t generation_ = 0;
  uint64_t visit_mark_ = 0;
};

/// What a backward rule sees: the output gradients, the inputs, the retained outputs.
class BackwardContext {
 public:
  int num_inputs() const { return node_.num_inputs(); }
  int num_outputs() const { return node_.num_outputs(); }
  /// Whether input i needs a gradient (rules may skip the others).
  bool needs_input_grad(int i) const { return node_.inputs_[i]->requires_grad; }
  /// Whether output i received a gradient.
  bool has_output_grad(int i = 0) const { return (*grad_outputs_)[i].defined(); }
  /// The gradient of output i (zeros if it received none).
  const Variable& output_grad(int i = 0);
  /// Input variable i.
  Variable input(int i) const { return Variable(node_.inputs_[i]); }
  /// Output variable i; it must have been retained when recorded.
  Variable output(int i = 0);
  /// Sets the gradient of input i; its shape and dtype must match the input's.
  void set_input_grad(int i, Variable grad);
  /// The gradient input i has already received in this backward, when the rule may add its own
  /// gradient into it in place instead of setting one (Note [Accumulating into an input's
  /// gradient]): never while recording (double backprop), never for a leaf, and only when
  /// nothing else refers to it and it is dense, of the input's shape, dtype and device.
  /// Undefined otherwise. A rule that adds into it calls set_input_grad_accumulated(i) and does
  /// not call set_input_grad(i, ...).
  Array input_grad_accumulator(int i) const;
  /// Says that the rule added input i's gradient into input_grad_accumulator(i).
  void set_input_grad_accumulated(int i);
  /// True when the rule's own operations are being recorded (double backprop).
  bool is_double_backprop() const { return double_backprop_; }
  const char* function_name() const { return node_.name(); }

  // For the engine. `accumulators` may be null (no rule may accumulate); `accumulated` (one
  // flag per input) must be given with it.
  BackwardContext(FunctionNode& node, std::vector<Variable>& grad_outputs, std::vector<Variable>& grad_inputs,
                  bool double_backprop, detail::GradAccumulators* accumulators = nullptr,
                  std::vector<uint8_t>* accumulated = nullptr)
      : node_(node),
        grad_outputs_(&grad_outputs),
        grad_inputs_(&grad_inputs),
        double_backprop_(double_backprop),
        accumulators_(accumulators),
        accumulated_(accumulated) {}

 private:
  FunctionNode& node_;
  std::vector<Variable>* grad_outputs_;
  std::vector<Variable>* grad_inputs_;
  bool double_backprop_;
  detail::GradAccumulators* accumulators_;
  std::vector<uint8_t>* accumulated_;
};

/// Which outputs a recorded function keeps for its backward rule.
enum RetainFlag : int { kRetainNothing = 0, kRetainOutput = 1 };

/// True when a function applied to `inputs` would be recorded (backprop enabled and some input
/// requires a gradient). Functions can use it to skip work that only backward needs.
bool needs_recording(std::initializer_list<const Variable*> inputs);
bool needs_recording(const std::vector<Variable>& inputs);

namespace detail {

/// Builds the node and the output variables; see record().
std::vector<Variable> record_node(const char* name, const Variable* inputs, size_t n_inputs,
                                  std::vector<Array> outputs, BackwardRule rule,
                                  const std::vector<int>& retained_outputs);
Variable record_node1(const char* name, const Variable* inputs, size_t n_inputs, Array output, BackwardRule rule,
                      bool retain_output);

}  // namespace detail

/// Records a one-output function (see Note [Writing a differentiable function]).
template <typename Rule>
Variable record(const char* name, std::initializer_list<Variable> inputs, Array output, Rule&& rule,
                RetainFlag retain = kRetainNothing) {
  bool any = false;
  if (is_backprop_enabled()) {
    for (const Variable& v : inputs) {
      if (v.defined() && v.requires_grad()) {
        any = true;
        break;
      }
    }
  }
  if (!any) return Variable(std::move(output));
  return detail::record_node1(name, inputs.begin(), inputs.size(), std::move(output),
                              BackwardRule(std::forward<Rule>(rule)), retain == kRetainOutput);
}

/// Records a function with any number of inputs and outputs.
template <typename Rule>
std::vector<Variable> record_multi(const char* name, const std::vector<Variable>& inputs, std::vector<Array> outputs,
                                   Rule&& rule, const std::vector<int>& retained_outputs = {}) {
  if (!needs_recording(inputs)) {
    std::vector<Variable> out;
    out.reserve(outputs.size());
    for (Array& a : outputs) out.emplace_back(std::move(a));
    return out;
  }
  return detail::record_node(name, inputs.data(), inputs.size(), std::move(outputs),
                             BackwardRule(std::forward<Rule>(rule)), retained_outputs);
}

}  // namespace kusari
