// CPU kernels: fill, arange, copy (with dtype conversion) and random numbers.
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/loops.h"

namespace kusari::cpu {

void fill(Array& out, Scalar value) {
  visit_dtype(out.dtype(), [&](auto tag) {
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
  visit_dtype(out.dtype(), [&](auto tag) {
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
  visit_dtype(src.dtype(), [&](auto stag) {
    using S = decltype(stag);
    visit_dtype(dst.dtype(), [&](auto dtag) {
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
  visit_floating_dtype(out.dtype(), "uniform", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    if constexpr (std::is_same_v<T, double>) {
      const uint64_t start = gen.advance(static_cast<uint64_t>((n + 1) / 2));
      parallel_for((n + 1) / 2, 20, [&](int64_t b, int64_t e) {
        for (int64_t blk = b; blk < e; ++blk) {
          uint64_t c = start + static_cast<uint64_t>(blk);
          auto r = philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}, key);
          for (int j = 0; j < 2 && blk * 2 + j < n; ++j) {
            o[blk * 2 + j] = low + (high - low) * uint32x2_to_unit_double(r[2 * j], r[2 * j + 1]);
          }
        }
      });
    } else {
      const uint64_t start = gen.advance(static_cast<uint64_t>((n + 3) / 4));
      parallel_for((n + 3) / 4, 20, [&](int64_t b, int64_t e) {
        for (int64_t blk = b; blk < e; ++blk) {
          uint64_t c = start + static_cast<uint64_t>(blk);
          auto r = philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}, key);
          for (int j = 0; j < 4 && blk * 4 + j < n; ++j) {
            float u = uint32_to_unit_float(r[j]);
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
  visit_floating_dtype(out.dtype(), "normal", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    parallel_for((n + 1) / 2, 40, [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        uint64_t c = start + static_cast<uint64_t>(blk);
        auto r = philox4x32({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0, 0}, key);
        // Box-Muller on two uniforms in (0, 1].
        double u1 = 1.0 - uint32x2_to_unit_double(r[0], r[1]);
        double u2 = uint32x2_to_unit_double(r[2], r[3]);
        double radius = std::sqrt(-2.0 * std::log(u1));
        double angle = 2.0 * M_PI * u2;
        int64_t i0 = blk * 2;
        o[i0] = static_cast<T>(static_cast<compute_t<T>>(mean + stddev * radius * std::cos(angle)));
        if (i0 + 1 < n) o[i0 + 1] = static_cast<T>(static_cast<compute_t<T>>(mean + stddev * radius * std::sin(angle)));
      }
    });
  });
}

}  // namespace kusari::cpu
