// Each transform against hand-computed values on small images.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "image_test_util.h"
#include "kusari/core/routines.h"
#include "kusari/datasets/transforms.h"
#include "test_util.h"

namespace kusari::transforms {
namespace {

using testing::test_picture;
using testing::ThrowsWith;

Image grey_row(std::vector<uint8_t> values) {
  Image img = Image::zeros(1, static_cast<int64_t>(values.size()), 1);
  img.pixels = std::move(values);
  return img;
}

CropPlan whole(const Image& img, int64_t oh, int64_t ow) {
  return CropPlan{0, 0, static_cast<double>(img.height), static_cast<double>(img.width), oh, ow};
}

TEST(ResampleTest, ShrinkAveragesUnderAWidenedTriangle) {
  // 4 -> 2: scale 2, filter half-width 2. Output 0 is centred at 1.0 and takes pixels 0, 1, 2 with
  // weights 0.75, 0.75, 0.25 (sum 1.75); output 1 (centre 3.0) takes pixels 1, 2, 3 with 0.25,
  // 0.75, 0.75.
  const Image out = resample(grey_row({0, 10, 20, 30}), whole(grey_row({0, 10, 20, 30}), 1, 2));
  ASSERT_EQ(out.width, 2);
  EXPECT_EQ(out.pixels[0], 7);   // 12.5 / 1.75 = 7.14
  EXPECT_EQ(out.pixels[1], 23);  // 40 / 1.75 = 22.86
}

TEST(ResampleTest, EnlargeIsBilinear) {
  // 2 -> 4: output centres at 0.25, 0.75, 1.25, 1.75 in source pixels; pixel centres at 0.5, 1.5.
  const Image src = grey_row({0, 100});
  const Image out = resample(src, whole(src, 1, 4));
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{0, 25, 75, 100}));
}

TEST(ResampleTest, BothAxesAndChannels) {
  // A 2x2 RGB image shrunk to 1x1 is the mean of its four pixels per channel.
  Image img = Image::zeros(2, 2, 3);
  img.pixels = {0, 10, 200, 10, 20, 200, 20, 30, 200, 30, 41, 200};
  const Image out = resample(img, whole(img, 1, 1));
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{15, 25, 200}));
  // A whole-pixel region of the output's size is copied.
  const Image pic = test_picture(6, 7, 3);
  const Image crop = resample(pic, CropPlan{2, 3, 3, 4, 3, 4});
  for (int64_t y = 0; y < 3; ++y) {
    for (int64_t x = 0; x < 4; ++x) {
      for (int64_t c = 0; c < 3; ++c) {
        ASSERT_EQ(crop.pixels[static_cast<size_t>((y * 4 + x) * 3 + c)],
                  pic.pixels[static_cast<size_t>(((y + 2) * 7 + x + 3) * 3 + c)]);
      }
    }
  }
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        resample(pic, CropPlan{4, 0, 3, 7, 2, 2});
      },
      {"resample", "does not fit"}));
}

// Note [Resampling] written out plainly, one output value at a time, in double where the order of
// operations does not matter and in the library's float order where it does: the horizontal pass
// sums w * pixel in float in tap order, the vertical pass sums w * row value in float in tap
// order, and the result is floor(sum + 0.5) clamped to [0, 255].
Image reference_resample(const Image& img, const CropPlan& p) {
  struct Axis {
    std::vector<int64_t> first, count;
    std::vector<std::vector<float>> w;
  };
  auto taps = [](double begin, double extent, int64_t in, int64_t out) {
    Axis a;
    const double scale = extent / static_cast<double>(out), f = std::max(scale, 1.0);
    const int64_t max_taps = static_cast<int64_t>(std::ceil(f)) * 2 + 1;
    for (int64_t i = 0; i < out; ++i) {
      const double c = begin + (static_cast<double>(i) + 0.5) * scale;
      int64_t lo = std::clamp<int64_t>(static_cast<int64_t>(c - f + 0.5), 0, in - 1);
      int64_t hi = std::clamp<int64_t>(static_cast<int64_t>(c + f + 0.5), lo + 1, in);
      hi = std::min(hi, lo + max_taps);
      std::vector<double> w;
      double sum = 0;
      for (int64_t j = lo; j < hi; ++j) {
        w.push_back(std::max(0.0, 1.0 - std::abs((static_cast<double>(j) + 0.5 - c) / f)));
        sum += w.back();
      }
      if (sum <= 0) {
        w.assign(1, 1.0);
        hi = lo + 1;
        sum = 1;
      }
      std::vector<float> wf;
      for (double v : w) wf.push_back(static_cast<float>(static_cast<float>(v) / sum));
      a.first.push_back(lo);
      a.count.push_back(hi - lo);
      a.w.push_back(wf);
    }
    return a;
  };
  const Axis ax = taps(p.left, p.width, img.width, p.out_width);
  const Axis ay = taps(p.top, p.height, img.height, p.out_height);
  const int64_t C = img.channels;
  Image out = Image::zeros(p.out_height, p.out_width, C);
  for (int64_t y = 0; y < p.out_height; ++y) {
    for (int64_t x = 0; x < p.out_width; ++x) {
      for (int64_t c = 0; c < C; ++c) {
        float v = 0;
        for (int64_t i = 0; i < ay.count[y]; ++i) {
          const int64_t row = ay.first[y] + i;
          float h = 0;
          for (int64_t k = 0; k < ax.count[x]; ++k) {
            h += ax.w[x][k] * img.pixels[static_cast<size_t>((row * img.width + ax.first[x] + k) * C + c)];
          }
          v += ay.w[y][i] * h;
        }
        out.pixels[static_cast<size_t>((y * p.out_width + x) * C + c)] =
            static_cast<uint8_t>(std::clamp(std::floor(v + 0.5f), 0.0f, 255.0f));
      }
    }
  }
  return out;
}

// Random regions of a height x width image (fractional ones too) and output sizes.
std::vector<CropPlan> random_plans(int64_t height, int64_t width, int n, uint32_t seed) {
  Rng rng(seed);
  std::vector<CropPlan> plans;
  for (int k = 0; k < n; ++k) {
    CropPlan p;
    p.height = uniform(rng, 1.0, static_cast<double>(height));
    p.width = uniform(rng, 1.0, static_cast<double>(width));
    if (k % 3 == 0) {
      p.height = std::floor(p.height);
      p.width = std::floor(p.width);
    }
    p.top = uniform(rng, 0.0, static_cast<double>(height) - p.height);
    p.left = uniform(rng, 0.0, static_cast<double>(width) - p.width);
    if (k % 3 == 0) {
      p.top = std::floor(p.top);
      p.left = std::floor(p.left);
    }
    p.out_height = 1 + static_cast<int64_t>(rng() % 40);
    p.out_width = 1 + static_cast<int64_t>(rng() % 40);
    plans.push_back(p);
  }
  return plans;
}

TEST(ResampleTest, EqualsThePlainTwoPassReferenceBitForBit) {
  for (int64_t channels : {1, 3, 4}) {
    const Image pic = test_picture(37, 53, channels, 3);
    for (const CropPlan& p : random_plans(37, 53, 60, static_cast<uint32_t>(channels))) {
      SCOPED_TRACE(::testing::Message() << channels << " channels, region top " << p.top << " left "
                                        << p.left << " " << p.height << "x" << p.width << " -> "
                                        << p.out_height << "x" << p.out_width);
      ASSERT_EQ(resample(pic, p).pixels, reference_resample(pic, p).pixels);
    }
  }
}

TEST(ResampleTest, AWindowHoldingWhatThePlanReadsGivesTheSameResult) {
  const Image pic = test_picture(41, 47, 3, 5);
  for (const CropPlan& p : random_plans(41, 47, 60, 9)) {
    const PixelWindow w = resample_reads(41, 47, p);
    ASSERT_GE(w.top, 0);
    ASSERT_LE(w.top + w.height, 41);
    ASSERT_LE(w.left + w.width, 47);
    Image window = Image::zeros(w.height, w.width, 3);
    for (int64_t y = 0; y < w.height; ++y) {
      for (int64_t x = 0; x < w.width * 3; ++x) {
        window.pixels[static_cast<size_t>(y * w.width * 3 + x)] =
            pic.pixels[static_cast<size_t>((w.top + y) * 47 * 3 + w.left * 3 + x)];
      }
    }
    ASSERT_EQ(resample(window, p, w, 41, 47).pixels, resample(pic, p).pixels);
    if (w.height > 1) {  // one row short of what the plan reads
      Image shorter = window;
      shorter.height -= 1;
      shorter.pixels.resize(static_cast<size_t>(shorter.height * w.width * 3));
      const PixelWindow w2{w.top, w.left, w.height - 1, w.width};
      EXPECT_TRUE(ThrowsWith<ValueError>([&] { resample(shorter, p, w2, 41, 47); },
                                         {"resample", "does not hold the pixels the plan reads"}));
    }
  }
}

TEST(ComposeTest, DecodingOnlyTheWindowGivesTheFullDecodesResult) {
  const Image pic = test_picture(187, 251, 3, 4);
  const std::vector<uint8_t> jpeg = encode_jpeg(pic, 90);
  Compose pipeline({std::make_shared<RandomResizedCrop>(24), std::make_shared<RandomHorizontalFlip>()});
  for (uint64_t seed = 0; seed < 40; ++seed) {
    Rng a(seed), b(seed);
    const Image windowed =
        pipeline.decode_and_apply(jpeg.data(), jpeg.size(), "p.jpg", {}, a, false);
    Image full = decode_image(jpeg.data(), jpeg.size(), "p.jpg");
    pipeline.apply(full, b);
    ASSERT_EQ(windowed.pixels, full.pixels) << "seed " << seed;
    ASSERT_EQ(a(), b());
  }
}

TEST(CenterCropTest, RoundedOffsetLikeTorchvision) {
  Image img = Image::zeros(4, 5, 1);
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i);
  Rng rng(1);
  CenterCrop(2).apply(img, rng);
  // top = round(1) = 1, left = round(1.5) = 2 (half to even, as Python's round).
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{7, 8, 12, 13}));
  Image small = Image::zeros(3, 3, 1);
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { CenterCrop(4).apply(small, rng); }, {"CenterCrop", "smaller"}));
}

TEST(ResizeTest, ShortSideToSize) {
  Rng rng(1);
  Image img = Image::zeros(4, 6, 3);
  std::fill(img.pixels.begin(), img.pixels.end(), 77);
  Resize(2).apply(img, rng);
  EXPECT_EQ(img.height, 2);
  EXPECT_EQ(img.width, 3);
  for (uint8_t v : img.pixels) ASSERT_EQ(v, 77);
  Image tall = Image::zeros(10, 3, 1);
  Resize(4).apply(tall, rng);
  EXPECT_EQ(tall.width, 4);
  EXPECT_EQ(tall.height, 13);  // 4 * 10 / 3 truncated
}

TEST(RandomHorizontalFlipTest, MirrorsHwcAndChw) {
  Image img = Image::zeros(1, 3, 2);
  img.pixels = {1, 2, 3, 4, 5, 6};
  Rng rng(0);
  RandomHorizontalFlip(1.0).apply(img, rng);
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{5, 6, 3, 4, 1, 2}));
  RandomHorizontalFlip(0.0).apply(img, rng);
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{5, 6, 3, 4, 1, 2}));
  Image chw;
  chw.height = 1;
  chw.width = 2;
  chw.channels = 2;
  chw.planar = true;
  chw.is_float = true;
  chw.values = {1, 2, 3, 4};
  RandomHorizontalFlip(1.0).apply(chw, rng);
  EXPECT_EQ(chw.values, (std::vector<float>{2, 1, 4, 3}));
  // p = 0.5 flips about half of many examples.
  int flipped = 0;
  for (int i = 0; i < 1000; ++i) {
    Rng r(example_seed(5, 0, i));
    Image one = grey_row({1, 2});
    RandomHorizontalFlip().apply(one, r);
    flipped += one.pixels[0] == 2;
  }
  EXPECT_GT(flipped, 430);
  EXPECT_LT(flipped, 570);
}

TEST(NormalizeTest, ScalesAndLaysOut) {
  Image img = Image::zeros(1, 2, 2);
  img.pixels = {0, 51, 255, 102};  // pixel 0: (0, 51), pixel 1: (255, 102)
  Rng rng(0);
  Image chw = img;
  Normalize({0.5f, 0.0f}, {0.5f, 0.2f}).apply(chw, rng);
  ASSERT_TRUE(chw.is_float);
  ASSERT_TRUE(chw.planar);
  ASSERT_EQ(chw.values.size(), 4u);
  // channel 0: (0 - .5) / .5 = -1, (1 - .5) / .5 = 1; channel 1: 0.2 / 0.2 = 1, 0.4 / 0.2 = 2.
  EXPECT_FLOAT_EQ(chw.values[0], -1.0f);
  EXPECT_FLOAT_EQ(chw.values[1], 1.0f);
  EXPECT_FLOAT_EQ(chw.values[2], 1.0f);
  EXPECT_FLOAT_EQ(chw.values[3], 2.0f);
  Image hwc = img;
  Normalize({0.5f, 0.0f}, {0.5f, 0.2f}, /*planar=*/false).apply(hwc, rng);
  EXPECT_FALSE(hwc.planar);
  EXPECT_FLOAT_EQ(hwc.values[0], -1.0f);
  EXPECT_FLOAT_EQ(hwc.values[1], 1.0f);
  EXPECT_FLOAT_EQ(hwc.values[2], 1.0f);
  EXPECT_FLOAT_EQ(hwc.values[3], 2.0f);
  Image three = Image::zeros(1, 1, 3);
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { Normalize({0.5f}, {0.5f}).apply(three, rng); },
                                     {"Normalize", "3 channels", "1"}));
}

TEST(NormalizeTest, ApplyBatchGivesApplysValuesInEveryDtypeAndLayout) {
  std::vector<Image> images;
  Array batch = Array::empty({3, 5, 4, 3}, uint8, Device::cpu());
  for (int i = 0; i < 3; ++i) {
    images.push_back(test_picture(5, 4, 3, i));
    std::memcpy(static_cast<uint8_t*>(batch.raw_data()) + i * 60, images.back().pixels.data(), 60);
  }
  for (bool planar : {true, false}) {
    const Normalize n(kImageNetMean, kImageNetStd, planar);
    std::vector<float> expected;
    for (Image img : images) {
      Rng rng(0);
      n.apply(img, rng);
      expected.insert(expected.end(), img.values.begin(), img.values.end());
    }
    const Array want = Array::from_vector(expected, planar ? Shape{3, 3, 5, 4} : Shape{3, 5, 4, 3});
    for (Dtype d : {float32, bfloat16, float16}) {
      SCOPED_TRACE(::testing::Message() << (planar ? "CHW " : "HWC ") << dtype_name(d));
      const Array got = n.apply_batch(batch, d);
      ASSERT_EQ(got.dtype(), d);
      ASSERT_EQ(got.shape(), want.shape());
      EXPECT_TRUE(got.is_contiguous());
      EXPECT_TRUE(array_equal(got, want.astype(d)));
    }
  }
  const Normalize grey({0.5f}, {0.25f});
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { grey.apply_batch(batch); },
                                     {"apply_batch", "3 channels", "mean and std have 1"}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { grey.apply_batch(batch.astype(float32)); },
                                     {"apply_batch", "expected uint8 images"}));
}

TEST(ToCHWTest, Planes) {
  Image img = Image::zeros(1, 2, 3);
  img.pixels = {1, 2, 3, 4, 5, 6};
  Rng rng(0);
  ToCHW().apply(img, rng);
  EXPECT_TRUE(img.planar);
  EXPECT_EQ(img.pixels, (std::vector<uint8_t>{1, 4, 2, 5, 3, 6}));
}

TEST(RandomResizedCropTest, PlansLikeTorchvision) {
  // Whole-area square crops of a 10x20 image never fit (14x14 > 10 rows): after the attempts the
  // fallback is the centre crop of the largest region with ratio <= 1, 10x10 at column 5.
  Rng rng(3);
  const CropPlan p = RandomResizedCrop(4, {1.0, 1.0}, {1.0, 1.0}).plan(10, 20, rng);
  EXPECT_EQ(p.top, 0);
  EXPECT_EQ(p.left, 5);
  EXPECT_EQ(p.height, 10);
  EXPECT_EQ(p.width, 10);
  EXPECT_EQ(p.out_height, 4);
  // Whole-area square crop of a square image: the image itself.
  const CropPlan q = RandomResizedCrop(4, {1.0, 1.0}, {1.0, 1.0}).plan(12, 12, rng);
  EXPECT_EQ(q.top, 0);
  EXPECT_EQ(q.left, 0);
  EXPECT_EQ(q.height, 12);
  // Random plans stay inside the image, within the scale range (up to rounding), and repeat for
  // the same seed.
  const RandomResizedCrop rrc(224);
  for (int i = 0; i < 500; ++i) {
    Rng a(example_seed(9, 1, i)), b(example_seed(9, 1, i));
    const CropPlan pa = rrc.plan(375, 500, a);
    const CropPlan pb = rrc.plan(375, 500, b);
    ASSERT_EQ(pa.top, pb.top);
    ASSERT_EQ(pa.width, pb.width);
    ASSERT_GE(pa.top, 0);
    ASSERT_GE(pa.left, 0);
    ASSERT_LE(pa.top + pa.height, 375);
    ASSERT_LE(pa.left + pa.width, 500);
    const double area = pa.height * pa.width / (375.0 * 500.0);
    ASSERT_GT(area, 0.07);
    ASSERT_LE(area, 1.0);
  }
}

TEST(ExampleSeedTest, DependsOnEveryPart) {
  EXPECT_EQ(example_seed(1, 2, 3), example_seed(1, 2, 3));
  EXPECT_NE(example_seed(1, 2, 3), example_seed(1, 2, 4));
  EXPECT_NE(example_seed(1, 2, 3), example_seed(1, 3, 3));
  EXPECT_NE(example_seed(1, 2, 3), example_seed(2, 2, 3));
  Rng r(7);
  for (int i = 0; i < 100; ++i) {
    const double u = uniform(r, 2.0, 3.0);
    ASSERT_GE(u, 2.0);
    ASSERT_LT(u, 3.0);
  }
}

TEST(ComposeTest, ReducedDecodeMatchesAFullDecode) {
  // A smooth picture: DCT scaling and the resampling filter agree up to a few levels.
  Image pic = Image::zeros(400, 400, 3);
  for (int64_t y = 0; y < 400; ++y) {
    for (int64_t x = 0; x < 400; ++x) {
      for (int64_t c = 0; c < 3; ++c) {
        pic.pixels[static_cast<size_t>((y * 400 + x) * 3 + c)] =
            static_cast<uint8_t>(x / 5 + y / 5 + 30 * c);
      }
    }
  }
  const std::vector<uint8_t> jpeg = encode_jpeg(pic, 95);
  Compose pipeline({std::make_shared<RandomResizedCrop>(50, std::array<double, 2>{1.0, 1.0},
                                                        std::array<double, 2>{1.0, 1.0}),
                    std::make_shared<Normalize>(std::vector<float>{0, 0, 0},
                                                std::vector<float>{1, 1, 1}, false)});
  Rng a(1), b(1);
  const Image reduced = pipeline.decode_and_apply(jpeg.data(), jpeg.size(), "p.jpg", {}, a, true);
  const Image full = pipeline.decode_and_apply(jpeg.data(), jpeg.size(), "p.jpg", {}, b, false);
  ASSERT_EQ(reduced.values.size(), full.values.size());
  ASSERT_EQ(reduced.height, 50);
  double diff = 0;
  for (size_t i = 0; i < full.values.size(); ++i)
    diff += std::abs(reduced.values[i] - full.values[i]);
  EXPECT_LT(diff / static_cast<double>(full.values.size()), 2.0 / 255.0);
  // Both drew the same numbers.
  EXPECT_EQ(a(), b());
  EXPECT_NE(pipeline.name().find("RandomResizedCrop(50"), std::string::npos);
}

TEST(ComposeTest, ImagenetPipelinesGiveChwFloat) {
  const Image pic = test_picture(300, 260, 3);
  const std::vector<uint8_t> jpeg = encode_jpeg(pic);
  Rng rng(4);
  const Image train =
      imagenet_train_transform(32)->decode_and_apply(jpeg.data(), jpeg.size(), "p.jpg", {}, rng);
  EXPECT_TRUE(train.is_float && train.planar);
  EXPECT_EQ(train.height, 32);
  EXPECT_EQ(train.width, 32);
  const Image eval = imagenet_eval_transform(224, 256)->decode_and_apply(jpeg.data(), jpeg.size(),
                                                                         "p.jpg", {}, rng);
  EXPECT_EQ(eval.height, 224);
  EXPECT_EQ(eval.width, 224);
  EXPECT_EQ(eval.values.size(), 3u * 224 * 224);
}

}  // namespace
}  // namespace kusari::transforms
