// PlotReport: plots reported values against the epoch or iteration into an image in the
// output folder (Chainer's extensions.PlotReport).
//
//   trainer.extend(extensions::PlotReport({"main/loss", "validation/main/loss"}, "epoch",
//                                         nullptr, "loss.png"));
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kusari/training/extension.h"
#include "kusari/training/summary.h"
#include "kusari/training/trigger.h"

namespace kusari::training::extensions {

/// How a PlotReport image looks.
struct PlotStyle {
  /// Marker at each point: 'x' (Chainer's default), '+', 'o', 's', '.', or 0 for none.
  char marker = 'x';
  /// Light grid lines at the ticks.
  bool grid = true;
  /// The title; empty means the y keys joined by ", ".
  std::string title;
  /// Image width in pixels (grown when the labels or the legend need more room).
  int width = 800;
  /// Image height in pixels.
  int height = 500;
};

/// Gathers the observations of `y_keys` every iteration and, each time its trigger fires,
/// appends the interval's mean of each key as a point at x = the `x_key` value ("epoch",
/// "iteration" or another reported key), then redraws <trainer.out()>/<filename>: one line
/// per key with markers, axes with tick labels, the x key as axis label, a legend and a title.
///
/// Note [PlotReport images]
/// Chainer draws with matplotlib; kusari draws the same kind of plot with cairo, as PNG (a
/// ".png" filename) or SVG (".svg"); see Note [PlotReport drawing] in the source. Files are
/// written atomically (temporary file, then rename), so a viewer never shows a half-written
/// image. Like Chainer, PlotReport keeps its own summary of the keys, so it works without a
/// LogReport, and nothing is written until some key has a point.
class PlotReport : public Extension {
 public:
  /// `trigger`: when to add points and redraw (default every epoch). `filename` must end in
  /// ".png" or ".svg".
  explicit PlotReport(std::vector<std::string> y_keys, std::string x_key = "epoch",
                      std::shared_ptr<Trigger> trigger = nullptr, std::string filename = "plot.png",
                      PlotStyle style = {});

  /// Adds the iteration's values; adds points and redraws the file when the interval ends.
  void operator()(Trainer& trainer) override;
  /// "PlotReport".
  std::string default_name() const override { return "PlotReport"; }
  /// Every iteration: the values of each iteration are gathered.
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }

  /// The points so far: key -> (x, y) list.
  const std::map<std::string, std::vector<std::pair<double, double>>>& data() const {
    return data_;
  }
  /// The current plot as an SVG document (what a .svg file holds).
  std::string render_svg() const;
  /// The current plot as PNG bytes (what a .png file holds).
  std::string render_png() const;

  /// Saves or loads the points ("_plot_<filename>", a JSON string, Chainer's layout), plus the
  /// trigger ("_trigger") and the interval's summary ("_summary") so a resume is exact.
  void serialize(Serializer& serializer) override;

 private:
  std::vector<std::string> y_keys_;
  std::string x_key_;
  std::shared_ptr<Trigger> trigger_;
  std::string filename_;
  bool svg_;
  PlotStyle style_;
  DictSummary summary_;
  std::map<std::string, std::vector<std::pair<double, double>>> data_;
};

}  // namespace kusari::training::extensions
