#include "kusari/functions/evaluation.h"

#include "functions/function_util.h"
#include "kusari/core/routines.h"

namespace kusari::functions {

Variable accuracy(const Variable& y, const Array& t, std::optional<int64_t> ignore_label) {
  const char* fn = "accuracy";
  detail::check_floating(fn, y);
  KUSARI_CHECK(t.dtype() == int32 || t.dtype() == int64, DtypeError, fn,
               ": labels must be int32 or int64, got ", dtype_name(t.dtype()));
  KUSARI_CHECK(y.ndim() >= 2, ShapeError, fn,
               ": y must be at least 2-d (batch, classes, ...), got shape ", y.shape());
  Shape expected = y.shape();
  expected.erase(1);
  KUSARI_CHECK(t.shape() == expected, ShapeError, fn, ": labels of shape ", t.shape(),
               " do not match y of shape ", y.shape(), " (expected ", expected, ")");
  KUSARI_CHECK(t.device() == y.device(), DeviceError, fn, ": y is on ", y.device(),
               " but the labels are on ", t.device());
  Array pred = kusari::argmax(y.data(), 1);
  Array correct = kusari::equal(pred, t.astype(int64));
  // Counts are divided in float64 and only the ratio is rounded, to y's dtype or to float32 for
  // 16-bit y (float16 could not hold counts above 2048 exactly, nor bfloat16 a ratio to better
  // than 0.4%). Everything stays on the device: no host synchronisation.
  Array count, total;
  if (ignore_label) {
    Array valid = kusari::not_equal(t, *ignore_label);
    count = kusari::sum(kusari::logical_and(correct, valid)).astype(float64);
    total = kusari::sum(valid).astype(float64);
  } else {
    count = kusari::sum(correct).astype(float64);
    total = Array::full({}, static_cast<double>(t.size()), float64, y.device());
  }
  Array ratio = kusari::where(kusari::equal(total, 0.0), Scalar(0.0),
                              count / kusari::maximum(total, Scalar(1.0)));
  Array result = ratio.astype(is_half_precision(y.dtype()) ? float32 : y.dtype());
  return Variable(std::move(result));
}

}  // namespace kusari::functions
