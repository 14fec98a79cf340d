// Internal access to FunctionNode's private state for the graph code (recording, backward).
#pragma once

#include "kusari/autograd/function_node.h"

namespace kusari::detail {

struct GraphAccess {
  static auto& inputs(FunctionNode& n) { return n.inputs_; }
  static auto& outputs(FunctionNode& n) { return n.outputs_; }
  static auto& rule(FunctionNode& n) { return n.rule_; }
  static int64_t& generation(FunctionNode& n) { return n.generation_; }
  static uint64_t& visit_mark(FunctionNode& n) { return n.visit_mark_; }
};

/// Says that the backward rule of `output`'s creator never reads the data of its input `i`, so
/// that the data may be freed once only such nodes refer to the input (Note [Inputs whose data
/// no rule reads] in function_node.cc). Does nothing when `output` was not recorded.
void input_data_unread(const Variable& output, int i);

/// Counts the backward passes running on this thread: nodes recorded by backward rules (double
/// backprop) do not call DataSource::at_next_node, since a rule may hold data it read earlier.
struct BackwardScope {
  BackwardScope();
  ~BackwardScope();
  BackwardScope(const BackwardScope&) = delete;
  BackwardScope& operator=(const BackwardScope&) = delete;
};

}  // namespace kusari::detail
