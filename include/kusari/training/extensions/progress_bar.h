// ProgressBar: shows how far training has got, its speed and the time left (Chainer's
// extensions.ProgressBar).
//
//   trainer.extend(extensions::ProgressBar());   // length taken from the stop trigger
#pragma once

#include <chrono>
#include <deque>
#include <iostream>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "kusari/training/extension.h"

namespace kusari::training::extensions {

/// Every `update_interval` iterations, prints the progress of the whole training and of the
/// current epoch, the iteration and epoch counts, iterations per second (over the last 100
/// updates, from the start of the run at first) and the estimated time to finish. With an
/// updater that has no epochs (Updater::has_epochs(), e.g. reinforcement learning), the epoch
/// parts are left out: "600 iter / 10000 iterations; total 6.00%; ...".
///
/// Note [ProgressBar output]
/// On a terminal the display is Chainer's: four lines redrawn in place with ANSI escapes,
///
///        total [#################.................................] 35.54%
///   this epoch [#####.............................................] 10.84%
///        91300 iter, 7 epoch / 20 epochs
///      0.71428 iters/sec. Estimated time to finish: 2 days, 16:23:34.613215.
///
/// When the output is not a terminal (a batch job's log file), escapes would only garble the
/// file, so each update prints one plain line instead:
///
///   91300 iter, 7 epoch / 20 epochs; total 35.54%, this epoch 10.84%; 0.71428 iters/sec;
///   estimated time to finish: 2 days, 16:23:34.613215.
///
/// (one line in the file). What counts as a terminal is Note [Terminal output]
/// (kusari/training/terminal.h): isatty() on std::cout / std::cerr, except under an MPI or
/// batch launcher (whose ranks often get a pseudo-terminal while the job's output goes to a
/// file), overridden by KUSARI_TERMINAL=0/1 or set_terminal_output(); any other stream counts
/// as a file. set_terminal() overrides all of that for this extension.
class ProgressBar : public Extension {
 public:
  /// `training_length`: (length, "epoch" | "iteration"); when absent it is taken from the
  /// trainer's stop trigger, which must then be an IntervalTrigger.
  explicit ProgressBar(std::optional<std::pair<double, std::string>> training_length = std::nullopt,
                       int64_t update_interval = 100, int bar_length = 50,
                       std::ostream& out = std::cout);

  /// Forces the terminal (true) or plain-line (false) display instead of detecting it
  /// (Note [Terminal output]).
  ProgressBar& set_terminal(bool terminal) {
    terminal_ = terminal;
    return *this;
  }

  /// Draws the progress when the iteration is a multiple of update_interval.
  void operator()(Trainer& trainer) override;
  /// "ProgressBar".
  std::string default_name() const override { return "ProgressBar"; }
  /// Every iteration (it draws only every update_interval iterations).
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }
  /// Starts the speed's window at the run's first iteration (so the first report already has a
  /// speed and an estimate).
  void initialize(Trainer& trainer) override;
  /// Erases the bar (on a terminal).
  void finalize() override;

 private:
  std::optional<std::pair<double, std::string>> training_length_;
  int64_t update_interval_;
  int bar_length_;
  std::ostream* out_;
  std::optional<bool> terminal_;
  // (iteration, epoch_detail, time) of the last updates, at most 100.
  std::deque<std::tuple<int64_t, double, std::chrono::steady_clock::time_point>> recent_;
  bool drawn_ = false;
};

}  // namespace kusari::training::extensions
