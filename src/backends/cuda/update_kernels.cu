// CUDA kernels: fused optimizer updates, one pass over the parameter, its gradient and its state.
//
// The rules, their hyperparameter layouts and the rounding of 16-bit states are the CPU's
// (Note [Fused updates], Note [Update rule layouts]): derived constants (1 - beta1, momentum^2,
// ...) are computed on the host in double and rounded to the compute type exactly as the CPU
// does, and every state is stored and read back before it is used, so 16-bit states round at the
// same points. One kernel per dtype switches on the rule (Note [Runtime op switch]).
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernel_util.cuh"

namespace kusari::cuda {
namespace {

/// The hyperparameters of one step in the compute type C; see update_constants for the layout.
template <typename C>
struct UpdateConstants {
  UpdateRule rule;
  C c[6];
  bool flag;  // Adam: amsgrad; RMSprop: eps inside the square root
};

// --- kernels -------------------------------------------------------------------------------------

/// max(a, b) that propagates a NaN in either operand (numpy.maximum's behaviour).
template <typename C>
__device__ __forceinline__ C nan_max(C a, C b) {
  return (b != b || b > a) ? b : a;
}

// p, g, s0, s1, s2 (n,) contiguous: one step of the rule per element; none when *skip != 0.
template <typename T>
__global__ void update_kernel(int64_t n, T* p, const T* g, T* s0, T* s1, T* s2,
                              UpdateConstants<compute_t<T>> k, const int64_t* skip) {
  using C = compute_t<T>;
  if (skip != nullptr && *skip != 0) return;
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    const C gi = to_compute(g[i]);
    switch (k.rule) {
      case UpdateRule::kSgd:
        p[i] = from_compute<T>(to_compute(p[i]) - k.c[0] * gi);
        break;
      case UpdateRule::kMomentumSgd: {
        // c: lr, momentum
        s0[i] = from_compute<T>(k.c[1] * to_compute(s0[i]) - k.c[0] * gi);
        p[i] = from_compute<T>(to_compute(p[i]) + to_compute(s0[i]));
        break;
      }
      case UpdateRule::kNesterov: {
        // c: lr, momentum, momentum^2, (1 + momentum) lr
        s0[i] = from_compute<T>(k.c[1] * to_compute(s0[i]) - k.c[0] * gi);
        p[i] = from_compute<T>(to_compute(p[i]) + (k.c[2] * to_compute(s0[i]) - k.c[3] * gi));
        break;
      }
      case UpdateRule::kAdam: {
        // c: alpha_t, 1 - beta1, 1 - beta2, eps, eta, weight_decay_rate; flag: amsgrad
        C mi = to_compute(s0[i]), vi = to_compute(s1[i]);
        mi += k.c[1] * (gi - mi);
        vi += k.c[2] * (gi * gi - vi);
        s0[i] = from_compute<T>(mi);
        s1[i] = from_compute<T>(vi);
        mi = to_compute(s0[i]);
        vi = to_compute(s1[i]);
        if (k.flag) {
          s2[i] = from_compute<T>(nan_max(to_compute(s2[i]), vi));
          vi = to_compute(s2[i]);
        }
        const C pi = to_compute(p[i]);
        p[i] =
            from_compute<T>(pi - k.c[4] * (k.c[0] * mi / (dmath::sqrt(vi) + k.c[3]) + k.c[5] * pi));
        break;
      }
      case UpdateRule::kRmsprop: {
        // c: lr, alpha, 1 - alpha, eps; flag: eps inside the square root
        s0[i] = from_compute<T>(k.c[1] * to_compute(s0[i]) + k.c[2] * gi * gi);
        const C msi = to_compute(s0[i]);
        const C denom = k.flag ? dmath::sqrt(msi + k.c[3]) : dmath::sqrt(msi) + k.c[3];
        p[i] = from_compute<T>(to_compute(p[i]) - k.c[0] * gi / denom);
        break;
      }
      case UpdateRule::kAdaGrad: {
        // c: lr, eps
        s0[i] = from_compute<T>(to_compute(s0[i]) + gi * gi);
        const C hi = to_compute(s0[i]);
        p[i] = from_compute<T>(to_compute(p[i]) - k.c[0] * gi / (dmath::sqrt(hi) + k.c[1]));
        break;
      }
    }
  }
}

// Note [Counting over many arrays]
// Dynamic loss scaling counts the non-finite values of every gradient each step; a reduction per
// array would be several launches per parameter. One launch takes up to kMaxArrays arrays of one
// dtype, their pointers and sizes passed by value in the kernel's arguments: blockIdx.y picks the
// array, the blocks along x stride over it, and each warp adds its count to the total with one
// atomic, only when it found something (a finite step costs no atomics).
constexpr int kMaxArrays = 48;

struct ArrayList {
  const void* data[kMaxArrays];
  int64_t size[kMaxArrays];
};

template <typename T>
__global__ void count_nonfinite_kernel(ArrayList list, unsigned long long* out) {
  const T* p = static_cast<const T*>(list.data[blockIdx.y]);
  const int64_t n = list.size[blockIdx.y];
  unsigned long long bad = 0;
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    const auto v = to_compute(p[i]);
    bad += (dmath::isnan(v) || dmath::isinf(v)) ? 1 : 0;
  }
  for (int offset = 16; offset > 0; offset >>= 1) bad += __shfl_down_sync(0xffffffffu, bad, offset);
  if ((threadIdx.x & 31) == 0 && bad != 0) atomicAdd(out, bad);
}

// --- launchers -----------------------------------------------------------------------------------

/// The constants of one step, converted from double exactly as the CPU kernels convert them.
template <typename C>
UpdateConstants<C> update_constants(UpdateRule rule, const double* h) {
  UpdateConstants<C> k{};
  k.rule = rule;
  const auto c = [](double v) { return static_cast<C>(v); };
  switch (rule) {
    case UpdateRule::kSgd:
      k.c[0] = c(h[0]);
      break;
    case UpdateRule::kMomentumSgd:
      k.c[0] = c(h[0]);
      k.c[1] = c(h[1]);
      break;
    case UpdateRule::kNesterov:
      k.c[0] = c(h[0]);
      k.c[1] = c(h[1]);
      k.c[2] = c(h[1] * h[1]);
      k.c[3] = c((1.0 + h[1]) * h[0]);
      break;
    case UpdateRule::kAdam:
      k.c[0] = c(h[0]);
      k.c[1] = c(1.0 - h[1]);
      k.c[2] = c(1.0 - h[2]);
      k.c[3] = c(h[3]);
      k.c[4] = c(h[4]);
      k.c[5] = c(h[5]);
      k.flag = h[6] != 0.0;
      break;
    case UpdateRule::kRmsprop:
      k.c[0] = c(h[0]);
      k.c[1] = c(h[1]);
      k.c[2] = c(1.0 - h[1]);
      k.c[3] = c(h[2]);
      k.flag = h[3] != 0.0;
      break;
    case UpdateRule::kAdaGrad:
      k.c[0] = c(h[0]);
      k.c[1] = c(h[1]);
      break;
  }
  return k;
}

}  // namespace

void update_parameter(UpdateRule rule, Array& param, const Array& grad, Array* state, int n_state,
                      const double* hyper, int n_hyper, const Array* skip) {
  // kusari::update_parameter (the routine) checked the counts, shapes, dtypes and layout.
  const int64_t n = param.size();
  if (n == 0) return;
  const int device = param.device().index();
  cudaStream_t stream = prepare(param);
  visit_floating_dtype(param.dtype(), "update_parameter", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    auto st = [&](int k) { return k < n_state ? static_cast<T*>(state[k].raw_data()) : nullptr; };
    update_kernel<T><<<grid_for(n, device), kBlockSize, 0, stream>>>(
        n, static_cast<T*>(param.raw_data()), static_cast<const T*>(grad.raw_data()), st(0), st(1),
        st(2), update_constants<compute_t<T>>(rule, hyper),
        skip ? static_cast<const int64_t*>(skip->raw_data()) : nullptr);
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

void count_nonfinite(const Array* arrays, int n, Array& out) {
  const int device = out.device().index();
  cudaStream_t stream = prepare(out);
  auto* total = static_cast<unsigned long long*>(out.raw_data());
  KUSARI_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(unsigned long long), stream));
  for (Dtype dtype : {Dtype::kFloat16, Dtype::kBFloat16, Dtype::kFloat32, Dtype::kFloat64}) {
    ArrayList list{};
    int count = 0;
    int64_t longest = 0;
    auto launch = [&] {
      if (count == 0) return;
      visit_floating_dtype(dtype, "count_nonfinite", [&](auto tag) {
        using T = device_t<decltype(tag)>;
        const dim3 grid(grid_for(longest, device), static_cast<unsigned>(count));
        count_nonfinite_kernel<T><<<grid, kBlockSize, 0, stream>>>(list, total);
      });
      KUSARI_CUDA_CHECK_LAUNCH();
      count = 0;
      longest = 0;
    };
    for (int k = 0; k < n; ++k) {
      if (arrays[k].dtype() != dtype) continue;
      list.data[count] = arrays[k].raw_data();
      list.size[count] = arrays[k].size();
      longest = std::max(longest, arrays[k].size());
      if (++count == kMaxArrays) launch();
    }
    launch();
  }
}

}  // namespace kusari::cuda
