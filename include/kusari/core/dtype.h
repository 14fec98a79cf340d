// Element types of arrays.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "kusari/core/error.h"
#include "kusari/core/half.h"

namespace kusari {

/// The element type of an Array.
enum class Dtype : int8_t {
  kBool,
  kUInt8,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

/// Shorthands so that user code reads like NumPy: `Array::zeros({2, 3}, kusari::float32)`.
inline constexpr Dtype bool_ = Dtype::kBool;
inline constexpr Dtype uint8 = Dtype::kUInt8;
inline constexpr Dtype int32 = Dtype::kInt32;
inline constexpr Dtype int64 = Dtype::kInt64;
inline constexpr Dtype float16 = Dtype::kFloat16;
inline constexpr Dtype bfloat16 = Dtype::kBFloat16;
inline constexpr Dtype float32 = Dtype::kFloat32;
inline constexpr Dtype float64 = Dtype::kFloat64;

/// Size of one element in bytes.
constexpr size_t itemsize(Dtype d) {
  switch (d) {
    case Dtype::kBool:
    case Dtype::kUInt8:
      return 1;
    case Dtype::kFloat16:
    case Dtype::kBFloat16:
      return 2;
    case Dtype::kInt32:
    case Dtype::kFloat32:
      return 4;
    case Dtype::kInt64:
    case Dtype::kFloat64:
      return 8;
  }
  return 0;
}

/// NumPy's name of the dtype ("float32", "bool", ...).
const char* dtype_name(Dtype d);

/// Parses a NumPy dtype name; throws DtypeError listing the valid names.
Dtype dtype_from_name(const std::string& name);

/// True for float16, bfloat16, float32 and float64.
constexpr bool is_floating(Dtype d) {
  return d == Dtype::kFloat16 || d == Dtype::kBFloat16 || d == Dtype::kFloat32 || d == Dtype::kFloat64;
}

/// True for the 16-bit floating dtypes (float16, bfloat16), which mixed precision computes in
/// float32 where rounding matters.
constexpr bool is_half_precision(Dtype d) { return d == Dtype::kFloat16 || d == Dtype::kBFloat16; }

/// True for the integer dtypes and bool.
constexpr bool is_integral(Dtype d) { return !is_floating(d); }

inline std::ostream& operator<<(std::ostream& os, Dtype d) { return os << dtype_name(d); }

/// The dtype of a C++ element type.
template <typename T>
struct DtypeOf;
template <>
struct DtypeOf<bool> {
  static constexpr Dtype value = Dtype::kBool;
};
template <>
struct DtypeOf<uint8_t> {
  static constexpr Dtype value = Dtype::kUInt8;
};
template <>
struct DtypeOf<int32_t> {
  static constexpr Dtype value = Dtype::kInt32;
};
template <>
struct DtypeOf<int64_t> {
  static constexpr Dtype value = Dtype::kInt64;
};
template <>
struct DtypeOf<Half> {
  static constexpr Dtype value = Dtype::kFloat16;
};
template <>
struct DtypeOf<BFloat16> {
  static constexpr Dtype value = Dtype::kBFloat16;
};
template <>
struct DtypeOf<float> {
  static constexpr Dtype value = Dtype::kFloat32;
};
template <>
struct DtypeOf<double> {
  static constexpr Dtype value = Dtype::kFloat64;
};
template <typename T>
inline constexpr Dtype dtype_of = DtypeOf<T>::value;

/// Calls `f(T{})` with T the C++ type of `d`: one switch, then fully typed code.
template <typename F>
decltype(auto) visit_dtype(Dtype d, F&& f) {
  switch (d) {
    case Dtype::kBool:
      return f(bool{});
    case Dtype::kUInt8:
      return f(uint8_t{});
    case Dtype::kInt32:
      return f(int32_t{});
    case Dtype::kInt64:
      return f(int64_t{});
    case Dtype::kFloat16:
      return f(Half{});
    case Dtype::kBFloat16:
      return f(BFloat16{});
    case Dtype::kFloat32:
      return f(float{});
    case Dtype::kFloat64:
      return f(double{});
  }
  KUSARI_THROW(DtypeError, "invalid dtype code ", static_cast<int>(d));
}

/// Like visit_dtype, for floating dtypes only; `fn` names the caller in the error.
template <typename F>
decltype(auto) visit_floating_dtype(Dtype d, const char* fn, F&& f) {
  switch (d) {
    case Dtype::kFloat16:
      return f(Half{});
    case Dtype::kBFloat16:
      return f(BFloat16{});
    case Dtype::kFloat32:
      return f(float{});
    case Dtype::kFloat64:
      return f(double{});
    default:
      break;
  }
  KUSARI_THROW(DtypeError, fn, ": expected a floating-point dtype (float16, bfloat16, float32, float64), got ",
               dtype_name(d));
}

}  // namespace kusari
