// Weighted running means of reported values (Chainer's reporter.Summary and DictSummary):
// LogReport, PlotReport and Evaluator summarise observations with them.
//
//   DictSummary s;
//   s.add(observation);             // {"main/loss": 0-d array, ...}, weight 1
//   s.add(batch_observation, 32);   // weighted, e.g. by batch size
//   std::map<std::string, double> means = s.compute_mean();
#pragma once

#include <map>
#include <string>
#include <utility>

#include "kusari/core/array.h"
#include "kusari/core/reporter.h"
#include "kusari/serializers/serializer.h"

namespace kusari::training {

/// The weighted sum, sum of squares and total weight of a stream of scalar values.
///
/// Note [Summaries on the device]
/// Reported values are 0-d arrays that may live on a GPU. Reading each one on the host would
/// wait for the GPU once per value per iteration. A Summary instead adds values of a device
/// array into float64 0-d arrays on that device (queued kernels, no wait) and copies the sums
/// to the host once, when a mean is asked for (fold_to_host). CPU values are added on the host
/// directly. If a value arrives on another device than the running device sums, those sums
/// are folded first, so mixing devices is allowed, only slower.
class Summary : public Serializable {
 public:
  /// Adds a scalar (a 1-element array, any dtype and device) with `weight`.
  void add(const Array& value, double weight = 1.0);
  /// Adds a host value with `weight`.
  void add(double value, double weight = 1.0);

  /// sum(w x) / sum(w) (ValueError when nothing has been added or the total weight is 0).
  double compute_mean() const;
  /// (mean, standard deviation), the deviation from sum(w x^2) / sum(w) - mean^2.
  std::pair<double, double> make_statistics() const;

  /// The raw sum of weight * value (for a multi-node allreduce before dividing).
  double sum() const;
  /// The raw sum of weight * value^2.
  double sum_of_squares() const;
  /// The total weight (number of values when every weight is 1).
  double weight() const { return n_; }
  /// Replaces the raw sums, e.g. with their allreduced totals.
  void set_raw(double sum, double sum_of_squares, double weight);

  /// Copies device sums to the host now (compute_mean and the raw accessors do it on demand).
  void fold_to_host() const;

  /// Saves or loads "_x", "_x2" and "_n" (Chainer's layout).
  void serialize(Serializer& serializer) override;

 private:
  mutable double x_ = 0.0;
  mutable double x2_ = 0.0;
  double n_ = 0.0;
  // Pending sums of device values (float64, 0-d, on that device); undefined when none.
  mutable Array device_x_;
  mutable Array device_x2_;
};

/// Summaries by key: add() takes a whole observation ("main/loss" -> 0-d array, ...).
class DictSummary : public Serializable {
 public:
  /// Adds every scalar of `observation` with `weight`. Like Chainer, values that are not 0-d
  /// (or 1-element) arrays are ignored.
  void add(const Observation& observation, double weight = 1.0);
  /// Adds one value under `key`.
  void add(const std::string& key, const Array& value, double weight = 1.0);
  /// Adds one host value under `key`.
  void add(const std::string& key, double value, double weight = 1.0);

  /// The mean of every key.
  std::map<std::string, double> compute_mean() const;
  /// Every key's mean, and its standard deviation under "<key>.std" (Chainer's make_statistics).
  std::map<std::string, double> make_statistics() const;

  /// The keys in the order they were first added (Observation's order), then any key added
  /// through summaries() only, in key order.
  std::vector<std::string> keys() const;

  /// The per-key summaries (their raw sums and weights), e.g. for a multi-node allreduce.
  std::map<std::string, Summary>& summaries() { return summaries_; }
  /// Read-only view of the per-key summaries.
  const std::map<std::string, Summary>& summaries() const { return summaries_; }
  /// True when no key has been added.
  bool empty() const { return summaries_.empty(); }
  /// Forgets every key.
  void clear() {
    summaries_.clear();
    order_.clear();
  }

  /// Saves or loads "_names" (a JSON list of the keys) and "_summaries/<i>/..." (Chainer's
  /// layout). Loading replaces the current contents.
  void serialize(Serializer& serializer) override;

 private:
  Summary& summary_of(const std::string& key);

  std::map<std::string, Summary> summaries_;
  std::vector<std::string> order_;  // keys in the order first added
};

}  // namespace kusari::training
