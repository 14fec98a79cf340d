// PlotReport: PNG files that libpng decodes, SVG files holding the series, the points kept,
// resume, and the renderer's edge cases.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "kusari/config.h"
#include "kusari/training/extensions.h"
#include "test_util.h"
#include "training/extensions/plot.h"
#include "training_test_util.h"

#if KUSARI_HAVE_PNG
#include <png.h>
#endif

namespace kusari::training::extensions {
namespace {

using testing::make_setup;
using testing::MapSerializer;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

uint32_t big_endian(const std::string& bytes, size_t offset) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(bytes[offset + i]);
  return v;
}

#if KUSARI_HAVE_PNG

// Decodes a PNG file to RGB with libpng's simplified API.
struct Decoded {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> rgb;
  size_t count_near(uint8_t r, uint8_t g, uint8_t b, int tolerance = 8) const {
    size_t n = 0;
    for (size_t i = 0; i + 2 < rgb.size(); i += 3) {
      if (std::abs(rgb[i] - r) <= tolerance && std::abs(rgb[i + 1] - g) <= tolerance &&
          std::abs(rgb[i + 2] - b) <= tolerance) {
        ++n;
      }
    }
    return n;
  }
};

Decoded decode_png(const std::string& path) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  Decoded d;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    ADD_FAILURE() << "libpng cannot read " << path << ": " << image.message;
    return d;
  }
  image.format = PNG_FORMAT_RGB;
  d.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, d.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << "libpng cannot decode " << path << ": " << image.message;
    return d;
  }
  d.width = image.width;
  d.height = image.height;
  return d;
}

TEST(PlotReportTest, WritesAPngThatLibpngDecodes) {
  const std::string out = testing::fresh_out_dir("plot_png");
  auto s = make_setup(out, interval(4, "epoch"));
  auto plot = std::make_shared<PlotReport>(std::vector<std::string>{"main/loss", "main/x_mean"},
                                           "epoch", nullptr, "plot.png");
  s.trainer->extend(plot);
  s.trainer->run();

  const std::string bytes = read_file(out + "/plot.png");
  ASSERT_GT(bytes.size(), 33u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  // The first chunk is IHDR: 13 bytes of width, height, depth 8, colour type 2 (RGB), ...
  EXPECT_EQ(big_endian(bytes, 8), 13u);
  EXPECT_EQ(bytes.substr(12, 4), "IHDR");
  const uint32_t width = big_endian(bytes, 16), height = big_endian(bytes, 20);
  EXPECT_GE(width, 800u);
  EXPECT_GE(height, 500u);
  EXPECT_EQ(static_cast<uint8_t>(bytes[24]), 8);
  EXPECT_EQ(static_cast<uint8_t>(bytes[25]), 2);
  EXPECT_EQ(static_cast<uint8_t>(bytes[26]), 0);  // compression
  EXPECT_EQ(static_cast<uint8_t>(bytes[28]), 0);  // no interlace
  EXPECT_EQ(bytes.substr(bytes.size() - 8, 4), "IEND");

  const Decoded image = decode_png(out + "/plot.png");
  EXPECT_EQ(image.width, width);
  EXPECT_EQ(image.height, height);
  ASSERT_EQ(image.rgb.size(), static_cast<size_t>(width) * height * 3);
  EXPECT_EQ(image.rgb[0], 255);  // white background in the corner
  EXPECT_GT(image.count_near(31, 119, 180), 100u) << "the first series (blue) is drawn";
  EXPECT_GT(image.count_near(255, 127, 14), 100u) << "the second series (orange) is drawn";
  EXPECT_GT(image.count_near(0, 0, 0, 0), 1000u) << "axes and title are drawn";

  ASSERT_EQ(plot->data().at("main/x_mean").size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(plot->data().at("main/x_mean")[i].first, static_cast<double>(i + 1));
    EXPECT_DOUBLE_EQ(plot->data().at("main/x_mean")[i].second, 2.5);
  }
  EXPECT_EQ(bytes, plot->render_png());
  std::vector<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(out))
    files.push_back(f.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"plot.png"}) << "no temporary files are left behind";
}

#else

TEST(PlotReportTest, PngWithoutLibpngSuggestsSvg) {
  try {
    PlotReport({"main/loss"}, "epoch", nullptr, "loss.png");
    ADD_FAILURE() << "a .png filename should be rejected without libpng";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find(".svg"), std::string::npos) << e.what();
  }
}

#endif

TEST(PlotReportTest, WritesAnSvgHoldingTheSeries) {
  const std::string out = testing::fresh_out_dir("plot_svg");
  auto s = make_setup(out, interval(12, "iteration"));
  PlotStyle style;
  style.marker = 'o';
  style.title = "loss & mean <per 3 iterations>";
  s.trainer->extend(PlotReport({"main/loss", "main/x_mean", "never/reported"}, "iteration",
                               interval(3, "iteration"), "plot.svg", style));
  s.trainer->run();
  const std::string svg = read_file(out + "/plot.svg");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("<title>loss &amp; mean &lt;per 3 iterations&gt;</title>"), std::string::npos);
  EXPECT_NE(svg.find("<g class=\"series\" data-label=\"main/loss\">"), std::string::npos);
  EXPECT_NE(svg.find("<g class=\"series\" data-label=\"main/x_mean\">"), std::string::npos);
  EXPECT_EQ(svg.find("never/reported"), std::string::npos) << "keys without points are left out";
  EXPECT_NE(svg.find(">main/loss</text>"), std::string::npos) << "legend";
  EXPECT_NE(svg.find(">iteration</text>"), std::string::npos) << "x axis label";
  // Each series is one polyline of 4 points (iterations 3, 6, 9, 12) with a circle per point.
  const size_t series = svg.find("data-label=\"main/x_mean\"");
  const size_t points = svg.find("points=\"", series);
  ASSERT_NE(points, std::string::npos);
  const std::string list = svg.substr(points + 8, svg.find('"', points + 8) - points - 8);
  EXPECT_EQ(std::count(list.begin(), list.end(), ','), 4) << list;
  size_t circles = 0;
  for (size_t at = svg.find("<circle", series);
       at != std::string::npos && at < svg.find("</g>", series); at = svg.find("<circle", at + 1)) {
    ++circles;
  }
  EXPECT_EQ(circles, 4u);
  // Tick labels of the iteration axis are integers.
  EXPECT_NE(svg.find(">6</text>"), std::string::npos);
  EXPECT_EQ(svg.find(".5</text>"), std::string::npos);
}

TEST(PlotReportTest, ResumeKeepsThePoints) {
  auto store = std::make_shared<MapSerializer::Store>();
  const std::string out = testing::fresh_out_dir("plot_resume");
  {
    auto s = make_setup(out, interval(2, "epoch"));
    s.trainer->extend(PlotReport({"main/x_mean"}, "epoch", nullptr, "plot.svg"));
    s.trainer->run();
    MapSerializer saver(store, false);
    s.trainer->serialize(saver);
  }
  EXPECT_TRUE(store->count("extensions/PlotReport/_plot_plot.svg"));
  auto s = make_setup(out, interval(3, "epoch"));
  auto plot = std::make_shared<PlotReport>(std::vector<std::string>{"main/x_mean"}, "epoch",
                                           nullptr, "plot.svg");
  s.trainer->extend(plot);
  MapSerializer loader(store, true);
  s.trainer->serialize(loader);
  s.trainer->run();
  const auto& points = plot->data().at("main/x_mean");
  ASSERT_EQ(points.size(), 3u);
  EXPECT_DOUBLE_EQ(points[0].first, 1.0);
  EXPECT_DOUBLE_EQ(points[2].first, 3.0);
}

TEST(PlotReportTest, RejectsBadArguments) {
  EXPECT_THROW(PlotReport({"main/loss"}, "epoch", nullptr, "plot.jpg"), ValueError);
  EXPECT_THROW(PlotReport({}, "epoch", nullptr, "plot.svg"), ValueError);
  PlotStyle bad_marker;
  bad_marker.marker = '*';
  EXPECT_THROW(PlotReport({"main/loss"}, "epoch", nullptr, "plot.svg", bad_marker), ValueError);
  auto s = make_setup(testing::fresh_out_dir("plot_bad_x"), interval(1, "epoch"));
  s.trainer->extend(PlotReport({"main/loss"}, "not/reported", nullptr, "plot.svg"));
  EXPECT_THROW(s.trainer->run(), ValueError);
}

TEST(PlotRendererTest, EdgeCases) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  detail::PlotLook look;
  look.title = "edge cases";
  look.x_label = "epoch";
  const std::vector<std::vector<detail::PlotSeries>> cases = {
      {},                                                // nothing at all
      {{"one point", {{1, 5}}}},                         // a single point
      {{"flat", {{1, 0}, {2, 0}, {3, 0}}}},              // zero range
      {{"gaps", {{1, 1}, {2, nan}, {3, inf}, {4, 2}}}},  // non-finite values break the line
      {{"tiny", {{0.5, 1e-9}, {1.5, 3e-9}}}, {"huge", {{1, 1e12}}}},  // extreme magnitudes
      {{std::string(120, 'k'), {{1, 1}, {2, 2}}}},                    // a very long legend label
  };
  for (const auto& series : cases) {
    detail::Raster r = detail::render_plot_raster(series, look);
    EXPECT_GE(r.width, look.width);
    EXPECT_GE(r.height, look.height);
    EXPECT_EQ(r.rgb.size(), static_cast<size_t>(r.width) * r.height * 3);
    const std::string svg = detail::render_plot_svg(series, look);
    EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
    EXPECT_EQ(svg.find("inf"), std::string::npos) << svg;
  }
}

}  // namespace
}  // namespace kusari::training::extensions
