// Line plots for PlotReport: a layout drawn through a small painter interface onto either an
// SVG document or an RGB raster (own rasteriser, own bitmap font), and PNG encoding of the
// raster with libpng. Internal to kusari.
#pragma once

#include <cstdint>
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

/// An 8-bit RGB image, rows top to bottom.
struct Raster {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
};

/// The plot as an SVG document.
std::string render_plot_svg(const std::vector<PlotSeries>& series, const PlotLook& look);
/// The plot as an RGB raster.
Raster render_plot_raster(const std::vector<PlotSeries>& series, const PlotLook& look);
/// True when this build can write PNG files (it was built with libpng).
bool png_supported();
/// The raster as PNG file bytes (NotImplementedError without libpng).
std::string encode_png(const Raster& raster);

}  // namespace kusari::training::detail
