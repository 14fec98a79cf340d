// Converting a batch of examples into arrays (Chainer's concat_examples).
#pragma once

#include <optional>
#include <vector>

#include "kusari/core/scalar.h"
#include "kusari/datasets/dataset.h"

namespace kusari {

/// Stacks the i-th array of every example into one array with a leading batch axis, on `device`:
/// {x (784,), t ()} x 100 -> {x (100, 784), t (100,)}. All examples must have the same number of
/// arrays; arrays in one position must have the same shape unless `padding` is given, in which
/// case they are padded to the largest shape with that value.
std::vector<Array> concat_examples(const std::vector<Example>& batch, Device device = Device::cpu(),
                                   std::optional<Scalar> padding = std::nullopt);

}  // namespace kusari
