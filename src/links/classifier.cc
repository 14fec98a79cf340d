#include "kusari/links/classifier.h"

#include "kusari/core/reporter.h"
#include "kusari/functions/evaluation.h"
#include "kusari/functions/loss.h"

namespace kusari::links {

Classifier::Classifier(std::shared_ptr<Link> predictor, LossFunction lossfun,
                       AccuracyFunction accfun)
    : predictor_(std::move(predictor)), lossfun_(std::move(lossfun)), accfun_(std::move(accfun)) {
  KUSARI_CHECK(predictor_, ValueError, "Classifier: the predictor is null");
  add_link("predictor", predictor_);
  if (!lossfun_) {
    lossfun_ = [](const Variable& y, const Array& t) {
      return functions::softmax_cross_entropy(y, t);
    };
  }
  if (!accfun_) {
    accfun_ = [](const Variable& y, const Array& t) { return functions::accuracy(y, t); };
  }
}

Variable Classifier::operator()(const Variable& x, const Array& t) {
  y = predictor_->forward(x);
  loss = lossfun_(y, t);
  Observation values{{"loss", loss.data()}};  // loss, then accuracy: Chainer's order
  if (compute_accuracy) {
    accuracy = accfun_(y, t);
    values["accuracy"] = accuracy.data();
  }
  report(values, static_cast<const Link*>(this));
  return loss;
}

Variable Classifier::forward_batch(const std::vector<Variable>& batch) {
  KUSARI_CHECK(batch.size() == 2, ValueError, "Classifier: expected a batch of (x, t), got ",
               batch.size(), " arrays");
  return (*this)(batch[0], batch[1].data());
}

}  // namespace kusari::links
