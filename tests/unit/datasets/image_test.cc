// Decoding against libjpeg's own jpeglib API, PNG round trips, errors that name the file, and the
// image file datasets.
#include <gtest/gtest.h>

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include "image_test_util.h"
#include "kusari/datasets/image.h"
#include "test_util.h"

#include <jpeglib.h>

namespace kusari {
namespace {

using testing::TempDir;
using testing::test_picture;
using testing::ThrowsWith;

struct JpegErrorJump {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
};

void jump_on_error(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<JpegErrorJump*>(cinfo->err)->jump, 1);
}

// Decodes with the plain jpeglib API (libjpeg's defaults: ISLOW DCT, fancy upsampling).
Image jpeglib_decode(const std::vector<uint8_t>& bytes, J_COLOR_SPACE out, int scale_denom = 1) {
  jpeg_decompress_struct cinfo;
  JpegErrorJump err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jump_on_error;
  Image img;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    ADD_FAILURE() << "jpeglib could not decode the test image";
    return img;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = out;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(scale_denom);
  jpeg_start_decompress(&cinfo);
  img = Image::zeros(cinfo.output_height, cinfo.output_width, cinfo.output_components);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = &img.pixels[static_cast<size_t>(cinfo.output_scanline) * cinfo.output_width *
                               static_cast<size_t>(cinfo.output_components)];
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return img;
}

// Encodes an RGB or grey image with jpeglib, with the given luma sampling factors (2x2: 4:2:0,
// 2x1: 4:2:2, 1x1: 4:4:4) and optionally as a progressive JPEG.
std::vector<uint8_t> jpeglib_encode(const Image& img, int h_samp, int v_samp, bool progressive) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = static_cast<JDIMENSION>(img.width);
  cinfo.image_height = static_cast<JDIMENSION>(img.height);
  cinfo.input_components = static_cast<int>(img.channels);
  cinfo.in_color_space = img.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 90, TRUE);
  if (img.channels == 3) {
    cinfo.comp_info[0].h_samp_factor = h_samp;
    cinfo.comp_info[0].v_samp_factor = v_samp;
  }
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  for (int64_t y = 0; y < img.height; ++y) {
    JSAMPROW row = const_cast<uint8_t*>(&img.pixels[static_cast<size_t>(y * img.width * img.channels)]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(buf, buf + size);
  std::free(buf);
  jpeg_destroy_compress(&cinfo);
  return out;
}

// The window w of img.
Image cut(const Image& img, const PixelWindow& w) {
  Image out = Image::zeros(w.height, w.width, img.channels);
  for (int64_t y = 0; y < w.height; ++y) {
    for (int64_t x = 0; x < w.width * img.channels; ++x) {
      out.pixels[static_cast<size_t>(y * w.width * img.channels + x)] =
          img.pixels[static_cast<size_t>(((w.top + y) * img.width + w.left) * img.channels + x)];
    }
  }
  return out;
}

// Encodes a 4-channel CMYK image with jpeglib (which writes an Adobe marker for CMYK).
std::vector<uint8_t> jpeglib_encode_cmyk(const Image& cmyk) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr err;
  cinfo.err = jpeg_std_error(&err);
  jpeg_create_compress(&cinfo);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = static_cast<JDIMENSION>(cmyk.width);
  cinfo.image_height = static_cast<JDIMENSION>(cmyk.height);
  cinfo.input_components = 4;
  cinfo.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, 95, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(
        &cmyk.pixels[static_cast<size_t>(cinfo.next_scanline) * cmyk.width * 4]);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(buf, buf + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buf);
  return out;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(DecodeImageTest, JpegEqualsJpeglibAtEveryScale) {
  const std::vector<uint8_t> jpeg = encode_jpeg(test_picture(45, 67, 3), 90);
  for (int d : {1, 2, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << "scale 1/" << d);
    DecodeOptions o;
    o.scale_denom = d;
    const Image ours = decode_image(jpeg.data(), jpeg.size(), "picture.jpg", o);
    const Image ref = jpeglib_decode(jpeg, JCS_RGB, d);
    EXPECT_EQ(ours.height, ref.height);
    EXPECT_EQ(ours.width, ref.width);
    EXPECT_EQ(ours.height, (45 + d - 1) / d);
    EXPECT_EQ(ours.width, (67 + d - 1) / d);
    EXPECT_EQ(ours.channels, 3);
    EXPECT_EQ(ours.pixels, ref.pixels);
  }
}

TEST(DecodeImageTest, JpegWindowEqualsThatWindowOfJpeglibsFullDecode) {
  // Windows at every edge and inside, at every DCT scale, for 4:2:0, 4:2:2 and 4:4:4 chroma,
  // progressive, grey, and colour decoded as grey.
  struct Case {
    int h_samp, v_samp;
    bool progressive;
    int64_t channels;
    int want;
  };
  const Case cases[] = {{2, 2, false, 3, 3}, {2, 1, false, 3, 3}, {1, 1, false, 3, 3},
                        {2, 2, true, 3, 3},  {1, 1, false, 1, 1}, {2, 2, false, 3, 1},
                        {1, 1, false, 1, 3}};
  const Image pic = test_picture(203, 317, 3, 7);
  const Image grey = test_picture(203, 317, 1, 7);
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    const std::vector<uint8_t> jpeg =
        jpeglib_encode(c.channels == 1 ? grey : pic, c.h_samp, c.v_samp, c.progressive);
    for (int d : {1, 2, 4, 8}) {
      const Image full = jpeglib_decode(jpeg, c.want == 1 ? JCS_GRAYSCALE : JCS_RGB, d);
      std::vector<PixelWindow> windows = {{0, 0, full.height, full.width},
                                          {0, 0, 1, 1},
                                          {full.height - 1, full.width - 1, 1, 1},
                                          {0, full.width / 2, full.height, full.width - full.width / 2},
                                          {full.height / 3, 0, full.height / 3, full.width / 3}};
      for (int k = 0; k < 12; ++k) {
        PixelWindow w;
        w.top = static_cast<int64_t>(rng() % static_cast<unsigned>(full.height));
        w.left = static_cast<int64_t>(rng() % static_cast<unsigned>(full.width));
        w.height = 1 + static_cast<int64_t>(rng() % static_cast<unsigned>(full.height - w.top));
        w.width = 1 + static_cast<int64_t>(rng() % static_cast<unsigned>(full.width - w.left));
        windows.push_back(w);
      }
      for (const PixelWindow& w : windows) {
        SCOPED_TRACE(::testing::Message()
                     << "sampling " << c.h_samp << "x" << c.v_samp << (c.progressive ? " progressive" : "")
                     << ", " << c.channels << " -> " << c.want << " channels, scale 1/" << d
                     << ", window top " << w.top << " left " << w.left << " " << w.height << "x"
                     << w.width);
        DecodeOptions o;
        o.channels = c.want;
        o.scale_denom = d;
        o.window = w;
        const Image ours = decode_image(jpeg.data(), jpeg.size(), "picture.jpg", o);
        ASSERT_EQ(ours.height, w.height);
        ASSERT_EQ(ours.width, w.width);
        ASSERT_EQ(ours.channels, c.want);
        ASSERT_EQ(ours.pixels, cut(full, w).pixels);
      }
    }
  }
}

TEST(DecodeImageTest, WindowsOfPngsAndBadWindows) {
  const Image pic = test_picture(30, 40, 3, 2);
  const std::vector<uint8_t> png = encode_png(pic);
  DecodeOptions o;
  o.window = PixelWindow{3, 5, 20, 30};
  EXPECT_EQ(decode_image(png.data(), png.size(), "p.png", o).pixels, cut(pic, *o.window).pixels);
  const std::vector<uint8_t> jpeg = encode_jpeg(pic);
  o.scale_denom = 2;  // a 15x20 image
  o.window = PixelWindow{10, 0, 6, 20};
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { decode_image(jpeg.data(), jpeg.size(), "p.jpg", o); },
      {"p.jpg", "the window (top 10, left 0, 6x20) does not lie inside the 15x20 image (1/2 of 30x40)"}));
}

TEST(DecodeImageTest, TruncatedJpegIsAnErrorAlsoWhenTheWindowEndsAbove) {
  const std::vector<uint8_t> jpeg = jpeglib_encode(test_picture(256, 256, 3, 1), 2, 2, false);
  const std::vector<uint8_t> truncated(jpeg.begin(), jpeg.begin() + jpeg.size() * 3 / 4);
  DecodeOptions o;
  o.window = PixelWindow{0, 0, 16, 16};  // far above the missing part
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(truncated.data(), truncated.size(), "t.jpg", o); },
                                  {"t.jpg", "truncated or damaged JPEG", "end-of-image marker"}));
  o.window = PixelWindow{200, 0, 56, 256};  // inside the missing part
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(truncated.data(), truncated.size(), "t.jpg", o); },
                                  {"t.jpg", "truncated or damaged JPEG"}));
}

TEST(DecodeImageTest, DamagedJpegWindowsAreErrorsNamingTheFileNeverCrashes) {
  // Bytes flipped, runs zeroed and tails cut at random places of baseline and progressive files:
  // a window decode either succeeds or raises an IOError naming the file.
  std::mt19937 rng(3);
  for (bool progressive : {false, true}) {
    const std::vector<uint8_t> jpeg = jpeglib_encode(test_picture(96, 128, 3, 5), 2, 2, progressive);
    int errors = 0;
    for (int k = 0; k < 300; ++k) {
      std::vector<uint8_t> bad = jpeg;
      const size_t at = 2 + rng() % (bad.size() - 2);
      switch (k % 3) {
        case 0:
          bad[at] ^= static_cast<uint8_t>(1 + rng() % 255);
          break;
        case 1:
          std::fill(bad.begin() + static_cast<std::ptrdiff_t>(at),
                    bad.begin() + static_cast<std::ptrdiff_t>(std::min(bad.size(), at + 16)), 0);
          break;
        default:
          bad.resize(at);
      }
      DecodeOptions o;
      o.scale_denom = 1 << (k % 4);
      o.window = PixelWindow{static_cast<int64_t>(rng() % 4), static_cast<int64_t>(rng() % 4), 4, 5};
      try {
        const Image img = decode_image(bad.data(), bad.size(), "damaged.jpg", o);
        EXPECT_EQ(img.height, 4);
        EXPECT_EQ(img.width, 5);
      } catch (const IOError& e) {
        ++errors;
        EXPECT_NE(std::string(e.what()).find("damaged.jpg"), std::string::npos) << e.what();
      } catch (const ValueError& e) {  // a damaged header that makes the picture smaller
        ++errors;
        EXPECT_NE(std::string(e.what()).find("damaged.jpg"), std::string::npos) << e.what();
      }
    }
    EXPECT_GT(errors, 50);  // most of the damage is noticed
  }
}

TEST(DecodeImageTest, AJpegWhoseHeaderFailsDoesNotBreakTheNextDecodeOfTheThread) {
  // Note [A fresh TurboJPEG handle after an error]: a loader thread goes on after a bad file.
  const std::vector<uint8_t> good = encode_jpeg(test_picture(20, 30, 3, 1));
  std::vector<uint8_t> bad = good;  // a frame header of 3-bit samples: libjpeg refuses it
  for (size_t i = 2; i + 4 < bad.size(); ++i) {
    if (bad[i] == 0xFF && bad[i + 1] == 0xC0) {
      bad[i + 4] = 3;
      break;
    }
  }
  std::vector<uint8_t> cut(good.begin(), good.begin() + 4);  // ends inside its first marker
  cut.resize(300, 0x5A);
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(bad.data(), bad.size(), "bad.jpg"); },
                                    {"bad.jpg", "precision 3"}));
    EXPECT_TRUE(ThrowsWith<IOError>([&] { read_image_info(cut.data(), cut.size(), "cut.jpg"); },
                                    {"cut.jpg", "ends before a frame header"}));
    EXPECT_EQ(decode_image(good.data(), good.size(), "good.jpg").width, 30);
    EXPECT_EQ(read_image_info(good.data(), good.size(), "good.jpg").height, 20);
  }
}

TEST(DecodeImageTest, GreyJpegAsOneOrThreeChannels) {
  const std::vector<uint8_t> jpeg = encode_jpeg(test_picture(20, 30, 1), 90);
  const Image ref = jpeglib_decode(jpeg, JCS_GRAYSCALE);
  DecodeOptions one;
  one.channels = 1;
  EXPECT_EQ(decode_image(jpeg.data(), jpeg.size(), "g.jpg", one).pixels, ref.pixels);
  DecodeOptions stored;
  stored.channels = 0;
  EXPECT_EQ(decode_image(jpeg.data(), jpeg.size(), "g.jpg", stored).channels, 1);
  const Image rgb = decode_image(jpeg.data(), jpeg.size(), "g.jpg");
  ASSERT_EQ(rgb.channels, 3);
  for (size_t i = 0; i < ref.pixels.size(); ++i) {
    ASSERT_EQ(rgb.pixels[3 * i], ref.pixels[i]);
    ASSERT_EQ(rgb.pixels[3 * i + 1], ref.pixels[i]);
    ASSERT_EQ(rgb.pixels[3 * i + 2], ref.pixels[i]);
  }
}

TEST(DecodeImageTest, ColourJpegAsGreyIsTheLumaPlane) {
  const std::vector<uint8_t> jpeg = encode_jpeg(test_picture(16, 24, 3), 90);
  DecodeOptions one;
  one.channels = 1;
  EXPECT_EQ(decode_image(jpeg.data(), jpeg.size(), "c.jpg", one).pixels,
            jpeglib_decode(jpeg, JCS_GRAYSCALE).pixels);
}

TEST(DecodeImageTest, AdobeCmykJpegBecomesRgb) {
  // Stored (inverted, Adobe) CMYK values; R = C' K' / 255 (Note [Colour conversions]).
  Image cmyk = Image::zeros(16, 16, 4);
  for (size_t p = 0; p < 256; ++p) {
    cmyk.pixels[4 * p] = 255;
    cmyk.pixels[4 * p + 1] = 128;
    cmyk.pixels[4 * p + 2] = 0;
    cmyk.pixels[4 * p + 3] = 200;
  }
  const std::vector<uint8_t> jpeg = jpeglib_encode_cmyk(cmyk);
  const Image stored = jpeglib_decode(jpeg, JCS_CMYK);
  const Image rgb = decode_image(jpeg.data(), jpeg.size(), "cmyk.jpg");
  ASSERT_EQ(rgb.channels, 3);
  for (size_t p = 0; p < 256; ++p) {
    const int k = stored.pixels[4 * p + 3];
    for (int c = 0; c < 3; ++c) {
      ASSERT_EQ(rgb.pixels[3 * p + static_cast<size_t>(c)],
                (stored.pixels[4 * p + static_cast<size_t>(c)] * k + 127) / 255);
    }
  }
  // Roughly (200, 100, 0) whatever the JPEG rounding.
  EXPECT_NEAR(rgb.pixels[0], 200, 3);
  EXPECT_NEAR(rgb.pixels[1], 100, 3);
  EXPECT_NEAR(rgb.pixels[2], 0, 3);
}

TEST(DecodeImageTest, PngRoundTrips) {
  TempDir dir;
  for (int channels : {1, 3}) {
    const Image img = test_picture(13, 17, channels, channels);
    const std::string path = dir.file("p" + std::to_string(channels) + ".png");
    write_png(path, img);
    DecodeOptions o;
    o.channels = 0;
    const Image back = decode_image(path, o);
    EXPECT_EQ(back.channels, channels);
    EXPECT_EQ(back.height, 13);
    EXPECT_EQ(back.width, 17);
    EXPECT_EQ(back.pixels, img.pixels);
  }
  // RGBA: the alpha channel is dropped, not composited.
  Image rgba = test_picture(5, 6, 4);
  write_png(dir.file("a.png"), rgba);
  const Image rgb = decode_image(dir.file("a.png"));
  ASSERT_EQ(rgb.channels, 3);
  for (size_t p = 0; p < 30; ++p) {
    for (size_t c = 0; c < 3; ++c) ASSERT_EQ(rgb.pixels[3 * p + c], rgba.pixels[4 * p + c]);
  }
  // Grey PNG as RGB replicates; RGB PNG as grey is BT.601 luma.
  const Image grey = test_picture(4, 4, 1);
  write_png(dir.file("g.png"), grey);
  const Image grey3 = decode_image(dir.file("g.png"));
  EXPECT_EQ(grey3.pixels[0], grey.pixels[0]);
  EXPECT_EQ(grey3.pixels[2], grey.pixels[0]);
  Image one = Image::zeros(1, 1, 3);
  one.pixels = {200, 100, 50};
  write_png(dir.file("one.png"), one);
  DecodeOptions g;
  g.channels = 1;
  EXPECT_EQ(decode_image(dir.file("one.png"), g).pixels[0],
            (299 * 200 + 587 * 100 + 114 * 50 + 500) / 1000);
}

TEST(DecodeImageTest, ImageInfoFromTheHeader) {
  const std::vector<uint8_t> jpeg = encode_jpeg(test_picture(21, 34, 3));
  const ImageInfo j = read_image_info(jpeg.data(), jpeg.size(), "x.jpg");
  EXPECT_EQ(j.format, ImageFormat::kJpeg);
  EXPECT_EQ(j.height, 21);
  EXPECT_EQ(j.width, 34);
  EXPECT_EQ(j.channels, 3);
  const std::vector<uint8_t> png = encode_png(test_picture(9, 8, 1));
  const ImageInfo p = read_image_info(png.data(), png.size(), "x.png");
  EXPECT_EQ(p.format, ImageFormat::kPng);
  EXPECT_EQ(p.height, 9);
  EXPECT_EQ(p.width, 8);
  EXPECT_EQ(p.channels, 1);
}

TEST(DecodeImageTest, BadFilesRaiseErrorsNamingTheFile) {
  TempDir dir;
  const std::vector<uint8_t> jpeg = encode_jpeg(test_picture(64, 64, 3));
  const std::vector<uint8_t> png = encode_png(test_picture(32, 32, 3));
  write_text(dir.file("empty.jpg"), "");
  write_text(dir.file("notes.jpg"), "these are not pixels\n");
  write_file_bytes(dir.file("truncated.jpg"),
                   std::vector<uint8_t>(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
  std::vector<uint8_t> corrupt(jpeg.begin(), jpeg.begin() + 4);
  corrupt.resize(300, 0x5A);
  write_file_bytes(dir.file("corrupt.jpg"), corrupt);
  write_file_bytes(dir.file("truncated.png"),
                   std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2));
  std::vector<uint8_t> bad_png = png;
  for (size_t i = 40; i < bad_png.size(); i += 7) bad_png[i] ^= 0xFF;
  write_file_bytes(dir.file("corrupt.png"), bad_png);

  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(dir.file("empty.jpg")); },
                                  {dir.file("empty.jpg"), "empty"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(dir.file("notes.jpg")); },
                                  {dir.file("notes.jpg"), "not a JPEG or PNG"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(dir.file("truncated.jpg")); },
                                  {dir.file("truncated.jpg"), "JPEG"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(dir.file("corrupt.jpg")); },
                                  {dir.file("corrupt.jpg"), "JPEG"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(dir.file("truncated.png")); },
                                  {dir.file("truncated.png"), "PNG"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(dir.file("corrupt.png")); },
                                  {dir.file("corrupt.png"), "PNG"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(dir.file("missing.jpg")); },
                                  {dir.file("missing.jpg"), "cannot open"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { decode_image(dir.path().string()); }, {"is a directory"}));
}

TEST(DecodeImageTest, OptionsAreChecked) {
  const std::vector<uint8_t> jpeg = encode_jpeg(test_picture(8, 8, 3));
  DecodeOptions o;
  o.scale_denom = 3;
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { decode_image(jpeg.data(), jpeg.size(), "x.jpg", o); },
                             {"decode_image", "x.jpg", "scale_denom", "1, 2, 4 or 8", "got 3"}));
  o = {};
  o.channels = 2;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { decode_image(jpeg.data(), jpeg.size(), "x.jpg", o); },
                                     {"channels"}));
}

TEST(DecodeImageTest, ScaleDenomForACrop) {
  EXPECT_EQ(jpeg_scale_denom_for(400, 400, 50, 50), 8);
  EXPECT_EQ(jpeg_scale_denom_for(399, 400, 50, 50), 8);  // ceil(399 / 8) = 50
  EXPECT_EQ(jpeg_scale_denom_for(392, 400, 50, 50), 4);
  EXPECT_EQ(jpeg_scale_denom_for(448, 500, 224, 224), 2);
  EXPECT_EQ(jpeg_scale_denom_for(300, 300, 224, 224), 1);
  EXPECT_EQ(jpeg_scale_denom_for(100, 100, 224, 224), 1);
}

TEST(WriteFileTest, WritesThroughATemporaryFile) {
  TempDir dir;
  write_file_bytes(dir.file("x.bin"), {1, 2, 3});
  EXPECT_EQ(read_file_bytes(dir.file("x.bin")), (std::vector<uint8_t>{1, 2, 3}));
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1u);  // no temporary left behind
  EXPECT_TRUE(ThrowsWith<IOError>([&] { write_file_bytes(dir.file("no/such/dir/x.bin"), {1}); },
                                  {"write_file_bytes", "no/such/dir/x.bin"}));
}

TEST(LabeledImageDatasetTest, ReadsTheListAndDecodes) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "imgs");
  write_jpeg(dir.file("imgs/a.jpg"), test_picture(10, 12, 3, 1));
  write_png(dir.file("imgs/b c.png"), test_picture(6, 7, 3, 2));
  write_text(dir.file("list.txt"), "# path label\nimgs/a.jpg 3\n\nimgs/b c.png\t0\n");
  LabeledImageDataset ds(dir.file("list.txt"), dir.path().string());
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.path(1), dir.file("imgs/b c.png"));
  const Example a = ds.get_example(0);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].shape(), (Shape{10, 12, 3}));
  EXPECT_EQ(a[0].dtype(), uint8);
  EXPECT_EQ(a[1].item<int32_t>(), 3);
  const Example b = ds.get_example(-1);
  EXPECT_EQ(b[0].shape(), (Shape{6, 7, 3}));
  EXPECT_EQ(b[1].item<int32_t>(), 0);
  const Image png = test_picture(6, 7, 3, 2);
  EXPECT_EQ(std::memcmp(b[0].contiguous().raw_data(), png.pixels.data(), png.pixels.size()), 0);
}

TEST(LabeledImageDatasetTest, ErrorsNameTheListOrTheFile) {
  TempDir dir;
  write_text(dir.file("bad.txt"), "a.jpg 1\nb.jpg x\n");
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { LabeledImageDataset(dir.file("bad.txt"), dir.path().string()); },
                          {"LabeledImageDataset", dir.file("bad.txt"), "line 2", "'x'"}));
  write_text(dir.file("nolabel.txt"), "a.jpg\n");
  EXPECT_TRUE(ThrowsWith<IOError>(
      [&] { LabeledImageDataset(dir.file("nolabel.txt"), dir.path().string()); },
      {"line 1", "expected 'path label'"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { LabeledImageDataset(dir.file("none.txt")); },
                                  {"cannot open the list file", dir.file("none.txt")}));
  // A list entry whose file is missing fails when it is read, naming the file.
  write_jpeg(dir.file("here.jpg"), test_picture(4, 4, 3));
  write_text(dir.file("list.txt"), "here.jpg 0\ngone.jpg 1\n");
  LabeledImageDataset ds(dir.file("list.txt"), dir.path().string());
  EXPECT_NO_THROW(ds.get_example(0));
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { ds.get_example(1); }, {dir.file("gone.jpg"), "cannot open"}));
  EXPECT_TRUE(ThrowsWith<IndexError>([&] { ds.get_example(2); }, {"index 2", "2 images"}));
}

TEST(ImageDatasetTest, PathsOnly) {
  TempDir dir;
  write_jpeg(dir.file("x.jpg"), test_picture(5, 9, 3));
  ImageDataset ds(std::vector<std::string>{"x.jpg"}, dir.path().string());
  const Example e = ds.get_example(0);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].shape(), (Shape{5, 9, 3}));
  write_text(dir.file("list.txt"), "x.jpg\n" + dir.file("x.jpg") + "\n");
  ImageDataset listed(dir.file("list.txt"), "elsewhere");
  EXPECT_EQ(listed.path(0), "elsewhere/x.jpg");
  EXPECT_EQ(listed.path(1), dir.file("x.jpg"));  // absolute paths are kept
}

TEST(ImageFolderDatasetTest, SortedClassesAndFiles) {
  TempDir dir;
  for (const char* cls : {"zebra", "ant", "moth"})
    std::filesystem::create_directories(dir.path() / cls);
  write_jpeg(dir.file("zebra/2.jpg"), test_picture(4, 4, 3));
  write_jpeg(dir.file("zebra/1.JPG"), test_picture(4, 4, 3));
  write_png(dir.file("ant/a.png"), test_picture(4, 4, 3));
  write_text(dir.file("ant/readme.txt"), "not an image");
  ImageFolderDataset ds(dir.path().string());
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"ant", "moth", "zebra"}));
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.path(0), dir.file("ant/a.png"));
  EXPECT_EQ(*ds.label(0), 0);
  EXPECT_EQ(ds.path(1), dir.file("zebra/1.JPG"));
  EXPECT_EQ(*ds.label(1), 2);
  EXPECT_EQ(ds.get_example(2)[1].item<int32_t>(), 2);
  TempDir empty;
  EXPECT_TRUE(ThrowsWith<IOError>([&] { ImageFolderDataset{empty.path().string()}; },
                                  {"ImageFolderDataset", "found no images"}));
  EXPECT_TRUE(
      ThrowsWith<IOError>([&] { ImageFolderDataset{dir.file("nope")}; }, {"is not a folder"}));
}

}  // namespace
}  // namespace kusari
