#include "kusari/links/initializers.h"

#include <cmath>

namespace kusari::initializers {

std::pair<int64_t, int64_t> get_fans(const Shape& shape) {
  KUSARI_CHECK(shape.size() >= 2, ShapeError,
               "initializer: fan-in and fan-out need a weight of at least 2 "
               "dimensions, got shape ",
               shape);
  int64_t receptive = 1;
  for (int i = 2; i < shape.size(); ++i) receptive *= shape[i];
  return {shape[1] * receptive, shape[0] * receptive};
}

namespace {

void fill_normal(Array& a, double stddev, Generator& gen) {
  a.assign(Array::normal(a.shape(), 0.0, stddev, a.dtype(), a.device(), &gen));
}

void fill_uniform(Array& a, double bound, Generator& gen) {
  a.assign(Array::uniform(a.shape(), -bound, bound, a.dtype(), a.device(), &gen));
}

}  // namespace

void Constant::operator()(Array& array) const {
  array.fill(value_);
}
void Normal::operator()(Array& a) const {
  fill_normal(a, scale_, generator());
}
void Uniform::operator()(Array& a) const {
  fill_uniform(a, scale_, generator());
}

void LeCunNormal::operator()(Array& a) const {
  auto [fan_in, fan_out] = get_fans(a.shape());
  fill_normal(a, scale_ * std::sqrt(1.0 / static_cast<double>(fan_in)), generator());
}

void GlorotNormal::operator()(Array& a) const {
  auto [fan_in, fan_out] = get_fans(a.shape());
  fill_normal(a, scale_ * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), generator());
}

void HeNormal::operator()(Array& a) const {
  auto [fan_in, fan_out] = get_fans(a.shape());
  fill_normal(a, scale_ * std::sqrt(2.0 / static_cast<double>(fan_in)), generator());
}

void LeCunUniform::operator()(Array& a) const {
  auto [fan_in, fan_out] = get_fans(a.shape());
  fill_uniform(a, scale_ * std::sqrt(3.0 / static_cast<double>(fan_in)), generator());
}

void GlorotUniform::operator()(Array& a) const {
  auto [fan_in, fan_out] = get_fans(a.shape());
  fill_uniform(a, scale_ * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)), generator());
}

void HeUniform::operator()(Array& a) const {
  auto [fan_in, fan_out] = get_fans(a.shape());
  fill_uniform(a, scale_ * std::sqrt(6.0 / static_cast<double>(fan_in)), generator());
}

}  // namespace kusari::initializers
