// The one dtype visitor of the backends: a switch on the dtype that calls a typed lambda with
// the element type as the backend stores it (Note [Shared backend code]).
#pragma once

#include <cstdint>

#include "kusari/core/dtype.h"
#include "kusari/core/error.h"

namespace kusari::common {

/// Sets of dtypes a kernel is instantiated for (bit d for Dtype d).
using DtypeSet = uint32_t;
constexpr DtypeSet dtype_bit(Dtype d) { return DtypeSet{1} << static_cast<int>(d); }
inline constexpr DtypeSet kFloatingDtypes = dtype_bit(Dtype::kFloat16) | dtype_bit(Dtype::kBFloat16) |
                                            dtype_bit(Dtype::kFloat32) | dtype_bit(Dtype::kFloat64);
inline constexpr DtypeSet kAllDtypes = dtype_bit(Dtype::kBool) | dtype_bit(Dtype::kUInt8) |
                                       dtype_bit(Dtype::kInt32) | dtype_bit(Dtype::kInt64) | kFloatingDtypes;

/// The storage type of each element type on the host: the type itself. (The CUDA kernels map the
/// 16-bit floats to __half and __nv_bfloat16, Note [Device element types].)
template <typename T>
struct HostStorage {
  using type = T;
};

[[noreturn]] inline void throw_unsupported_dtype(const char* fn, Dtype d, DtypeSet set) {
  if (set == kFloatingDtypes) {
    KUSARI_THROW(DtypeError, fn, ": expected a floating-point dtype (float16, bfloat16, float32, float64), got ",
                 dtype_name(d));
  }
  KUSARI_THROW(DtypeError, fn, ": not supported for dtype ", dtype_name(d));
}

/// Calls f(S{}) with S = Storage<T>::type for T the C++ type of `d`, for the dtypes in `Set`
/// (only those are instantiated); other dtypes throw DtypeError naming `fn`.
template <DtypeSet Set = kAllDtypes, template <typename> class Storage = HostStorage, typename F>
decltype(auto) visit_dtype(Dtype d, const char* fn, F&& f) {
#define KUSARI_VISIT_CASE(code, T)                                                  \
  case code:                                                                        \
    if constexpr ((Set & dtype_bit(code)) != 0) return f(typename Storage<T>::type{}); \
    break;
  switch (d) {
    KUSARI_VISIT_CASE(Dtype::kBool, bool)
    KUSARI_VISIT_CASE(Dtype::kUInt8, uint8_t)
    KUSARI_VISIT_CASE(Dtype::kInt32, int32_t)
    KUSARI_VISIT_CASE(Dtype::kInt64, int64_t)
    KUSARI_VISIT_CASE(Dtype::kFloat16, Half)
    KUSARI_VISIT_CASE(Dtype::kBFloat16, BFloat16)
    KUSARI_VISIT_CASE(Dtype::kFloat32, float)
    KUSARI_VISIT_CASE(Dtype::kFloat64, double)
  }
#undef KUSARI_VISIT_CASE
  throw_unsupported_dtype(fn, d, Set);
}

/// visit_dtype over the floating dtypes.
template <template <typename> class Storage = HostStorage, typename F>
decltype(auto) visit_floating_dtype(Dtype d, const char* fn, F&& f) {
  return visit_dtype<kFloatingDtypes, Storage>(d, fn, static_cast<F&&>(f));
}

}  // namespace kusari::common
