#include "kusari/functions/activation.h"

#include "functions/function_util.h"
#include "kusari/core/routines.h"

namespace kusari::functions {

Variable relu(const Variable& x) {
  detail::check_floating("relu", x);
  return record(
      "relu", {x}, kusari::relu(x.data()),
      [](BackwardContext& ctx) {
        ctx.set_input_grad(0, detail::masked(ctx.output_grad(), kusari::greater(ctx.output().data(), 0.0)));
      },
      kRetainOutput);
}

}  // namespace kusari::functions
