#include "kusari/models/gpt.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <utility>

#include "kusari/autograd/mode.h"
#include "kusari/core/reporter.h"
#include "kusari/core/routines.h"
#include "kusari/functions/activation.h"
#include "kusari/functions/array.h"
#include "kusari/functions/loss.h"
#include "kusari/functions/math.h"
#include "kusari/functions/noise.h"

namespace kusari::models {

namespace F = kusari::functions;

GPTConfig gpt2_small_config() { return GPTConfig{}; }

GPTConfig gpt2_medium_config() {
  GPTConfig c;
  c.n_layer = 24;
  c.n_head = 16;
  c.n_embd = 1024;
  return c;
}

GPTConfig gpt_tiny_config(int64_t vocab_size) {
  GPTConfig c;
  c.vocab_size = vocab_size;
  c.block_size = 256;
  c.n_layer = 6;
  c.n_head = 6;
  c.n_embd = 384;
  return c;
}

GPT::GPT(const GPTConfig& config, Generator* generator) : config_(config) {
  const GPTConfig& c = config_;
  KUSARI_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0, ValueError,
               "GPT: vocab_size, block_size, n_layer, n_head and n_embd must be positive, got ", c.vocab_size, ", ",
               c.block_size, ", ", c.n_layer, ", ", c.n_head, ", ", c.n_embd);
  KUSARI_CHECK(c.n_embd % c.n_head == 0, ValueError, "GPT: n_embd ", c.n_embd, " is not a multiple of n_head ",
               c.n_head);
  KUSARI_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, ValueError, "GPT: dropout must be in [0, 1), got ", c.dropout);
  KUSARI_CHECK(c.vocab_multiple > 0, ValueError, "GPT: vocab_multiple must be positive, got ",
               c.vocab_multiple);
  // GPT-2's initialisation (as its released code and nanoGPT do it).
  auto normal = std::make_shared<initializers::Normal>(0.02, float32, generator);
  auto residual = std::make_shared<initializers::Normal>(0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)),
                                                         float32, generator);
  wte = add_link("wte", std::make_shared<links::EmbedID>(padded_vocab_size(), c.n_embd, normal));
  wte->set_valid_ids(c.vocab_size);  // no token id selects the padding rows
  if (padded_vocab_size() > c.vocab_size) {
    wte->W.data()
        .at({Slice(c.vocab_size, padded_vocab_size())})
        .fill(0.0);  // Note [Padded vocabulary]
  }
  wpe = add_link("wpe", std::make_shared<links::EmbedID>(c.block_size, c.n_embd, normal));
  h = add_link("h", std::make_shared<ChainList>());
  links::TransformerBlockOptions b;
  b.causal = true;
  b.dropout = c.dropout;
  b.bias = c.bias;
  b.gelu_tanh = c.gelu_tanh;
  b.initialW = normal;
  b.initial_residual_W = residual;
  for (int64_t i = 0; i < c.n_layer; ++i) h->append(std::make_shared<links::TransformerBlock>(c.n_embd, c.n_head, b));
  ln_f = add_link("ln_f", std::make_shared<links::LayerNormalization>(c.n_embd, 1e-5, c.bias));
  if (c.dtype != float32) to_dtype(c.dtype);
}

// Note [Padded vocabulary]
// GPT-2's 50,257-token vocabulary makes the output layer's three products (the logits, x^T and
// wte's gradients, a third of GPT-2 small's step) run on cuBLAS's slow kernels: rows of 50,257
// 16-bit elements are not a multiple of 8 elements (16 bytes), and cuBLAS then loads one element
// at a time (Note [Aligning 16-bit GEMM operands] in src/backends/cuda/libs/cublas_linalg.cu).
// So wte has padded_vocab_size() rows, vocab_size rounded up to a multiple of vocab_multiple (64:
// 50,304, as llm.c and nanoGPT do), and the products are made over the padded rows. The padding
// rows start at 0 and no token id selects them (wte's valid_ids is vocab_size, so it refuses
// those ids: Note [Valid ids of an embedding] in src/functions/connection.cc); the logits'
// padding columns are left out: the loss reads the padded logits through
// softmax_cross_entropy_padded (Note [Padded classes] in src/functions/loss.cc: not part of the
// softmax, gradient 0, no copy of the logits), and forward() returns a view of the first vocab_size
// columns. The padding rows' gradient is therefore 0, and the model computes exactly what an
// unpadded GPT computes; only wte's shape differs (a GPT-2 checkpoint is padded when loaded:
// python/kusari/gpt2.py). vocab_multiple = 1 turns it off.
int64_t GPT::padded_vocab_size() const {
  const int64_t m = config_.vocab_multiple;
  return (config_.vocab_size + m - 1) / m * m;
}

Variable GPT::vocab_logits(const Variable& padded) {
  if (padded.shape()[2] == config_.vocab_size) return padded;
  return F::get_item(padded, {Slice(), Slice(), Slice(0, config_.vocab_size)});
}

Variable GPT::padded_logits(const Variable& idx, int64_t offset,
                            std::vector<links::KVCache>* caches) {
  KUSARI_CHECK(idx.defined() && idx.ndim() == 2, ShapeError, "GPT: expected token ids of shape (batch, T), got ",
               idx.defined() ? idx.shape().to_string() : std::string("an undefined variable"));
  KUSARI_CHECK(idx.dtype() == int32 || idx.dtype() == int64, DtypeError, "GPT: token ids must be int32 or int64, got ",
               dtype_name(idx.dtype()));
  const int64_t B = idx.shape()[0], T = idx.shape()[1];
  KUSARI_CHECK(offset + T <= config_.block_size, ShapeError, "GPT: a sequence of ", offset + T,
               " tokens is longer than the position table (block_size ", config_.block_size, ")");
  // wte checks the ids against vocab_size, not its padded rows (its valid_ids): one pass over them.
  Variable tok;
  try {
    tok = wte->forward(idx);
  } catch (const IndexError& e) {
    KUSARI_THROW(IndexError, "GPT: token ids must lie in [0, vocab_size) = [0, ",
                 config_.vocab_size, "): ", e.what());
  }
  Array pos = Array::arange(static_cast<double>(offset), static_cast<double>(offset + T), 1.0, int64, idx.device());
  Variable x = F::add(tok, wpe->forward(Variable(pos)));  // (B, T, C) + (T, C)
  if (config_.dropout > 0.0) x = F::dropout(x, config_.dropout);
  for (size_t i = 0; i < h->size(); ++i) {
    auto& block = static_cast<links::TransformerBlock&>((*h)[i]);
    x = block.forward(x, caches ? &(*caches)[i] : nullptr);
  }
  x = ln_f->forward(x);
  // The output layer is the token embedding, transposed (GPT-2 ties them).
  Variable logits = F::matmul(F::reshape(x, {B * T, config_.n_embd}), wte->W, false, true);
  return F::reshape(logits, {B, T, padded_vocab_size()});
}

Variable GPT::forward(const Variable& idx) {
  return vocab_logits(padded_logits(idx, 0, nullptr));
}

Variable GPT::forward(const Variable& idx, std::vector<links::KVCache>& caches) {
  caches.resize(static_cast<size_t>(config_.n_layer));
  return vocab_logits(padded_logits(idx, caches[0].length(), &caches));
}

Variable GPT::forward_batch(const std::vector<Variable>& batch) {
  KUSARI_CHECK(batch.size() == 2, ValueError, "GPT: expected a batch of (idx, targets), got ", batch.size(),
               " arrays");
  KUSARI_CHECK(batch[1].shape() == batch[0].shape(), ShapeError, "GPT: targets of shape ", batch[1].shape(),
               " do not match the ids of shape ", batch[0].shape());
  Variable logits = padded_logits(batch[0], 0, nullptr);
  const int64_t n = logits.shape()[0] * logits.shape()[1];
  Variable loss =
      F::softmax_cross_entropy_padded(F::reshape(logits, {n, padded_vocab_size()}),
                                      batch[1].data().reshape({n}), config_.vocab_size, -1);
  report({{"loss", loss.data()}}, static_cast<const Link*>(this));
  return loss;
}

double GPT::flops_per_token(int64_t T) const {
  const double n = static_cast<double>(count_params() - wpe->W.size() -
                                       (padded_vocab_size() - config_.vocab_size) * config_.n_embd);
  return 6.0 * n + 12.0 * static_cast<double>(config_.n_layer * config_.n_embd * T);
}

Array GPT::generate(const Array& prompt, int64_t max_new_tokens, double temperature, int64_t top_k,
                    Generator* generator) {
  KUSARI_CHECK(prompt.ndim() == 2 && prompt.shape()[1] > 0, ShapeError,
               "GPT::generate: expected a prompt of shape (batch, T) with T > 0, got ", prompt.shape());
  KUSARI_CHECK(max_new_tokens >= 0, ValueError, "GPT::generate: max_new_tokens must be >= 0, got ", max_new_tokens);
  KUSARI_CHECK(temperature >= 0.0, ValueError, "GPT::generate: temperature must be >= 0, got ", temperature);
  KUSARI_CHECK(top_k >= 0, ValueError, "GPT::generate: top_k must be >= 0, got ", top_k);
  NoBackpropMode no_graph;
  TrainMode test_mode(false);
  Generator& gen = generator ? *generator : default_generator();
  const int64_t B = prompt.shape()[0], V = config_.vocab_size;
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B));
  {
    std::vector<int64_t> p = prompt.astype(int64).to_device(Device::cpu()).to_vector<int64_t>();
    const int64_t T = prompt.shape()[1];
    for (int64_t b = 0; b < B; ++b) seqs[b].assign(p.begin() + b * T, p.begin() + (b + 1) * T);
  }
  std::vector<links::KVCache> caches;
  int64_t fed = 0;  // tokens of each sequence already in the caches
  for (int64_t step = 0; step < max_new_tokens; ++step) {
    const int64_t len = static_cast<int64_t>(seqs[0].size());
    int64_t from;  // the positions to feed: [from, len)
    if (len <= config_.block_size && fed > 0) {
      from = fed;  // the new token(s), after the cached ones
    } else {
      caches.clear();  // a fresh start: the whole prompt, or the last block_size tokens
      from = std::max<int64_t>(0, len - config_.block_size);
    }
    std::vector<int64_t> ids;
    for (int64_t b = 0; b < B; ++b) ids.insert(ids.end(), seqs[b].begin() + from, seqs[b].end());
    const int64_t n = len - from;
    Array idx = Array::from_vector(ids, Shape{B, n}).to_device(wte->W.device());
    Variable logits = forward(Variable(idx), caches);
    fed = len <= config_.block_size ? len : 0;
    // The last position's logits, on the CPU in float64.
    std::vector<double> last = logits.data().at({Slice(), Slice(n - 1, n)}).astype(float64).to_device(Device::cpu())
                                   .to_vector<double>();
    for (int64_t b = 0; b < B; ++b) {
      const double* row = last.data() + b * V;
      int64_t chosen = 0;
      if (temperature == 0.0) {
        chosen = std::max_element(row, row + V) - row;
      } else {
        std::vector<int64_t> order(static_cast<size_t>(V));
        std::iota(order.begin(), order.end(), 0);
        const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [row](int64_t a, int64_t c) { return row[a] > row[c]; });
        const double top = row[order[0]];
        std::vector<double> w(static_cast<size_t>(k));
        double total = 0.0;
        for (int64_t i = 0; i < k; ++i) total += (w[i] = std::exp((row[order[i]] - top) / temperature));
        const double u = Array::uniform({1}, 0.0, 1.0, float64, Device::cpu(), &gen).item<double>() * total;
        double acc = 0.0;
        chosen = order[k - 1];
        for (int64_t i = 0; i < k; ++i) {
          acc += w[i];
          if (u < acc) {
            chosen = order[i];
            break;
          }
        }
      }
      seqs[b].push_back(chosen);
    }
  }
  std::vector<int64_t> out;
  for (const auto& s : seqs) out.insert(out.end(), s.begin(), s.end());
  return Array::from_vector(out, Shape{B, static_cast<int64_t>(seqs[0].size())});
}

std::shared_ptr<GPT> gpt2_small(Generator* generator) { return std::make_shared<GPT>(gpt2_small_config(), generator); }
std::shared_ptr<GPT> gpt2_medium(Generator* generator) {
  return std::make_shared<GPT>(gpt2_medium_config(), generator);
}

}  // namespace kusari::models
