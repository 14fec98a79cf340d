// Differentiable connections with parameters: linear (fully connected), embed_id.
// Convolutions are in convolution.h.
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// y = x W^T + b for x (N, in), W (out, in), b (out,) (b may be undefined). Inputs with more
/// than two axes are flattened after `n_batch_axes` leading axes, as in Chainer.
Variable linear(const Variable& x, const Variable& W, const Variable& b = Variable(), int n_batch_axes = 1);

}  // namespace kusari::functions
