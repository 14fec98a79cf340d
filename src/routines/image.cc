#include "routines/image.h"

#include "kernels/image.h"
#include "kusari/core/error.h"
#include "kusari/core/routines.h"
#include "routines/routine_util.h"

namespace kusari::routines {

Array normalize_image_batch(const Array& images, const Array& table, Dtype dtype, bool planar) {
  const char* fn = "normalize_image_batch";
  check_defined(fn, images);
  check_defined(fn, table);
  KUSARI_CHECK(images.dtype() == uint8 && images.ndim() == 4, DtypeError, fn,
               ": expected uint8 images (B, H, W, C), got ", dtype_name(images.dtype()), " ",
               images.shape());
  const int64_t B = images.dim(0), H = images.dim(1), W = images.dim(2), C = images.dim(3);
  KUSARI_CHECK(table.dtype() == float32 && table.shape() == (Shape{C, 256}), ShapeError, fn,
               ": expected a float32 table of shape (", C, ", 256) for ", C,
               "-channel images, got ", dtype_name(table.dtype()), " ", table.shape());
  KUSARI_CHECK(table.device() == images.device(), DeviceError, fn, ": the images are on ",
               images.device(), " but the table is on ", table.device());
  KUSARI_CHECK(is_floating(dtype), DtypeError, fn, ": the output dtype must be floating, got ",
               dtype_name(dtype));
  const Array x = images.contiguous();
  const Array t = table.contiguous();
  Array out = Array::empty(planar ? Shape{B, C, H, W} : Shape{B, H, W, C}, dtype, x.device());
  if (out.size() == 0) return out;
  if (kernels::normalize_image_batch.try_run(x.device(), x, t, planar, out)) return out;
  // The composition: one take from the flattened table at c * 256 + value.
  const Array offsets = Array::arange(0.0, static_cast<double>(256 * C), 256.0, int64, x.device());
  const Array values = take(t.reshape({C * 256}), add(x.astype(int64), offsets), 0);
  const Array laid = planar ? values.transpose({0, 3, 1, 2}) : values;
  return laid.astype(dtype, /*copy=*/true).contiguous();
}

}  // namespace kusari::routines
