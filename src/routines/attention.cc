#include "routines/attention.h"

#include "kusari/core/error.h"

namespace kusari::routines {

Dtype attention_lse_dtype(Dtype dtype) { return dtype == Dtype::kFloat64 ? Dtype::kFloat64 : Dtype::kFloat32; }

Array attention_forward(const Array& q, const Array& k, const Array& v, const Array* mask,
                        const kernels::AttentionParams& p, Array& lse) {
  Array out = Array::empty({p.batch, p.heads, p.q_len, p.v_dim}, q.dtype(), q.device());
  lse = Array::empty({p.batch, p.heads, p.q_len}, attention_lse_dtype(q.dtype()), q.device());
  if (out.size() == 0) return out;
  if (!kernels::attention_forward.try_run(q.device(), q, k, v, mask, p, out, lse)) {
    lse = Array();
    return Array();
  }
  return out;
}

bool attention_backward(const Array& q, const Array& k, const Array& v, const Array* mask, const Array& out,
                        const Array& gout, const Array& lse, const kernels::AttentionParams& p, Array& gq,
                        Array& gk, Array& gv) {
  KUSARI_CHECK(gout.shape() == out.shape(), ShapeError, "scaled_dot_product_attention (gradient): the output's "
               "gradient of shape ", gout.shape(), " does not match the output ", out.shape());
  gq = Array::empty(q.shape(), q.dtype(), q.device());
  gk = Array::empty(k.shape(), k.dtype(), k.device());
  gv = Array::empty(v.shape(), v.dtype(), v.device());
  if (q.size() == 0 || k.size() == 0) {
    gq = Array::zeros(q.shape(), q.dtype(), q.device());
    gk = Array::zeros(k.shape(), k.dtype(), k.device());
    gv = Array::zeros(v.shape(), v.dtype(), v.device());
    return true;
  }
  const Array go = gout.is_contiguous() ? gout : gout.to_memory_format(MemoryFormat::kContiguous);
  if (!kernels::attention_backward.try_run(q.device(), q, k, v, mask, out, go, lse, p, gq, gk, gv)) {
    gq = gk = gv = Array();
    return false;
  }
  return true;
}

}  // namespace kusari::routines
