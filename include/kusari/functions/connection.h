// Differentiable connections with parameters: linear (fully connected), embed_id.
// Convolutions are in convolution.h.
#pragma once

#include <cstdint>
#include <optional>

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// y = x W^T + b for x (N, in), W (out, in), b (out,) (b may be undefined). Inputs with more
/// than two axes are flattened after `n_batch_axes` leading axes, as in Chainer.
Variable linear(const Variable& x, const Variable& W, const Variable& b = Variable(), int n_batch_axes = 1);

/// y = W[x]: the rows of W (vocab, dim) picked by integer ids x (int32 or int64, any shape), so y
/// has shape x.shape + (dim,). Ids equal to `ignore_label` give rows of zeros; every other id must
/// lie in [0, valid_ids) (IndexError otherwise), where valid_ids defaults to vocab and may be set
/// lower (0 < valid_ids <= vocab) to refuse rows that no id may select, such as the padding rows
/// of a padded vocabulary (Note [Valid ids of an embedding]). The gradient with respect to W is a
/// scatter-add of gy.
Variable embed_id(const Array& x, const Variable& W,
                  std::optional<int64_t> ignore_label = std::nullopt,
                  std::optional<int64_t> valid_ids = std::nullopt);

}  // namespace kusari::functions
