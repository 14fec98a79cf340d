#include "kusari/training/updater.h"

#include "kusari/core/cuda.h"
#include "kusari/core/reporter.h"
#include "kusari/datasets/convert.h"

namespace kusari::training {

StandardUpdater::StandardUpdater(std::shared_ptr<Iterator> iterator, std::shared_ptr<Optimizer> optimizer,
                                 Device device, Converter converter, LossFunction loss_func)
    : iterator_(std::move(iterator)),
      optimizer_(std::move(optimizer)),
      device_(device),
      converter_(std::move(converter)),
      loss_func_(std::move(loss_func)) {
  KUSARI_CHECK(iterator_, ValueError, "StandardUpdater: the iterator is null");
  KUSARI_CHECK(optimizer_, ValueError, "StandardUpdater: the optimizer is null");
  KUSARI_CHECK(optimizer_->target(), ValueError,
               "StandardUpdater: the optimizer has no target; call optimizer->setup(model) first");
  if (!converter_) {
    converter_ = [](const std::vector<Example>& batch, Device d) { return concat_examples(batch, d); };
  }
}

void StandardUpdater::update() {
  update_core();
  ++iteration_;
}

StandardUpdater::~StandardUpdater() = default;

void StandardUpdater::update_core() {
  if (accumulation_steps_ > 1) {
    Link* target = optimizer_->target();
    optimizer_->update_accumulated(accumulation_steps_, [&](int64_t) {
      std::vector<Example> batch = iterator_->next();
      KUSARI_CHECK(!batch.empty(), ValueError,
                   "StandardUpdater: the iterator has no more batches (a training iterator needs repeat=true)");
      if (iterator_->is_new_epoch()) optimizer_->new_epoch();
      std::vector<Array> arrays = converter_(batch, device_);
      std::vector<Variable> inputs(arrays.begin(), arrays.end());
      return loss_func_ ? loss_func_(inputs) : target->forward_batch(inputs);
    });
    return;
  }
  std::vector<Example> batch = iterator_->next();
  KUSARI_CHECK(!batch.empty(), ValueError,
               "StandardUpdater: the iterator has no more batches (a training iterator needs repeat=true)");
  std::vector<Array> arrays = converter_(batch, device_);
  if (use_cuda_graph_) {
    graph_step(arrays);
  } else {
    eager_step(arrays);
  }
  if (iterator_->is_new_epoch()) optimizer_->new_epoch();
}

void StandardUpdater::eager_step(const std::vector<Array>& arrays) {
  std::vector<Variable> inputs(arrays.begin(), arrays.end());
  Link* target = optimizer_->target();
  optimizer_->update([&]() { return loss_func_ ? loss_func_(inputs) : target->forward_batch(inputs); });
}

void StandardUpdater::set_accumulation_steps(int64_t steps) {
  KUSARI_CHECK(steps >= 1, ValueError, "StandardUpdater::set_accumulation_steps: steps must be positive, got ", steps);
  KUSARI_CHECK(steps == 1 || !use_cuda_graph_, ValueError, "StandardUpdater::set_accumulation_steps: gradient "
               "accumulation cannot be replayed as a CUDA graph; turn set_use_cuda_graph off first");
  accumulation_steps_ = steps;
}

void StandardUpdater::set_use_cuda_graph(bool use) {
  KUSARI_CHECK(!use || device_.is_cuda(), ValueError, "StandardUpdater::set_use_cuda_graph: the updater's device is ",
               device_, "; CUDA graphs record GPU work (give the updater a CUDA device)");
  KUSARI_CHECK(!use || accumulation_steps_ == 1, ValueError, "StandardUpdater::set_use_cuda_graph: gradient "
               "accumulation (", accumulation_steps_, " steps) cannot be replayed as a CUDA graph");
  use_cuda_graph_ = use;
  if (!use) recorded_.clear();
}

// Note [Graph steps in the updater]
// A recording is keyed by what the host froze into it: the shapes and dtypes of the converted
// batch and the loss scale (backward's initial gradient is a kernel argument). For a new key the
// step runs eagerly first (so lazy parameters, optimizer state and library handles exist), then
// forward and backward are recorded with arrays of their own as inputs. What the recording
// leaves behind is kept with it:
//   - the inputs, which later batches are assign()ed into;
//   - the gradient Variables backward gave the parameters (undefined for those it did not reach):
//     each replay rewrites their arrays, and they are put back on the parameters after the
//     replay, since an eager step or a replay of another recording in between gave the
//     parameters other gradients;
//   - what the model reported while recording (reported into an observation of its own, under
//     the same observer names): after each replay, copies of those arrays go into the current
//     observation, so every iteration's summary gets its own values.
// The optimizer's update runs eagerly after the replay: its hyperparameters change from step to
// step (Adam's bias correction, schedules), which a recording would freeze.
struct StandardUpdater::RecordedStep {
  std::vector<Shape> shapes;
  std::vector<Dtype> dtypes;
  double loss_scale = 1.0;
  std::vector<Array> inputs;
  std::vector<std::pair<Parameter, Variable>> grads;
  Observation reported;
  cuda::Graph graph;

  bool matches(const std::vector<Array>& arrays, double scale) const {
    if (arrays.size() != shapes.size() || scale != loss_scale) return false;
    for (size_t i = 0; i < arrays.size(); ++i) {
      if (arrays[i].shape() != shapes[i] || arrays[i].dtype() != dtypes[i]) return false;
    }
    return true;
  }
};

void StandardUpdater::graph_step(const std::vector<Array>& arrays) {
  const double scale = optimizer_->loss_scale();
  for (auto& step : recorded_) {
    if (!step->matches(arrays, scale)) continue;
    for (size_t i = 0; i < arrays.size(); ++i) {
      KUSARI_CHECK(arrays[i].device() == device_, DeviceError, "StandardUpdater: the converter put input ", i,
                   " on ", arrays[i].device(), " but the updater's device is ", device_);
      step->inputs[i].assign(arrays[i]);
    }
    step->graph.replay();
    for (auto& [param, grad] : step->grads) param.set_grad_var(grad);
    if (Reporter* reporter = current_reporter(); reporter && reporter->observation()) {
      for (const auto& [key, value] : step->reported) (*reporter->observation())[key] = value.copy();
    }
    optimizer_->update();
    ++graph_replays_;
    return;
  }
  eager_step(arrays);
  // Record this key for the next steps (the loss scale may have changed in the update).
  auto step = std::make_unique<RecordedStep>();
  step->loss_scale = optimizer_->loss_scale();
  for (const Array& a : arrays) {
    step->shapes.push_back(a.shape());
    step->dtypes.push_back(a.dtype());
    step->inputs.push_back(a.copy());
  }
  Link* target = optimizer_->target();
  // Without a trainer (an updater driven by hand) the recording reports into a reporter of its
  // own, which knows the model and its links as the trainer's would ("main/...").
  Reporter scratch_reporter;
  scratch_reporter.add_observer("main", target);
  std::vector<std::pair<std::string, const void*>> links;
  for (auto& [path, link] : target->namedlinks(true)) links.emplace_back(path, link);
  scratch_reporter.add_observers("main", links);
  Reporter* reporter = current_reporter();
  Reporter& recording_reporter = reporter ? *reporter : scratch_reporter;
  {
    ReporterScope scope(recording_reporter, step->reported);
    std::vector<Variable> inputs(step->inputs.begin(), step->inputs.end());
    step->graph.capture(device_, [&] {
      Variable loss = loss_func_ ? loss_func_(inputs) : target->forward_batch(inputs);
      target->cleargrads();
      BackwardOptions options;
      if (step->loss_scale != 1.0) options.loss_scale = step->loss_scale;
      options.retain_graph = false;  // Note [Freeing the graph during backward]
      loss.backward(options);
    });
  }
  for (auto& [path, param] : target->namedparams()) step->grads.emplace_back(param, param.grad_var());
  // The recording's gradients hold no values until a replay: the next step replays them.
  if (recorded_.size() == 4) recorded_.erase(recorded_.begin());
  recorded_.push_back(std::move(step));
}

Optimizer& StandardUpdater::optimizer(const std::string& name) {
  KUSARI_CHECK(name == "main", ValueError, "StandardUpdater: no optimizer named '", name, "' (it has 'main')");
  return *optimizer_;
}

Iterator& StandardUpdater::iterator(const std::string& name) {
  KUSARI_CHECK(name == "main", ValueError, "StandardUpdater: no iterator named '", name, "' (it has 'main')");
  return *iterator_;
}

void StandardUpdater::serialize(Serializer& s) {
  iterator_->serialize(*s.child("iterator:main"));
  optimizer_->serialize(*s.child("optimizer:main"));
  optimizer_->target()->serialize(*s.child("model:main"));
  s.count("iteration", iteration_);
}

}  // namespace kusari::training
