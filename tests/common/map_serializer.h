// A minimal in-memory Serializer for tests: entries live in a std::map keyed by full path
// ("updater/iteration", ...).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "kusari/core/error.h"
#include "kusari/serializers/serializer.h"

namespace kusari::testing {

/// Saves arrays (deep copies) into a shared map, or loads them back from it.
class MapSerializer : public Serializer {
 public:
  using Store = std::map<std::string, Array>;
  MapSerializer(std::shared_ptr<Store> store, bool loading, std::string path = "")
      : store_(std::move(store)), loading_(loading), path_(std::move(path)) {}

  bool is_loading() const override { return loading_; }
  std::unique_ptr<Serializer> child(const std::string& name) override {
    return std::make_unique<MapSerializer>(store_, loading_, path_ + name + "/");
  }
  void operator()(const std::string& key, Array& value) override {
    if (!loading_) {
      if (value.defined()) (*store_)[path_ + key] = value.copy();
      return;
    }
    auto it = store_->find(path_ + key);
    KUSARI_CHECK(it != store_->end(), ValueError, "MapSerializer: no entry '", path_ + key, "'");
    if (value.defined()) {
      value.assign(it->second);
    } else {
      value = it->second.copy();
    }
  }
  using Serializer::operator();
  bool contains(const std::string& key) const override {
    return !loading_ || store_->count(path_ + key) > 0;
  }
  std::string path() const override { return path_; }

 private:
  std::shared_ptr<Store> store_;
  bool loading_;
  std::string path_;
};

}  // namespace kusari::testing
