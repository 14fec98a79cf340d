#include "kusari/training/updater.h"

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

void StandardUpdater::update_core() {
  std::vector<Example> batch = iterator_->next();
  KUSARI_CHECK(!batch.empty(), ValueError,
               "StandardUpdater: the iterator has no more batches (a training iterator needs repeat=true)");
  std::vector<Array> arrays = converter_(batch, device_);
  std::vector<Variable> inputs(arrays.begin(), arrays.end());
  Link* target = optimizer_->target();
  optimizer_->update([&]() { return loss_func_ ? loss_func_(inputs) : target->forward_batch(inputs); });
  if (iterator_->is_new_epoch()) optimizer_->new_epoch();
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
  s("iteration", iteration_);
}

}  // namespace kusari::training
