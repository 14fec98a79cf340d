// Line plots for PlotReport, drawn with cairo as PNG or SVG. Internal to kusari.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kusari::training::detail {

/// One line of the plot: its legend label and its (x, y) points in order. Points with a
/// non-finite coordinate are skipped and break the line.
struct PlotSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;
};

/// How a plot looks.
struct PlotLook {
  std::string title;
  std::string x_label;
  /// 'x', '+', 'o', 's', '.' or 0 (no markers).
  char marker = 'x';
  bool grid = true;
  /// Image size in pixels (grown when the text does not fit).
  int width = 800;
  int height = 500;
};

/// The series of `keys` that have points, in the order of `keys`: like Chainer, a key without
/// points gets neither a line nor a legend entry.
std::vector<PlotSeries> series_with_points(
    const std::vector<std::string>& keys,
    const std::map<std::string, std::vector<std::pair<double, double>>>& data);

/// False in a build without cairo: then the functions below throw NotImplementedError.
bool plots_available();

/// Every text the plot shows, in drawing order: x tick labels, y tick labels, the x label, the
/// title, then the legend's labels.
std::vector<std::string> plot_texts(const std::vector<PlotSeries>& series, const PlotLook& look);
/// The plot as an SVG document.
std::string render_plot_svg(const std::vector<PlotSeries>& series, const PlotLook& look);
/// The plot as a PNG file (8-bit RGB).
std::string render_plot_png(const std::vector<PlotSeries>& series, const PlotLook& look);

}  // namespace kusari::training::detail
