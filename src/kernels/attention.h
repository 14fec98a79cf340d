// Kernels: scaled dot-product attention without an n x n matrix per head. See Note [Kernel
// families].
//
// Note [Blocked attention]
// softmax(q k^T * scale + mask) v is computed a block of queries against a block of keys at a
// time, with the softmax's running maximum and sum per query row (the online softmax of
// FlashAttention, Dao et al.): a block of scores exists only while it is used, so memory is O(n)
// per head however long the sequence. Forward keeps the output and, per query row, lse = m +
// log(l) (m the maximum score, l the sum of exp(score - m)); backward recomputes each block's
// probabilities from lse, p = exp(score - lse), and with D = rowsum(gout * out):
//   gv += p_d^T gout,  gp = (gout v^T) * keep / (1 - dropout),  gs = p * (gp - D),
//   gq += gs k * scale,  gk += gs^T q * scale,
// p_d being p with dropout applied. A row whose keys are all masked has no softmax: its output is
// 0, its lse -inf, and it passes no gradient.
//
// causal: query i (of q_len) sees the keys j <= i + kv_len - q_len, the mask aligned at the
// bottom right, which is the usual upper-triangular mask when q_len == kv_len and the right one
// for a query block appended to a KV cache.
//
// Dropout: the element (b, h, i, j) of the (batch, heads, q_len, kv_len) probabilities is kept
// when the float32 uniform number of index ((b * heads + h) * q_len + i) * kv_len + j, drawn as
// Array::uniform draws (Note [Random streams]) from Philox block `counter` on, is >= dropout. So
// the blocked kernels and the composed path give the same mask from the same generator state,
// and backward recomputes it instead of storing it.
#pragma once

#include <cstdint>

#include "kernels/kernel.h"
#include "kusari/core/array.h"

namespace kusari::kernels {

/// The geometry and options of one attention call: q (batch, heads, q_len, head_dim), k
/// (batch, heads, kv_len, head_dim), v (batch, heads, kv_len, v_dim), any strides.
struct AttentionParams {
  int64_t batch = 0;
  int64_t heads = 0;
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t head_dim = 0;
  int64_t v_dim = 0;
  double scale = 1.0;
  bool causal = false;
  double dropout = 0.0;
  uint32_t key0 = 0, key1 = 0;  // the dropout's Philox key and first block
  uint64_t counter = 0;
};

/// out (batch, heads, q_len, v_dim, contiguous) and lse (batch, heads, q_len; float32, float64 for
/// float64 data). mask, when given, is (batch, heads, q_len, kv_len) in any strides (a broadcast
/// view): bool (true: attend) or x's dtype (added to the scores). May decline.
inline constinit Kernel<bool(const Array& q, const Array& k, const Array& v, const Array* mask,
                             const AttentionParams& p, Array& out, Array& lse)>
    attention_forward{"attention_forward"};

/// gq, gk, gv (contiguous, of q, k, v's shapes) from the forward's out and lse and the output's
/// gradient gout (contiguous). May decline.
inline constinit Kernel<bool(const Array& q, const Array& k, const Array& v, const Array* mask, const Array& out,
                             const Array& gout, const Array& lse, const AttentionParams& p, Array& gq, Array& gk,
                             Array& gv)>
    attention_backward{"attention_backward"};

}  // namespace kusari::kernels
