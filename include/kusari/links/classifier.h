// A classifier wrapper (Chainer's L.Classifier): predictor + loss + accuracy, reported.
#pragma once

#include <functional>
#include <memory>

#include "kusari/links/link.h"

namespace kusari::links {

/// Wraps a predictor link. forward_batch({x, t}) computes y = predictor(x), the loss
/// lossfun(y, t) and, when compute_accuracy, accfun(y, t); it reports "loss" and "accuracy"
/// (as "main/loss", "main/accuracy" in a trainer) and returns the loss.
class Classifier : public Chain {
 public:
  using LossFunction = std::function<Variable(const Variable& y, const Array& t)>;
  using AccuracyFunction = std::function<Variable(const Variable& y, const Array& t)>;

  /// Defaults: softmax_cross_entropy and accuracy.
  explicit Classifier(std::shared_ptr<Link> predictor, LossFunction lossfun = nullptr,
                      AccuracyFunction accfun = nullptr);

  /// batch = {x, t}: the label is the last array, the predictor gets the first.
  Variable forward_batch(const std::vector<Variable>& batch) override;
  /// The loss for inputs x and labels t.
  Variable operator()(const Variable& x, const Array& t);

  Link& predictor() { return *predictor_; }
  const std::shared_ptr<Link>& predictor_ptr() const { return predictor_; }
  bool compute_accuracy = true;
  /// The last forward's prediction, loss and accuracy.
  Variable y, loss, accuracy;

 protected:
  const char* type_name() const override { return "Classifier"; }

 private:
  std::shared_ptr<Link> predictor_;
  LossFunction lossfun_;
  AccuracyFunction accfun_;
};

}  // namespace kusari::links
