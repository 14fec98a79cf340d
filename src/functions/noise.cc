#include "kusari/functions/noise.h"

#include "functions/function_util.h"
#include "kusari/core/routines.h"

namespace kusari::functions {

// Note [Dropout mask]
// The mask (uniform >= ratio) / (1 - ratio) is drawn once in the forward and is a constant of the
// graph: the backward is gy * mask, itself a differentiable (linear) function of gy, so dropout can
// be differentiated any number of times. The uniform numbers are drawn in float32 (float64 for
// float64 inputs) so that half-precision rounding cannot bias the keep probability; the generator
// is counter-based, so the same seed gives the same mask on every device.
Variable dropout(const Variable& x, double ratio, Generator* generator) {
  detail::check_floating("dropout", x);
  KUSARI_CHECK(ratio >= 0.0 && ratio < 1.0, ValueError, "dropout: ratio must be in [0, 1), got ",
               ratio);
  if (!is_train_mode() || ratio == 0.0) return x;
  const Dtype udtype = x.dtype() == float64 ? float64 : float32;
  Array u = Array::uniform(x.shape(), 0.0, 1.0, udtype, x.device(),
                           generator != nullptr ? generator : &default_generator());
  Array mask = kusari::greater_equal(u, ratio).astype(x.dtype()) * (1.0 / (1.0 - ratio));
  Array y = kusari::multiply(x.data(), mask);
  return record("dropout", {x}, std::move(y), [mask](BackwardContext& ctx) {
    ctx.set_input_grad(0, mul(ctx.output_grad(), Variable(mask)));
  });
}

}  // namespace kusari::functions
