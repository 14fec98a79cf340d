// Differentiable activation functions (Chainer's F.activation family).
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"

namespace kusari::functions {

/// max(x, 0).
Variable relu(const Variable& x);
/// x where x >= 0, slope * x elsewhere (Chainer's leaky_relu).
Variable leaky_relu(const Variable& x, double slope = 0.2);
/// x where x >= 0, alpha * (exp(x) - 1) elsewhere.
Variable elu(const Variable& x, double alpha = 1.0);
/// 1 / (1 + exp(-x)), computed stably in both tails.
Variable sigmoid(const Variable& x);
/// Hyperbolic tangent.
Variable tanh(const Variable& x);
/// log(1 + exp(beta x)) / beta, computed stably.
Variable softplus(const Variable& x, double beta = 1.0);
/// x Phi(x), Phi the standard normal CDF (PyTorch's gelu); with tanh_approximation, the form
/// GPT-2 was trained with: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). One kernel each way;
/// differentiable any number of times.
Variable gelu(const Variable& x, bool tanh_approximation = false);
/// x sigmoid(x) (swish with beta 1). One kernel each way; differentiable any number of times.
Variable silu(const Variable& x);
/// exp(x) / sum(exp(x)) along `axis`.
Variable softmax(const Variable& x, int axis = 1);
/// x - logsumexp(x) along `axis`.
Variable log_softmax(const Variable& x, int axis = 1);

/// scale * elu(x, alpha): the self-normalising activation (Klambauer et al. 2017), with their
/// constants by default (Chainer's selu).
Variable selu(const Variable& x, double alpha = 1.6732632423543772848170429916717,
              double scale = 1.0507009873554804934193349852946);
/// clip(0.2 x + 0.5, 0, 1) (Chainer's hard_sigmoid); the gradient is 0.2 inside (-2.5, 2.5).
Variable hard_sigmoid(const Variable& x);
/// concat(relu(x), relu(-x)) along `axis`: the concatenated ReLU (Shang et al. 2016); that axis
/// doubles.
Variable crelu(const Variable& x, int axis = 1);
/// The maximum over groups of `pool_size` consecutive entries of `axis` (Goodfellow et al. 2013,
/// Chainer's maxout): that axis shrinks from M to M / pool_size (ValueError unless it divides).
Variable maxout(const Variable& x, int64_t pool_size, int axis = 1);

}  // namespace kusari::functions
