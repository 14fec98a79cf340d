#include "kusari/mn/batch_normalization.h"

namespace kusari::mn {

CommunicatorStatisticsReducer::CommunicatorStatisticsReducer(std::shared_ptr<Communicator> comm)
    : comm_(std::move(comm)) {
  KUSARI_CHECK(comm_, ValueError, "MultiNodeBatchNormalization: the communicator is null");
}

void CommunicatorStatisticsReducer::sum(Array& packed) {
  Array c = packed.contiguous();
  comm_->allreduce_inplace(c, ReduceOp::kSum);
  packed = c;
}

MultiNodeBatchNormalization::MultiNodeBatchNormalization(int64_t size, std::shared_ptr<Communicator> comm,
                                                         double decay, double eps, Dtype dtype, bool use_gamma,
                                                         bool use_beta)
    : links::BatchNormalization(size, decay, eps, dtype, use_gamma, use_beta) {
  set_statistics_reducer(std::make_shared<CommunicatorStatisticsReducer>(std::move(comm)));
}

std::shared_ptr<Link> create_mnbn_model(std::shared_ptr<Link> model, std::shared_ptr<Communicator> comm) {
  KUSARI_CHECK(model, ValueError, "create_mnbn_model: the model is null");
  auto reducer = std::make_shared<CommunicatorStatisticsReducer>(std::move(comm));
  for (auto& [path, link] : model->namedlinks()) {
    if (auto* bn = dynamic_cast<links::BatchNormalization*>(link)) bn->set_statistics_reducer(reducer);
  }
  return model;
}

}  // namespace kusari::mn
