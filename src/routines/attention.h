// Routines of scaled dot-product attention (Note [Blocked attention]), used by
// functions::scaled_dot_product_attention. Each checks what its kernel needs and calls it; when the
// backend declines (or has no such kernel) it returns an undefined array or false and writes
// nothing, and the caller composes the same values from matmul and softmax.
#pragma once

#include "kernels/attention.h"
#include "kusari/core/array.h"

namespace kusari::routines {

/// The dtype of the kernels' lse: float64 for float64 data, else float32.
Dtype attention_lse_dtype(Dtype dtype);

/// out of the attention of q, k, v (4-d, checked by the caller) and lse; mask as the kernel takes
/// it (already broadcast to (batch, heads, q_len, kv_len)) or null. Undefined when declined.
Array attention_forward(const Array& q, const Array& k, const Array& v, const Array* mask,
                        const kernels::AttentionParams& p, Array& lse);

/// gq, gk, gv from the forward's out and lse. False when declined.
bool attention_backward(const Array& q, const Array& k, const Array& v, const Array* mask, const Array& out,
                        const Array& gout, const Array& lse, const kernels::AttentionParams& p, Array& gq,
                        Array& gk, Array& gv);

}  // namespace kusari::routines
