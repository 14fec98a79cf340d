// Scaled dot-product attention, the core of a transformer.
#pragma once

#include <optional>

#include "kusari/autograd/variable.h"
#include "kusari/core/random.h"

namespace kusari::functions {

/// How scaled_dot_product_attention computes.
enum class AttentionPath {
  kAuto,      ///< the fused or blocked kernels where the device has them, else composed
  kFused,     ///< the kernels only: an error if the device or dtype has none
  kComposed,  ///< matmul, softmax, matmul: holds the (batch, heads, q_len, kv_len) probabilities
};

/// The options of scaled_dot_product_attention.
struct AttentionOptions {
  /// Undefined, or an array that broadcasts to (batch, heads, q_len, kv_len): bool (true where a
  /// query may attend to a key) or q's dtype (added to the scaled scores).
  Array mask;
  /// Each query attends to the keys up to its own position, aligned at the bottom right: query i
  /// of q_len sees keys j <= i + kv_len - q_len (the usual causal mask when q_len == kv_len, and
  /// the right one for new queries after a KV cache).
  bool causal = false;
  /// The probability of dropping an attention weight, in training mode only (Chainer's config).
  double dropout = 0.0;
  /// The scores' scale; 1 / sqrt(head_dim) by default.
  std::optional<double> scale;
  AttentionPath path = AttentionPath::kAuto;
  /// The dropout's random numbers (default_generator() when null).
  Generator* generator = nullptr;
};

/// softmax(q k^T * scale + mask) v over the last two axes, as PyTorch's
/// F.scaled_dot_product_attention: q is (batch, heads, q_len, head_dim), k (batch, heads,
/// kv_len, head_dim), v (batch, heads, kv_len, v_dim); 3-d arguments are one head. The result
/// is (batch, heads, q_len, v_dim). On the CPU it runs blocked (Note [Blocked attention]): no
/// (q_len, kv_len) matrix per head is ever held, forward or backward. A query whose keys are all
/// masked gets 0. Differentiable in q, k and v, twice (double backprop recomputes the weights
/// with differentiable functions).
Variable scaled_dot_product_attention(const Variable& q, const Variable& k, const Variable& v,
                                      const AttentionOptions& options = {});

}  // namespace kusari::functions
