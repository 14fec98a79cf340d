#include "kusari/training/summary.h"

#include <algorithm>

#include <cmath>
#include <nlohmann/json.hpp>
#include <vector>

#include "kusari/core/routines.h"

namespace kusari::training {

void Summary::add(const Array& value, double weight) {
  KUSARI_CHECK(value.defined(), ValueError, "Summary::add: the value is an undefined array");
  KUSARI_CHECK(value.size() == 1, ShapeError,
               "Summary::add: a summarised value must be a scalar, got shape ", value.shape());
  if (value.device().is_cpu()) {
    add(value.item<double>(), weight);
    return;
  }
  // See Note [Summaries on the device]: keep the sums on the value's device.
  if (device_x_.defined() && device_x_.device() != value.device()) fold_to_host();
  Array v = value.reshape({}).astype(Dtype::kFloat64, /*copy=*/true);
  Array wv = weight == 1.0 ? v : v * weight;
  Array wv2 = wv * v;
  if (device_x_.defined()) {
    device_x_ = device_x_ + wv;
    device_x2_ = device_x2_ + wv2;
  } else {
    device_x_ = wv;
    device_x2_ = wv2;
  }
  n_ += weight;
}

void Summary::add(double value, double weight) {
  x_ += weight * value;
  x2_ += weight * value * value;
  n_ += weight;
}

void Summary::fold_to_host() const {
  if (!device_x_.defined()) return;
  x_ += device_x_.item<double>();
  x2_ += device_x2_.item<double>();
  device_x_ = Array();
  device_x2_ = Array();
}

double Summary::sum() const {
  fold_to_host();
  return x_;
}

double Summary::sum_of_squares() const {
  fold_to_host();
  return x2_;
}

void Summary::set_raw(double sum, double sum_of_squares, double weight) {
  device_x_ = Array();
  device_x2_ = Array();
  x_ = sum;
  x2_ = sum_of_squares;
  n_ = weight;
}

double Summary::compute_mean() const {
  KUSARI_CHECK(n_ != 0.0, ValueError,
               "Summary::compute_mean: no values have been added (total weight is 0)");
  fold_to_host();
  return x_ / n_;
}

std::pair<double, double> Summary::make_statistics() const {
  const double mean = compute_mean();
  // Rounding can make the variance of equal values slightly negative.
  const double var = std::max(x2_ / n_ - mean * mean, 0.0);
  return {mean, std::sqrt(var)};
}

void Summary::serialize(Serializer& s) {
  fold_to_host();
  s("_x", x_);
  s("_x2", x2_);
  s("_n", n_);
}

void DictSummary::add(const Observation& observation, double weight) {
  for (const auto& [key, value] : observation) {
    // Chainer summarises scalars only and silently skips other reported values.
    if (!value.defined() || value.size() != 1 || value.ndim() > 1) continue;
    summary_of(key).add(value, weight);
  }
}

Summary& DictSummary::summary_of(const std::string& key) {
  auto it = summaries_.find(key);
  if (it != summaries_.end()) return it->second;
  order_.push_back(key);
  return summaries_[key];
}

std::vector<std::string> DictSummary::keys() const {
  std::vector<std::string> keys;
  for (const std::string& key : order_)
    if (summaries_.count(key)) keys.push_back(key);
  for (const auto& [key, summary] : summaries_)
    if (std::find(order_.begin(), order_.end(), key) == order_.end()) keys.push_back(key);
  return keys;
}

void DictSummary::add(const std::string& key, const Array& value, double weight) {
  summary_of(key).add(value, weight);
}

void DictSummary::add(const std::string& key, double value, double weight) {
  summary_of(key).add(value, weight);
}

std::map<std::string, double> DictSummary::compute_mean() const {
  std::map<std::string, double> means;
  for (const auto& [key, summary] : summaries_) means[key] = summary.compute_mean();
  return means;
}

std::map<std::string, double> DictSummary::make_statistics() const {
  std::map<std::string, double> stats;
  for (const auto& [key, summary] : summaries_) {
    auto [mean, std] = summary.make_statistics();
    stats[key] = mean;
    stats[key + ".std"] = std;
  }
  return stats;
}

void DictSummary::serialize(Serializer& s) {
  if (!s.is_loading()) {
    const std::vector<std::string> names = keys();  // Chainer's _names: the dict's order
    std::string text = nlohmann::json(names).dump();
    s("_names", text);
    auto children = s.child("_summaries");
    for (size_t i = 0; i < names.size(); ++i)
      summaries_[names[i]].serialize(*children->child(std::to_string(i)));
    return;
  }
  clear();
  std::string text;
  s("_names", text);
  nlohmann::json names = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  KUSARI_CHECK(names.is_array(), IOError, "DictSummary::serialize: '", s.path(),
               "_names' is not a JSON list of keys: ", text);
  auto children = s.child("_summaries");
  for (size_t i = 0; i < names.size(); ++i) {
    KUSARI_CHECK(names[i].is_string(), IOError, "DictSummary::serialize: '", s.path(),
                 "_names' holds a non-string: ", text);
    summary_of(names[i].get<std::string>()).serialize(*children->child(std::to_string(i)));
  }
}

}  // namespace kusari::training
