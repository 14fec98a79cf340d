#include "kusari/links/transformer.h"

#include <utility>

#include "kusari/autograd/mode.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/array.h"
#include "kusari/functions/math.h"
#include "kusari/functions/noise.h"
#include "kusari/functions/normalization.h"

namespace kusari::links {

namespace F = kusari::functions;

namespace {

void check_rank3(const char* who, const Variable& x, int64_t size) {
  KUSARI_CHECK(x.ndim() == 3, ShapeError, who, ": expected an input of shape (batch, length, ", size, "), got ",
               x.shape());
  KUSARI_CHECK(x.shape()[2] == size, ShapeError, who, ": the input has ", x.shape()[2], " features (shape ",
               x.shape(), ") but the link was made for ", size);
}

}  // namespace

// --- LayerNormalization, RMSNormalization -------------------------------------------------------

LayerNormalization::LayerNormalization(int64_t size, double eps_, bool use_beta) : eps(eps_) {
  KUSARI_CHECK(size > 0, ValueError, "LayerNormalization: size must be positive, got ", size);
  KUSARI_CHECK(eps_ > 0, ValueError, "LayerNormalization: eps must be positive, got ", eps_);
  gamma = add_param("gamma", Parameter(std::make_shared<initializers::One>(), Shape{size}, device()));
  if (use_beta) beta = add_param("beta", Parameter(std::make_shared<initializers::Zero>(), Shape{size}, device()));
}

Variable LayerNormalization::forward(const Variable& x) {
  return F::layer_normalization(x, gamma, beta.defined() ? Variable(beta) : Variable(), eps);
}

void LayerNormalization::to_dtype(Dtype dtype) {
  check_link_dtype(dtype);
  convert_dtype(is_half_precision(dtype) ? float32 : dtype);  // (the kernels read float32 parameters)
}

RMSNormalization::RMSNormalization(int64_t size, double eps_) : eps(eps_) {
  KUSARI_CHECK(size > 0, ValueError, "RMSNormalization: size must be positive, got ", size);
  KUSARI_CHECK(eps_ > 0, ValueError, "RMSNormalization: eps must be positive, got ", eps_);
  gamma = add_param("gamma", Parameter(std::make_shared<initializers::One>(), Shape{size}, device()));
}

Variable RMSNormalization::forward(const Variable& x) { return F::rms_normalization(x, gamma, eps); }

void RMSNormalization::to_dtype(Dtype dtype) {
  check_link_dtype(dtype);
  convert_dtype(is_half_precision(dtype) ? float32 : dtype);
}

// --- MultiHeadAttention --------------------------------------------------------------------------

MultiHeadAttention::MultiHeadAttention(int64_t size, int64_t n_heads, MultiHeadAttentionOptions options)
    : size_(size), n_heads_(n_heads), options_(std::move(options)) {
  KUSARI_CHECK(size > 0 && n_heads > 0, ValueError, "MultiHeadAttention: size and n_heads must be positive, got ",
               size, " and ", n_heads);
  KUSARI_CHECK(size % n_heads == 0, ValueError, "MultiHeadAttention: size ", size, " is not a multiple of n_heads ",
               n_heads);
  KUSARI_CHECK(options_.dropout >= 0.0 && options_.dropout < 1.0, ValueError,
               "MultiHeadAttention: dropout must be in [0, 1), got ", options_.dropout);
  KUSARI_CHECK(options_.kv_size >= 0, ValueError, "MultiHeadAttention: kv_size must be 0 (self-attention) or "
               "positive, got ", options_.kv_size);
  const bool nobias = !options_.bias;
  auto out_w = options_.initial_out_W ? options_.initial_out_W : options_.initialW;
  if (options_.kv_size == 0) {
    c_attn = add_link("c_attn", std::make_shared<Linear>(size, 3 * size, nobias, options_.initialW));
  } else {
    q_proj = add_link("q_proj", std::make_shared<Linear>(size, size, nobias, options_.initialW));
    kv_proj = add_link("kv_proj", std::make_shared<Linear>(options_.kv_size, 2 * size, nobias, options_.initialW));
  }
  c_proj = add_link("c_proj", std::make_shared<Linear>(size, size, nobias, out_w));
}

Variable MultiHeadAttention::split_heads(const Variable& x) const {
  const Shape& s = x.shape();  // (B, T, C)
  return F::transpose(F::reshape(x, {s[0], s[1], n_heads_, size_ / n_heads_}), {0, 2, 1, 3});
}

Variable MultiHeadAttention::attend(const Variable& q, const Variable& k, const Variable& v, const Array& mask,
                                    bool causal) {
  F::AttentionOptions o;
  o.mask = mask;
  o.causal = causal;
  o.dropout = options_.dropout;
  Variable y = F::scaled_dot_product_attention(q, k, v, o);  // (B, H, T, D)
  const Shape& s = y.shape();
  y = F::reshape(F::transpose(y, {0, 2, 1, 3}), {s[0], s[2], size_});
  y = c_proj->forward(y, 2);
  return options_.dropout > 0.0 ? F::dropout(y, options_.dropout) : y;
}

Variable MultiHeadAttention::forward(const Variable& x) { return forward(x, static_cast<KVCache*>(nullptr)); }

Variable MultiHeadAttention::forward(const Variable& x, KVCache* cache, const Array& mask) {
  KUSARI_CHECK(c_attn, ValueError, "MultiHeadAttention: this link does cross-attention (kv_size ", options_.kv_size,
               "); call forward(x, memory)");
  check_rank3("MultiHeadAttention", x, size_);
  std::vector<Variable> qkv = F::split_axis(c_attn->forward(x, 2), 3, 2);
  Variable q = split_heads(qkv[0]), k = split_heads(qkv[1]), v = split_heads(qkv[2]);
  if (cache != nullptr) {
    if (cache->k.defined()) {
      KUSARI_CHECK(cache->k.shape()[0] == x.shape()[0] && cache->k.shape()[1] == n_heads_ &&
                       cache->k.shape()[3] == size_ / n_heads_,
                   ShapeError, "MultiHeadAttention: the KV cache holds keys of shape ", cache->k.shape(),
                   ", which do not fit this call (batch ", x.shape()[0], ", ", n_heads_, " heads of ",
                   size_ / n_heads_, ")");
      k = F::concat({cache->k, k}, 2);
      v = F::concat({cache->v, v}, 2);
    }
    cache->k = k;
    cache->v = v;
  }
  return attend(q, k, v, mask, options_.causal);
}

Variable MultiHeadAttention::forward(const Variable& x, const Variable& memory, const Array& mask) {
  KUSARI_CHECK(q_proj, ValueError, "MultiHeadAttention: this link does self-attention; make it with a kv_size "
               "for cross-attention");
  check_rank3("MultiHeadAttention", x, size_);
  check_rank3("MultiHeadAttention (memory)", memory, options_.kv_size);
  KUSARI_CHECK(memory.shape()[0] == x.shape()[0], ShapeError, "MultiHeadAttention: x has a batch of ", x.shape()[0],
               " but the memory of ", memory.shape()[0]);
  Variable q = split_heads(q_proj->forward(x, 2));
  std::vector<Variable> kv = F::split_axis(kv_proj->forward(memory, 2), 2, 2);
  return attend(q, split_heads(kv[0]), split_heads(kv[1]), mask, options_.causal);
}

// --- TransformerBlock ----------------------------------------------------------------------------

TransformerBlock::TransformerBlock(int64_t size, int64_t n_heads, TransformerBlockOptions options)
    : options_(std::move(options)) {
  KUSARI_CHECK(options_.mlp_ratio > 0, ValueError, "TransformerBlock: mlp_ratio must be positive, got ",
               options_.mlp_ratio);
  const bool nobias = !options_.bias;
  auto residual_w = options_.initial_residual_W ? options_.initial_residual_W : options_.initialW;
  ln_1 = add_link("ln_1", std::make_shared<LayerNormalization>(size, options_.eps, options_.bias));
  MultiHeadAttentionOptions a;
  a.causal = options_.causal;
  a.dropout = options_.dropout;
  a.bias = options_.bias;
  a.initialW = options_.initialW;
  a.initial_out_W = residual_w;
  attn = add_link("attn", std::make_shared<MultiHeadAttention>(size, n_heads, a));
  ln_2 = add_link("ln_2", std::make_shared<LayerNormalization>(size, options_.eps, options_.bias));
  mlp = add_link("mlp", std::make_shared<Chain>());
  c_fc = mlp->add_link("c_fc", std::make_shared<Linear>(size, options_.mlp_ratio * size, nobias, options_.initialW));
  c_proj = mlp->add_link("c_proj", std::make_shared<Linear>(options_.mlp_ratio * size, size, nobias, residual_w));
}

Variable TransformerBlock::forward(const Variable& x) { return forward(x, nullptr); }

Variable TransformerBlock::forward(const Variable& x, KVCache* cache) {
  Variable h = F::add(x, attn->forward(ln_1->forward(x), cache));
  Variable m = c_proj->forward(F::gelu(c_fc->forward(ln_2->forward(h), 2), options_.gelu_tanh), 2);
  if (options_.dropout > 0.0) m = F::dropout(m, options_.dropout);
  return F::add(h, m);
}

}  // namespace kusari::links
