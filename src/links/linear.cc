#include "kusari/links/linear.h"

#include <algorithm>

#include "kusari/functions/connection.h"

namespace kusari::links {

Linear::Linear(std::optional<int64_t> in_size, int64_t out_size, bool nobias,
               std::shared_ptr<Initializer> initialW, std::shared_ptr<Initializer> initial_bias)
    : out_size_(out_size) {
  KUSARI_CHECK(out_size > 0, ValueError, "Linear: out_size must be positive, got ", out_size);
  KUSARI_CHECK(!in_size || *in_size > 0, ValueError, "Linear: in_size must be positive, got ",
               *in_size);
  if (!initialW) initialW = std::make_shared<initializers::LeCunNormal>();
  std::optional<Shape> wshape;
  if (in_size) wshape = Shape{out_size, *in_size};
  W = add_param("W", Parameter(initialW, wshape, device()));
  if (!nobias) {
    if (!initial_bias) initial_bias = std::make_shared<initializers::Zero>(initialW->dtype());
    b = add_param("b", Parameter(initial_bias, Shape{out_size}, device()));
  }
}

Variable Linear::forward(const Variable& x) { return forward(x, 1); }

Variable Linear::forward(const Variable& x, int n_batch_axes) {
  KUSARI_CHECK(n_batch_axes >= 1 && n_batch_axes < std::max(x.ndim(), 2), ValueError,
               "Linear: n_batch_axes must leave at least one feature axis of the input of shape ", x.shape(),
               ", got ", n_batch_axes);
  int64_t batch = 1;
  for (int d = 0; d < std::min(n_batch_axes, x.ndim()); ++d) batch *= x.shape()[d];
  if (!W.is_initialized()) {
    KUSARI_CHECK(batch > 0, ShapeError, "Linear: cannot infer in_size from input of shape ", x.shape());
    W.initialize({out_size_, x.size() / batch});
  }
  const int64_t features = batch > 0 ? x.size() / batch : 0;
  KUSARI_CHECK(W.ndim() != 2 || batch == 0 || W.shape()[1] == features, ShapeError,
               "Linear: the input has ", features, " features per example (shape ", x.shape(),
               ") but W of shape ", W.shape(), W.shape_origin(), " expects ", W.shape()[1]);
  return functions::linear(x, W, b.defined() ? Variable(b) : Variable(), n_batch_axes);
}

}  // namespace kusari::links
