// GPT (Radford et al. 2019, GPT-2): a decoder-only transformer language model, built as GPT-2 is
// (learnt position embeddings, pre-norm blocks, gelu's tanh form, a final layer norm, the output
// layer tied to the token embedding) with GPT-2's parameter names, so its checkpoints map by name
// (docs/transformers.md).
//
//   auto model = kusari::models::gpt2_small();          // 124,475,904 parameters (vocabulary
//   padded) kusari::Variable logits = model->forward(idx);       // idx (batch, T) ids -> (batch,
//   T, vocab) kusari::Array text = model->generate(prompt, 100, 0.8, 40);
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kusari/core/random.h"
#include "kusari/links/embed_id.h"
#include "kusari/links/link.h"
#include "kusari/links/transformer.h"

namespace kusari::models {

/// The size of a GPT.
struct GPTConfig {
  /// Token ids are 0 .. vocab_size - 1 (GPT-2's BPE: 50257; bytes: 256).
  int64_t vocab_size = 50257;
  /// The token embedding's rows are vocab_size rounded up to a multiple of this (GPT-2's 50,257
  /// to 50,304), so that the output layer's products run on the GPU's fast kernels; the padding
  /// rows are 0, never looked up, and left out of the logits and the loss (Note [Padded
  /// vocabulary] in src/models/gpt.cc). 1: exactly vocab_size rows, as GPT-2's checkpoints.
  int64_t vocab_multiple = 64;
  /// The longest sequence (the position table's length).
  int64_t block_size = 1024;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  /// Dropout on the embeddings, the attention weights and the residual branches.
  double dropout = 0.0;
  /// Biases on the linear layers and layer norms (GPT-2 has them).
  bool bias = true;
  /// gelu's tanh form (GPT-2's) or the exact one.
  bool gelu_tanh = true;
  /// The parameters' dtype (bfloat16 or float16: the layer norms keep float32).
  Dtype dtype = float32;
};

/// GPT-2 small: 12 layers, 12 heads, 768 features, 1024 positions, 124M parameters.
GPTConfig gpt2_small_config();
/// GPT-2 medium: 24 layers, 16 heads, 1024 features, 350M parameters.
GPTConfig gpt2_medium_config();
/// A GPT for CPUs and tests: 6 layers, 6 heads, 384 features, 256 positions.
GPTConfig gpt_tiny_config(int64_t vocab_size = 256);

/// A GPT language model (see the file's comment). Initialised as GPT-2: weights N(0, 0.02), the
/// two projections into the residual stream N(0, 0.02 / sqrt(2 n_layer)), biases 0.
class GPT : public Chain {
 public:
  explicit GPT(const GPTConfig& config, Generator* generator = nullptr);

  /// The logits (batch, T, vocab_size) of the next token after each position of `idx`, an int32
  /// or int64 array (batch, T) of token ids wrapped in a Variable.
  Variable forward(const Variable& idx) override;
  /// The same with one KV cache per layer (`caches` is resized to n_layer): the positions of
  /// idx follow the cached ones. For generation.
  Variable forward(const Variable& idx, std::vector<links::KVCache>& caches);
  /// The training loss of a batch {idx, targets} ((batch, T) each): the mean cross-entropy of
  /// the next token (targets of -1 are ignored), reported as "loss".
  Variable forward_batch(const std::vector<Variable>& batch) override;

  /// Appends `max_new_tokens` sampled tokens to each sequence of `prompt` (batch, T): each from
  /// softmax(logits / temperature) restricted to the `top_k` likeliest (0: all), with a KV
  /// cache while the sequence fits the position table (then from its last block_size tokens).
  /// temperature 0 takes the likeliest token. Returns (batch, T + max_new_tokens) int64 ids
  /// on the CPU. Runs in test mode without recording a graph.
  Array generate(const Array& prompt, int64_t max_new_tokens, double temperature = 1.0, int64_t top_k = 0,
                 Generator* generator = nullptr);

  const GPTConfig& config() const { return config_; }
  /// The token embedding's rows: vocab_size rounded up to a multiple of vocab_multiple.
  int64_t padded_vocab_size() const;
  /// Floating-point operations of one training step per token (forward and backward, the
  /// attention's included, at sequence length T): 6 N + 12 n_layer n_embd T with N the
  /// parameters without the position table and the vocabulary's padding (PaLM's appendix B
  /// estimate), for MFU.
  double flops_per_token(int64_t T) const;

  std::shared_ptr<links::EmbedID> wte, wpe;
  std::shared_ptr<ChainList> h;
  std::shared_ptr<links::LayerNormalization> ln_f;

 protected:
  const char* type_name() const override { return "GPT"; }

 private:
  /// The logits over the padded vocabulary, (batch, T, padded_vocab_size()).
  Variable padded_logits(const Variable& idx, int64_t offset, std::vector<links::KVCache>* caches);
  /// Those of the vocabulary, (batch, T, vocab_size): a view of the padded ones.
  Variable vocab_logits(const Variable& padded);
  GPTConfig config_;
};

std::shared_ptr<GPT> gpt2_small(Generator* generator = nullptr);
std::shared_ptr<GPT> gpt2_medium(Generator* generator = nullptr);

}  // namespace kusari::models
