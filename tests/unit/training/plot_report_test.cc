// PlotReport: PNG files that libpng decodes, SVG files holding the series, the texts drawn, the
// points kept, resume, and the renderer's edge cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include <png.h>

#include "kusari/core/build.h"
#include "kusari/training/extensions.h"
#include "test_util.h"
#include "training/extensions/plot.h"
#include "training_test_util.h"

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

Decoded decode_png_bytes(const std::string& bytes, const std::string& what) {
  png_image image;
  std::memset(&image, 0, sizeof(image));
  image.version = PNG_IMAGE_VERSION;
  Decoded d;
  if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size())) {
    ADD_FAILURE() << "libpng cannot read " << what << ": " << image.message;
    return d;
  }
  image.format = PNG_FORMAT_RGB;
  d.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, d.rgb.data(), 0, nullptr)) {
    ADD_FAILURE() << "libpng cannot decode " << what << ": " << image.message;
    return d;
  }
  d.width = image.width;
  d.height = image.height;
  return d;
}

Decoded decode_png(const std::string& path) {
  return decode_png_bytes(read_file(path), path);
}

TEST(PlotReportTest, WritesAPngThatLibpngDecodes) {
  if (!build_info().cairo) GTEST_SKIP() << "this build of kusari has no cairo: PlotReport draws nothing";
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

// cairo's percentage form of an 8-bit colour in SVG styles: "rgb(100%,49.803922%,5.490196%)".
std::string svg_color(int r, int g, int b) {
  auto percent = [](int v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%f", v / 2.55);
    std::string s = buf;
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
    return s + "%";
  };
  return "rgb(" + percent(r) + "," + percent(g) + "," + percent(b) + ")";
}

TEST(PlotReportTest, WritesAnSvgHoldingTheSeries) {
  if (!build_info().cairo) GTEST_SKIP() << "this build of kusari has no cairo: PlotReport draws nothing";
  const std::string out = testing::fresh_out_dir("plot_svg");
  auto s = make_setup(out, interval(12, "iteration"));
  PlotStyle style;
  style.marker = 'o';
  style.title = "loss & mean <per 3 iterations>";
  const std::vector<std::string> keys{"main/loss", "main/x_mean", "never/reported"};
  auto plot = std::make_shared<PlotReport>(keys, "iteration", interval(3, "iteration"),
                                           "plot.svg", style);
  s.trainer->extend(plot);
  s.trainer->run();
  const std::string svg = read_file(out + "/plot.svg");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("viewBox=\"0 0 800 500\""), std::string::npos) << "the image size";
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  // The two series with points are drawn in the first two colours of the cycle; the key without
  // points gets no line (and so the third colour is not used).
  EXPECT_NE(svg.find(svg_color(31, 119, 180)), std::string::npos) << "main/loss (blue)";
  EXPECT_NE(svg.find(svg_color(255, 127, 14)), std::string::npos) << "main/x_mean (orange)";
  EXPECT_EQ(svg.find(svg_color(44, 160, 44)), std::string::npos) << "never/reported is left out";
  // Text is drawn as glyph outlines.
  EXPECT_NE(svg.find("<symbol overflow=\"visible\" id=\"glyph"), std::string::npos);

  // Each series has 4 points (iterations 3, 6, 9, 12).
  const auto& points = plot->data().at("main/x_mean");
  ASSERT_EQ(points.size(), 4u);
  EXPECT_DOUBLE_EQ(points[1].first, 6.0);
  // What the plot writes: the title, the x axis label, integer tick labels on the iteration axis
  // and a legend of the keys that have points.
  detail::PlotLook look;
  look.title = style.title;
  look.x_label = "iteration";
  look.marker = 'o';
  const std::vector<std::string> texts =
      detail::plot_texts(detail::series_with_points(keys, plot->data()), look);
  auto has = [&](const std::string& t) {
    return std::find(texts.begin(), texts.end(), t) != texts.end();
  };
  EXPECT_TRUE(has("loss & mean <per 3 iterations>"));
  EXPECT_TRUE(has("iteration"));
  EXPECT_TRUE(has("main/loss")) << "legend";
  EXPECT_TRUE(has("main/x_mean")) << "legend";
  EXPECT_FALSE(has("never/reported")) << "keys without points are left out";
  EXPECT_TRUE(has("6"));
  for (const std::string& t : texts) EXPECT_EQ(t.find(".5"), std::string::npos) << t;
}

TEST(PlotReportTest, ResumeKeepsThePoints) {
  if (!build_info().cairo) GTEST_SKIP() << "this build of kusari has no cairo: PlotReport draws nothing";
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
  if (!build_info().cairo) GTEST_SKIP() << "this build of kusari has no cairo: PlotReport draws nothing";
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
    const Decoded r = decode_png_bytes(detail::render_plot_png(series, look), "the plot");
    EXPECT_GE(r.width, static_cast<uint32_t>(look.width));
    EXPECT_GE(r.height, static_cast<uint32_t>(look.height));
    EXPECT_EQ(r.rgb.size(), static_cast<size_t>(r.width) * r.height * 3);
    const std::string svg = detail::render_plot_svg(series, look);
    EXPECT_EQ(svg.find("nan"), std::string::npos) << svg;
    EXPECT_EQ(svg.find("inf"), std::string::npos) << svg;
  }
}

}  // namespace
}  // namespace kusari::training::extensions
