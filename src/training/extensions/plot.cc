#include "training/extensions/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "kusari/config.h"
#include "kusari/core/error.h"
#include "training/extensions/bitmap_font.h"

#if KUSARI_HAVE_PNG
#include <png.h>

#include <csetjmp>
#endif

namespace kusari::training::detail {

namespace {

struct Color {
  uint8_t r, g, b;
};

constexpr Color kWhite{255, 255, 255};
constexpr Color kBlack{0, 0, 0};
constexpr Color kGridColor{221, 221, 221};
constexpr Color kLegendBorder{190, 190, 190};
constexpr Color kTextColor{34, 34, 34};
// matplotlib's default cycle ("tab10"), so plots look like Chainer's.
constexpr Color kPalette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                              {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                              {188, 189, 34},  {23, 190, 207}};

constexpr int kTextScale = 2;
constexpr double kMargin = 14;
constexpr double kTickLength = 5;
constexpr double kLineWidth = 2;
constexpr double kMarkerRadius = 4;

enum class Align { kLeft, kCenter, kRight };

double text_width(const std::string& s, int scale) {
  return s.empty() ? 0.0 : static_cast<double>(s.size() * kGlyphAdvance - 1) * scale;
}
double cap_height(int scale) {
  return static_cast<double>(kGlyphCapHeight * scale);
}

// --- painters ------------------------------------------------------------------------------------

// The drawing operations a plot needs; the layout code draws through it onto SVG or a raster.
class Painter {
 public:
  virtual ~Painter() = default;
  virtual void fill_rect(double x, double y, double w, double h, Color c) = 0;
  /// A 1-pixel outline.
  virtual void stroke_rect(double x, double y, double w, double h, Color c) = 0;
  virtual void polyline(const std::vector<std::pair<double, double>>& points, double width,
                        Color c) = 0;
  void line(double x0, double y0, double x1, double y1, double width, Color c) {
    polyline({{x0, y0}, {x1, y1}}, width, c);
  }
  virtual void marker(double x, double y, char kind, double radius, Color c) = 0;
  /// Text whose capitals' top edge is at y.
  virtual void text(double x, double y, const std::string& s, Color c, Align align) = 0;
  /// Groups what follows under a series label (SVG only).
  virtual void begin_series(const std::string& label) {}
  virtual void end_series() {}
};

class RasterPainter : public Painter {
 public:
  explicit RasterPainter(Raster& r) : r_(r) {}

  void fill_rect(double x, double y, double w, double h, Color c) override {
    const int x0 = std::max(0, static_cast<int>(std::lround(x)));
    const int y0 = std::max(0, static_cast<int>(std::lround(y)));
    const int x1 = std::min(r_.width, static_cast<int>(std::lround(x + w)));
    const int y1 = std::min(r_.height, static_cast<int>(std::lround(y + h)));
    for (int iy = y0; iy < y1; ++iy) {
      for (int ix = x0; ix < x1; ++ix) blend(ix, iy, c, 1.0);
    }
  }

  void stroke_rect(double x, double y, double w, double h, Color c) override {
    polyline({{x, y}, {x + w, y}, {x + w, y + h}, {x, y + h}, {x, y}}, 1.0, c);
  }

  // Anti-aliased: each pixel is covered by the distance of its centre to the nearest segment;
  // the coverage of all segments is combined with max() so joints are not drawn twice.
  void polyline(const std::vector<std::pair<double, double>>& pts, double width, Color c) override {
    if (pts.empty()) return;
    const double hw = width / 2;
    double bx0 = pts[0].first, bx1 = bx0, by0 = pts[0].second, by1 = by0;
    for (const auto& [x, y] : pts) {
      bx0 = std::min(bx0, x), bx1 = std::max(bx1, x), by0 = std::min(by0, y),
      by1 = std::max(by1, y);
    }
    const int x0 = std::max(0, static_cast<int>(std::floor(bx0 - hw - 1)));
    const int x1 = std::min(r_.width - 1, static_cast<int>(std::ceil(bx1 + hw + 1)));
    const int y0 = std::max(0, static_cast<int>(std::floor(by0 - hw - 1)));
    const int y1 = std::min(r_.height - 1, static_cast<int>(std::ceil(by1 + hw + 1)));
    if (x0 > x1 || y0 > y1) return;
    const int w = x1 - x0 + 1;
    std::vector<float> cover(static_cast<size_t>(w) * (y1 - y0 + 1), 0.0f);
    auto segment = [&](double ax, double ay, double bx, double by) {
      const int sx0 = std::max(x0, static_cast<int>(std::floor(std::min(ax, bx) - hw - 1)));
      const int sx1 = std::min(x1, static_cast<int>(std::ceil(std::max(ax, bx) + hw + 1)));
      const int sy0 = std::max(y0, static_cast<int>(std::floor(std::min(ay, by) - hw - 1)));
      const int sy1 = std::min(y1, static_cast<int>(std::ceil(std::max(ay, by) + hw + 1)));
      const double dx = bx - ax, dy = by - ay, len2 = dx * dx + dy * dy;
      for (int iy = sy0; iy <= sy1; ++iy) {
        for (int ix = sx0; ix <= sx1; ++ix) {
          const double px = ix + 0.5, py = iy + 0.5;
          double t = len2 > 0 ? ((px - ax) * dx + (py - ay) * dy) / len2 : 0.0;
          t = std::clamp(t, 0.0, 1.0);
          const double d = std::hypot(px - (ax + t * dx), py - (ay + t * dy));
          const float cov = static_cast<float>(std::clamp(hw + 0.5 - d, 0.0, 1.0));
          float& cell = cover[static_cast<size_t>(iy - y0) * w + (ix - x0)];
          cell = std::max(cell, cov);
        }
      }
    };
    if (pts.size() == 1) segment(pts[0].first, pts[0].second, pts[0].first, pts[0].second);
    for (size_t i = 1; i < pts.size(); ++i)
      segment(pts[i - 1].first, pts[i - 1].second, pts[i].first, pts[i].second);
    for (int iy = y0; iy <= y1; ++iy) {
      for (int ix = x0; ix <= x1; ++ix) {
        const float cov = cover[static_cast<size_t>(iy - y0) * w + (ix - x0)];
        if (cov > 0) blend(ix, iy, c, cov);
      }
    }
  }

  void marker(double x, double y, char kind, double r, Color c) override {
    switch (kind) {
      case 'x':
        line(x - r, y - r, x + r, y + r, 1.5, c);
        line(x - r, y + r, x + r, y - r, 1.5, c);
        break;
      case '+':
        line(x - r, y, x + r, y, 1.5, c);
        line(x, y - r, x, y + r, 1.5, c);
        break;
      case 's':
        polyline({{x - r, y - r}, {x + r, y - r}, {x + r, y + r}, {x - r, y + r}, {x - r, y - r}},
                 1.5, c);
        break;
      case 'o':
      case '.': {
        const double radius = kind == 'o' ? r : r * 0.6;
        for (int iy = static_cast<int>(std::floor(y - r - 2));
             iy <= static_cast<int>(std::ceil(y + r + 2)); ++iy) {
          for (int ix = static_cast<int>(std::floor(x - r - 2));
               ix <= static_cast<int>(std::ceil(x + r + 2)); ++ix) {
            const double d = std::hypot(ix + 0.5 - x, iy + 0.5 - y);
            // A ring of width 1.5 for 'o', a filled disc for '.'.
            const double cov = kind == 'o' ? std::clamp(0.75 + 0.5 - std::abs(d - radius), 0.0, 1.0)
                                           : std::clamp(radius + 0.5 - d, 0.0, 1.0);
            if (cov > 0) blend(ix, iy, c, cov);
          }
        }
        break;
      }
      default:
        break;
    }
  }

  void text(double x, double y, const std::string& s, Color c, Align align) override {
    const double w = text_width(s, kTextScale);
    double left = align == Align::kLeft ? x : align == Align::kCenter ? x - w / 2 : x - w;
    const int x0 = static_cast<int>(std::lround(left));
    const int y0 = static_cast<int>(std::lround(y));
    for (size_t i = 0; i < s.size(); ++i) {
      const uint8_t* rows = glyph_rows(s[i]);
      const int gx = x0 + static_cast<int>(i) * kGlyphAdvance * kTextScale;
      for (int row = 0; row < kGlyphHeight; ++row) {
        for (int col = 0; col < kGlyphWidth; ++col) {
          if (!(rows[row] & (1 << (kGlyphWidth - 1 - col)))) continue;
          for (int dy = 0; dy < kTextScale; ++dy) {
            for (int dx = 0; dx < kTextScale; ++dx) {
              blend(gx + col * kTextScale + dx, y0 + row * kTextScale + dy, c, 1.0);
            }
          }
        }
      }
    }
  }

 private:
  void blend(int x, int y, Color c, double a) {
    if (x < 0 || y < 0 || x >= r_.width || y >= r_.height) return;
    uint8_t* p = &r_.rgb[(static_cast<size_t>(y) * r_.width + x) * 3];
    p[0] = static_cast<uint8_t>(std::lround(p[0] * (1 - a) + c.r * a));
    p[1] = static_cast<uint8_t>(std::lround(p[1] * (1 - a) + c.g * a));
    p[2] = static_cast<uint8_t>(std::lround(p[2] * (1 - a) + c.b * a));
  }

  Raster& r_;
};

std::string svg_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  std::string s(buf);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

std::string svg_color(Color c) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", c.r, c.g, c.b);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(ch) >= 0x20 || ch == '\t' || ch == '\n') out += ch;
    }
  }
  return out;
}

class SvgPainter : public Painter {
 public:
  explicit SvgPainter(std::ostringstream& os) : os_(os) {}

  void fill_rect(double x, double y, double w, double h, Color c) override {
    os_ << "<rect x=\"" << svg_number(x) << "\" y=\"" << svg_number(y) << "\" width=\""
        << svg_number(w) << "\" height=\"" << svg_number(h) << "\" fill=\"" << svg_color(c)
        << "\"/>\n";
  }
  void stroke_rect(double x, double y, double w, double h, Color c) override {
    os_ << "<rect x=\"" << svg_number(x) << "\" y=\"" << svg_number(y) << "\" width=\""
        << svg_number(w) << "\" height=\"" << svg_number(h) << "\" fill=\"none\" stroke=\""
        << svg_color(c) << "\" stroke-width=\"1\"/>\n";
  }
  void polyline(const std::vector<std::pair<double, double>>& pts, double width, Color c) override {
    os_ << "<polyline fill=\"none\" stroke=\"" << svg_color(c) << "\" stroke-width=\""
        << svg_number(width) << "\" stroke-linejoin=\"round\" stroke-linecap=\"round\" points=\"";
    for (size_t i = 0; i < pts.size(); ++i) {
      os_ << (i ? " " : "") << svg_number(pts[i].first) << "," << svg_number(pts[i].second);
    }
    os_ << "\"/>\n";
  }
  void marker(double x, double y, char kind, double r, Color c) override {
    const std::string stroke = "stroke=\"" + svg_color(c) + "\" stroke-width=\"1.5\"";
    auto p = [](double v) { return svg_number(v); };
    switch (kind) {
      case 'x':
        os_ << "<path fill=\"none\" " << stroke << " d=\"M" << p(x - r) << "," << p(y - r) << "L"
            << p(x + r) << "," << p(y + r) << "M" << p(x - r) << "," << p(y + r) << "L" << p(x + r)
            << "," << p(y - r) << "\"/>\n";
        break;
      case '+':
        os_ << "<path fill=\"none\" " << stroke << " d=\"M" << p(x - r) << "," << p(y) << "L"
            << p(x + r) << "," << p(y) << "M" << p(x) << "," << p(y - r) << "L" << p(x) << ","
            << p(y + r) << "\"/>\n";
        break;
      case 's':
        os_ << "<rect fill=\"none\" " << stroke << " x=\"" << p(x - r) << "\" y=\"" << p(y - r)
            << "\" width=\"" << p(2 * r) << "\" height=\"" << p(2 * r) << "\"/>\n";
        break;
      case 'o':
        os_ << "<circle fill=\"none\" " << stroke << " cx=\"" << p(x) << "\" cy=\"" << p(y)
            << "\" r=\"" << p(r) << "\"/>\n";
        break;
      case '.':
        os_ << "<circle fill=\"" << svg_color(c) << "\" cx=\"" << p(x) << "\" cy=\"" << p(y)
            << "\" r=\"" << p(r * 0.6) << "\"/>\n";
        break;
      default:
        break;
    }
  }
  void text(double x, double y, const std::string& s, Color c, Align align) override {
    const char* anchor = align == Align::kLeft     ? "start"
                         : align == Align::kCenter ? "middle"
                                                   : "end";
    // A monospace font of size 10*scale advances about 6*scale per character, like the bitmap font.
    os_ << "<text x=\"" << svg_number(x) << "\" y=\"" << svg_number(y + cap_height(kTextScale))
        << "\" font-family=\"monospace\" font-size=\"" << 10 * kTextScale << "\" fill=\""
        << svg_color(c) << "\" text-anchor=\"" << anchor << "\">" << xml_escape(s) << "</text>\n";
  }
  void begin_series(const std::string& label) override {
    os_ << "<g class=\"series\" data-label=\"" << xml_escape(label) << "\">\n";
  }
  void end_series() override { os_ << "</g>\n"; }

 private:
  std::ostringstream& os_;
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

Layout make_layout(const std::vector<PlotSeries>& series, const PlotLook& look, int x_target,
                   int y_target) {
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

  const double text_h = cap_height(kTextScale);
  double ytick_w = 0, xtick_w = 0;
  for (const auto& s : L.y.labels) ytick_w = std::max(ytick_w, text_width(s, kTextScale));
  for (const auto& s : L.x.labels) xtick_w = std::max(xtick_w, text_width(s, kTextScale));
  double legend_text_w = 0;
  for (const PlotSeries& s : series)
    legend_text_w = std::max(legend_text_w, text_width(s.label, kTextScale));

  L.legend_line = kGlyphHeight * kTextScale + 8;
  L.legend_w = series.empty() ? 0 : 10 + 30 + 8 + legend_text_w + 10;
  L.legend_h = series.empty() ? 0 : 8 + series.size() * L.legend_line;

  const double left = std::max(kMargin + ytick_w + 6 + kTickLength, xtick_w / 2 + 4);
  const double top = kMargin + (look.title.empty() ? 0 : text_h + 16);
  const double bottom =
      kMargin + kTickLength + 6 + text_h + (look.x_label.empty() ? 0 : 12 + text_h);
  const double right = std::max(kMargin + (series.empty() ? 0 : L.legend_w + 16), xtick_w / 2 + 4);
  const double title_w = text_width(look.title, kTextScale) + 2 * kMargin;
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
Layout make_layout(const std::vector<PlotSeries>& series, const PlotLook& look) {
  int x_target = 8, y_target = 6;
  for (;;) {
    Layout L = make_layout(series, look, x_target, y_target);
    double label_w = 0;
    for (const auto& s : L.x.labels) label_w = std::max(label_w, text_width(s, kTextScale));
    const bool x_fits = tick_spacing(L.x, L.px1 - L.px0) >= label_w + 30 || x_target <= 2;
    const bool y_fits =
        tick_spacing(L.y, L.py1 - L.py0) >= cap_height(kTextScale) + 12 || y_target <= 2;
    if (x_fits && y_fits) return L;
    if (!x_fits) --x_target;
    if (!y_fits) --y_target;
  }
}

void draw_plot(Painter& p, const Layout& L, const std::vector<PlotSeries>& series,
               const PlotLook& look) {
  const double text_h = cap_height(kTextScale);
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
    p.begin_series(series[i].label);
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
    p.end_series();
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
    const double half = text_width(look.title, kTextScale) / 2;
    const double x =
        std::clamp(center, kMargin + half, std::max(kMargin + half, L.width - kMargin - half));
    p.text(x, kMargin, look.title, kBlack, Align::kCenter);
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

#if KUSARI_HAVE_PNG
void png_write_to_string(png_structp png, png_bytep data, png_size_t length) {
  static_cast<std::string*>(png_get_io_ptr(png))
      ->append(reinterpret_cast<const char*>(data), length);
}
void png_flush_nothing(png_structp) {}
void png_record_error(png_structp png, png_const_charp message) {
  auto* error = static_cast<std::string*>(png_get_error_ptr(png));
  if (error) *error = message;
  png_longjmp(png, 1);
}
void png_ignore_warning(png_structp, png_const_charp) {}

// Note [libpng errors]
// libpng reports errors by longjmp to the setjmp below. This function holds no object with a
// destructor between setjmp and the libpng calls, so the jump skips no destructor; the
// caller owns every buffer.
bool encode_png_rows(int width, int height, png_bytep* rows, std::string* out, std::string* error) {
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, error, png_record_error, png_ignore_warning);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_set_write_fn(png, out, png_write_to_string, png_flush_nothing);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width), static_cast<png_uint_32>(height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}
#endif

}  // namespace

std::string render_plot_svg(const std::vector<PlotSeries>& series, const PlotLook& look) {
  const Layout L = make_layout(series, look);
  std::ostringstream os;
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
     << "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" << L.width
     << "\" height=\"" << L.height << "\" viewBox=\"0 0 " << L.width << " " << L.height << "\">\n";
  if (!look.title.empty()) os << "<title>" << xml_escape(look.title) << "</title>\n";
  SvgPainter painter(os);
  draw_plot(painter, L, series, look);
  os << "</svg>\n";
  return os.str();
}

Raster render_plot_raster(const std::vector<PlotSeries>& series, const PlotLook& look) {
  const Layout L = make_layout(series, look);
  Raster r;
  r.width = L.width;
  r.height = L.height;
  r.rgb.assign(static_cast<size_t>(r.width) * r.height * 3, 255);
  RasterPainter painter(r);
  draw_plot(painter, L, series, look);
  return r;
}

bool png_supported() {
  return KUSARI_HAVE_PNG != 0;
}

std::string encode_png(const Raster& raster) {
#if KUSARI_HAVE_PNG
  KUSARI_CHECK(raster.width > 0 && raster.height > 0 &&
                   raster.rgb.size() == static_cast<size_t>(raster.width) * raster.height * 3,
               ValueError, "encode_png: the raster's size ", raster.width, "x", raster.height,
               " does not match its ", raster.rgb.size(), " bytes");
  std::vector<png_bytep> rows(static_cast<size_t>(raster.height));
  for (int y = 0; y < raster.height; ++y) {
    rows[y] = const_cast<png_bytep>(raster.rgb.data() + static_cast<size_t>(y) * raster.width * 3);
  }
  std::string out, error;
  KUSARI_CHECK(encode_png_rows(raster.width, raster.height, rows.data(), &out, &error), IOError,
               "encode_png: libpng failed to encode a ", raster.width, "x", raster.height,
               " image: ", error.empty() ? "out of memory" : error);
  return out;
#else
  KUSARI_THROW(
      NotImplementedError,
      "encode_png: this build of kusari has no libpng (KUSARI_HAVE_PNG is 0); write SVG instead");
#endif
}

}  // namespace kusari::training::detail
