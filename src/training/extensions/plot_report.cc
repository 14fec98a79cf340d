#include "kusari/training/extensions/plot_report.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <limits>
#include <nlohmann/json.hpp>

#include "kusari/training/trainer.h"
#include "training/extensions/extension_util.h"
#include "training/extensions/plot.h"

namespace kusari::training::extensions {

namespace {

bool ends_with_ci(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.rbegin(), suffix.rend(), s.rbegin(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) == b;
  });
}

}  // namespace

PlotReport::PlotReport(std::vector<std::string> y_keys, std::string x_key,
                       std::shared_ptr<Trigger> trigger, std::string filename, PlotStyle style)
    : y_keys_(std::move(y_keys)),
      x_key_(std::move(x_key)),
      trigger_(std::move(trigger)),
      filename_(std::move(filename)),
      style_(std::move(style)) {
  KUSARI_CHECK(!y_keys_.empty(), ValueError, "PlotReport: no keys to plot");
  KUSARI_CHECK(!x_key_.empty(), ValueError, "PlotReport: the x key is empty");
  const bool png = ends_with_ci(filename_, ".png");
  svg_ = ends_with_ci(filename_, ".svg");
  KUSARI_CHECK(png || svg_, ValueError, "PlotReport: cannot tell the image format of '", filename_,
               "'; the filename must end in .png or .svg");
  const std::string markers = "x+os.";
  KUSARI_CHECK(style_.marker == 0 || markers.find(style_.marker) != std::string::npos, ValueError,
               "PlotReport: unknown marker '", style_.marker,
               "'; use one of x + o s . or 0 for none");
  KUSARI_CHECK(style_.width > 0 && style_.height > 0, ValueError,
               "PlotReport: the image size must be positive, got ", style_.width, "x",
               style_.height);
  if (!trigger_) trigger_ = interval(1, "epoch");
  if (style_.title.empty()) {
    for (size_t i = 0; i < y_keys_.size(); ++i) style_.title += (i ? ", " : "") + y_keys_[i];
  }
  for (const std::string& key : y_keys_) data_[key];
}

void PlotReport::operator()(Trainer& trainer) {
  const Observation& observation = trainer.observation();
  Observation selected;
  for (const std::string& key : y_keys_) {
    auto it = observation.find(key);
    if (it != observation.end()) selected.emplace(key, it->second);
  }
  if (x_key_ != "epoch" && x_key_ != "iteration") {
    auto it = observation.find(x_key_);
    if (it != observation.end()) selected.emplace(x_key_, it->second);
  }
  summary_.add(selected);
  if (!(*trigger_)(trainer)) return;

  std::map<std::string, double> stats = summary_.compute_mean();
  summary_.clear();
  stats["epoch"] = static_cast<double>(trainer.updater().epoch());
  stats["iteration"] = static_cast<double>(trainer.updater().iteration());
  auto x = stats.find(x_key_);
  KUSARI_CHECK(
      x != stats.end(), ValueError, "PlotReport: the x key '", x_key_,
      "' was not reported during the interval (use \"epoch\", \"iteration\" or a reported key)");
  bool any = false;
  for (const std::string& key : y_keys_) {
    auto y = stats.find(key);
    if (y != stats.end()) data_[key].emplace_back(x->second, y->second);
    any = any || !data_[key].empty();
  }
  if (!any) return;
  if (!detail::plots_available()) {
    // Note [PlotReport drawing]: a build without cairo draws nothing, and says so once.
    static std::once_flag warned;
    std::call_once(warned, [&] {
      std::fprintf(stderr, "PlotReport: this build of kusari has no cairo, so %s is not drawn "
                           "(install libcairo2-dev and rebuild to get plots)\n", filename_.c_str());
    });
    return;
  }
  const std::string path = (std::filesystem::path(trainer.out()) / filename_).string();
  detail::write_file_atomically(path, svg_ ? render_svg() : render_png(), "PlotReport");
}

namespace {

detail::PlotLook make_look(const PlotStyle& style, const std::string& x_key) {
  detail::PlotLook look;
  look.title = style.title;
  look.x_label = x_key;
  look.marker = style.marker;
  look.grid = style.grid;
  look.width = style.width;
  look.height = style.height;
  return look;
}

}  // namespace

std::string PlotReport::render_svg() const {
  return detail::render_plot_svg(detail::series_with_points(y_keys_, data_),
                                 make_look(style_, x_key_));
}

std::string PlotReport::render_png() const {
  return detail::render_plot_png(detail::series_with_points(y_keys_, data_),
                                 make_look(style_, x_key_));
}

void PlotReport::serialize(Serializer& s) {
  trigger_->serialize(*s.child("_trigger"));
  summary_.serialize(*s.child("_summary"));
  const std::string key = "_plot_" + filename_;
  if (s.is_loading()) {
    std::string text;
    s(key, text);
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    KUSARI_CHECK(j.is_object(), IOError, "PlotReport::serialize: '", s.path(), key,
                 "' is not a JSON object of points");
    data_.clear();
    for (const std::string& k : y_keys_) data_[k];
    for (auto it = j.begin(); it != j.end(); ++it) {
      auto& points = data_[it.key()];
      for (const nlohmann::json& p : it.value()) {
        KUSARI_CHECK(p.is_array() && p.size() == 2, IOError, "PlotReport::serialize: '", s.path(),
                     key, "' holds a point that is not an [x, y] pair");
        auto number = [](const nlohmann::json& v) {
          return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
        };
        points.emplace_back(number(p[0]), number(p[1]));
      }
    }
  } else {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, points] : data_) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& [x, y] : points) list.push_back({x, y});
      j[k] = list;
    }
    std::string text = j.dump();
    s(key, text);
  }
}

}  // namespace kusari::training::extensions
