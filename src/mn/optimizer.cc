#include "kusari/mn/optimizer.h"

#include <algorithm>

namespace kusari::mn {

MultiNodeOptimizer::MultiNodeOptimizer(std::shared_ptr<Optimizer> actual, std::shared_ptr<Communicator> comm,
                                       bool zero_fill)
    : actual_(std::move(actual)), comm_(std::move(comm)), zero_fill_(zero_fill) {
  KUSARI_CHECK(actual_, ValueError, "create_multi_node_optimizer: the optimizer is null");
  KUSARI_CHECK(comm_, ValueError, "create_multi_node_optimizer: the communicator is null");
  if (actual_->target()) target_ = actual_->target_ptr();
}

void MultiNodeOptimizer::setup(std::shared_ptr<Link> target) {
  actual_->setup(target);
  target_ = std::move(target);
  first_ = true;
  last_params_.clear();
}

bool MultiNodeOptimizer::parameters_changed() {
  KUSARI_CHECK(target_, ValueError, "MultiNodeOptimizer: call setup(model) before update");
  std::vector<std::pair<std::string, bool>> now;
  for (auto& [path, p] : target_->namedparams(true)) now.emplace_back(path, p.is_initialized());
  std::sort(now.begin(), now.end());
  const bool changed = first_ || now != last_params_;
  first_ = false;
  last_params_ = std::move(now);
  return changed;
}

void MultiNodeOptimizer::mark_parameters_synchronized() {
  parameters_changed();  // remembers the current parameter set and clears first_
}

void MultiNodeOptimizer::step_after_backward() {
  if (parameters_changed()) {
    comm_->bcast_data(*target_);
    return;
  }
  comm_->multi_node_mean_grad(*target_, zero_fill_);
  actual_->update();
}

void MultiNodeOptimizer::update() { step_after_backward(); }

void MultiNodeOptimizer::update(const std::function<Variable()>& lossfun) {
  KUSARI_CHECK(target_, ValueError, "MultiNodeOptimizer: call setup(model) before update");
  Variable loss = lossfun();
  target_->cleargrads();
  BackwardOptions options;
  if (actual_->loss_scale() != 1.0) options.loss_scale = actual_->loss_scale();
  loss.backward(options);
  loss = Variable();
  step_after_backward();
}

void MultiNodeOptimizer::add_hook(std::shared_ptr<OptimizerHook> hook, const std::string& name) {
  actual_->add_hook(std::move(hook), name);
}
void MultiNodeOptimizer::remove_hook(const std::string& name) { actual_->remove_hook(name); }
void MultiNodeOptimizer::new_epoch() { actual_->new_epoch(); }
double& MultiNodeOptimizer::hyperparam(const std::string& name) { return actual_->hyperparam(name); }
bool MultiNodeOptimizer::has_hyperparam(const std::string& name) const { return actual_->has_hyperparam(name); }
double MultiNodeOptimizer::lr() const { return actual_->lr(); }
std::vector<ParamState>& MultiNodeOptimizer::param_states() { return actual_->param_states(); }
void MultiNodeOptimizer::serialize(Serializer& s) { actual_->serialize(s); }

std::shared_ptr<Optimizer> create_multi_node_optimizer(std::shared_ptr<Optimizer> actual,
                                                       std::shared_ptr<Communicator> comm, bool double_buffering,
                                                       bool zero_fill) {
  KUSARI_CHECK(!double_buffering, NotImplementedError,
               "create_multi_node_optimizer: double_buffering needs an NCCL communicator (pure_nccl); '",
               comm ? comm->name() : "null", "' does not support it");
  return std::make_shared<MultiNodeOptimizer>(std::move(actual), std::move(comm), zero_fill);
}

}  // namespace kusari::mn
