// Plots one reported value (by default the validation accuracy) of several training runs
// against the epoch, from their LogReport files, into one PNG, with kusari's own plotting (the
// code PlotReport draws with). The large-minibatch experiment draws its curves with it:
//
//   plot_logs --out curves.png --title "..." small=runs/small/log large=runs/large/log
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <exception>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kusari/datasets/image.h"
#include "kusari/core/program.h"
#include "training/extensions/plot.h"

namespace {

namespace D = kusari::training::detail;

// The (x, y) points of `key` in a LogReport file: one per entry that has both keys.
D::PlotSeries read_series(const std::string& label, const std::string& path, const std::string& x,
                          const std::string& key) {
  std::ifstream in(path);
  if (!in) throw kusari::IOError("plot_logs: cannot read the log '" + path + "'");
  nlohmann::json log;
  try {
    in >> log;
  } catch (const std::exception& e) {
    throw kusari::IOError("plot_logs: '" + path + "' is not a LogReport file: " + e.what());
  }
  if (!log.is_array()) {
    throw kusari::IOError("plot_logs: '" + path + "' is not a LogReport file (expected a list)");
  }
  D::PlotSeries series{label, {}};
  for (const auto& entry : log) {
    if (!entry.contains(x) || !entry.contains(key)) continue;
    series.points.emplace_back(entry[x].get<double>(), entry[key].get<double>());
  }
  if (series.points.empty()) {
    throw kusari::IOError("plot_logs: '" + path + "' has no entry with both '" + x + "' and '" +
                          key + "'");
  }
  return series;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plots one value of several LogReport files against the epoch into a PNG"};
  std::string out, key = "validation/main/accuracy", x = "epoch", title;
  std::vector<std::string> runs;
  int width = 640, height = 400;
  app.add_option("--out", out, "PNG file to write")->required();
  app.add_option("--key", key, "The reported value to plot")->capture_default_str();
  app.add_option("--x", x, "The value along the x axis")->capture_default_str();
  app.add_option("--title", title, "Title of the plot");
  app.add_option("--width", width, "Width in pixels")->capture_default_str()->check(CLI::Range(100, 4000));
  app.add_option("--height", height, "Height in pixels")->capture_default_str()->check(CLI::Range(100, 4000));
  app.add_option("runs", runs, "label=path/to/log, one per line of the plot")->required();
  CLI11_PARSE(app, argc, argv);
  if (kusari::only_check_arguments("plot_logs")) return 0;
  try {
    std::vector<D::PlotSeries> series;
    for (const std::string& run : runs) {
      const size_t eq = run.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == run.size()) {
        std::fprintf(stderr, "Error: expected label=path/to/log, got '%s'\n", run.c_str());
        return 1;
      }
      series.push_back(read_series(run.substr(0, eq), run.substr(eq + 1), x, key));
    }
    D::PlotLook look;
    look.title = title.empty() ? key : title;
    look.x_label = x;
    look.marker = 'o';
    look.width = width;
    look.height = height;
    const std::string png = D::render_plot_png(series, look);
    kusari::write_file_bytes(out, std::vector<uint8_t>(png.begin(), png.end()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "Error: %s\n", e.what());
    return 1;
  }
  return 0;
}
