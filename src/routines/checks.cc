#include "kusari/core/routines.h"

#include <cmath>

#include "routines/routine_util.h"

namespace kusari {

// --- argument checks (public helpers of routines.h) ------------------------------------------

void check_same_device(const char* fn, std::initializer_list<const Array*> arrays) {
  const Array* first = nullptr;
  for (const Array* a : arrays) {
    if (!a->defined()) continue;
    if (!first) {
      first = a;
      continue;
    }
    KUSARI_CHECK(a->device() == first->device(), DeviceError, fn, ": arrays are on different devices (",
                 first->device(), " and ", a->device(), "); move them with to_device() first");
  }
}

void check_same_dtype(const char* fn, std::initializer_list<const Array*> arrays) {
  const Array* first = nullptr;
  for (const Array* a : arrays) {
    if (!a->defined()) continue;
    if (!first) {
      first = a;
      continue;
    }
    KUSARI_CHECK(a->dtype() == first->dtype(), DtypeError, fn, ": dtypes differ (", dtype_name(first->dtype()),
                 " and ", dtype_name(a->dtype()), "); convert one with astype()");
  }
}

void check_floating(const char* fn, const Array& x) {
  KUSARI_CHECK(is_floating(x.dtype()), DtypeError, fn, ": expected a floating-point array, got ",
               dtype_name(x.dtype()));
}


// --- comparisons ---------------------------------------------------------------------------------

bool allclose(const Array& a, const Array& b, double rtol, double atol, bool equal_nan) {
  Shape s = broadcast_shapes(a.shape(), b.shape(), "allclose");
  std::vector<double> va = a.broadcast_to(s).to_vector<double>();
  std::vector<double> vb = b.broadcast_to(s).to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) {
    const double x = va[i], y = vb[i];
    if (std::isnan(x) || std::isnan(y)) {
      if (equal_nan && std::isnan(x) && std::isnan(y)) continue;
      return false;
    }
    if (x == y) continue;
    if (!(std::abs(x - y) <= atol + rtol * std::abs(y))) return false;
  }
  return true;
}

bool array_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) return false;
  return a.to_vector<double>() == b.to_vector<double>();
}

}  // namespace kusari
