#include "training/extensions/plot.h"

#include "kusari/config.h"

#if KUSARI_HAVE_CAIRO
#include <cairo-svg.h>
#include <cairo.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>

#include "kusari/core/error.h"

namespace kusari::training::detail {

std::vector<PlotSeries> series_with_points(
    const std::vector<std::string>& keys,
    const std::map<std::string, std::vector<std::pair<double, double>>>& data) {
  std::vector<PlotSeries> series;
  for (const std::string& key : keys) {
    auto it = data.find(key);
    if (it != data.end() && !it->second.empty()) series.push_back({key, it->second});
  }
  return series;
}

bool plots_available() { return KUSARI_HAVE_CAIRO != 0; }

#if KUSARI_HAVE_CAIRO

// Note [PlotReport drawing]
// cairo draws the plot, on an image surface for PNG and on an SVG surface for SVG, so both
// formats show the same picture. Text goes through cairo's "toy" text API with the generic
// "sans-serif" family: fontconfig picks the system's sans font (DejaVu Sans where
// fonts-dejavu-core is installed), and where no font is installed at all cairo falls back to its
// built-in stroked font, so the labels are always drawn. Text is measured with the font's
// metrics, unhinted, so that the layout (and the image size) is the same on both surfaces. The
// layout -- ticks at 1, 2 or 5 times a power of ten, matplotlib's 5% margins, the legend to the
// right of the frame -- is kusari's own. cairo is optional (KUSARI_WITH_CAIRO): a build without
// it still trains, and PlotReport says once that it draws nothing.

namespace {

struct Color {
  double r, g, b;
};

constexpr Color rgb(int r, int g, int b) {
  return {r / 255.0, g / 255.0, b / 255.0};
}

constexpr Color kWhite = rgb(255, 255, 255);
constexpr Color kBlack = rgb(0, 0, 0);
constexpr Color kGridColor = rgb(221, 221, 221);
constexpr Color kLegendBorder = rgb(190, 190, 190);
constexpr Color kTextColor = rgb(34, 34, 34);
// matplotlib's default cycle ("tab10"), so plots look like Chainer's.
constexpr Color kPalette[] = {rgb(31, 119, 180),  rgb(255, 127, 14), rgb(44, 160, 44),
                              rgb(214, 39, 40),   rgb(148, 103, 189), rgb(140, 86, 75),
                              rgb(227, 119, 194), rgb(127, 127, 127), rgb(188, 189, 34),
                              rgb(23, 190, 207)};

constexpr char kFontFamily[] = "sans-serif";
constexpr double kTextSize = 14;
constexpr double kTitleSize = 16;
constexpr double kMargin = 14;
constexpr double kTickLength = 5;
constexpr double kLineWidth = 2;
constexpr double kMarkerRadius = 4;

enum class Align { kLeft, kCenter, kRight };
enum class Font { kText, kTitle };

using CairoPtr = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;
using SurfacePtr = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;

void check_cairo(cairo_status_t status, const char* what) {
  KUSARI_CHECK(status == CAIRO_STATUS_SUCCESS, IOError, "PlotReport: cairo failed ", what, ": ",
               cairo_status_to_string(status));
}

void use_font(cairo_t* cr, Font font) {
  cairo_select_font_face(cr, kFontFamily, CAIRO_FONT_SLANT_NORMAL,
                         font == Font::kTitle ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, font == Font::kTitle ? kTitleSize : kTextSize);
}

// Gives a context the settings every drawing and measurement uses.
void set_up(cairo_t* cr) {
  cairo_font_options_t* options = cairo_font_options_create();
  cairo_font_options_set_hint_metrics(options, CAIRO_HINT_METRICS_OFF);
  cairo_font_options_set_hint_style(options, CAIRO_HINT_STYLE_NONE);
  cairo_set_font_options(cr, options);
  cairo_font_options_destroy(options);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
}

// Text sizes, measured with the fonts the plot is drawn with.
class TextMeasure {
 public:
  TextMeasure()
      : surface_(cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1), cairo_surface_destroy),
        cr_(cairo_create(surface_.get()), cairo_destroy) {
    check_cairo(cairo_status(cr_.get()), "to start measuring text");
    set_up(cr_.get());
    cap_height_ = measure_cap(Font::kText);
    title_cap_height_ = measure_cap(Font::kTitle);
  }
  double width(const std::string& s, Font font = Font::kText) const {
    if (s.empty()) return 0;
    use_font(cr_.get(), font);
    cairo_text_extents_t e;
    cairo_text_extents(cr_.get(), s.c_str(), &e);
    return e.x_advance;
  }
  /// The height of a capital letter: text is placed by the top of its capitals.
  double cap_height(Font font = Font::kText) const {
    return font == Font::kTitle ? title_cap_height_ : cap_height_;
  }

 private:
  double measure_cap(Font font) const {
    use_font(cr_.get(), font);
    cairo_text_extents_t e;
    cairo_text_extents(cr_.get(), "H", &e);
    return e.height > 0 ? e.height : (font == Font::kTitle ? kTitleSize : kTextSize) * 0.72;
  }

  SurfacePtr surface_;
  CairoPtr cr_;
  double cap_height_ = 0, title_cap_height_ = 0;
};

// --- layout --------------------------------------------------------------------------------------

struct Axis {
  double lo = 0, hi = 1;
  std::vector<double> ticks;
  std::vector<std::string> labels;
};

// 1, 2 or 5 times a power of ten, giving about `target` intervals over `range`.
double nice_step(double range, int target) {
  const double raw = range / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

Axis make_axis(double lo, double hi, bool integral, int target) {
  Axis a;
  if (!(lo <= hi)) {  // no data
    lo = 0;
    hi = 1;
  }
  if (hi == lo) {
    const double pad = integral ? 1.0 : (lo == 0 ? 1.0 : std::abs(lo) * 0.1);
    lo -= pad;
    hi += pad;
  } else {
    // matplotlib's default 5% margins.
    const double pad = (hi - lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  a.lo = lo;
  a.hi = hi;
  double step = nice_step(hi - lo, target);
  if (integral && step < 1) step = 1;
  if (!(step > 0) || !std::isfinite(step)) return a;
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (int i = 0; i < 100; ++i) {
    double t = first + i * step;
    if (t > hi + step * 1e-9) break;
    if (std::abs(t) < step * 1e-9) t = 0;
    a.ticks.push_back(t);
  }
  const double maxabs = std::max(std::abs(lo), std::abs(hi));
  const int step_exp = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  const bool scientific = maxabs >= 1e6 || maxabs < 1e-4;
  const int decimals = std::max(0, -step_exp);
  const int significant =
      std::clamp(static_cast<int>(std::floor(std::log10(maxabs))) - step_exp + 1, 1, 15);
  for (double t : a.ticks) {
    char buf[64];
    if (scientific) {
      std::snprintf(buf, sizeof(buf), "%.*g", significant, t);
    } else {
      std::snprintf(buf, sizeof(buf), "%.*f", decimals, t);
    }
    a.labels.emplace_back(buf);
  }
  return a;
}

struct Layout {
  int width = 0, height = 0;
  double px0 = 0, px1 = 0, py0 = 0, py1 = 0;  // the plot frame, on pixel centres
  Axis x, y;
  double legend_x = 0, legend_y = 0, legend_w = 0, legend_h = 0, legend_line = 0;

  double map_x(double v) const { return px0 + (v - x.lo) / (x.hi - x.lo) * (px1 - px0); }
  double map_y(double v) const { return py1 - (v - y.lo) / (y.hi - y.lo) * (py1 - py0); }
};

bool finite_point(const std::pair<double, double>& p) {
  return std::isfinite(p.first) && std::isfinite(p.second);
}

Layout make_layout(const std::vector<PlotSeries>& series, const PlotLook& look,
                   const TextMeasure& m, int x_target, int y_target) {
  Layout L;
  const double inf = std::numeric_limits<double>::infinity();
  double xmin = inf, xmax = -inf, ymin = inf, ymax = -inf;
  bool integral_x = true;
  for (const PlotSeries& s : series) {
    for (const auto& p : s.points) {
      if (!finite_point(p)) continue;
      xmin = std::min(xmin, p.first), xmax = std::max(xmax, p.first);
      ymin = std::min(ymin, p.second), ymax = std::max(ymax, p.second);
      integral_x = integral_x && p.first == std::floor(p.first);
    }
  }
  L.x = make_axis(xmin, xmax, integral_x, x_target);
  L.y = make_axis(ymin, ymax, false, y_target);

  const double text_h = m.cap_height();
  double ytick_w = 0, xtick_w = 0;
  for (const auto& s : L.y.labels) ytick_w = std::max(ytick_w, m.width(s));
  for (const auto& s : L.x.labels) xtick_w = std::max(xtick_w, m.width(s));
  double legend_text_w = 0;
  for (const PlotSeries& s : series) legend_text_w = std::max(legend_text_w, m.width(s.label));

  L.legend_line = text_h * 2 + 6;
  L.legend_w = series.empty() ? 0 : 10 + 30 + 8 + legend_text_w + 10;
  L.legend_h = series.empty() ? 0 : 8 + series.size() * L.legend_line;

  const double left = std::max(kMargin + ytick_w + 6 + kTickLength, xtick_w / 2 + 4);
  const double top = kMargin + (look.title.empty() ? 0 : m.cap_height(Font::kTitle) + 16);
  const double bottom =
      kMargin + kTickLength + 6 + text_h + (look.x_label.empty() ? 0 : 12 + text_h);
  const double right = std::max(kMargin + (series.empty() ? 0 : L.legend_w + 16), xtick_w / 2 + 4);
  const double title_w = m.width(look.title, Font::kTitle) + 2 * kMargin;
  L.width = static_cast<int>(
      std::ceil(std::max({static_cast<double>(look.width), left + 400 + right, title_w})));
  L.height = static_cast<int>(std::ceil(
      std::max({static_cast<double>(look.height), top + 150 + bottom, top + L.legend_h + bottom})));
  L.px0 = std::floor(left) + 0.5;
  L.px1 = std::floor(L.width - right) + 0.5;
  L.py0 = std::floor(top) + 0.5;
  L.py1 = std::floor(L.height - bottom) + 0.5;
  L.legend_x = L.px1 + 16;
  L.legend_y = L.py0;
  return L;
}

// Pixels between neighbouring ticks of an axis drawn over `length` pixels.
double tick_spacing(const Axis& a, double length) {
  if (a.ticks.size() < 2) return length;
  return (a.ticks[1] - a.ticks[0]) / (a.hi - a.lo) * length;
}

// The layout with as many ticks as fit: fewer when the tick labels would touch.
Layout make_layout(const std::vector<PlotSeries>& series, const PlotLook& look,
                   const TextMeasure& m) {
  int x_target = 8, y_target = 6;
  for (;;) {
    Layout L = make_layout(series, look, m, x_target, y_target);
    double label_w = 0;
    for (const auto& s : L.x.labels) label_w = std::max(label_w, m.width(s));
    const bool x_fits = tick_spacing(L.x, L.px1 - L.px0) >= label_w + 30 || x_target <= 2;
    const bool y_fits = tick_spacing(L.y, L.py1 - L.py0) >= m.cap_height() + 12 || y_target <= 2;
    if (x_fits && y_fits) return L;
    if (!x_fits) --x_target;
    if (!y_fits) --y_target;
  }
}

// Draws the plot through `cr`, or only lists its texts into `texts` when `cr` is null.
class Drawer {
 public:
  Drawer(cairo_t* cr, const TextMeasure& m, std::vector<std::string>* texts = nullptr)
      : cr_(cr), m_(m), texts_(texts) {}

  void fill_rect(double x, double y, double w, double h, Color c) {
    if (!cr_) return;
    cairo_rectangle(cr_, x, y, w, h);
    set_color(c);
    cairo_fill(cr_);
  }
  /// A 1-pixel outline.
  void stroke_rect(double x, double y, double w, double h, Color c) {
    if (!cr_) return;
    cairo_rectangle(cr_, x, y, w, h);
    stroke(1.0, c);
  }
  void polyline(const std::vector<std::pair<double, double>>& pts, double width, Color c) {
    if (!cr_ || pts.empty()) return;
    cairo_move_to(cr_, pts[0].first, pts[0].second);
    for (size_t i = 1; i < pts.size(); ++i) cairo_line_to(cr_, pts[i].first, pts[i].second);
    stroke(width, c);
  }
  void line(double x0, double y0, double x1, double y1, double width, Color c) {
    polyline({{x0, y0}, {x1, y1}}, width, c);
  }
  void marker(double x, double y, char kind, double r, Color c) {
    if (!cr_) return;
    switch (kind) {
      case 'x':
        cairo_move_to(cr_, x - r, y - r);
        cairo_line_to(cr_, x + r, y + r);
        cairo_move_to(cr_, x - r, y + r);
        cairo_line_to(cr_, x + r, y - r);
        break;
      case '+':
        cairo_move_to(cr_, x - r, y);
        cairo_line_to(cr_, x + r, y);
        cairo_move_to(cr_, x, y - r);
        cairo_line_to(cr_, x, y + r);
        break;
      case 's':
        cairo_rectangle(cr_, x - r, y - r, 2 * r, 2 * r);
        break;
      case 'o':
        cairo_new_sub_path(cr_);
        cairo_arc(cr_, x, y, r, 0, 2 * M_PI);
        break;
      case '.':
        cairo_new_sub_path(cr_);
        cairo_arc(cr_, x, y, r * 0.6, 0, 2 * M_PI);
        set_color(c);
        cairo_fill(cr_);
        return;
      default:
        return;
    }
    stroke(1.5, c);
  }
  /// Text whose capitals' top edge is at y.
  void text(double x, double y, const std::string& s, Color c, Align align,
            Font font = Font::kText) {
    if (texts_) texts_->push_back(s);
    if (!cr_ || s.empty()) return;
    const double w = m_.width(s, font);
    const double left = align == Align::kLeft ? x : align == Align::kCenter ? x - w / 2 : x - w;
    use_font(cr_, font);
    set_color(c);
    cairo_move_to(cr_, left, y + m_.cap_height(font));
    cairo_show_text(cr_, s.c_str());
    cairo_new_path(cr_);
  }

 private:
  void set_color(Color c) { cairo_set_source_rgb(cr_, c.r, c.g, c.b); }
  void stroke(double width, Color c) {
    cairo_set_line_width(cr_, width);
    set_color(c);
    cairo_stroke(cr_);
  }

  cairo_t* cr_;
  const TextMeasure& m_;
  std::vector<std::string>* texts_;
};

void draw_plot(Drawer& p, const Layout& L, const std::vector<PlotSeries>& series,
               const PlotLook& look, const TextMeasure& m) {
  const double text_h = m.cap_height();
  auto snap = [](double v) { return std::floor(v) + 0.5; };
  p.fill_rect(0, 0, L.width, L.height, kWhite);
  if (look.grid) {
    for (double t : L.x.ticks)
      p.line(snap(L.map_x(t)), L.py0, snap(L.map_x(t)), L.py1, 1.0, kGridColor);
    for (double t : L.y.ticks)
      p.line(L.px0, snap(L.map_y(t)), L.px1, snap(L.map_y(t)), 1.0, kGridColor);
  }
  for (size_t i = 0; i < series.size(); ++i) {
    const Color c = kPalette[i % std::size(kPalette)];
    std::vector<std::pair<double, double>> run;
    auto flush = [&]() {
      if (run.size() > 1) p.polyline(run, kLineWidth, c);
      run.clear();
    };
    for (const auto& pt : series[i].points) {
      if (!finite_point(pt)) {
        flush();
        continue;
      }
      run.emplace_back(L.map_x(pt.first), L.map_y(pt.second));
    }
    flush();
    if (look.marker) {
      for (const auto& pt : series[i].points) {
        if (finite_point(pt))
          p.marker(L.map_x(pt.first), L.map_y(pt.second), look.marker, kMarkerRadius, c);
      }
    }
  }
  p.stroke_rect(L.px0, L.py0, L.px1 - L.px0, L.py1 - L.py0, kBlack);
  for (size_t i = 0; i < L.x.ticks.size(); ++i) {
    const double x = snap(L.map_x(L.x.ticks[i]));
    p.line(x, L.py1, x, L.py1 + kTickLength, 1.0, kBlack);
    p.text(x, L.py1 + kTickLength + 6, L.x.labels[i], kTextColor, Align::kCenter);
  }
  for (size_t i = 0; i < L.y.ticks.size(); ++i) {
    const double y = snap(L.map_y(L.y.ticks[i]));
    p.line(L.px0 - kTickLength, y, L.px0, y, 1.0, kBlack);
    p.text(L.px0 - kTickLength - 6, y - text_h / 2, L.y.labels[i], kTextColor, Align::kRight);
  }
  const double center = (L.px0 + L.px1) / 2;
  if (!look.x_label.empty()) {
    p.text(center, L.py1 + kTickLength + 6 + text_h + 12, look.x_label, kTextColor, Align::kCenter);
  }
  if (!look.title.empty()) {
    // Centred over the plot, but kept inside the image when it is wider than the plot.
    const double half = m.width(look.title, Font::kTitle) / 2;
    const double x =
        std::clamp(center, kMargin + half, std::max(kMargin + half, L.width - kMargin - half));
    p.text(x, kMargin, look.title, kBlack, Align::kCenter, Font::kTitle);
  }
  if (!series.empty()) {
    p.fill_rect(L.legend_x, L.legend_y, L.legend_w, L.legend_h, kWhite);
    p.stroke_rect(std::floor(L.legend_x) + 0.5, L.legend_y, std::floor(L.legend_w),
                  std::floor(L.legend_h), kLegendBorder);
    for (size_t i = 0; i < series.size(); ++i) {
      const Color c = kPalette[i % std::size(kPalette)];
      const double cy = L.legend_y + 4 + L.legend_line * (i + 0.5);
      p.line(L.legend_x + 10, cy, L.legend_x + 40, cy, kLineWidth, c);
      if (look.marker) p.marker(L.legend_x + 25, cy, look.marker, kMarkerRadius, c);
      p.text(L.legend_x + 48, cy - text_h / 2, series[i].label, kTextColor, Align::kLeft);
    }
  }
}

cairo_status_t append_to_string(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

// Draws the plot onto `surface` (of the layout's size) and finishes it.
void render(cairo_surface_t* surface, const Layout& L, const std::vector<PlotSeries>& series,
            const PlotLook& look, const TextMeasure& m) {
  check_cairo(cairo_surface_status(surface), "to create the image");
  CairoPtr cr(cairo_create(surface), cairo_destroy);
  check_cairo(cairo_status(cr.get()), "to start drawing");
  set_up(cr.get());
  Drawer drawer(cr.get(), m);
  draw_plot(drawer, L, series, look, m);
  check_cairo(cairo_status(cr.get()), "while drawing the plot");
  cr.reset();
  cairo_surface_flush(surface);
}

}  // namespace

std::vector<std::string> plot_texts(const std::vector<PlotSeries>& series, const PlotLook& look) {
  const TextMeasure m;
  const Layout L = make_layout(series, look, m);
  std::vector<std::string> texts;
  Drawer lister(nullptr, m, &texts);
  draw_plot(lister, L, series, look, m);
  return texts;
}

std::string render_plot_svg(const std::vector<PlotSeries>& series, const PlotLook& look) {
  const TextMeasure m;
  const Layout L = make_layout(series, look, m);
  std::string out;
  SurfacePtr surface(
      cairo_svg_surface_create_for_stream(append_to_string, &out, L.width, L.height),
      cairo_surface_destroy);
  render(surface.get(), L, series, look, m);
  cairo_surface_finish(surface.get());
  check_cairo(cairo_surface_status(surface.get()), "to write the SVG document");
  return out;
}

std::string render_plot_png(const std::vector<PlotSeries>& series, const PlotLook& look) {
  const TextMeasure m;
  const Layout L = make_layout(series, look, m);
  SurfacePtr surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, L.width, L.height),
                     cairo_surface_destroy);
  render(surface.get(), L, series, look, m);
  std::string out;
  check_cairo(cairo_surface_write_to_png_stream(surface.get(), append_to_string, &out),
              "to encode the PNG image");
  return out;
}

#else  // !KUSARI_HAVE_CAIRO

namespace {
[[noreturn]] void no_cairo(const char* what) {
  KUSARI_THROW(NotImplementedError, "PlotReport: ", what,
               ": this build of kusari has no cairo (install libcairo2-dev and rebuild)");
}
}  // namespace

std::vector<std::string> plot_texts(const std::vector<PlotSeries>&, const PlotLook&) { no_cairo("plot_texts"); }
std::string render_plot_svg(const std::vector<PlotSeries>&, const PlotLook&) { no_cairo("SVG"); }
std::string render_plot_png(const std::vector<PlotSeries>&, const PlotLook&) { no_cairo("PNG"); }

#endif  // KUSARI_HAVE_CAIRO

}  // namespace kusari::training::detail
