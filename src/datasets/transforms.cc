#include "kusari/datasets/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "datasets/dataset_util.h"
#include "kusari/core/error.h"
#include "routines/image.h"

namespace kusari::transforms {
namespace {

using detail::splitmix64;

// A uniform integer in [lo, hi] (hi >= lo).
int64_t uniform_int(Rng& rng, int64_t lo, int64_t hi) {
  const auto span = static_cast<uint64_t>(hi - lo) + 1;
  return lo + static_cast<int64_t>(rng() % span);
}

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Note [Resampling]
// resample() is PIL's BILINEAR resize with a box, done in two separable passes (rows, then
// columns) with float intermediates and one rounding at the end. For an axis mapping the source
// range [b, b + s) onto n outputs, scale = s / n and the filter is the triangle
// tri(t) = max(0, 1 - |t|) stretched by f = max(scale, 1): output i is centred at
// c = b + (i + 0.5) scale and takes the source pixels j in [trunc(c - f + 0.5), trunc(c + f + 0.5))
// (clipped to the image) with weights tri((j + 0.5 - c) / f), normalised to sum 1. When shrinking,
// every source pixel under the output contributes (no aliasing); when enlarging (f = 1) this
// is plain bilinear interpolation between the two nearest pixel centres.
struct Taps {
  std::vector<int64_t> first;  // first source index of output i
  std::vector<int64_t> count;  // number of taps of output i
  std::vector<float> weights;  // max_taps per output
  int64_t max_taps = 0;
};

Taps make_taps(double begin, double extent, int64_t in_size, int64_t out_size) {
  Taps t;
  const double scale = extent / static_cast<double>(out_size);
  const double f = std::max(scale, 1.0);
  t.max_taps = static_cast<int64_t>(std::ceil(f)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.weights.assign(static_cast<size_t>(out_size * t.max_taps), 0.0f);
  for (int64_t i = 0; i < out_size; ++i) {
    const double c = begin + (static_cast<double>(i) + 0.5) * scale;
    int64_t lo = static_cast<int64_t>(c - f + 0.5);
    int64_t hi = static_cast<int64_t>(c + f + 0.5);
    lo = std::clamp<int64_t>(lo, 0, in_size - 1);
    hi = std::clamp<int64_t>(hi, lo + 1, in_size);
    hi = std::min(hi, lo + t.max_taps);
    float* w = &t.weights[static_cast<size_t>(i * t.max_taps)];
    double sum = 0;
    for (int64_t j = lo; j < hi; ++j) {
      const double v = std::max(0.0, 1.0 - std::abs((static_cast<double>(j) + 0.5 - c) / f));
      w[j - lo] = static_cast<float>(v);
      sum += v;
    }
    if (sum <= 0) {  // the centre lies outside the image: take the nearest pixel
      w[0] = 1.0f;
      hi = lo + 1;
      sum = 1.0;
    }
    for (int64_t j = 0; j < hi - lo; ++j) w[j] = static_cast<float>(w[j] / sum);
    t.first[static_cast<size_t>(i)] = lo;
    t.count[static_cast<size_t>(i)] = hi - lo;
  }
  return t;
}

bool is_whole(double v) {
  return v == std::floor(v);
}

void check_uint8_hwc(const Image& image, const char* fn) {
  KUSARI_CHECK(!image.is_float && !image.planar, ValueError, fn,
               ": expected a uint8 HWC image (resample before Normalize and ToCHW), got a ",
               image.is_float ? "float" : "uint8", image.planar ? " CHW" : " HWC", " image");
  KUSARI_CHECK(image.height > 0 && image.width > 0 && image.channels > 0, ValueError, fn,
               ": the image is empty (", image.height, "x", image.width, "x", image.channels, ")");
}

}  // namespace

uint64_t example_seed(uint64_t seed, int64_t epoch, int64_t index) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ static_cast<uint64_t>(epoch));
  return splitmix64(h ^ static_cast<uint64_t>(index));
}

double uniform(Rng& rng, double lo, double hi) {
  const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  return lo + (hi - lo) * u;
}

CropPlan Transform::plan(int64_t, int64_t, Rng&) const {
  KUSARI_THROW(NotImplementedError, name(), " is not a geometric transform: it has no plan()");
}

void Transform::execute(Image&, const CropPlan&) const {
  KUSARI_THROW(NotImplementedError, name(), " is not a geometric transform: it has no execute()");
}

namespace {

// Four floats, added and multiplied lane by lane (GCC and Clang vector extensions: SSE on x86-64,
// NEON on AArch64). Each lane rounds exactly as the scalar code would.
typedef float Float4 __attribute__((vector_size(16)));

void check_plan(const CropPlan& plan, int64_t height, int64_t width, const char* fn) {
  KUSARI_CHECK(plan.out_height > 0 && plan.out_width > 0 && plan.height > 0 && plan.width > 0 &&
                   plan.top >= 0 && plan.left >= 0 && plan.top + plan.height <= height + 1e-6 &&
                   plan.left + plan.width <= width + 1e-6,
               ValueError, fn, ": the region (top ", plan.top, ", left ", plan.left, ", ",
               plan.height, "x", plan.width, ") -> ", plan.out_height, "x", plan.out_width,
               " does not fit a ", height, "x", width, " image");
}

// [first, last) of the source pixels that any output of `t` reads.
std::pair<int64_t, int64_t> tap_span(const Taps& t) {
  int64_t lo = t.first.front(), hi = 0;
  for (size_t i = 0; i < t.first.size(); ++i) {
    lo = std::min(lo, t.first[i]);
    hi = std::max(hi, t.first[i] + t.count[i]);
  }
  return {lo, hi};
}

bool is_copy(const CropPlan& plan) {
  return is_whole(plan.top) && is_whole(plan.left) &&
         plan.height == static_cast<double>(plan.out_height) &&
         plan.width == static_cast<double>(plan.out_width);
}

// The horizontal pass of one row: dst[x * C + c] = sum_k w_x[k] src[(first_x + k) * C + c], the
// taps' first pixels counted from `shift`, accumulated in float in tap order. For C = 3 the
// pixels [span0, span1) are first converted to floats (`wide`, scratch; a loop the compiler
// vectorises), and each output is one Float4 sum of the pixel's three values and the next
// pixel's first (a lane that is never kept); the products and sums of the kept lanes are the
// scalar ones, in the same order. dst has room for one float past the row.
void resample_row(const uint8_t* src, int64_t C, const Taps& tx, int64_t shift, int64_t span0,
                  int64_t span1, std::vector<float>& wide, float* dst) {
  const auto OW = static_cast<int64_t>(tx.first.size());
  if (C == 3) {
    const int64_t n_values = (span1 - span0) * 3;
    wide.resize(static_cast<size_t>(n_values + 1));
    const uint8_t* s = src + span0 * 3;
    float* f = wide.data();
    for (int64_t j = 0; j < n_values; ++j) f[j] = static_cast<float>(s[j]);
    f[n_values] = 0.0f;
    // One output's sum is a chain of dependent additions; four outputs at a time keep four
    // independent chains in flight (each still in its own tap order).
    auto tap = [&](int64_t x, int64_t k) {
      Float4 v;
      std::memcpy(&v, f + (tx.first[static_cast<size_t>(x)] - shift - span0 + k) * 3, sizeof(v));
      return tx.weights[static_cast<size_t>(x * tx.max_taps + k)] * v;
    };
    int64_t x = 0;
    for (; x + 4 <= OW; x += 4) {
      const int64_t* count = &tx.count[static_cast<size_t>(x)];
      const int64_t m = std::min(std::min(count[0], count[1]), std::min(count[2], count[3]));
      Float4 a[4] = {};
      for (int64_t k = 0; k < m; ++k) {
        a[0] += tap(x, k);
        a[1] += tap(x + 1, k);
        a[2] += tap(x + 2, k);
        a[3] += tap(x + 3, k);
      }
      for (int i = 0; i < 4; ++i) {
        for (int64_t k = m; k < count[i]; ++k) a[i] += tap(x + i, k);
      }
      // In order: each store's fourth lane is overwritten by the next output.
      for (int i = 0; i < 4; ++i) std::memcpy(dst + 3 * (x + i), &a[i], sizeof(Float4));
    }
    for (; x < OW; ++x) {
      Float4 a = {};
      for (int64_t k = 0; k < tx.count[static_cast<size_t>(x)]; ++k) a += tap(x, k);
      std::memcpy(dst + 3 * x, &a, sizeof(a));
    }
    return;
  }
  for (int64_t x = 0; x < OW; ++x) {
    const float* w = &tx.weights[static_cast<size_t>(x * tx.max_taps)];
    const uint8_t* s = src + (tx.first[static_cast<size_t>(x)] - shift) * C;
    const int64_t n = tx.count[static_cast<size_t>(x)];
    for (int64_t ch = 0; ch < C; ++ch) {
      float a = 0;
      for (int64_t k = 0; k < n; ++k) a += w[k] * s[k * C + ch];
      dst[x * C + ch] = a;
    }
  }
}

// The vertical pass of one output row: out[j] = round(sum_k w[k] rows[k][j]), summed in float in
// tap order (four values at a time, each lane in the scalar order) and rounded to nearest: the
// sums are >= 0 (no weight or pixel is negative), where truncating v + 0.5 is floor(v + 0.5).
void resample_column(const float* rows, int64_t row_len, const float* w, int64_t n, uint8_t* out) {
  typedef int Int4 __attribute__((vector_size(16)));
  int64_t j = 0;
  for (; j + 4 <= row_len; j += 4) {
    Float4 a = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t k = 0; k < n; ++k) {
      Float4 v;
      std::memcpy(&v, rows + k * row_len + j, sizeof(v));
      a += w[k] * v;
    }
    Int4 r = __builtin_convertvector(a + 0.5f, Int4);
    r = r < 255 ? r : 255;
    for (int l = 0; l < 4; ++l) out[j + l] = static_cast<uint8_t>(r[l]);
  }
  for (; j < row_len; ++j) {
    float a = 0.0f;
    for (int64_t k = 0; k < n; ++k) a += w[k] * rows[k * row_len + j];
    const int r = static_cast<int>(a + 0.5f);
    out[j] = static_cast<uint8_t>(r < 255 ? r : 255);
  }
}

// resample() of the pixels of `window` of a full_height x full_width image (see the header).
// With `mirror` the output is mirrored left-right (RandomHorizontalFlip's result, without a pass
// of its own: output x takes the taps of output OW - 1 - x).
Image resample_window(const Image& image, const CropPlan& plan, const PixelWindow& window,
                      int64_t full_height, int64_t full_width, bool mirror = false) {
  const int64_t C = image.channels, W = image.width;
  Image out = Image::zeros(plan.out_height, plan.out_width, C);
  if (is_copy(plan) && !mirror) {  // a whole-pixel region of the output's size: a copy
    const auto top = static_cast<int64_t>(plan.top) - window.top;
    const auto left = static_cast<int64_t>(plan.left) - window.left;
    KUSARI_ASSERT(top >= 0 && left >= 0 && top + plan.out_height <= image.height &&
                      left + plan.out_width <= W,
                  "resample: the window holds the region");
    for (int64_t y = 0; y < plan.out_height; ++y) {
      std::memcpy(&out.pixels[static_cast<size_t>(y * plan.out_width * C)],
                  &image.pixels[static_cast<size_t>(((top + y) * W + left) * C)],
                  static_cast<size_t>(plan.out_width * C));
    }
    return out;
  }
  // The taps are those of the full image, so the result does not depend on the window.
  Taps tx = make_taps(plan.left, plan.width, full_width, plan.out_width);
  const Taps ty = make_taps(plan.top, plan.height, full_height, plan.out_height);
  if (mirror) {
    std::reverse(tx.first.begin(), tx.first.end());
    std::reverse(tx.count.begin(), tx.count.end());
    const auto OW = static_cast<size_t>(plan.out_width), m = static_cast<size_t>(tx.max_taps);
    for (size_t x = 0; x < OW / 2; ++x) {
      std::swap_ranges(tx.weights.begin() + static_cast<std::ptrdiff_t>(x * m),
                       tx.weights.begin() + static_cast<std::ptrdiff_t>((x + 1) * m),
                       tx.weights.begin() + static_cast<std::ptrdiff_t>((OW - 1 - x) * m));
    }
  }
  const auto [row0, row1] = tap_span(ty);
  const auto [col0, col1] = tap_span(tx);
  KUSARI_ASSERT(row0 >= window.top && row1 <= window.top + image.height &&
                    col0 >= window.left && col1 <= window.left + W,
                "resample: the window holds every pixel the plan reads");
  const int64_t OW = plan.out_width;
  const int64_t row_len = OW * C;
  // Horizontal pass over the rows the vertical pass reads, then the vertical pass.
  std::vector<float> tmp(static_cast<size_t>((row1 - row0) * row_len + 1));
  std::vector<float> wide;
  for (int64_t y = row0; y < row1; ++y) {
    const uint8_t* src = &image.pixels[static_cast<size_t>((y - window.top) * W * C)];
    resample_row(src, C, tx, window.left, col0 - window.left, col1 - window.left, wide,
                 &tmp[static_cast<size_t>((y - row0) * row_len)]);
  }
  for (int64_t y = 0; y < plan.out_height; ++y) {
    resample_column(&tmp[static_cast<size_t>((ty.first[static_cast<size_t>(y)] - row0) * row_len)],
                    row_len, &ty.weights[static_cast<size_t>(y * ty.max_taps)],
                    ty.count[static_cast<size_t>(y)], &out.pixels[static_cast<size_t>(y * row_len)]);
  }
  return out;
}

}  // namespace

Image resample(const Image& image, const CropPlan& plan) {
  const char* fn = "resample";
  check_uint8_hwc(image, fn);
  check_plan(plan, image.height, image.width, fn);
  return resample_window(image, plan, PixelWindow{0, 0, image.height, image.width}, image.height,
                         image.width);
}

Image resample(const Image& image, const CropPlan& plan, const PixelWindow& window,
               int64_t full_height, int64_t full_width) {
  const char* fn = "resample";
  check_uint8_hwc(image, fn);
  check_plan(plan, full_height, full_width, fn);
  const PixelWindow reads = resample_reads(full_height, full_width, plan);
  KUSARI_CHECK(window.height == image.height && window.width == image.width &&
                   window.top <= reads.top && window.left <= reads.left &&
                   window.top + window.height >= reads.top + reads.height &&
                   window.left + window.width >= reads.left + reads.width,
               ValueError, fn, ": the ", image.height, "x", image.width,
               " image given as the window (top ", window.top, ", left ", window.left, ", ",
               window.height, "x", window.width, ") of a ", full_height, "x", full_width,
               " image does not hold the pixels the plan reads (top ", reads.top, ", left ",
               reads.left, ", ", reads.height, "x", reads.width, ")");
  return resample_window(image, plan, window, full_height, full_width);
}

PixelWindow resample_reads(int64_t height, int64_t width, const CropPlan& plan) {
  check_plan(plan, height, width, "resample_reads");
  if (is_copy(plan)) {
    return PixelWindow{static_cast<int64_t>(plan.top), static_cast<int64_t>(plan.left),
                       plan.out_height, plan.out_width};
  }
  const Taps tx = make_taps(plan.left, plan.width, width, plan.out_width);
  const Taps ty = make_taps(plan.top, plan.height, height, plan.out_height);
  const auto [row0, row1] = tap_span(ty);
  const auto [col0, col1] = tap_span(tx);
  return PixelWindow{row0, col0, row1 - row0, col1 - col0};
}

RandomResizedCrop::RandomResizedCrop(int64_t size, std::array<double, 2> scale,
                                     std::array<double, 2> ratio, int attempts)
    : size_(size), scale_(scale), ratio_(ratio), attempts_(attempts) {
  KUSARI_CHECK(size > 0, ValueError, "RandomResizedCrop: size must be positive, got ", size);
  KUSARI_CHECK(scale[0] > 0 && scale[0] <= scale[1] && scale[1] <= 1.0, ValueError,
               "RandomResizedCrop: scale must satisfy 0 < scale[0] <= scale[1] <= 1, got (",
               scale[0], ", ", scale[1], ")");
  KUSARI_CHECK(ratio[0] > 0 && ratio[0] <= ratio[1], ValueError,
               "RandomResizedCrop: ratio must satisfy 0 < ratio[0] <= ratio[1], got (", ratio[0],
               ", ", ratio[1], ")");
  KUSARI_CHECK(attempts >= 0, ValueError, "RandomResizedCrop: attempts must be >= 0, got ",
               attempts);
}

CropPlan RandomResizedCrop::plan(int64_t height, int64_t width, Rng& rng) const {
  KUSARI_CHECK(height > 0 && width > 0, ValueError, name(), ": the image is empty (", height, "x",
               width, ")");
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_lo = std::log(ratio_[0]), log_hi = std::log(ratio_[1]);
  CropPlan p;
  p.out_height = p.out_width = size_;
  for (int a = 0; a < attempts_; ++a) {
    const double target = area * uniform(rng, scale_[0], scale_[1]);
    const double aspect = std::exp(uniform(rng, log_lo, log_hi));
    const auto w = static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const auto h = static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      p.top = static_cast<double>(uniform_int(rng, 0, height - h));
      p.left = static_cast<double>(uniform_int(rng, 0, width - w));
      p.height = static_cast<double>(h);
      p.width = static_cast<double>(w);
      return p;
    }
  }
  // Fallback: the centre crop of the largest region whose ratio is in range.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio_[0]) {
    h = std::min(height, static_cast<int64_t>(std::nearbyint(static_cast<double>(w) / ratio_[0])));
  } else if (in_ratio > ratio_[1]) {
    w = std::min(width, static_cast<int64_t>(std::nearbyint(static_cast<double>(h) * ratio_[1])));
  }
  p.top = static_cast<double>((height - h) / 2);
  p.left = static_cast<double>((width - w) / 2);
  p.height = static_cast<double>(h);
  p.width = static_cast<double>(w);
  return p;
}

std::string RandomResizedCrop::name() const {
  return "RandomResizedCrop(" + std::to_string(size_) + ", scale=(" + fmt(scale_[0]) + ", " +
         fmt(scale_[1]) + "), ratio=(" + fmt(ratio_[0]) + ", " + fmt(ratio_[1]) + "))";
}

Resize::Resize(int64_t size) : size_(size) {
  KUSARI_CHECK(size > 0, ValueError, "Resize: size must be positive, got ", size);
}

CropPlan Resize::plan(int64_t height, int64_t width, Rng&) const {
  KUSARI_CHECK(height > 0 && width > 0, ValueError, name(), ": the image is empty (", height, "x",
               width, ")");
  CropPlan p;
  p.height = static_cast<double>(height);
  p.width = static_cast<double>(width);
  if (width <= height) {
    p.out_width = size_;
    p.out_height = std::max<int64_t>(1, size_ * height / width);
  } else {
    p.out_height = size_;
    p.out_width = std::max<int64_t>(1, size_ * width / height);
  }
  return p;
}

std::string Resize::name() const {
  return "Resize(" + std::to_string(size_) + ")";
}

CenterCrop::CenterCrop(int64_t height, int64_t width) : height_(height), width_(width) {
  KUSARI_CHECK(height > 0 && width > 0, ValueError, "CenterCrop: the size must be positive, got ",
               height, "x", width);
}

CropPlan CenterCrop::plan(int64_t height, int64_t width, Rng&) const {
  KUSARI_CHECK(height >= height_ && width >= width_, ValueError, name(), ": the image (", height,
               "x", width, ") is smaller than the window; resize it first (e.g. Resize(",
               std::max(height_, width_), "))");
  CropPlan p;
  p.top = std::nearbyint(static_cast<double>(height - height_) / 2.0);
  p.left = std::nearbyint(static_cast<double>(width - width_) / 2.0);
  p.height = static_cast<double>(height_);
  p.width = static_cast<double>(width_);
  p.out_height = height_;
  p.out_width = width_;
  return p;
}

std::string CenterCrop::name() const {
  return "CenterCrop(" + std::to_string(height_) + ", " + std::to_string(width_) + ")";
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  KUSARI_CHECK(p >= 0 && p <= 1, ValueError, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

namespace {

template <typename T>
void flip_rows(std::vector<T>& data, int64_t rows, int64_t width, int64_t group) {
  for (int64_t r = 0; r < rows; ++r) {
    T* row = &data[static_cast<size_t>(r * width * group)];
    for (int64_t a = 0, b = width - 1; a < b; ++a, --b) {
      for (int64_t g = 0; g < group; ++g) std::swap(row[a * group + g], row[b * group + g]);
    }
  }
}

}  // namespace

bool RandomHorizontalFlip::flips(Rng& rng) const {
  return uniform(rng, 0.0, 1.0) < p_;
}

void RandomHorizontalFlip::apply(Image& image, Rng& rng) const {
  if (!flips(rng)) return;
  // HWC: rows of width pixels of `channels` values; CHW: channels * height rows of single values.
  const int64_t rows = image.planar ? image.channels * image.height : image.height;
  const int64_t group = image.planar ? 1 : image.channels;
  if (image.is_float) {
    flip_rows(image.values, rows, image.width, group);
  } else {
    flip_rows(image.pixels, rows, image.width, group);
  }
}

std::string RandomHorizontalFlip::name() const {
  return "RandomHorizontalFlip(" + fmt(p_) + ")";
}

Normalize::Normalize(std::vector<float> mean, std::vector<float> std, bool planar)
    : mean_(std::move(mean)), std_(std::move(std)), planar_(planar) {
  KUSARI_CHECK(!mean_.empty() && mean_.size() == std_.size(), ValueError,
               "Normalize: mean and std need one value per channel, got ", mean_.size(), " and ",
               std_.size());
  for (size_t c = 0; c < std_.size(); ++c) {
    KUSARI_CHECK(std_[c] > 0, ValueError, "Normalize: std[", c, "] must be positive, got ",
                 std_[c]);
  }
  // One table per channel: (v / 255 - mean) / std for every byte.
  table_.resize(256 * mean_.size());
  for (size_t c = 0; c < mean_.size(); ++c) {
    for (int v = 0; v < 256; ++v) {
      table_[c * 256 + static_cast<size_t>(v)] = (static_cast<float>(v) / 255.0f - mean_[c]) / std_[c];
    }
  }
}

Array Normalize::table() const {
  return Array::from_vector(table_, Shape{static_cast<int64_t>(mean_.size()), 256}, Device::cpu());
}

Array Normalize::apply_batch(const Array& images, Dtype dtype) const {
  KUSARI_CHECK(images.ndim() == 4 && images.dtype() == uint8, ValueError, name(),
               "::apply_batch: expected uint8 images (B, H, W, C), got ",
               dtype_name(images.dtype()), " ", images.shape());
  KUSARI_CHECK(images.dim(3) == static_cast<int64_t>(mean_.size()), ValueError, name(),
               "::apply_batch: the images have ", images.dim(3), " channels but mean and std have ",
               mean_.size());
  return routines::normalize_image_batch(images, table().to_device(images.device()), dtype,
                                         planar_);
}

void Normalize::apply_into(const Image& image, float* out) const {
  const int64_t C = image.channels;
  KUSARI_CHECK(static_cast<size_t>(C) == mean_.size(), ValueError, name(), ": the image has ", C,
               " channels but mean and std have ", mean_.size());
  const int64_t HW = image.height * image.width;
  // out index of (pixel p, channel c) and in index of the same.
  const bool in_planar = image.planar;
  auto in_index = [&](int64_t p, int64_t c) { return in_planar ? c * HW + p : p * C + c; };
  auto out_index = [&](int64_t p, int64_t c) { return planar_ ? c * HW + p : p * C + c; };
  if (!image.is_float) {
    const std::vector<float>& table = table_;
    const uint8_t* src = image.pixels.data();
    if (!in_planar && planar_) {
      for (int64_t c = 0; c < C; ++c) {
        const float* t = &table[static_cast<size_t>(c * 256)];
        float* d = out + c * HW;
        for (int64_t p = 0; p < HW; ++p) d[p] = t[src[p * C + c]];
      }
    } else {
      for (int64_t p = 0; p < HW; ++p) {
        for (int64_t c = 0; c < C; ++c) {
          out[out_index(p, c)] = table[static_cast<size_t>(c * 256 + src[in_index(p, c)])];
        }
      }
    }
  } else {
    for (int64_t p = 0; p < HW; ++p) {
      for (int64_t c = 0; c < C; ++c) {
        out[out_index(p, c)] =
            (image.values[static_cast<size_t>(in_index(p, c))] - mean_[static_cast<size_t>(c)]) /
            std_[static_cast<size_t>(c)];
      }
    }
  }
}

void Normalize::apply(Image& image, Rng&) const {
  std::vector<float> out(static_cast<size_t>(image.size()));
  apply_into(image, out.data());
  image.values = std::move(out);
  image.pixels.clear();
  image.pixels.shrink_to_fit();
  image.is_float = true;
  image.planar = planar_;
}

std::string Normalize::name() const {
  std::string s = "Normalize(mean=(";
  for (size_t c = 0; c < mean_.size(); ++c) s += (c ? ", " : "") + fmt(mean_[c]);
  s += "), std=(";
  for (size_t c = 0; c < std_.size(); ++c) s += (c ? ", " : "") + fmt(std_[c]);
  return s + (planar_ ? "), CHW)" : "), HWC)");
}

namespace {

template <typename T>
std::vector<T> hwc_to_chw(const std::vector<T>& in, int64_t HW, int64_t C) {
  std::vector<T> out(in.size());
  for (int64_t p = 0; p < HW; ++p) {
    for (int64_t c = 0; c < C; ++c)
      out[static_cast<size_t>(c * HW + p)] = in[static_cast<size_t>(p * C + c)];
  }
  return out;
}

}  // namespace

void ToCHW::apply(Image& image, Rng&) const {
  if (image.planar) return;
  const int64_t HW = image.height * image.width;
  if (image.is_float) {
    image.values = hwc_to_chw(image.values, HW, image.channels);
  } else {
    image.pixels = hwc_to_chw(image.pixels, HW, image.channels);
  }
  image.planar = true;
}

Compose::Compose(std::vector<std::shared_ptr<const Transform>> steps) : steps_(std::move(steps)) {
  for (size_t i = 0; i < steps_.size(); ++i) {
    KUSARI_CHECK(steps_[i] != nullptr, ValueError, "Compose: step ", i, " is null");
  }
}

void Compose::apply(Image& image, Rng& rng) const {
  for (const auto& s : steps_) s->apply(image, rng);
}

std::string Compose::name() const {
  std::string s = "Compose(";
  for (size_t i = 0; i < steps_.size(); ++i) s += (i ? ", " : "") + steps_[i]->name();
  return s + ")";
}

Image Compose::decode_and_apply(const uint8_t* data, size_t size, const std::string& name,
                                DecodeOptions options, Rng& rng, bool reduced_decode) const {
  const bool jpeg = size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF;
  const auto* resampler =
      steps_.empty() ? nullptr : dynamic_cast<const GeometricTransform*>(steps_[0].get());
  const bool scaled = reduced_decode && !steps_.empty() && steps_[0]->is_geometric();
  if (!jpeg || options.window || (resampler == nullptr && !scaled)) {
    Image image = decode_image(data, size, name, options);
    apply(image, rng);
    return image;
  }
  const ImageInfo info = read_image_info(data, size, name);
  CropPlan p = steps_[0]->plan(info.height, info.width, rng);
  if (scaled) {
    options.scale_denom = jpeg_scale_denom_for(static_cast<int64_t>(p.height),
                                               static_cast<int64_t>(p.width), p.out_height,
                                               p.out_width);
  }
  // The size libjpeg decodes at 1/scale_denom (rounded up), and the plan on it.
  const int64_t d = options.scale_denom;
  const int64_t height = (info.height + d - 1) / d, width = (info.width + d - 1) / d;
  if (d > 1) {
    const double sy = static_cast<double>(height) / static_cast<double>(info.height);
    const double sx = static_cast<double>(width) / static_cast<double>(info.width);
    p.top *= sy;
    p.height = std::min(p.height * sy, static_cast<double>(height) - p.top);
    p.left *= sx;
    p.width = std::min(p.width * sx, static_cast<double>(width) - p.left);
  }
  Image image;
  size_t next = 1;
  if (resampler != nullptr) {
    // Only the pixels the resampling reads (Note [Decoding a window of a JPEG]); a flip right
    // after it mirrors the resampling's output instead of making a pass of its own.
    const PixelWindow window = resample_reads(height, width, p);
    options.window = window;
    bool mirror = false;
    if (steps_.size() > 1) {
      if (const auto* flip = dynamic_cast<const RandomHorizontalFlip*>(steps_[1].get())) {
        mirror = flip->flips(rng);
        next = 2;
      }
    }
    const Image decoded = decode_image(data, size, name, options);
    check_uint8_hwc(decoded, "resample");
    image = resample_window(decoded, p, window, height, width, mirror);
  } else {
    image = decode_image(data, size, name, options);
    steps_[0]->execute(image, p);
  }
  for (size_t i = next; i < steps_.size(); ++i) steps_[i]->apply(image, rng);
  return image;
}

std::shared_ptr<Compose> imagenet_train_transform(int64_t size, bool planar) {
  return std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<RandomResizedCrop>(size), std::make_shared<RandomHorizontalFlip>(),
      std::make_shared<Normalize>(kImageNetMean, kImageNetStd, planar)});
}

std::shared_ptr<Compose> imagenet_eval_transform(int64_t size, int64_t resize, bool planar) {
  return std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<Resize>(resize), std::make_shared<CenterCrop>(size),
      std::make_shared<Normalize>(kImageNetMean, kImageNetStd, planar)});
}

}  // namespace kusari::transforms
