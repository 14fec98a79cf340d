// Pieces shared by the multi-process tests (tests/mn): the world's rank and size, and the small
// models and optimizer several test files train.
#pragma once

#include <mpi.h>

#include <memory>

#include "kusari/core/routines.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"
#include "kusari/optimizers/optimizer.h"

namespace kusari::mn::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// Plain SGD through array routines (no fused kernel), lr 0.1.
class Plain : public Optimizer {
 public:
  Plain() { declare_hyperparam("lr", 0.1); }
  const char* type_name() const override { return "Plain"; }

 protected:
  void update_one(ParamState& s) override {
    s.param.set_data(s.param.data() - s.param.grad() * hyperparam("lr"));
  }
};

/// Two lazily sized Linear layers (3 and 2 outputs): their parameters appear at the first
/// forward through each.
class TwoLazyLayers : public Chain {
 public:
  TwoLazyLayers() {
    l1 = add_link("l1", std::make_shared<links::Linear>(3));
    l2 = add_link("l2", std::make_shared<links::Linear>(2));
  }
  std::shared_ptr<links::Linear> l1, l2;
};

}  // namespace kusari::mn::test
