// Differentiable activation functions (Chainer's F.activation family).
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// max(x, 0).
Variable relu(const Variable& x);

}  // namespace kusari::functions
