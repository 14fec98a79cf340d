// 16-bit floating-point storage types for the CPU: IEEE half (Half) and bfloat16 (BFloat16).
// They only store; arithmetic converts to float, computes, and rounds back (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>

namespace kusari {

namespace detail {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Note [Half conversion]
// float -> half rounds to nearest even, saturates to infinity past 65504 and keeps NaN a NaN;
// values below the smallest normal (2^-14) become subnormals, rounded the same way.
inline uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to infinity
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    // Adding 0.5f shifts the mantissa so that the float adder does the rounding for us.
    float shifted = bits_float(abs) + 0.5f;
    return static_cast<uint16_t>(sign | (float_bits(shifted) - 0x3f000000u));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (abs >> 13));
}

inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // subnormal: value = mant * 2^-24
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t float_to_bfloat16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

inline float bfloat16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

}  // namespace detail

/// IEEE 754 binary16, stored as 16 bits.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(detail::float_to_half_bits(f)) {}  // NOLINT: implicit like a float
  Half(double d) : Half(static_cast<float>(d)) {}          // NOLINT
  operator float() const { return detail::half_bits_to_float(bits); }  // NOLINT
  static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

/// bfloat16 (the upper 16 bits of a float32), stored as 16 bits.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(detail::float_to_bfloat16_bits(f)) {}  // NOLINT
  BFloat16(double d) : BFloat16(static_cast<float>(d)) {}         // NOLINT
  operator float() const { return detail::bfloat16_bits_to_float(bits); }  // NOLINT
  static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

inline std::ostream& operator<<(std::ostream& os, Half h) { return os << static_cast<float>(h); }
inline std::ostream& operator<<(std::ostream& os, BFloat16 h) { return os << static_cast<float>(h); }

}  // namespace kusari
