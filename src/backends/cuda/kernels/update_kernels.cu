// CUDA kernels: fused optimizer updates, one pass over the parameter, its gradient and its state.
//
// The rules, their hyperparameter layouts and the rounding of 16-bit states are the CPU's
// (Note [Fused updates], Note [Update rule layouts]): derived constants (1 - beta1, momentum^2,
// ...) are computed on the host in double and rounded to the compute type exactly as the CPU
// does, and every state is stored and read back before it is used, so 16-bit states round at the
// same points. One kernel per dtype switches on the rule (Note [Runtime op switch]).
#include "backends/cuda/kernels/cuda_kernels.h"
#include "kernels/update.h"
#include "backends/cuda/primitives/kernel_util.cuh"
#include "backends/cuda/primitives/reduce.cuh"

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

// One step of the rule on element i of p, g, s0, s1, s2: the code both update kernels run, so
// that the per-parameter and the multi-tensor launches agree bit for bit.
template <typename T>
__device__ __forceinline__ void step_element(int64_t i, T* __restrict__ p, const T* __restrict__ g,
                                             T* __restrict__ s0, T* __restrict__ s1,
                                             T* __restrict__ s2,
                                             const UpdateConstants<compute_t<T>>& k) {
  using C = compute_t<T>;
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
    case UpdateRule::kRmspropWarmup: {
      // c: sgd_lr, rmsprop_lr, momentum, alpha, 1 - alpha, eps
      s0[i] = from_compute<T>(k.c[3] * to_compute(s0[i]) + k.c[4] * gi * gi);
      const C msi = to_compute(s0[i]);
      const C rate = k.c[0] + k.c[1] / (dmath::sqrt(msi) + k.c[5]);
      s1[i] = from_compute<T>(k.c[2] * to_compute(s1[i]) - rate * gi);
      p[i] = from_compute<T>(to_compute(p[i]) + to_compute(s1[i]));
      break;
    }
  }
}

// p, g, s0, s1, s2 (n,) contiguous: one step of the rule per element; none when *skip != 0.
template <typename T>
__global__ void update_kernel(int64_t n, T* p, const T* g, T* s0, T* s1, T* s2,
                              UpdateConstants<compute_t<T>> k, const int64_t* skip) {
  if (skip != nullptr && *skip != 0) return;
  for (int64_t i = grid_start(); i < n; i += grid_step()) step_element(i, p, g, s0, s1, s2, k);
}

// Note [Multi-tensor launches]
// update_parameters steps many tensors of one dtype in one launch. Their pointers and sizes
// travel by value in the kernel's arguments (TensorTable, under the 4 KiB argument limit), so a
// step copies nothing from the host to the device and can be captured in a CUDA graph. Each
// tensor is cut into chunks of kChunk elements; chunk_end[k] is the number of chunks of tensors
// 0..k, a chunk -> tensor map in prefix form: block b takes chunks b, b + gridDim.x, ..., finds
// each chunk's tensor by a binary search of chunk_end (at most 6 steps for 64 tensors) and its
// threads stride over the chunk. Up to kMaxTensors tensors go into one launch, so ResNet-50's
// 161 parameters take 3 launches per dtype. Every element runs step_element with the
// constants update_parameter would pass, hence the same bits.
constexpr int kMaxTensors = 64;
constexpr int64_t kChunk = 4096;

struct TensorTable {
  void* p[kMaxTensors];
  const void* g[kMaxTensors];
  void* s[3][kMaxTensors];
  int64_t size[kMaxTensors];
  int32_t chunk_end[kMaxTensors];
  int32_t n;
};
static_assert(sizeof(TensorTable) + sizeof(UpdateConstants<double>) + sizeof(void*) <= 4096,
              "update_multi_kernel's arguments must fit the 4 KiB kernel parameter limit");

template <typename T>
__global__ void update_multi_kernel(TensorTable t, UpdateConstants<compute_t<T>> k,
                                    const int64_t* skip) {
  if (skip != nullptr && *skip != 0) return;
  const int32_t chunks = t.chunk_end[t.n - 1];
  for (int32_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int lo = 0, hi = t.n - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (t.chunk_end[mid] > c) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int32_t first = lo == 0 ? 0 : t.chunk_end[lo - 1];
    const int64_t begin = static_cast<int64_t>(c - first) * kChunk;
    const int64_t end = begin + kChunk < t.size[lo] ? begin + kChunk : t.size[lo];
    T* p = static_cast<T*>(t.p[lo]);
    const T* g = static_cast<const T*>(t.g[lo]);
    T* s0 = static_cast<T*>(t.s[0][lo]);
    T* s1 = static_cast<T*>(t.s[1][lo]);
    T* s2 = static_cast<T*>(t.s[2][lo]);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      step_element(i, p, g, s0, s1, s2, k);
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
  bad = warp_reduce(bad, [](unsigned long long a, unsigned long long b) { return a + b; });
  if ((threadIdx.x & 31) == 0 && bad != 0) atomicAdd(out, bad);
}

// --- launchers -----------------------------------------------------------------------------------

/// The constants of one step, converted from double exactly as the CPU kernels convert them.
template <typename C>
UpdateConstants<C> update_constants(const kernels::UpdateParams& params) {
  UpdateConstants<C> k{};
  k.rule = kernels::update_rule(params);
  const auto c = [](double v) { return static_cast<C>(v); };
  if (const auto* h = std::get_if<kernels::SgdParams>(&params)) {
    k.c[0] = c(h->lr);
  } else if (const auto* h = std::get_if<kernels::MomentumSgdParams>(&params)) {
    k.c[0] = c(h->lr);
    k.c[1] = c(h->momentum);
  } else if (const auto* h = std::get_if<kernels::NesterovParams>(&params)) {
    k.c[0] = c(h->lr);
    k.c[1] = c(h->momentum);
    k.c[2] = c(h->momentum * h->momentum);
    k.c[3] = c((1.0 + h->momentum) * h->lr);
  } else if (const auto* h = std::get_if<kernels::AdamParams>(&params)) {
    k.c[0] = c(h->alpha_t);
    k.c[1] = c(1.0 - h->beta1);
    k.c[2] = c(1.0 - h->beta2);
    k.c[3] = c(h->eps);
    k.c[4] = c(h->eta);
    k.c[5] = c(h->weight_decay_rate);
    k.flag = h->amsgrad;
  } else if (const auto* h = std::get_if<kernels::RmspropParams>(&params)) {
    k.c[0] = c(h->lr);
    k.c[1] = c(h->alpha);
    k.c[2] = c(1.0 - h->alpha);
    k.c[3] = c(h->eps);
    k.flag = h->eps_inside_sqrt;
  } else if (const auto* h = std::get_if<kernels::AdaGradParams>(&params)) {
    k.c[0] = c(h->lr);
    k.c[1] = c(h->eps);
  } else if (const auto* h = std::get_if<kernels::RmspropWarmupParams>(&params)) {
    k.c[0] = c(h->sgd_lr);
    k.c[1] = c(h->rmsprop_lr);
    k.c[2] = c(h->momentum);
    k.c[3] = c(h->alpha);
    k.c[4] = c(1.0 - h->alpha);
    k.c[5] = c(h->eps);
  }
  return k;
}

}  // namespace

void update_parameter(Array& param, const Array& grad, Array* state, int n_state,
                      const kernels::UpdateParams& params, const Array* skip) {
  // kusari::update_parameter (the routine) checked the counts, shapes, dtypes and layout.
  const int64_t n = param.size();
  if (n == 0) return;
  const int device = param.device().index();
  cudaStream_t stream = prepare(param);
  common::visit_floating_dtype(param.dtype(), "update_parameter", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    auto st = [&](int k) { return k < n_state ? static_cast<T*>(state[k].raw_data()) : nullptr; };
    update_kernel<T><<<grid_for(n, device), kBlockSize, 0, stream>>>(
        n, static_cast<T*>(param.raw_data()), static_cast<const T*>(grad.raw_data()), st(0), st(1),
        st(2), update_constants<compute_t<T>>(params),
        skip ? static_cast<const int64_t*>(skip->raw_data()) : nullptr);
  });
  KUSARI_CUDA_CHECK_LAUNCH();
}

void update_parameters(Array* param, const Array* grad, Array* state, int n_tensors, int n_state,
                       const kernels::UpdateParams& params, const Array* skip) {
  // kusari::update_parameters (the routine) checked every tensor as update_parameter does.
  if (n_tensors == 0) return;
  const int device = param[0].device().index();
  cudaStream_t stream = prepare(param[0]);
  const int64_t* skip_ptr = skip ? static_cast<const int64_t*>(skip->raw_data()) : nullptr;
  common::visit_floating_dtype(param[0].dtype(), "update_parameters", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    const UpdateConstants<compute_t<T>> k = update_constants<compute_t<T>>(params);
    TensorTable table{};
    int64_t chunks = 0;
    auto launch = [&] {
      if (table.n == 0) return;
      const unsigned grid = grid_for(chunks * kBlockSize, device);  // (about one block per chunk)
      update_multi_kernel<T><<<grid, kBlockSize, 0, stream>>>(table, k, skip_ptr);
      KUSARI_CUDA_CHECK_LAUNCH();
      table = TensorTable{};
      chunks = 0;
    };
    for (int i = 0; i < n_tensors; ++i) {
      const int64_t n = param[i].size();
      const int64_t tensor_chunks = (n + kChunk - 1) / kChunk;
      KUSARI_CHECK(tensor_chunks < (int64_t{1} << 30), ValueError, "update_parameters: tensor ", i,
                   " has ", n, " elements, more than ", (int64_t{1} << 30) * kChunk,
                   " (the most one launch takes)");
      if (table.n == kMaxTensors || chunks + tensor_chunks > (int64_t{1} << 30)) launch();
      const int j = table.n++;
      table.p[j] = param[i].raw_data();
      table.g[j] = grad[i].raw_data();
      for (int s = 0; s < 3; ++s) {
        table.s[s][j] =
            s < n_state ? state[static_cast<ptrdiff_t>(i) * n_state + s].raw_data() : nullptr;
      }
      table.size[j] = n;
      chunks += tensor_chunks;
      table.chunk_end[j] = static_cast<int32_t>(chunks);
    }
    launch();
  });
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
      common::visit_floating_dtype(dtype, "count_nonfinite", [&](auto tag) {
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

void register_cuda_update_kernels() {
  kernels::update_parameter.set(DeviceType::kCUDA, &update_parameter);
  kernels::update_parameters.set(DeviceType::kCUDA, &update_parameters);
  kernels::count_nonfinite.set(DeviceType::kCUDA, &count_nonfinite);
}

}  // namespace kusari::cuda
