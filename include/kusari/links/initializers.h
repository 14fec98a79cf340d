// Parameter initializers (Chainer's chainer.initializers). Each fills an array in place, drawing
// from a Generator (the default one unless given), so a seed reproduces a model exactly.
#pragma once

#include <memory>
#include <utility>

#include "kusari/autograd/variable.h"
#include "kusari/core/random.h"

namespace kusari::initializers {

/// (fan_in, fan_out) of a weight shape: (shape[1] * receptive field, shape[0] * receptive field).
std::pair<int64_t, int64_t> get_fans(const Shape& shape);

/// Fills with one value.
class Constant : public Initializer {
 public:
  explicit Constant(double value, Dtype dtype = Dtype::kFloat32) : value_(value), dtype_(dtype) {}
  void operator()(Array& array) const override;
  Dtype dtype() const override { return dtype_; }

 private:
  double value_;
  Dtype dtype_;
};

/// Zeros (Chainer's default for biases).
class Zero : public Constant {
 public:
  explicit Zero(Dtype dtype = Dtype::kFloat32) : Constant(0.0, dtype) {}
};

/// Ones.
class One : public Constant {
 public:
  explicit One(Dtype dtype = Dtype::kFloat32) : Constant(1.0, dtype) {}
};

/// Random initializers share the dtype and the optional generator.
class RandomInitializer : public Initializer {
 public:
  RandomInitializer(double scale, Dtype dtype, Generator* generator)
      : scale_(scale), dtype_(dtype), generator_(generator) {}
  Dtype dtype() const override { return dtype_; }

 protected:
  Generator& generator() const { return generator_ ? *generator_ : default_generator(); }
  double scale_;
  Dtype dtype_;
  Generator* generator_;
};

/// N(0, scale^2).
class Normal : public RandomInitializer {
 public:
  explicit Normal(double scale = 0.05, Dtype dtype = Dtype::kFloat32, Generator* gen = nullptr)
      : RandomInitializer(scale, dtype, gen) {}
  void operator()(Array& array) const override;
};

/// U(-scale, scale).
class Uniform : public RandomInitializer {
 public:
  explicit Uniform(double scale = 0.05, Dtype dtype = Dtype::kFloat32, Generator* gen = nullptr)
      : RandomInitializer(scale, dtype, gen) {}
  void operator()(Array& array) const override;
};

/// N(0, scale^2 / fan_in) (Chainer's default for Linear and Convolution2D weights).
class LeCunNormal : public RandomInitializer {
 public:
  explicit LeCunNormal(double scale = 1.0, Dtype dtype = Dtype::kFloat32, Generator* gen = nullptr)
      : RandomInitializer(scale, dtype, gen) {}
  void operator()(Array& array) const override;
};

/// N(0, scale^2 * 2 / (fan_in + fan_out)).
class GlorotNormal : public RandomInitializer {
 public:
  explicit GlorotNormal(double scale = 1.0, Dtype dtype = Dtype::kFloat32, Generator* gen = nullptr)
      : RandomInitializer(scale, dtype, gen) {}
  void operator()(Array& array) const override;
};

/// N(0, scale^2 * 2 / fan_in).
class HeNormal : public RandomInitializer {
 public:
  explicit HeNormal(double scale = 1.0, Dtype dtype = Dtype::kFloat32, Generator* gen = nullptr)
      : RandomInitializer(scale, dtype, gen) {}
  void operator()(Array& array) const override;
};

/// U(-s, s) with s = scale * sqrt(3 / fan_in).
class LeCunUniform : public RandomInitializer {
 public:
  explicit LeCunUniform(double scale = 1.0, Dtype dtype = Dtype::kFloat32, Generator* gen = nullptr)
      : RandomInitializer(scale, dtype, gen) {}
  void operator()(Array& array) const override;
};

/// U(-s, s) with s = scale * sqrt(6 / (fan_in + fan_out)).
class GlorotUniform : public RandomInitializer {
 public:
  explicit GlorotUniform(double scale = 1.0, Dtype dtype = Dtype::kFloat32, Generator* gen = nullptr)
      : RandomInitializer(scale, dtype, gen) {}
  void operator()(Array& array) const override;
};

/// U(-s, s) with s = scale * sqrt(6 / fan_in).
class HeUniform : public RandomInitializer {
 public:
  explicit HeUniform(double scale = 1.0, Dtype dtype = Dtype::kFloat32, Generator* gen = nullptr)
      : RandomInitializer(scale, dtype, gen) {}
  void operator()(Array& array) const override;
};

}  // namespace kusari::initializers
