#include "kusari/training/extensions/evaluator.h"

#include "kusari/autograd/mode.h"
#include "kusari/core/reporter.h"
#include "kusari/datasets/convert.h"

namespace kusari::training::extensions {

namespace {

void check_not_repeating(const Iterator& it) {
  KUSARI_CHECK(!it.repeat(), ValueError,
               "Evaluator: the iterator repeats (repeat() is true), so an evaluation would never "
               "end; create the "
               "evaluation iterator with repeat=false");
}

}  // namespace

Evaluator::Evaluator(std::shared_ptr<Iterator> iterator, std::shared_ptr<Link> target,
                     Converter converter, Device device, EvalFunction eval_func)
    : iterator_(std::move(iterator)),
      target_(std::move(target)),
      converter_(std::move(converter)),
      device_(device),
      eval_func_(std::move(eval_func)) {
  KUSARI_CHECK(iterator_, ValueError, "Evaluator: the iterator is null");
  KUSARI_CHECK(target_, ValueError, "Evaluator: the target link is null");
  check_not_repeating(*iterator_);
  if (!converter_) {
    converter_ = [](const std::vector<Example>& batch, Device d) {
      return concat_examples(batch, d);
    };
  }
}

void Evaluator::operator()(Trainer&) {
  evaluate();
}

void Evaluator::evaluate_batch(const std::vector<Example>& batch) {
  std::vector<Array> arrays = converter_(batch, device_);
  std::vector<Variable> inputs(arrays.begin(), arrays.end());
  if (eval_func_) {
    eval_func_(inputs);
  } else {
    target_->forward_batch(inputs);
  }
}

DictSummary Evaluator::evaluate_summary() {
  check_not_repeating(*iterator_);
  const std::string prefix = name().empty() ? "main" : name() + "/main";
  Reporter reporter;
  reporter.add_observer(prefix, target_.get());
  std::vector<std::pair<std::string, const void*>> links;
  for (auto& [path, link] : target_->namedlinks(/*skipself=*/true)) links.emplace_back(path, link);
  reporter.add_observers(prefix, links);

  NoBackpropMode no_backprop;
  TrainMode test_mode(false);
  iterator_->reset();
  DictSummary summary;
  for (;;) {
    std::vector<Example> batch = iterator_->next();
    if (batch.empty()) break;
    Observation observation;
    {
      ReporterScope scope(reporter, observation);
      evaluate_batch(batch);
    }
    // See Note [Evaluator weighting].
    summary.add(observation, static_cast<double>(batch.size()));
  }
  return summary;
}

std::map<std::string, double> Evaluator::evaluate() {
  const DictSummary summary = evaluate_summary();
  std::map<std::string, double> means = summary.compute_mean();
  // Reported in the order the model reported them (validation/main/loss before .../accuracy).
  Observation values;
  for (const std::string& key : summary.keys())
    values[key] = Array::full({}, means.at(key), Dtype::kFloat64, Device::cpu());
  report(values);
  return means;
}

}  // namespace kusari::training::extensions
