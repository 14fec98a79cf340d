// CPU kernels: 2-d convolution (forward, gradient of the data, gradient of the filter) through
// oneDNN or through im2col + GEMM.
//
// Note [CPU convolution algorithms]
// Two implementations sit behind the three convolution entries of the kernel table:
//   - oneDNN (when the build has it, KUSARI_HAVE_DNNL), for float32. Creating a oneDNN primitive
//     is expensive (it picks and JIT-compiles an implementation), so primitives are built once per
//     geometry and kept in a mutex-protected cache; see Note [oneDNN primitive cache].
//   - im2col + GEMM (gemm.h), for float64 (oneDNN has no f64 convolution), for builds without
//     oneDNN, and whenever the environment variable KUSARI_CPU_CONV=im2col is set. A batch is
//     processed in chunks of images whose column matrix stays under kColumnBudget elements; see
//     Note [im2col layout].
// KUSARI_CPU_CONV accepts "" or "auto" (the default choice above) and "im2col"; any other value is
// a ValueError, so a misspelt setting never goes unnoticed. It is read on every call (a getenv is
// nothing next to a convolution), so a program or a test can switch paths at run time.
// float16 and bfloat16 are converted to float32, computed there, and rounded once at the end.
// Both paths take stride, pad, dilation and groups. oneDNN reads and writes channels-last
// arrays as they are (Note [oneDNN layouts]); im2col makes non-contiguous operands contiguous
// first and computes a channels-last output into an NCHW buffer that one strided copy moves into
// its NHWC memory.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/loops.h"
#include "kernels/elementwise.h"
#include "kernels/nn.h"
#include "kusari/config.h"
#include "kusari/core/error.h"

#if KUSARI_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kusari::cpu {
namespace {

/// The sizes of one convolution: x (n, c, h, w), w (o, c / groups, kh, kw), y (n, o, oh, ow).
struct ConvGeometry {
  int64_t n, c, h, w;
  int64_t o, kh, kw;
  int64_t oh, ow;
  int64_t sh, sw, ph, pw, dh, dw, groups;

  int64_t cg() const { return c / groups; }     // input channels per group
  int64_t og() const { return o / groups; }     // output channels per group
  int64_t k() const { return cg() * kh * kw; }  // rows of a column matrix
  int64_t pixels() const { return oh * ow; }    // output pixels of one image
};

ConvGeometry geometry(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  return ConvGeometry{.n = x[0],
                      .c = x[1],
                      .h = x[2],
                      .w = x[3],
                      .o = w[0],
                      .kh = w[2],
                      .kw = w[3],
                      .oh = y[2],
                      .ow = y[3],
                      .sh = p.stride[0],
                      .sw = p.stride[1],
                      .ph = p.pad[0],
                      .pw = p.pad[1],
                      .dh = p.dilation[0],
                      .dw = p.dilation[1],
                      .groups = p.groups};
}

enum class ConvAlgorithm { kAuto, kIm2col };

ConvAlgorithm requested_algorithm() {
  const char* env = std::getenv("KUSARI_CPU_CONV");
  const std::string_view v = env ? env : "";
  if (v.empty() || v == "auto") return ConvAlgorithm::kAuto;
  if (v == "im2col") return ConvAlgorithm::kIm2col;
  KUSARI_THROW(ValueError, "convolution_2d: the environment variable KUSARI_CPU_CONV is \"", v,
               "\"; expected \"auto\" (or unset) or \"im2col\"");
}

// --- im2col + GEMM ------------------------------------------------------------------------------

// Note [im2col layout]
// For a chunk of nb images and one group, the column matrix has k = cg * kh * kw rows (input
// channel, kernel row, kernel column) and nb * P columns (image, output row, output column),
// P = oh * ow; taps that fall into the padding are 0. Image b's block of columns, with leading
// dimension nb * P, and its channels of the group in NCHW (og rows of P, leading dimension P) are
// both plain matrices for BLAS, so per image and group
//   forward:         y_g (og, P)   = W_g (og, k) @ col_b (k, P)
//   gradient of x:   col_b (k, P)  = W_g^T @ gy_g (og, P), then col2im adds col back into gx
//   gradient of W:   gW_g (og, k) += gy_g (og, P) @ col_b^T
// without gathering y or gy into another layout. im2col and col2im work on the whole chunk in
// one OpenMP region (few regions: OpenMP and BLAS threads share the cores); the GEMMs use the
// GEMM's own threads (gemm.h). Buffers are left uninitialised (every element is written first).

/// Elements a column matrix may hold before the batch is split into chunks.
constexpr int64_t kColumnBudget = int64_t{1} << 23;

int64_t chunk_images(const ConvGeometry& g) {
  const int64_t per_image = std::max<int64_t>(g.k() * g.pixels(), 1);
  return std::clamp<int64_t>(kColumnBudget / per_image, 1, std::max<int64_t>(g.n, 1));
}

template <typename T>
std::unique_ptr<T[]> column_buffer(const ConvGeometry& g, int64_t chunk) {
  return std::unique_ptr<T[]>(new T[static_cast<size_t>(g.k() * chunk * g.pixels())]);
}

template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b,
          int64_t ldb, T beta, T* c, int64_t ldc) {
  cpu::gemm(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

/// Fills col (k, nb * P) from images [n0, n0 + nb) of x, group `group`.
template <typename T>
void im2col(const T* x, const ConvGeometry& g, int64_t n0, int64_t nb, int64_t group, T* col) {
  const int64_t rows = g.k(), pixels = g.pixels(), cols = nb * pixels;
  parallel_for(rows * nb, pixels, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / nb, b = item % nb;
      const int64_t c = r / (g.kh * g.kw), i = (r / g.kw) % g.kh, j = r % g.kw;
      const T* plane = x + ((n0 + b) * g.c + group * g.cg() + c) * g.h * g.w;
      T* out = col + r * cols + b * pixels;
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        const int64_t iy = oy * g.sh - g.ph + i * g.dh;
        T* orow = out + oy * g.ow;
        if (iy < 0 || iy >= g.h) {
          std::fill(orow, orow + g.ow, T(0));
          continue;
        }
        const T* irow = plane + iy * g.w;
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          const int64_t ix = ox * g.sw - g.pw + j * g.dw;
          orow[ox] = (ix >= 0 && ix < g.w) ? irow[ix] : T(0);
        }
      }
    }
  });
}

/// Adds col (k, nb * P) back into images [n0, n0 + nb) of gx, group `group` (the adjoint of
/// im2col).
template <typename T>
void col2im(const T* col, const ConvGeometry& g, int64_t n0, int64_t nb, int64_t group, T* gx) {
  const int64_t pixels = g.pixels(), cols = nb * pixels;
  // Each (image, channel) plane is written by one thread only.
  parallel_for(nb * g.cg(), g.kh * g.kw * pixels, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / g.cg(), c = item % g.cg();
      T* plane = gx + ((n0 + b) * g.c + group * g.cg() + c) * g.h * g.w;
      for (int64_t i = 0; i < g.kh; ++i) {
        for (int64_t j = 0; j < g.kw; ++j) {
          const T* in = col + ((c * g.kh + i) * g.kw + j) * cols + b * pixels;
          for (int64_t oy = 0; oy < g.oh; ++oy) {
            const int64_t iy = oy * g.sh - g.ph + i * g.dh;
            if (iy < 0 || iy >= g.h) continue;
            T* prow = plane + iy * g.w;
            const T* irow = in + oy * g.ow;
            for (int64_t ox = 0; ox < g.ow; ++ox) {
              const int64_t ix = ox * g.sw - g.pw + j * g.dw;
              if (ix >= 0 && ix < g.w) prow[ix] += irow[ox];
            }
          }
        }
      }
    }
  });
}

/// Offset of the first channel of `group` of image n in an NCHW tensor with `channels` channels
/// of `pixels` each, `per_group` channels per group.
inline int64_t group_offset(int64_t n, int64_t group, int64_t channels, int64_t per_group,
                            int64_t pixels) {
  return (n * channels + group * per_group) * pixels;
}

template <typename T>
void forward_im2col(const Array& x_in, const Array& w_in, const Array& b_in, const Conv2dParams& p,
                    Array& y) {
  const Array x = x_in.contiguous(), w = w_in.contiguous();
  const Array b = b_in.defined() ? b_in.contiguous() : Array();
  const ConvGeometry g = geometry(x.shape(), w.shape(), y.shape(), p);
  const T* xp = x.data<const T>();
  const T* wp = w.data<const T>();
  T* yp = y.data<T>();
  const int64_t pixels = g.pixels();
  // Start from the bias (or 0) and let the GEMMs add to it.
  const T* bp = b.defined() ? b.data<const T>() : nullptr;
  parallel_for(g.n * g.o, pixels, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::fill(yp + i * pixels, yp + (i + 1) * pixels, bp ? bp[i % g.o] : T(0));
  });
  if (g.k() == 0) return;
  const int64_t chunk = chunk_images(g);
  auto col = column_buffer<T>(g, chunk);
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, g.n - n0), cols = nb * pixels;
    for (int64_t group = 0; group < g.groups; ++group) {
      im2col(xp, g, n0, nb, group, col.get());
      for (int64_t i = 0; i < nb; ++i) {
        gemm<T>(false, false, g.og(), pixels, g.k(), wp + group * g.og() * g.k(), g.k(),
                col.get() + i * pixels, cols, T(1),
                yp + group_offset(n0 + i, group, g.o, g.og(), pixels), pixels);
      }
    }
  }
}

template <typename T>
void backward_data_im2col(const Array& w_in, const Array& gy_in, const Conv2dParams& p, Array& gx) {
  const Array w = w_in.contiguous(), gy = gy_in.contiguous();
  const ConvGeometry g = geometry(gx.shape(), w.shape(), gy.shape(), p);
  const T* wp = w.data<const T>();
  const T* gyp = gy.data<const T>();
  T* gxp = gx.data<T>();
  std::fill(gxp, gxp + gx.size(), T(0));
  if (g.k() == 0 || g.og() == 0) return;
  const int64_t pixels = g.pixels(), chunk = chunk_images(g);
  auto col = column_buffer<T>(g, chunk);
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, g.n - n0), cols = nb * pixels;
    for (int64_t group = 0; group < g.groups; ++group) {
      for (int64_t i = 0; i < nb; ++i) {
        gemm<T>(true, false, g.k(), pixels, g.og(), wp + group * g.og() * g.k(), g.k(),
                gyp + group_offset(n0 + i, group, g.o, g.og(), pixels), pixels, T(0),
                col.get() + i * pixels, cols);
      }
      col2im(col.get(), g, n0, nb, group, gxp);
    }
  }
}

template <typename T>
void backward_filter_im2col(const Array& x_in, const Array& gy_in, const Conv2dParams& p,
                            Array& gw) {
  const Array x = x_in.contiguous(), gy = gy_in.contiguous();
  const ConvGeometry g = geometry(x.shape(), gw.shape(), gy.shape(), p);
  const T* xp = x.data<const T>();
  const T* gyp = gy.data<const T>();
  T* gwp = gw.data<T>();
  std::fill(gwp, gwp + gw.size(), T(0));
  if (g.k() == 0 || g.og() == 0 || g.pixels() == 0) return;
  const int64_t pixels = g.pixels(), chunk = chunk_images(g);
  auto col = column_buffer<T>(g, chunk);
  for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
    const int64_t nb = std::min(chunk, g.n - n0), cols = nb * pixels;
    for (int64_t group = 0; group < g.groups; ++group) {
      im2col(xp, g, n0, nb, group, col.get());
      for (int64_t i = 0; i < nb; ++i) {
        gemm<T>(false, true, g.og(), g.k(), pixels,
                gyp + group_offset(n0 + i, group, g.o, g.og(), pixels), pixels,
                col.get() + i * pixels, cols, T(1), gwp + group * g.og() * g.k(), g.k());
      }
    }
  }
}

// --- oneDNN ------------------------------------------------------------------------------------

#if KUSARI_HAVE_DNNL

// Note [oneDNN primitive cache]
// A oneDNN primitive is created once per (operation, shapes, stride, pad, dilation, groups, bias,
// layouts) and kept in a process-wide map behind a mutex, together with the reorders its layouts
// need (Note [oneDNN layouts]); a training loop therefore pays the creation cost on its first
// iteration only. Primitives are created with a user-managed scratchpad, and every buffer a call
// needs (scratchpad, reordered operands) comes from the calling thread's own arena, so one cached
// primitive may run on several threads at once and a step allocates no fresh pages. A geometry
// oneDNN cannot handle is remembered as an empty entry and goes to im2col. The cache holds at
// most kMaxCachedPrimitives entries and starts over when full (programs with ever-changing shapes
// would otherwise grow it without bound).
//
// Note [oneDNN layouts]
// Our arrays are NCHW or channels-last (Note [Memory formats]); oneDNN's fast convolutions want
// either NHWC activations or its own blocked layouts (nChw16c and the like on AVX-512, where its
// plain-NCHW implementation is an im2col GEMM two to three times slower).
//   - Channels-last activations are given to oneDNN as they are (nhwc memory descriptors): no
//     copy and no reorder; the output is written straight into the channels-last result.
//   - NCHW float32 activations: the primitive is created with format_tag::any, oneDNN picks its
//     blocked layout, and the activations are reordered into it and the result back out (two
//     cheap passes next to the convolution; a single-channel input usually stays plain).
//   - Filters are always format_tag::any and are reordered from the array's layout (oihw or, for a
//     channels-last filter, ohwi; goihw-like with groups) on every call. Caching the reordered
//     filter would save a pass over a few thousand to a few million numbers, but an optimizer
//     updates the filter in place and an array carries no version counter, so a cached copy could
//     silently go stale; the reorder is cheap, the primitive cache is where the time goes.
//   - The layout of a call follows its output (y, gx: Note [Memory formats]; gW: x's layout),
//     and an input in the other layout is converted to it first.
// Every reorder primitive is created with its convolution and cached with it.
constexpr size_t kMaxCachedPrimitives = 1024;

enum class DnnlOp : int64_t { kForward, kBackwardData, kBackwardWeights };

using DnnlKey = std::array<int64_t, 20>;

/// One operand of a cached primitive: the array's memory as given (user), the primitive's (md),
/// and the reorder between them when they differ.
struct DnnlOperand {
  dnnl::memory::desc user, md;
  dnnl::reorder reorder;  // user -> md for inputs, md -> user for outputs
  bool needs_reorder = false;
};

struct DnnlEntry {
  dnnl::primitive primitive;
  // Forward: src, weights, bias, dst. Gradient of x: diff_dst, weights, diff_src. Gradient of W:
  // src, diff_dst, diff_weights. Ids are DNNL_ARG_*.
  std::vector<std::pair<int, DnnlOperand>> operands;
  dnnl::memory::desc scratchpad;
  bool valid = false;
};

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

/// The memory descriptor of a dense 4-d activation (n, c, h, w) in NCHW or NHWC.
dnnl::memory::desc activation_md(int64_t n, int64_t c, int64_t h, int64_t w, bool nhwc) {
  using tag = dnnl::memory::format_tag;
  return dnnl::memory::desc({n, c, h, w}, dnnl::memory::data_type::f32,
                            nhwc ? tag::nhwc : tag::nchw);
}

/// The memory descriptor of a dense filter (o, c / groups, kh, kw) in OIHW or, channels-last, OHWI
/// order, as oneDNN's (o, i, h, w) or, with groups, (g, o / g, i, h, w) weights.
dnnl::memory::desc weights_md(const ConvGeometry& g, bool ohwi) {
  const int64_t cg = g.cg();
  // Strides of the (o, i, h, w) array.
  const int64_t so = cg * g.kh * g.kw;
  const int64_t si = ohwi ? 1 : g.kh * g.kw, sh = ohwi ? g.kw * cg : g.kw, sw = ohwi ? cg : 1;
  if (g.groups == 1) {
    return dnnl::memory::desc({g.o, cg, g.kh, g.kw}, dnnl::memory::data_type::f32,
                              {so, si, sh, sw});
  }
  return dnnl::memory::desc({g.groups, g.og(), cg, g.kh, g.kw}, dnnl::memory::data_type::f32,
                            {g.og() * so, so, si, sh, sw});
}

DnnlOperand operand(const dnnl::memory::desc& user, const dnnl::memory::desc& md, bool input) {
  DnnlOperand out;
  out.user = user;
  out.md = md;
  out.needs_reorder = !(user == md);
  if (out.needs_reorder) {
    out.reorder =
        input
            ? dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), user, dnnl_engine(), md))
            : dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), md, dnnl_engine(), user));
  }
  return out;
}

std::shared_ptr<const DnnlEntry> create_entry(DnnlOp op, const ConvGeometry& g, bool bias,
                                              bool nhwc, bool ohwi) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  using dnnl::memory;
  auto entry = std::make_shared<DnnlEntry>();
  try {
    // The arrays as they are, and what the primitive is asked to take (Note [oneDNN layouts]).
    const memory::desc src_user = activation_md(g.n, g.c, g.h, g.w, nhwc);
    const memory::desc dst_user = activation_md(g.n, g.o, g.oh, g.ow, nhwc);
    const memory::desc w_user = weights_md(g, ohwi);
    const memory::desc src_any =
        nhwc ? src_user : memory::desc({g.n, g.c, g.h, g.w}, dt::f32, tag::any);
    const memory::desc dst_any =
        nhwc ? dst_user : memory::desc({g.n, g.o, g.oh, g.ow}, dt::f32, tag::any);
    const memory::desc w_any(w_user.dims(), dt::f32, tag::any);
    const memory::desc bias_md = bias ? memory::desc({g.o}, dt::f32, tag::x) : memory::desc();
    // oneDNN counts dilation from 0 (no gaps); the right padding may be whatever keeps the
    // output size, and the symmetric pad does.
    const memory::dims strides{g.sh, g.sw}, dilates{g.dh - 1, g.dw - 1}, pad{g.ph, g.pw};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::convolution_forward::desc fwd_desc(
        dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, src_any, w_any,
        bias_md, dst_any, strides, dilates, pad, pad);
    const dnnl::convolution_forward::primitive_desc fwd_pd(fwd_desc, attr, dnnl_engine());
    switch (op) {
      case DnnlOp::kForward:
        entry->primitive = dnnl::convolution_forward(fwd_pd);
        entry->scratchpad = fwd_pd.scratchpad_desc();
        entry->operands = {{DNNL_ARG_SRC, operand(src_user, fwd_pd.src_desc(), true)},
                           {DNNL_ARG_WEIGHTS, operand(w_user, fwd_pd.weights_desc(), true)},
                           {DNNL_ARG_DST, operand(dst_user, fwd_pd.dst_desc(), false)}};
        if (bias)
          entry->operands.push_back({DNNL_ARG_BIAS, operand(bias_md, fwd_pd.bias_desc(), true)});
        break;
      case DnnlOp::kBackwardData: {
        const dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, src_any,
                                                      w_any, dst_any, strides, dilates, pad, pad);
        const dnnl::convolution_backward_data::primitive_desc pd(d, attr, dnnl_engine(), fwd_pd);
        entry->primitive = dnnl::convolution_backward_data(pd);
        entry->scratchpad = pd.scratchpad_desc();
        entry->operands = {{DNNL_ARG_DIFF_DST, operand(dst_user, pd.diff_dst_desc(), true)},
                           {DNNL_ARG_WEIGHTS, operand(w_user, pd.weights_desc(), true)},
                           {DNNL_ARG_DIFF_SRC, operand(src_user, pd.diff_src_desc(), false)}};
        break;
      }
      case DnnlOp::kBackwardWeights: {
        const dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct,
                                                         src_any, w_any, dst_any, strides, dilates,
                                                         pad, pad);
        const dnnl::convolution_backward_weights::primitive_desc pd(d, attr, dnnl_engine(), fwd_pd);
        entry->primitive = dnnl::convolution_backward_weights(pd);
        entry->scratchpad = pd.scratchpad_desc();
        entry->operands = {{DNNL_ARG_SRC, operand(src_user, pd.src_desc(), true)},
                           {DNNL_ARG_DIFF_DST, operand(dst_user, pd.diff_dst_desc(), true)},
                           {DNNL_ARG_DIFF_WEIGHTS, operand(w_user, pd.diff_weights_desc(), false)}};
        break;
      }
    }
    entry->valid = true;
  } catch (const dnnl::error&) {
    entry->valid = false;
  }
  return entry;
}

/// The cached primitive for a geometry and layouts (see Note [oneDNN primitive cache]).
std::shared_ptr<const DnnlEntry> dnnl_primitive(DnnlOp op, const ConvGeometry& g, bool bias,
                                                bool nhwc, bool ohwi) {
  static std::mutex mutex;
  static std::map<DnnlKey, std::shared_ptr<const DnnlEntry>> cache;
  const DnnlKey key{int64_t(op), g.n,  g.c,      g.h,           g.w,           g.o,          g.kh,
                    g.kw,        g.oh, g.ow,     g.sh,          g.sw,          g.ph,         g.pw,
                    g.dh,        g.dw, g.groups, int64_t{bias}, int64_t{nhwc}, int64_t{ohwi}};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxCachedPrimitives) cache.clear();
  auto entry = create_entry(op, g, bias, nhwc, ohwi);
  cache.emplace(key, entry);
  return entry;
}

/// The calling thread's scratch buffers, reused from call to call (a fresh multi-megabyte
/// allocation per call would fault its pages in every time). Slot 0 is the scratchpad, the
/// others hold reordered operands.
char* thread_buffer(size_t slot, size_t bytes) {
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t size = 0;
  };
  thread_local std::array<Buffer, 5> buffers;
  Buffer& b = buffers.at(slot);
  if (b.size < bytes) {
    b.data.reset(new char[bytes + 64]);
    b.size = bytes;
  }
  // oneDNN prefers 64-byte aligned buffers.
  return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(b.data.get()) + 63) & ~uintptr_t{63});
}

/// Runs a cached primitive on the arrays' memory (argument id -> data), reordering each operand
/// whose layout the primitive chose differently (Note [oneDNN layouts]).
void dnnl_execute(const DnnlEntry& entry, std::initializer_list<std::pair<int, void*>> data) {
  dnnl::stream stream(dnnl_engine());
  std::unordered_map<int, dnnl::memory> args;
  std::vector<std::pair<const DnnlOperand*, std::pair<dnnl::memory, dnnl::memory>>> outputs;
  size_t slot = 1;
  for (const auto& [id, operand] : entry.operands) {
    void* ptr = nullptr;
    for (const auto& [did, p] : data) {
      if (did == id) ptr = p;
    }
    KUSARI_ASSERT(ptr != nullptr, "dnnl_execute: no data for argument ", id);
    dnnl::memory user(operand.user, dnnl_engine(), ptr);
    if (!operand.needs_reorder) {
      args.emplace(id, user);
      continue;
    }
    dnnl::memory inner(operand.md, dnnl_engine(), thread_buffer(slot++, operand.md.get_size()));
    const bool is_output =
        id == DNNL_ARG_DST || id == DNNL_ARG_DIFF_SRC || id == DNNL_ARG_DIFF_WEIGHTS;
    if (is_output) {
      outputs.push_back({&operand, {inner, user}});
    } else {
      operand.reorder.execute(stream, user, inner);
    }
    args.emplace(id, inner);
  }
  args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(entry.scratchpad, dnnl_engine(),
                                                 thread_buffer(0, entry.scratchpad.get_size())));
  entry.primitive.execute(stream, args);
  for (auto& [operand, mems] : outputs) operand->reorder.execute(stream, mems.first, mems.second);
  stream.wait();
}

/// True when a call should run in NHWC: its output is dense channels-last and either not also
/// C-contiguous or ambiguous (length-1 axes) with `in` channels-last.
bool dnnl_nhwc(const Array& out, const Array& in) {
  return out.is_contiguous(MemoryFormat::kChannelsLast) &&
         (!out.is_contiguous() || in.memory_format() == MemoryFormat::kChannelsLast);
}

/// `a` dense in NHWC (nhwc) or NCHW order: itself when it already is.
Array dense(const Array& a, bool nhwc) {
  return a.to_memory_format(nhwc ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous);
}

/// A filter as oneDNN reads it: itself when dense OIHW or channels-last (OHWI), else a copy.
Array dense_filter(const Array& w, bool* ohwi) {
  *ohwi = !w.is_contiguous() && w.is_contiguous(MemoryFormat::kChannelsLast);
  return *ohwi ? w : w.contiguous();
}

/// y = conv(x, w) + b in float32 through oneDNN; false when oneDNN cannot run this geometry.
bool forward_dnnl(const Array& x_in, const Array& w_in, const Array& b_in, const Conv2dParams& p,
                  Array& y) {
  if (!y.is_contiguous() && !y.is_contiguous(MemoryFormat::kChannelsLast)) return false;
  const ConvGeometry g = geometry(x_in.shape(), w_in.shape(), y.shape(), p);
  const bool nhwc = dnnl_nhwc(y, x_in);
  bool ohwi = false;
  const Array w = dense_filter(w_in, &ohwi);
  const auto entry = dnnl_primitive(DnnlOp::kForward, g, b_in.defined(), nhwc, ohwi);
  if (!entry->valid) return false;
  const Array x = dense(x_in, nhwc);
  if (b_in.defined()) {
    const Array b = b_in.contiguous();
    dnnl_execute(*entry, {{DNNL_ARG_SRC, x.raw_data()},
                          {DNNL_ARG_WEIGHTS, w.raw_data()},
                          {DNNL_ARG_BIAS, b.raw_data()},
                          {DNNL_ARG_DST, y.raw_data()}});
  } else {
    dnnl_execute(*entry, {{DNNL_ARG_SRC, x.raw_data()},
                          {DNNL_ARG_WEIGHTS, w.raw_data()},
                          {DNNL_ARG_DST, y.raw_data()}});
  }
  return true;
}

bool backward_data_dnnl(const Array& w_in, const Array& gy_in, const Conv2dParams& p, Array& gx) {
  if (!gx.is_contiguous() && !gx.is_contiguous(MemoryFormat::kChannelsLast)) return false;
  const ConvGeometry g = geometry(gx.shape(), w_in.shape(), gy_in.shape(), p);
  const bool nhwc = dnnl_nhwc(gx, gy_in);
  bool ohwi = false;
  const Array w = dense_filter(w_in, &ohwi);
  const auto entry = dnnl_primitive(DnnlOp::kBackwardData, g, false, nhwc, ohwi);
  if (!entry->valid) return false;
  const Array gy = dense(gy_in, nhwc);
  dnnl_execute(*entry, {{DNNL_ARG_DIFF_DST, gy.raw_data()},
                        {DNNL_ARG_WEIGHTS, w.raw_data()},
                        {DNNL_ARG_DIFF_SRC, gx.raw_data()}});
  return true;
}

bool backward_filter_dnnl(const Array& x_in, const Array& gy_in, const Conv2dParams& p, Array& gw) {
  bool ohwi = false;
  if (!gw.is_contiguous()) {
    if (!gw.is_contiguous(MemoryFormat::kChannelsLast)) return false;
    ohwi = true;
  }
  const ConvGeometry g = geometry(x_in.shape(), gw.shape(), gy_in.shape(), p);
  // NHWC when x is, or when x is both layouts (one channel) and gy is channels-last.
  const bool nhwc = dnnl_nhwc(x_in, gy_in);
  const auto entry = dnnl_primitive(DnnlOp::kBackwardWeights, g, false, nhwc, ohwi);
  if (!entry->valid) return false;
  const Array x = dense(x_in, nhwc), gy = dense(gy_in, nhwc);
  dnnl_execute(*entry, {{DNNL_ARG_SRC, x.raw_data()},
                        {DNNL_ARG_DIFF_DST, gy.raw_data()},
                        {DNNL_ARG_DIFF_WEIGHTS, gw.raw_data()}});
  return true;
}

#endif  // KUSARI_HAVE_DNNL

/// True when a float32 convolution should try oneDNN (see Note [CPU convolution algorithms]).
/// Every kernel asks, whatever its dtype, so that a bad KUSARI_CPU_CONV is always reported.
bool use_dnnl() {
  const bool requested = requested_algorithm() == ConvAlgorithm::kAuto;
  return KUSARI_HAVE_DNNL && requested;
}

/// A float32 copy of `a` (undefined stays undefined).
Array to_float32(const Array& a) {
  return a.defined() ? a.astype(Dtype::kFloat32) : Array();
}

/// An array like `a` but float32, dense in `a`'s layout when that is channels-last (else NCHW).
Array empty_float32_like(const Array& a) {
  const MemoryFormat f = a.is_contiguous(MemoryFormat::kChannelsLast) && !a.is_contiguous()
                             ? MemoryFormat::kChannelsLast
                             : MemoryFormat::kContiguous;
  return Array::empty(a.shape(), Dtype::kFloat32, a.device(), f);
}

/// Runs an im2col kernel of T into `out`, through a contiguous buffer and one strided copy when
/// `out` is not C-contiguous (im2col computes in NCHW).
template <typename F>
void into_contiguous(Array& out, F&& compute) {
  if (out.is_contiguous()) {
    compute(out);
    return;
  }
  Array nchw = Array::empty(out.shape(), out.dtype(), out.device());
  compute(nchw);
  copy(nchw, out);
}

void forward_float32(bool try_dnnl, const Array& x, const Array& w, const Array& b,
                     const Conv2dParams& p, Array& y) {
#if KUSARI_HAVE_DNNL
  if (try_dnnl && forward_dnnl(x, w, b, p, y)) return;
#endif
  into_contiguous(y, [&](Array& out) { forward_im2col<float>(x, w, b, p, out); });
}

void backward_data_float32(bool try_dnnl, const Array& w, const Array& gy, const Conv2dParams& p,
                           Array& gx) {
#if KUSARI_HAVE_DNNL
  if (try_dnnl && backward_data_dnnl(w, gy, p, gx)) return;
#endif
  into_contiguous(gx, [&](Array& out) { backward_data_im2col<float>(w, gy, p, out); });
}

void backward_filter_float32(bool try_dnnl, const Array& x, const Array& gy, const Conv2dParams& p,
                             Array& gw) {
#if KUSARI_HAVE_DNNL
  if (try_dnnl && backward_filter_dnnl(x, gy, p, gw)) return;
#endif
  into_contiguous(gw, [&](Array& out) { backward_filter_im2col<float>(x, gy, p, out); });
}

}  // namespace

void conv2d_forward(const Array& x, const Array& w, const Array& b, const Conv2dParams& p,
                    Array& y) {
  const bool try_dnnl = use_dnnl();
  switch (x.dtype()) {
    case Dtype::kFloat32:
      return forward_float32(try_dnnl, x, w, b, p, y);
    case Dtype::kFloat64:
      return into_contiguous(y, [&](Array& out) { forward_im2col<double>(x, w, b, p, out); });
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      Array y32 = empty_float32_like(y);
      forward_float32(try_dnnl, to_float32(x), to_float32(w), to_float32(b), p, y32);
      copy(y32, y);
      return;
    }
    default:
      KUSARI_THROW(DtypeError, "convolution_2d: not supported for dtype ", dtype_name(x.dtype()));
  }
}

void conv2d_backward_data(const Array& w, const Array& gy, const Conv2dParams& p, Array& gx,
                          bool accumulate) {
  if (accumulate) {
    // Computed apart, then added in place (one array fewer than the engine's sum).
    Array part = Array::empty(gx.shape(), gx.dtype(), gx.device(), gx.memory_format());
    conv2d_backward_data(w, gy, p, part, false);
    kernels::binary(gx.device(), BinaryOp::kAdd, gx, part, gx);
    return;
  }
  const bool try_dnnl = use_dnnl();
  switch (gy.dtype()) {
    case Dtype::kFloat32:
      return backward_data_float32(try_dnnl, w, gy, p, gx);
    case Dtype::kFloat64:
      return into_contiguous(gx, [&](Array& out) { backward_data_im2col<double>(w, gy, p, out); });
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      Array gx32 = empty_float32_like(gx);
      backward_data_float32(try_dnnl, to_float32(w), to_float32(gy), p, gx32);
      copy(gx32, gx);
      return;
    }
    default:
      KUSARI_THROW(DtypeError, "convolution_2d (gradient of x): not supported for dtype ",
                   dtype_name(gy.dtype()));
  }
}

void conv2d_backward_filter(const Array& x, const Array& gy, const Conv2dParams& p, Array& gw) {
  const bool try_dnnl = use_dnnl();
  switch (gy.dtype()) {
    case Dtype::kFloat32:
      return backward_filter_float32(try_dnnl, x, gy, p, gw);
    case Dtype::kFloat64:
      return into_contiguous(gw,
                             [&](Array& out) { backward_filter_im2col<double>(x, gy, p, out); });
    case Dtype::kFloat16:
    case Dtype::kBFloat16: {
      Array gw32 = empty_float32_like(gw);
      backward_filter_float32(try_dnnl, to_float32(x), to_float32(gy), p, gw32);
      copy(gw32, gw);
      return;
    }
    default:
      KUSARI_THROW(DtypeError, "convolution_2d (gradient of W): not supported for dtype ",
                   dtype_name(gy.dtype()));
  }
}

void register_cpu_nn_kernels() {
  kernels::conv2d_forward.set(DeviceType::kCPU, &conv2d_forward);
  kernels::conv2d_backward_data.set(DeviceType::kCPU, &conv2d_backward_data);
  kernels::conv2d_backward_filter.set(DeviceType::kCPU, &conv2d_backward_filter);
  kernels::pool2d_forward.set(DeviceType::kCPU, &pool2d_forward);
  kernels::pool2d_backward.set(DeviceType::kCPU, &pool2d_backward);
}

}  // namespace kusari::cpu
