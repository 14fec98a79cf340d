// The links of a transformer: layer and RMS normalization, multi-head attention (self and cross,
// causal, with a KV cache for generation) and a pre-norm transformer block. Children are named
// as in GPT-2's checkpoints (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj), so
// weights map by name (docs/transformers.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kusari/functions/attention.h"
#include "kusari/links/initializers.h"
#include "kusari/links/link.h"
#include "kusari/links/linear.h"

namespace kusari::links {

/// Layer normalization over the last axis of size `size` (Chainer's L.LayerNormalization):
/// y = (x - mean) / sqrt(var + eps) * gamma + beta. gamma (ones) and beta (zeros) stay float32
/// when the link is converted to float16 or bfloat16 (the fused kernels read them so).
class LayerNormalization : public Link {
 public:
  explicit LayerNormalization(int64_t size, double eps = 1e-5, bool use_beta = true);
  Variable forward(const Variable& x) override;
  void to_dtype(Dtype dtype) override;
  Parameter gamma;
  Parameter beta;  // undefined without use_beta
  double eps;

 protected:
  const char* type_name() const override { return "LayerNormalization"; }
};

/// RMS normalization over the last axis (LLaMA's RMSNorm): y = x / sqrt(mean(x^2) + eps) * gamma.
class RMSNormalization : public Link {
 public:
  explicit RMSNormalization(int64_t size, double eps = 1e-6);
  Variable forward(const Variable& x) override;
  void to_dtype(Dtype dtype) override;
  Parameter gamma;
  double eps;

 protected:
  const char* type_name() const override { return "RMSNormalization"; }
};

/// The keys and values a MultiHeadAttention has seen, (batch, heads, length, head_dim) each, for
/// generation one token at a time: each call appends the new ones and attends over all of them.
struct KVCache {
  Variable k;
  Variable v;
  /// Positions cached so far.
  int64_t length() const { return k.defined() ? k.shape()[2] : 0; }
  void clear() { k = v = Variable(); }
};

/// The options of MultiHeadAttention.
struct MultiHeadAttentionOptions {
  /// The features of the keys and values' input (cross-attention); 0: self-attention.
  int64_t kv_size = 0;
  /// Each position attends only to itself and the positions before it.
  bool causal = false;
  /// Dropout on the attention weights and on the output (training mode only).
  double dropout = 0.0;
  /// Biases on the projections.
  bool bias = true;
  /// The projections' initial weights (LeCunNormal when null) and the output projection's (the
  /// same when null).
  std::shared_ptr<Initializer> initialW;
  std::shared_ptr<Initializer> initial_out_W;
};

/// Multi-head attention (Vaswani et al. 2017) on (batch, length, size) inputs. Self-attention
/// projects x with one Linear to q, k and v (`c_attn`, size -> 3 size, GPT-2's layout); cross-
/// attention projects x to q (`q_proj`) and the memory to k and v (`kv_proj`). `c_proj` projects
/// the heads' concatenated outputs back to `size`.
class MultiHeadAttention : public Link {
 public:
  MultiHeadAttention(int64_t size, int64_t n_heads, MultiHeadAttentionOptions options = {});
  /// Self-attention of x (batch, length, size).
  Variable forward(const Variable& x) override;
  /// Self-attention of x with `cache` (may be null): the new keys and values are appended to it
  /// and x's positions attend to every cached one (causal: and to those of x before them).
  Variable forward(const Variable& x, KVCache* cache, const Array& mask = Array());
  /// Cross-attention of x (batch, length, size) to memory (batch, memory_length, kv_size); mask
  /// as in functions::scaled_dot_product_attention.
  Variable forward(const Variable& x, const Variable& memory, const Array& mask = Array());
  int64_t size() const { return size_; }
  int64_t n_heads() const { return n_heads_; }
  std::shared_ptr<Linear> c_attn, q_proj, kv_proj, c_proj;

 protected:
  const char* type_name() const override { return "MultiHeadAttention"; }

 private:
  Variable split_heads(const Variable& x) const;
  Variable attend(const Variable& q, const Variable& k, const Variable& v, const Array& mask, bool causal);
  int64_t size_;
  int64_t n_heads_;
  MultiHeadAttentionOptions options_;
};

/// The options of TransformerBlock.
struct TransformerBlockOptions {
  /// The MLP's hidden features per model feature (4 in GPT-2).
  int64_t mlp_ratio = 4;
  bool causal = true;
  double dropout = 0.0;
  bool bias = true;
  double eps = 1e-5;
  /// gelu's tanh form (GPT-2's) or the exact one.
  bool gelu_tanh = true;
  /// The initial weights of the projections (LeCunNormal when null) and of the two projections
  /// into the residual stream (GPT-2 scales those by 1 / sqrt(2 layers)).
  std::shared_ptr<Initializer> initialW;
  std::shared_ptr<Initializer> initial_residual_W;
};

/// A pre-norm transformer block (GPT-2's): x + attn(ln_1(x)), then + mlp(ln_2(x)) with
/// mlp = c_proj(gelu(c_fc(x))).
class TransformerBlock : public Link {
 public:
  TransformerBlock(int64_t size, int64_t n_heads, TransformerBlockOptions options = {});
  Variable forward(const Variable& x) override;
  /// With a KV cache for the attention (generation).
  Variable forward(const Variable& x, KVCache* cache);
  std::shared_ptr<LayerNormalization> ln_1, ln_2;
  std::shared_ptr<MultiHeadAttention> attn;
  std::shared_ptr<Chain> mlp;
  std::shared_ptr<Linear> c_fc, c_proj;  // mlp's children

 protected:
  const char* type_name() const override { return "TransformerBlock"; }

 private:
  TransformerBlockOptions options_;
};

}  // namespace kusari::links
