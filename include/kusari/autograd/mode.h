// Thread-local switches that change how functions run: backprop recording and train/test mode.
#pragma once

namespace kusari {

/// True unless a NoBackpropMode scope is active: functions record the graph for backward().
bool is_backprop_enabled();

/// True unless a TrainMode(false) scope is active (Chainer's `chainer.config.train`): dropout drops
/// and batch normalization uses batch statistics.
bool is_train_mode();

/// While alive, functions on this thread record no graph (Chainer's no_backprop_mode,
/// PyTorch's no_grad): outputs have no creator and need no memory for backward.
class NoBackpropMode {
 public:
  NoBackpropMode();
  ~NoBackpropMode();
  NoBackpropMode(const NoBackpropMode&) = delete;
  NoBackpropMode& operator=(const NoBackpropMode&) = delete;

 private:
  bool previous_;
};

/// While alive, functions on this thread record the graph even inside a NoBackpropMode.
class ForceBackpropMode {
 public:
  ForceBackpropMode();
  ~ForceBackpropMode();
  ForceBackpropMode(const ForceBackpropMode&) = delete;
  ForceBackpropMode& operator=(const ForceBackpropMode&) = delete;

 private:
  bool previous_;
};

/// Sets train mode (true) or test mode (false) on this thread until the scope ends.
class TrainMode {
 public:
  explicit TrainMode(bool train);
  ~TrainMode();
  TrainMode(const TrainMode&) = delete;
  TrainMode& operator=(const TrainMode&) = delete;

 private:
  bool previous_;
};

}  // namespace kusari
