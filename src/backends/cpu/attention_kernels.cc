// CPU kernels: blocked scaled dot-product attention (Note [Blocked attention]). Each block of
// queries is packed into a float buffer (double for float64 data) with the blocks of keys and
// values it meets, the block products go to the CPU's GEMM (gemm.h), and the online softmax runs between them; no
// buffer grows with the square of the sequence length.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/common/compute_type.h"
#include "backends/common/dtype_visit.h"
#include "backends/common/philox.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/loops.h"
#include "kernels/attention.h"

namespace kusari::cpu {
namespace {

using kernels::AttentionParams;

constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;

// The accumulation type: double for double data, float otherwise.
template <typename T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// C = A B^T (ta = false, tb = true) or other transposes, row-major, with beta 0 or 1.
template <typename A>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const A* a, int64_t lda, const A* b, int64_t ldb,
          A beta, A* c, int64_t ldc) {
  cpu::gemm(ta, tb, m, n, k, A(1), a, lda, b, ldb, beta, c, ldc);
}

// A (batch, heads, len, dim) array read through its strides.
template <typename T>
struct Heads {
  const T* p;
  int64_t sb, sh, sl, sd;
  Heads(const Array& a)  // NOLINT(google-explicit-constructor)
      : p(static_cast<const T*>(a.raw_data())),
        sb(a.strides()[0]),
        sh(a.strides()[1]),
        sl(a.strides()[2]),
        sd(a.strides()[3]) {}
  // Rows [r0, r0 + n) of head (b, h), `dim` wide, into dst (row-major, dim per row).
  template <typename A>
  void pack(int64_t b, int64_t h, int64_t r0, int64_t n, int64_t dim, A* dst) const {
    for (int64_t r = 0; r < n; ++r) {
      const T* row = p + b * sb + h * sh + (r0 + r) * sl;
      for (int64_t d = 0; d < dim; ++d) {
        dst[r * dim + d] = static_cast<A>(static_cast<common::compute_t<T>>(row[d * sd]));
      }
    }
  }
};

// The scores' adjustments of one (b, h): the mask, the causal limit and the dropout keep test.
template <typename T>
struct ScoreRules {
  const AttentionParams& p;
  const Array* mask;
  bool mask_bool = false;
  const void* mp = nullptr;
  int64_t ms[4] = {0, 0, 0, 0};
  int64_t offset = 0;  // kv_len - q_len: query i sees keys j <= i + offset when causal

  ScoreRules(const AttentionParams& params, const Array* m) : p(params), mask(m), offset(params.kv_len - params.q_len) {
    if (mask) {
      mask_bool = mask->dtype() == Dtype::kBool;
      mp = mask->raw_data();
      for (int d = 0; d < 4; ++d) ms[d] = mask->strides()[d];
    }
  }
  // The keys a query block [i0, i0 + n) may see: [0, end).
  int64_t key_end(int64_t i0, int64_t n) const {
    if (!p.causal) return p.kv_len;
    return std::clamp<int64_t>(i0 + n - 1 + offset + 1, 0, p.kv_len);
  }
  // score * scale adjusted by the mask and the causal rule (-inf when not attended).
  template <typename A>
  A adjust(A s, int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (p.causal && j > i + offset) return -std::numeric_limits<A>::infinity();
    s *= static_cast<A>(p.scale);
    if (mask) {
      const int64_t off = b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3];
      if (mask_bool) {
        if (!static_cast<const bool*>(mp)[off]) return -std::numeric_limits<A>::infinity();
      } else {
        s += static_cast<A>(static_cast<common::compute_t<T>>(static_cast<const T*>(mp)[off]));
      }
    }
    return s;
  }
  // The dropout factor of element (b, h, i, j): 0 or 1 / (1 - dropout).
  template <typename A>
  A keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const uint64_t idx = static_cast<uint64_t>(((b * p.heads + h) * p.q_len + i) * p.kv_len + j);
    const common::Philox4 r = common::philox4x32(p.counter + idx / 4, p.key0, p.key1);
    return common::unit_float(r.v[idx % 4]) >= static_cast<float>(p.dropout)
               ? static_cast<A>(1.0 / (1.0 - p.dropout))
               : A(0);
  }
};

template <typename T>
void forward_typed(const Array& q, const Array& k, const Array& v, const Array* mask, const AttentionParams& p,
                   Array& out, Array& lse) {
  using A = acc_t<T>;
  const Heads<T> hq(q), hk(k), hv(v);
  const ScoreRules<T> rules(p, mask);
  const int64_t D = p.head_dim, Dv = p.v_dim;
  const int64_t q_blocks = (p.q_len + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = p.batch * p.heads * q_blocks;
  T* op = out.data<T>();
  A* lp = lse.data<A>();
  const bool dropout = p.dropout > 0.0;
  parallel_for(tasks, kQueryBlock * p.kv_len * (D + Dv) * 2, [&](int64_t t0, int64_t t1) {
    std::vector<A> qf(kQueryBlock * D), kf(kKeyBlock * D), vf(kKeyBlock * Dv), s(kQueryBlock * kKeyBlock),
        o(kQueryBlock * Dv), m(kQueryBlock), l(kQueryBlock);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t qb = t % q_blocks, bh = t / q_blocks, b = bh / p.heads, h = bh % p.heads;
      const int64_t i0 = qb * kQueryBlock, nq = std::min(kQueryBlock, p.q_len - i0);
      hq.pack(b, h, i0, nq, D, qf.data());
      std::fill(o.begin(), o.end(), A(0));
      std::fill(m.begin(), m.end(), -std::numeric_limits<A>::infinity());
      std::fill(l.begin(), l.end(), A(0));
      const int64_t end = rules.key_end(i0, nq);
      for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
        const int64_t nk = std::min(kKeyBlock, end - j0);
        hk.pack(b, h, j0, nk, D, kf.data());
        hv.pack(b, h, j0, nk, Dv, vf.data());
        gemm<A>(false, true, nq, nk, D, qf.data(), D, kf.data(), D, A(0), s.data(), nk);
        for (int64_t r = 0; r < nq; ++r) {
          A* sr = s.data() + r * nk;
          A mx = m[r];
          for (int64_t c = 0; c < nk; ++c) {
            sr[c] = rules.adjust(sr[c], b, h, i0 + r, j0 + c);
            mx = std::max(mx, sr[c]);
          }
          if (mx == -std::numeric_limits<A>::infinity()) {  // nothing attended yet
            std::fill(sr, sr + nk, A(0));
            continue;
          }
          const A alpha = std::exp(m[r] - mx);  // 0 when m[r] is -inf
          A sum = 0;
          for (int64_t c = 0; c < nk; ++c) {
            const A e = std::exp(sr[c] - mx);
            sum += e;
            sr[c] = dropout ? e * rules.template keep<A>(b, h, i0 + r, j0 + c) : e;
          }
          l[r] = l[r] * alpha + sum;
          m[r] = mx;
          if (alpha != A(1)) {
            for (int64_t d = 0; d < Dv; ++d) o[r * Dv + d] *= alpha;
          }
        }
        gemm<A>(false, false, nq, Dv, nk, s.data(), nk, vf.data(), Dv, A(1), o.data(), Dv);
      }
      for (int64_t r = 0; r < nq; ++r) {
        const int64_t row = bh * p.q_len + i0 + r;
        const A inv = l[r] > A(0) ? A(1) / l[r] : A(0);
        T* orow = op + row * Dv;
        for (int64_t d = 0; d < Dv; ++d) {
          orow[d] = static_cast<T>(static_cast<common::compute_t<T>>(o[r * Dv + d] * inv));
        }
        lp[row] = l[r] > A(0) ? m[r] + std::log(l[r]) : -std::numeric_limits<A>::infinity();
      }
    }
  });
}

bool attention_forward(const Array& q, const Array& k, const Array& v, const Array* mask, const AttentionParams& p,
                       Array& out, Array& lse) {
  common::visit_floating_dtype(q.dtype(), "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    forward_typed<T>(q, k, v, mask, p, out, lse);
  });
  return true;
}

template <typename T>
void backward_typed(const Array& q, const Array& k, const Array& v, const Array* mask, const Array& out,
                    const Array& gout, const Array& lse, const AttentionParams& p, Array& gq, Array& gk, Array& gv) {
  using A = acc_t<T>;
  using C = common::compute_t<T>;
  const Heads<T> hq(q), hk(k), hv(v), ho(out), hgo(gout);
  const ScoreRules<T> rules(p, mask);
  const int64_t D = p.head_dim, Dv = p.v_dim;
  const A* lp = lse.data<A>();
  T* gqp = gq.data<T>();
  T* gkp = gk.data<T>();
  T* gvp = gv.data<T>();
  const bool dropout = p.dropout > 0.0;
  const A scale = static_cast<A>(p.scale);
  // One task per (b, h): its key and value gradients accumulate over all query blocks.
  parallel_for(p.batch * p.heads, p.q_len * p.kv_len * (D + Dv) * 4, [&](int64_t t0, int64_t t1) {
    std::vector<A> qf(kQueryBlock * D), gof(kQueryBlock * Dv), of(kQueryBlock * Dv), kf(kKeyBlock * D),
        vf(kKeyBlock * Dv), s(kQueryBlock * kKeyBlock), pd(kQueryBlock * kKeyBlock), dq(kQueryBlock * D),
        dk(p.kv_len * D), dv(p.kv_len * Dv), di(kQueryBlock);
    for (int64_t bh = t0; bh < t1; ++bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      std::fill(dk.begin(), dk.end(), A(0));
      std::fill(dv.begin(), dv.end(), A(0));
      for (int64_t i0 = 0; i0 < p.q_len; i0 += kQueryBlock) {
        const int64_t nq = std::min(kQueryBlock, p.q_len - i0);
        hq.pack(b, h, i0, nq, D, qf.data());
        hgo.pack(b, h, i0, nq, Dv, gof.data());
        ho.pack(b, h, i0, nq, Dv, of.data());
        for (int64_t r = 0; r < nq; ++r) {
          A sum = 0;
          for (int64_t d = 0; d < Dv; ++d) sum += gof[r * Dv + d] * of[r * Dv + d];
          di[r] = sum;
        }
        std::fill(dq.begin(), dq.end(), A(0));
        const int64_t end = rules.key_end(i0, nq);
        for (int64_t j0 = 0; j0 < end; j0 += kKeyBlock) {
          const int64_t nk = std::min(kKeyBlock, end - j0);
          hk.pack(b, h, j0, nk, D, kf.data());
          hv.pack(b, h, j0, nk, Dv, vf.data());
          // s = probabilities, pd = probabilities after dropout.
          gemm<A>(false, true, nq, nk, D, qf.data(), D, kf.data(), D, A(0), s.data(), nk);
          for (int64_t r = 0; r < nq; ++r) {
            const A l_r = lp[bh * p.q_len + i0 + r];
            for (int64_t c = 0; c < nk; ++c) {
              const A sc = rules.adjust(s[r * nk + c], b, h, i0 + r, j0 + c);
              const A pr = (l_r == -std::numeric_limits<A>::infinity() || sc == -std::numeric_limits<A>::infinity())
                               ? A(0)
                               : std::exp(sc - l_r);
              s[r * nk + c] = pr;
              pd[r * nk + c] = dropout ? pr * rules.template keep<A>(b, h, i0 + r, j0 + c) : pr;
            }
          }
          // gv[j0:] += pd^T gout
          gemm<A>(true, false, nk, Dv, nq, pd.data(), nk, gof.data(), Dv, A(1), dv.data() + j0 * Dv, Dv);
          // gp = gout v^T (into pd), then gs = p * (gp * keep - D) (into s)
          gemm<A>(false, true, nq, nk, Dv, gof.data(), Dv, vf.data(), Dv, A(0), pd.data(), nk);
          for (int64_t r = 0; r < nq; ++r) {
            for (int64_t c = 0; c < nk; ++c) {
              A gp = pd[r * nk + c];
              if (dropout) gp *= rules.template keep<A>(b, h, i0 + r, j0 + c);
              s[r * nk + c] = s[r * nk + c] * (gp - di[r]) * scale;
            }
          }
          // gq += gs k, gk[j0:] += gs^T q (gs already carries the scale)
          gemm<A>(false, false, nq, D, nk, s.data(), nk, kf.data(), D, A(1), dq.data(), D);
          gemm<A>(true, false, nk, D, nq, s.data(), nk, qf.data(), D, A(1), dk.data() + j0 * D, D);
        }
        T* gqr = gqp + (bh * p.q_len + i0) * D;
        for (int64_t e = 0; e < nq * D; ++e) gqr[e] = static_cast<T>(static_cast<C>(dq[e]));
      }
      T* gkr = gkp + bh * p.kv_len * D;
      for (int64_t e = 0; e < p.kv_len * D; ++e) gkr[e] = static_cast<T>(static_cast<C>(dk[e]));
      T* gvr = gvp + bh * p.kv_len * Dv;
      for (int64_t e = 0; e < p.kv_len * Dv; ++e) gvr[e] = static_cast<T>(static_cast<C>(dv[e]));
    }
  });
}

bool attention_backward(const Array& q, const Array& k, const Array& v, const Array* mask, const Array& out,
                        const Array& gout, const Array& lse, const AttentionParams& p, Array& gq, Array& gk,
                        Array& gv) {
  common::visit_floating_dtype(q.dtype(), "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    backward_typed<T>(q, k, v, mask, out, gout, lse, p, gq, gk, gv);
  });
  return true;
}

}  // namespace

void register_cpu_attention_kernels() {
  kernels::attention_forward.set(DeviceType::kCPU, &attention_forward);
  kernels::attention_backward.set(DeviceType::kCPU, &attention_backward);
}

}  // namespace kusari::cpu
