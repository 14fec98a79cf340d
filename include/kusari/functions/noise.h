// Functions that inject noise during training (Chainer's F.noise family).
#pragma once

#include "kusari/autograd/function_node.h"
#include "kusari/autograd/variable.h"
#include "kusari/core/random.h"

namespace kusari::functions {

/// In train mode (is_train_mode()), zeroes each element with probability `ratio` and scales the
/// rest by 1 / (1 - ratio); in test mode, or when ratio is 0, returns x itself. `ratio` must lie
/// in [0, 1). The mask is drawn from `generator` (default_generator() when null) on x's device.
Variable dropout(const Variable& x, double ratio = 0.5, Generator* generator = nullptr);

}  // namespace kusari::functions
