// Multi-node batch normalization (ChainerMN's MultiNodeBatchNormalization / create_mnbn_model):
// batch statistics over the union of every process's batch.
#pragma once

#include <memory>

#include "kusari/functions/normalization.h"
#include "kusari/links/batch_normalization.h"
#include "kusari/mn/communicator.h"

namespace kusari::mn {

/// Sums batch statistics over a communicator (one allreduce per forward and per backward).
class CommunicatorStatisticsReducer : public functions::BatchStatisticsReducer {
 public:
  explicit CommunicatorStatisticsReducer(std::shared_ptr<Communicator> comm);
  void sum(Array& packed) override;

 private:
  std::shared_ptr<Communicator> comm_;
};

/// BatchNormalization whose train-mode statistics (mean, variance, and in backward the sums of
/// gy and gy * x_hat) are computed over all ranks' batches, weighted by their sizes; test mode
/// uses the running statistics as usual. See Note [Multi-node batch statistics].
class MultiNodeBatchNormalization : public links::BatchNormalization {
 public:
  MultiNodeBatchNormalization(int64_t size, std::shared_ptr<Communicator> comm, double decay = 0.9,
                              double eps = 2e-5, Dtype dtype = Dtype::kFloat32, bool use_gamma = true,
                              bool use_beta = true);

 protected:
  const char* type_name() const override { return "MultiNodeBatchNormalization"; }
};

/// Makes every BatchNormalization link of `model` multi-node over `comm`, in place, and returns
/// the model. (ChainerMN returns a modified deep copy; a C++ model holds typed pointers to its
/// links, so kusari changes the links themselves.)
std::shared_ptr<Link> create_mnbn_model(std::shared_ptr<Link> model, std::shared_ptr<Communicator> comm);

}  // namespace kusari::mn
