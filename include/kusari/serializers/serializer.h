// The serialization protocol shared by links, optimizers, iterators, updaters and trainers
// (Chainer's Serializer / Deserializer): one `serialize(Serializer&)` method both saves and
// loads, walking a tree of named entries such as "updater/model:main/predictor/l1/W".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kusari/core/array.h"

namespace kusari {

/// Saves or loads named values under a path. A Serializer for saving reads the values it is
/// given; one for loading overwrites them.
class Serializer {
 public:
  virtual ~Serializer() = default;

  /// True when values are being loaded (written into the given references).
  virtual bool is_loading() const = 0;
  /// The serializer of the child entry `name` (the path gains "name/").
  virtual std::unique_ptr<Serializer> child(const std::string& name) = 0;
  /// Saves or loads an array. When loading into an undefined array, the array is created (on
  /// the CPU) with the stored shape and dtype; into a defined one, the stored values are copied
  /// in place (shapes must match; dtypes are converted).
  virtual void operator()(const std::string& key, Array& value) = 0;
  /// Saves or loads scalars (stored as 0-d arrays).
  void operator()(const std::string& key, double& value);
  void operator()(const std::string& key, int64_t& value);
  void operator()(const std::string& key, bool& value);
  /// Saves or loads a counter (an iteration, an epoch, a step count): like the int64_t overload,
  /// and when loading, a negative value is an IOError naming the key.
  void count(const std::string& key, int64_t& value);
  /// Saves or loads a string (stored as a uint8 array of its bytes).
  void operator()(const std::string& key, std::string& value);
  /// True when loading and `key` exists under the current path (saving: always true).
  virtual bool contains(const std::string& key) const = 0;
  /// The full path of this serializer, e.g. "updater/optimizer:main/".
  virtual std::string path() const = 0;
};

/// Anything that can be saved and loaded with a Serializer.
class Serializable {
 public:
  virtual ~Serializable() = default;
  virtual void serialize(Serializer& serializer) = 0;
};

}  // namespace kusari
