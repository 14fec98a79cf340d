// Trainer extensions: code run by the trainer when their trigger fires (Chainer's Extension).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "kusari/serializers/serializer.h"
#include "kusari/training/trigger.h"

namespace kusari::training {

class Trainer;

/// Priorities: writers run first (they produce values), editors next, readers (reports) last.
inline constexpr int kPriorityWriter = 300;
inline constexpr int kPriorityEditor = 200;
inline constexpr int kPriorityReader = 100;

class Extension : public Serializable {
 public:
  ~Extension() override = default;
  /// Runs the extension.
  virtual void operator()(Trainer& trainer) = 0;
  /// The name used when extend() is given none.
  virtual std::string default_name() const = 0;
  /// When the extension runs unless extend() says otherwise (every epoch by default).
  virtual std::shared_ptr<Trigger> default_trigger() const { return interval(1, "epoch"); }
  virtual int priority() const { return kPriorityReader; }
  /// Called once before the training loop (also when resuming).
  virtual void initialize(Trainer&) {}
  /// Called once after the loop ends, normally or not.
  virtual void finalize() {}
  /// Called when the loop is left by an exception, before finalize().
  virtual void on_error(Trainer&, const std::exception&) {}
  void serialize(Serializer&) override {}

  /// The name the extension was registered under by Trainer::extend ("" before that). Chainer
  /// sets `extension.name` the same way; Evaluator uses it as the prefix of its keys.
  const std::string& name() const { return name_; }
  /// Sets the registered name (Trainer::extend does this; wrappers may forward it).
  void set_name(std::string name) { name_ = std::move(name); }

 private:
  std::string name_;
};

/// An extension made from a function (Chainer's make_extension).
std::shared_ptr<Extension> make_extension(std::function<void(Trainer&)> fn, std::string name,
                                          std::shared_ptr<Trigger> trigger = nullptr,
                                          int priority = kPriorityReader);

}  // namespace kusari::training
