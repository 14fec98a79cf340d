// Image transforms for training and evaluation (torchvision's RandomResizedCrop, Resize,
// CenterCrop, RandomHorizontalFlip, Normalize), composable and seeded per example.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kusari/datasets/image.h"

namespace kusari::transforms {

// Note [Seeded transforms]
// A random transform draws from a std::mt19937_64 that the caller seeds per example with
// example_seed(seed, epoch, index): the draws depend only on the run's seed, the epoch and the
// example's dataset index, never on which worker thread handles the example or in which order,
// so a run gives the same batches with 1 or 16 workers and after resuming from a snapshot.
// Uniform numbers are made from the generator's raw output by the formulas in transforms.cc
// (not by std::uniform_real_distribution, whose algorithm the C++ standard leaves open), so the
// crops are the same with every standard library.

/// The random engine transforms draw from.
using Rng = std::mt19937_64;

/// The seed of example `index` in `epoch` of a run seeded with `seed`; see Note [Seeded
/// transforms].
uint64_t example_seed(uint64_t seed, int64_t epoch, int64_t index);

/// A uniform double in [lo, hi) from one draw of `rng` (53 random bits).
double uniform(Rng& rng, double lo, double hi);

/// A region of a source image in (possibly fractional) pixel coordinates, and the size it is
/// resampled to.
struct CropPlan {
  double top = 0;
  double left = 0;
  double height = 0;
  double width = 0;
  int64_t out_height = 0;
  int64_t out_width = 0;
};

/// One step of an image pipeline.
class Transform {
 public:
  virtual ~Transform() = default;
  /// Transforms `image` in place, drawing any randomness from `rng`.
  virtual void apply(Image& image, Rng& rng) const = 0;
  /// True for a crop or resize: a step that reads a region of its input and resamples it, and so
  /// can say, before decoding, how large a decode it needs (see plan()).
  virtual bool is_geometric() const { return false; }
  /// For a geometric step: the region of a height x width input it reads and the size it makes,
  /// drawing from `rng` exactly as apply() would. apply(image, rng) is
  /// execute(image, plan(image.height, image.width, rng)).
  virtual CropPlan plan(int64_t height, int64_t width, Rng& rng) const;
  /// For a geometric step: resamples plan's region of `image` to plan's size.
  virtual void execute(Image& image, const CropPlan& plan) const;
  /// A short description, e.g. "RandomResizedCrop(224, scale=(0.08, 1), ratio=(0.75, 1.33))".
  virtual std::string name() const = 0;
};

/// Resamples the region of a uint8 HWC image given by `plan` to plan.out_height x
/// plan.out_width with a triangle (bilinear) filter that widens with the scale when shrinking
/// (antialiased, as PIL's BILINEAR resize); a whole-pixel region of the output's size is copied.
/// See Note [Resampling] in transforms.cc.
Image resample(const Image& image, const CropPlan& plan);

/// resample() of a window of a larger image: `image` holds the pixels `window` of a
/// full_height x full_width image and `plan` is in the full image's coordinates. Equals
/// resample(full image, plan) bit for bit; the window must hold every pixel the plan reads
/// (resample_reads), else ValueError.
Image resample(const Image& image, const CropPlan& plan, const PixelWindow& window,
               int64_t full_height, int64_t full_width);

/// The pixels of a height x width image that resample(image, plan) reads.
PixelWindow resample_reads(int64_t height, int64_t width, const CropPlan& plan);

/// A crop or resize: apply() is execute(image, plan(...)), and execute() resamples the planned
/// region with resample(); a subclass says only which region (plan()).
class GeometricTransform : public Transform {
 public:
  void apply(Image& image, Rng& rng) const override {
    execute(image, plan(image.height, image.width, rng));
  }
  bool is_geometric() const final { return true; }
  CropPlan plan(int64_t height, int64_t width, Rng& rng) const override = 0;
  /// resample(image, plan); final, so that Compose may decode only the window it reads.
  void execute(Image& image, const CropPlan& plan) const final { image = resample(image, plan); }
};

/// A random part of the image (torchvision's RandomResizedCrop): area a fraction in `scale` of
/// the image's, aspect ratio (w / h) log-uniform in `ratio`, up to 10 attempts to fit, then the
/// centre crop of the largest region with a ratio in range; resampled to size x size.
class RandomResizedCrop : public GeometricTransform {
 public:
  explicit RandomResizedCrop(int64_t size, std::array<double, 2> scale = {0.08, 1.0},
                             std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0},
                             int attempts = 10);
  CropPlan plan(int64_t height, int64_t width, Rng& rng) const override;
  std::string name() const override;

 private:
  int64_t size_;
  std::array<double, 2> scale_;
  std::array<double, 2> ratio_;
  int attempts_;
};

/// Scales the image so that its shorter side is `size` (the longer one keeps the ratio,
/// truncated as in torchvision's Resize(int)).
class Resize : public GeometricTransform {
 public:
  explicit Resize(int64_t size);
  CropPlan plan(int64_t height, int64_t width, Rng& rng) const override;
  std::string name() const override;

 private:
  int64_t size_;
};

/// The centred height x width window (torchvision's CenterCrop: the offset is rounded, and an
/// image smaller than the window is an error).
class CenterCrop : public GeometricTransform {
 public:
  explicit CenterCrop(int64_t size) : CenterCrop(size, size) {}
  CenterCrop(int64_t height, int64_t width);
  CropPlan plan(int64_t height, int64_t width, Rng& rng) const override;
  std::string name() const override;

 private:
  int64_t height_;
  int64_t width_;
};

/// Mirrors the image left-right with probability p (one draw per example, also when p is 0 or 1).
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  void apply(Image& image, Rng& rng) const override;
  /// The draw apply() makes: true when the image is to be mirrored.
  bool flips(Rng& rng) const;
  std::string name() const override;

 private:
  double p_;
};

/// uint8 pixels x become float32 (x / 255 - mean[c]) / std[c] (a float image: (x - mean) / std),
/// written CHW when `planar`, HWC (channels-last) otherwise.
class Normalize : public Transform {
 public:
  Normalize(std::vector<float> mean, std::vector<float> std, bool planar = true);
  void apply(Image& image, Rng& rng) const override;
  std::string name() const override;
  /// apply()'s values for `image`, written to `out` (image.size() floats, laid out CHW when
  /// planar(), else HWC) instead of into the image: a loader writes them straight into its batch.
  void apply_into(const Image& image, float* out) const;

  const std::vector<float>& mean() const { return mean_; }
  const std::vector<float>& std() const { return std_; }
  /// True when the output is CHW (planar), false for HWC (channels-last).
  bool planar() const { return planar_; }
  /// What apply() maps each uint8 value of channel c to: a float32 (C, 256) CPU array.
  Array table() const;
  /// apply() on a whole batch of uint8 images (B, H, W, C) on any device, there: a (B, C, H, W)
  /// (planar) or (B, H, W, C) array of `dtype` (floating) whose values are apply()'s, rounded to
  /// `dtype`. On a GPU one kernel reads the bytes and writes the result, so a loader can copy
  /// uint8 batches (a quarter of float32's bytes) and normalise them there.
  Array apply_batch(const Array& images, Dtype dtype = float32) const;

 private:
  std::vector<float> mean_;
  std::vector<float> std_;
  bool planar_;
  std::vector<float> table_;  // (C, 256): what each byte of channel c becomes
};

/// HWC -> CHW without changing the values (uint8 or float).
class ToCHW : public Transform {
 public:
  void apply(Image& image, Rng& rng) const override;
  std::string name() const override { return "ToCHW"; }
};

/// The ImageNet statistics torchvision's models are trained with.
inline const std::vector<float> kImageNetMean = {0.485f, 0.456f, 0.406f};
inline const std::vector<float> kImageNetStd = {0.229f, 0.224f, 0.225f};

/// Several steps in a row.
class Compose : public Transform {
 public:
  explicit Compose(std::vector<std::shared_ptr<const Transform>> steps);
  void apply(Image& image, Rng& rng) const override;
  std::string name() const override;
  const std::vector<std::shared_ptr<const Transform>>& steps() const { return steps_; }

  /// Decodes an encoded image and applies the steps, drawing from `rng` as apply() would. When
  /// the data is a JPEG and the first step is geometric, that step is planned on the header's
  /// size; with `reduced_decode` the image is then decoded at the largest DCT scale (1/2, 1/4,
  /// 1/8) that keeps the planned region at least as large as the step's output
  /// (jpeg_scale_denom_for), and the region is scaled to the decoded size. When the first step
  /// is a GeometricTransform only the pixels it reads are decoded (resample_reads; the result is
  /// the same as after a full decode), and a RandomHorizontalFlip right after it mirrors the
  /// resampled image as it is made (the same pixels, one pass fewer). `name` names the data in
  /// errors.
  Image decode_and_apply(const uint8_t* data, size_t size, const std::string& name,
                         DecodeOptions options, Rng& rng, bool reduced_decode = true) const;

 private:
  std::vector<std::shared_ptr<const Transform>> steps_;
};

/// The usual ImageNet training pipeline: RandomResizedCrop(size), RandomHorizontalFlip(),
/// Normalize(ImageNet mean and std), CHW when `planar`.
std::shared_ptr<Compose> imagenet_train_transform(int64_t size = 224, bool planar = true);
/// The usual evaluation pipeline: Resize(resize), CenterCrop(size), Normalize.
std::shared_ptr<Compose> imagenet_eval_transform(int64_t size = 224, int64_t resize = 256,
                                                 bool planar = true);

}  // namespace kusari::transforms
