#include "kusari/training/extensions/progress_bar.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "kusari/training/trainer.h"
#include "training/extensions/extension_util.h"

namespace kusari::training::extensions {

namespace {

// Python's "{:6.2%}".
std::string percent(double rate) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%6.2f%%", rate * 100.0);
  return buf;
}

std::string bar(double rate, int length) {
  const int marks = std::clamp(static_cast<int>(rate * length), 0, length);
  std::string s(1, '[');
  s.append(marks, '#');
  s.append(length - marks, '.');
  s += ']';
  return s;
}

}  // namespace

ProgressBar::ProgressBar(std::optional<std::pair<double, std::string>> training_length,
                         int64_t update_interval, int bar_length, std::ostream& out)
    : training_length_(std::move(training_length)),
      update_interval_(update_interval),
      bar_length_(bar_length),
      out_(&out) {
  KUSARI_CHECK(update_interval > 0, ValueError,
               "ProgressBar: update_interval must be positive, got ", update_interval);
  KUSARI_CHECK(bar_length > 0, ValueError, "ProgressBar: bar_length must be positive, got ",
               bar_length);
  if (training_length_) {
    const auto& [length, unit] = *training_length_;
    KUSARI_CHECK(unit == "epoch" || unit == "iteration", ValueError,
                 "ProgressBar: the training length's unit must be 'epoch' or 'iteration', got '",
                 unit, "'");
    KUSARI_CHECK(length > 0, ValueError, "ProgressBar: the training length must be positive, got ",
                 length);
  }
}

void ProgressBar::initialize(Trainer& trainer) {
  // The run's start opens the speed's window: the first report (after update_interval
  // iterations) then has a speed and an estimate instead of "inf iters/sec".
  recent_.clear();
  Updater& updater = trainer.updater();
  recent_.emplace_back(updater.iteration(), updater.epoch_detail(), std::chrono::steady_clock::now());
}

void ProgressBar::operator()(Trainer& trainer) {
  if (!training_length_) {
    auto* stop = dynamic_cast<IntervalTrigger*>(&trainer.stop_trigger());
    KUSARI_CHECK(stop, ValueError,
                 "ProgressBar: cannot tell the training length from the trainer's stop trigger (it "
                 "is not an "
                 "IntervalTrigger); pass it, e.g. ProgressBar(std::make_pair(20.0, \"epoch\"))");
    training_length_ = std::make_pair(stop->period(), stop->unit());
  }
  Updater& updater = trainer.updater();
  const int64_t iteration = updater.iteration();
  if (iteration % update_interval_ != 0) return;

  const auto& [length, unit] = *training_length_;
  const double epoch = updater.epoch_detail();
  const auto now = std::chrono::steady_clock::now();
  recent_.emplace_back(iteration, epoch, now);
  if (recent_.size() > 100) recent_.pop_front();
  const auto& [old_t, old_e, old_time] = recent_.front();
  const double span = std::chrono::duration<double>(now - old_time).count();
  const double inf = std::numeric_limits<double>::infinity();
  // No earlier record (called before the run's start was recorded) or no time between them:
  // the speed is unknown, never "inf".
  const bool measured = span > 0 && iteration > old_t;
  const double speed_t = measured ? static_cast<double>(iteration - old_t) / span : 0.0;
  const double speed_e = measured ? (epoch - old_e) / span : 0.0;
  double estimated = inf;
  if (measured) {
    estimated = unit == "iteration" ? (length - static_cast<double>(iteration)) / speed_t
                                    : (length - epoch) / speed_e;
    if (!std::isfinite(estimated)) estimated = inf;  // no epoch progress over the window
    estimated = std::max(estimated, 0.0);
  }
  const bool epochs = updater.has_epochs();
  const double rate =
      std::min(unit == "iteration" ? static_cast<double>(iteration) / length : epoch / length, 1.0);
  const double epoch_rate = epoch - std::floor(epoch);

  char status[160];
  if (epochs) {
    std::snprintf(status, sizeof(status), "%lld iter, %lld epoch / %s %ss",
                  static_cast<long long>(iteration), static_cast<long long>(std::floor(epoch)),
                  detail::format_g(length, 12).c_str(), unit.c_str());
  } else {
    std::snprintf(status, sizeof(status), "%lld iter / %s %ss", static_cast<long long>(iteration),
                  detail::format_g(length, 12).c_str(), unit.c_str());
  }
  char speed[64];
  if (measured) {
    std::snprintf(speed, sizeof(speed), "%.5g iters/sec", speed_t);
  } else {
    std::snprintf(speed, sizeof(speed), "speed not yet known");
  }
  const std::string eta =
      std::isinf(estimated) ? std::string("unknown") : detail::format_timedelta(estimated);

  const bool terminal = detail::is_terminal(*out_, terminal_);
  std::string text;
  if (terminal) {
    char line[192];
    text += "\033[J";
    text += "     total " + bar(rate, bar_length_) + " " + percent(rate) + "\n";
    if (epochs) text += "this epoch " + bar(epoch_rate, bar_length_) + " " + percent(epoch_rate) + "\n";
    if (epochs) {
      std::snprintf(line, sizeof(line), "%10lld iter, %lld epoch / %s %ss\n",
                    static_cast<long long>(iteration), static_cast<long long>(std::floor(epoch)),
                    detail::format_g(length, 12).c_str(), unit.c_str());
    } else {
      std::snprintf(line, sizeof(line), "%10lld iter / %s %ss\n", static_cast<long long>(iteration),
                    detail::format_g(length, 12).c_str(), unit.c_str());
    }
    text += line;
    if (measured) {
      std::snprintf(line, sizeof(line), "%10.5g iters/sec", speed_t);
    } else {
      std::snprintf(line, sizeof(line), "%s", speed);
    }
    text += std::string(line) + ". Estimated time to finish: " + eta + ".\n";
    text += epochs ? "\033[4A" : "\033[3A";
    drawn_ = true;
  } else {
    std::string total = percent(rate), this_epoch = percent(epoch_rate);
    total.erase(0, total.find_first_not_of(' '));
    this_epoch.erase(0, this_epoch.find_first_not_of(' '));
    text += std::string(status) + "; total " + total;
    if (epochs) text += ", this epoch " + this_epoch;
    text += std::string("; ") + speed + "; estimated time to finish: " + eta + ".\n";
  }
  *out_ << text;
  out_->flush();
}

void ProgressBar::finalize() {
  if (drawn_) {
    *out_ << "\033[J";
    out_->flush();
  }
}

}  // namespace kusari::training::extensions
