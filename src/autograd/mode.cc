#include "kusari/autograd/mode.h"

namespace kusari {
namespace {
thread_local bool t_backprop_enabled = true;
thread_local bool t_train = true;
}  // namespace

bool is_backprop_enabled() { return t_backprop_enabled; }
bool is_train_mode() { return t_train; }

NoBackpropMode::NoBackpropMode() : previous_(t_backprop_enabled) { t_backprop_enabled = false; }
NoBackpropMode::~NoBackpropMode() { t_backprop_enabled = previous_; }

ForceBackpropMode::ForceBackpropMode() : previous_(t_backprop_enabled) { t_backprop_enabled = true; }
ForceBackpropMode::~ForceBackpropMode() { t_backprop_enabled = previous_; }

TrainMode::TrainMode(bool train) : previous_(t_train) { t_train = train; }
TrainMode::~TrainMode() { t_train = previous_; }

}  // namespace kusari
