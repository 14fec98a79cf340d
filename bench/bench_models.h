// Models shared by the benchmark programs.
#pragma once

#include <memory>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"

namespace kusari::bench {

/// The MNIST MLP every benchmark uses: 784 -> 1000 -> 1000 -> 10 with ReLU (as PyTorch's peers).
class MnistMLP : public Chain {
 public:
  MnistMLP() {
    l1 = add_link("l1", std::make_shared<links::Linear>(784, 1000));
    l2 = add_link("l2", std::make_shared<links::Linear>(1000, 1000));
    l3 = add_link("l3", std::make_shared<links::Linear>(1000, 10));
  }
  Variable forward(const Variable& x) override {
    return (*l3)(functions::relu((*l2)(functions::relu((*l1)(x)))));
  }
  std::shared_ptr<links::Linear> l1, l2, l3;
};

}  // namespace kusari::bench
