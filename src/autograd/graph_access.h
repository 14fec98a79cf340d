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

}  // namespace kusari::detail
