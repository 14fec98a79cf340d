// CPU kernels: fill, arange, copy (with dtype conversion) and random numbers.
#include <cmath>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KUSARI_CPU_F16C 1
#else
#define KUSARI_CPU_F16C 0
#endif

#include "backends/common/philox.h"
#include "backends/cpu/cpu_backend.h"
#include "kernels/creation.h"
#include "backends/cpu/loops.h"

namespace kusari::cpu {

void fill(Array& out, Scalar value) {
  common::visit_dtype(out.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    const T v = static_cast<T>(value.template to<compute_t<T>>());
    StridedLoop<1> loop(out.shape(), {&out});
    loop.run([&](char** p, int64_t n, const int64_t* s) {
      if (s[0] == sizeof(T)) {
        T* o = reinterpret_cast<T*>(p[0]);
        std::fill(o, o + n, v);
      } else {
        for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
      }
    });
  });
}

void arange(Array& out, double start, double step) {
  common::visit_dtype(out.dtype(), "arange", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const int64_t n = out.size();
    const int64_t st = out.strides().empty() ? 1 : out.strides()[0];
    for (int64_t i = 0; i < n; ++i) {
      o[i * st] = static_cast<T>(static_cast<compute_t<T>>(start + static_cast<double>(i) * step));
    }
  });
}

namespace {

// Note [Half conversion on the CPU]
// Mixed-precision training converts whole float16 arrays to float32 and back several times a
// step (matmul operands, master weights, gradients), and the portable bit-twiddling conversion
// in half.h runs at about one element per 5 ns. On x86-64 CPUs with F16C (all since 2013) a
// contiguous row is converted 8 elements at a time by vcvtph2ps / vcvtps2ph instead: the same
// IEEE results (round to nearest even, overflow to infinity, subnormals kept), chosen at run time
// so that the build stays portable. bfloat16 needs no such path: its conversions are shifts.
#if KUSARI_CPU_F16C
__attribute__((target("avx,f16c"))) void half_to_float_f16c(const Half* a, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i))));
  }
  for (; i < n; ++i) o[i] = static_cast<float>(a[i]);
}

__attribute__((target("avx,f16c"))) void float_to_half_f16c(const float* a, Half* o, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(a + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) o[i] = Half(a[i]);
}

bool have_f16c() {
  static const bool have = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return have;
}
#endif

// Converts a contiguous row between Half and float with F16C; false when it cannot.
template <typename S, typename D>
bool convert_row_fast(const S* a, D* o, int64_t n) {
#if KUSARI_CPU_F16C
  if constexpr (std::is_same_v<S, Half> && std::is_same_v<D, float>) {
    if (!have_f16c()) return false;
    half_to_float_f16c(a, o, n);
    return true;
  } else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, Half>) {
    if (!have_f16c()) return false;
    float_to_half_f16c(a, o, n);
    return true;
  }
#endif
  return false;
}

template <typename From, typename To>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != compute_t<From>(0);
  } else {
    return static_cast<To>(static_cast<compute_t<To>>(static_cast<compute_t<From>>(v)));
  }
}

}  // namespace

void copy(const Array& src, Array& dst) {
  KUSARI_ASSERT(src.shape() == dst.shape(), "copy: ", src.shape(), " vs ", dst.shape());
  StridedLoop<2> loop(dst.shape(), {&dst, &src});
  common::visit_dtype(src.dtype(), "copy", [&](auto stag) {
    using S = decltype(stag);
    common::visit_dtype(dst.dtype(), "copy", [&](auto dtag) {
      using D = decltype(dtag);
      loop.run([](char** p, int64_t n, const int64_t* s) {
        if constexpr (std::is_same_v<S, D>) {
          if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
            std::memcpy(p[0], p[1], static_cast<size_t>(n) * sizeof(D));
            return;
          }
        }
        if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
          D* o = reinterpret_cast<D*>(p[0]);
          const S* a = reinterpret_cast<const S*>(p[1]);
          if (convert_row_fast(a, o, n)) return;
          for (int64_t i = 0; i < n; ++i) o[i] = convert<S, D>(a[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) {
            *reinterpret_cast<D*>(p[0] + i * s[0]) = convert<S, D>(*reinterpret_cast<const S*>(p[1] + i * s[1]));
          }
        }
      });
    });
  });
}

// Note [Random streams]
// Element i of a draw uses Philox block (start + i / k) and word (i % k) of it, where k is the
// number of values one block yields (4 uniform floats, 2 uniform doubles, 2 normals from one
// Box-Muller pair per two words). The CUDA kernels use the same mapping, so a seed gives the same
// array on every device.
void random_uniform(Array& out, double low, double high, Generator& gen) {
  KUSARI_ASSERT(out.is_contiguous());
  const int64_t n = out.size();
  const auto key = gen.key();
  common::visit_floating_dtype(out.dtype(), "uniform", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    if constexpr (std::is_same_v<T, double>) {
      const uint64_t start = gen.advance(static_cast<uint64_t>((n + 1) / 2));
      parallel_for((n + 1) / 2, 20, [&](int64_t b, int64_t e) {
        for (int64_t blk = b; blk < e; ++blk) {
          uint64_t c = start + static_cast<uint64_t>(blk);
          const common::Philox4 r = common::philox4x32(c, key[0], key[1]);
          for (int j = 0; j < 2 && blk * 2 + j < n; ++j) {
            o[blk * 2 + j] = low + (high - low) * common::unit_double(r.v[2 * j], r.v[2 * j + 1]);
          }
        }
      });
    } else {
      const uint64_t start = gen.advance(static_cast<uint64_t>((n + 3) / 4));
      parallel_for((n + 3) / 4, 20, [&](int64_t b, int64_t e) {
        for (int64_t blk = b; blk < e; ++blk) {
          uint64_t c = start + static_cast<uint64_t>(blk);
          const common::Philox4 r = common::philox4x32(c, key[0], key[1]);
          for (int j = 0; j < 4 && blk * 4 + j < n; ++j) {
            float u = common::unit_float(r.v[j]);
            o[blk * 4 + j] = static_cast<T>(static_cast<float>(low + (high - low) * static_cast<double>(u)));
          }
        }
      });
    }
  });
}

void random_normal(Array& out, double mean, double stddev, Generator& gen) {
  KUSARI_ASSERT(out.is_contiguous());
  const int64_t n = out.size();
  const auto key = gen.key();
  const uint64_t start = gen.advance(static_cast<uint64_t>((n + 1) / 2));
  common::visit_floating_dtype(out.dtype(), "normal", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    parallel_for((n + 1) / 2, 40, [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        uint64_t c = start + static_cast<uint64_t>(blk);
        const common::Philox4 r = common::philox4x32(c, key[0], key[1]);
        // Box-Muller on two uniforms in (0, 1].
        double u1 = 1.0 - common::unit_double(r.v[0], r.v[1]);
        double u2 = common::unit_double(r.v[2], r.v[3]);
        double radius = std::sqrt(-2.0 * std::log(u1));
        double angle = 2.0 * M_PI * u2;
        int64_t i0 = blk * 2;
        o[i0] = static_cast<T>(static_cast<compute_t<T>>(mean + stddev * radius * std::cos(angle)));
        if (i0 + 1 < n) o[i0 + 1] = static_cast<T>(static_cast<compute_t<T>>(mean + stddev * radius * std::sin(angle)));
      }
    });
  });
}

void register_cpu_creation_kernels() {
  kernels::fill.set(DeviceType::kCPU, &fill);
  kernels::arange.set(DeviceType::kCPU, &arange);
  kernels::copy.set(DeviceType::kCPU, &copy);
  kernels::random_uniform.set(DeviceType::kCPU, &random_uniform);
  kernels::random_normal.set(DeviceType::kCPU, &random_normal);
}

}  // namespace kusari::cpu
