// Object detection datasets: COCO-style annotation files (reading and writing), a generator of
// synthetic detection pictures (coloured shapes on a grey background) for trying detectors, and
// augmentation that moves the boxes with the pixels (flips, resizes, a dataset that applies them).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/core/random.h"
#include "kusari/datasets/dataset.h"
#include "kusari/datasets/image.h"

namespace kusari {

// Note [Detection examples]
// A detection dataset's example i is {image, bbox, label}, as ChainerCV's detection datasets
// return it (and as its detectors and evaluators take it):
//   image  uint8 (H, W, C), decoded like the image file datasets' (Note [Image file datasets]);
//   bbox   float32 (R, 4), one row (y_min, x_min, y_max, x_max) per object, in pixels of the full
//          image, the max ends exclusive: a box of COCO's [x, y, w, h] is (y, x, y + h, x + w),
//          and an object covering rows 3..10 has y_min 3 and y_max 11;
//   label  int32 (R,), the class of each box, 0..K-1 (classes()[label] names it).
// R may be 0: an image without objects has a (0, 4) bbox and a (0,) label. Like the image file
// datasets, the dataset holds paths and boxes, never pixels: get_example(i) decodes image i on
// every call, and boxes(i) / labels(i) give the annotations without decoding anything.

/// What CocoDetectionDataset keeps of an annotation file.
struct CocoDetectionOptions {
  /// Drop the boxes marked iscrowd (a group of objects in one box, which COCO's evaluation
  /// ignores); when false they are kept as ordinary boxes.
  bool skip_crowd = true;
  /// Drop the images left without a box (after skipping crowd and degenerate boxes), as
  /// torchvision's detection training does; when false they stay, with R = 0.
  bool skip_images_without_boxes = false;
};

// Note [Reading COCO annotations]
// COCO's instances file is one JSON object with three arrays:
//   images       [{id, file_name, height, width}, ...]
//   annotations  [{id, image_id, category_id, bbox: [x, y, w, h], area, iscrowd}, ...]
//   categories   [{id, name}, ...]
// Only the keys the dataset uses must be there: an image's id and file_name, an annotation's
// image_id, category_id and bbox (iscrowd defaults to 0), a category's id and name; the others
// (height, width, area, info, licenses) are ignored, and the masks' polygons (segmentation), most
// of a COCO file, are skipped while it is parsed rather than held in memory. COCO's category ids
// are not contiguous (1..90 with gaps for its 80 classes), so the categories, sorted by id, get
// labels 0..K-1; category_id(label) maps back. Images keep the order of the images array; a file
// without an annotations array (an image list, like COCO's test-dev image_info) has no boxes. Boxes
// narrower or lower than one pixel (w < 1 or h < 1; COCO has a few) are dropped silently, the
// rule of mmdetection's CocoDataset; boxes are not clipped to the image. A file that cannot be
// read, is not JSON, lacks a key, holds a value of the wrong type, repeats an id, or has an
// annotation naming an unknown image or category throws IOError naming the file and the entry
// (e.g. "annotations[12].bbox").

/// A COCO-style detection dataset (torchvision's CocoDetection, ChainerCV's COCOBboxDataset):
/// image files under a root folder and their boxes from an instances JSON file. Example i is
/// {image, bbox, label} (Note [Detection examples]); the file is read as Note [Reading COCO
/// annotations] describes.
class CocoDetectionDataset : public Dataset {
 public:
  /// Reads `annotation_json`; images are image_root/file_name (file_name when it is absolute or
  /// image_root is empty). Throws IOError naming the file and entry for a bad file.
  CocoDetectionDataset(const std::string& annotation_json, std::string image_root,
                       DecodeOptions options = {}, CocoDetectionOptions opts = {});

  /// Number of images.
  int64_t size() const override { return static_cast<int64_t>(images_.size()); }
  /// {image uint8 (H, W, C), bbox float32 (R, 4), label int32 (R,)}; negative i counts from the
  /// end.
  Example get_example(int64_t i) const override;

  /// The full path of image i.
  std::string path(int64_t i) const;
  /// The boxes of image i: float32 (R, 4), (y_min, x_min, y_max, x_max), without decoding.
  Array boxes(int64_t i) const;
  /// The labels of image i: int32 (R,).
  Array labels(int64_t i) const;
  /// The COCO id of image i (its `id` in the images array).
  int64_t image_id(int64_t i) const;
  /// The class names; label k is classes()[k].
  const std::vector<std::string>& classes() const { return classes_; }
  /// The COCO category id of label `label` (0 <= label < classes().size()).
  int64_t category_id(int32_t label) const;
  /// How the images are decoded.
  const DecodeOptions& decode_options() const { return options_; }

 private:
  struct Entry {
    std::string file_name;
    int64_t id = 0;
    std::vector<float> boxes;  // R * 4, (y_min, x_min, y_max, x_max)
    std::vector<int32_t> labels;
  };
  // i after checking 0 <= i < size() (negative i counts from the end).
  int64_t checked_index(int64_t i, const char* fn) const;

  std::string root_;
  DecodeOptions options_;
  std::vector<Entry> images_;
  std::vector<std::string> classes_;
  std::vector<int64_t> category_ids_;
};

/// One image of a detection dataset to write: its file name (relative to the image folder), its
/// size and its objects.
struct CocoImageRecord {
  /// The file name as the annotation file names it, e.g. "000001.jpg".
  std::string file_name;
  /// The image's height in pixels.
  int64_t height = 0;
  /// The image's width in pixels.
  int64_t width = 0;
  /// (R, 4) boxes, (y_min, x_min, y_max, x_max), max ends exclusive (any real dtype; float32).
  Array bbox;
  /// (R,) labels 0..K-1 (any integer dtype; int32).
  Array label;
};

/// Writes a COCO instances JSON file for `images` (image ids 1, 2, ... in order; annotation ids
/// 1, 2, ...; label k becomes category id k + 1 named class_names[k]; bbox [x, y, w, h], area
/// w * h, iscrowd 0), through a temporary file that is renamed (write_file_bytes). Throws
/// ValueError naming the image when a bbox or label has the wrong shape or a label is outside
/// 0..class_names.size()-1, IOError when the file cannot be written.
void write_coco_detection(const std::string& annotation_json,
                          const std::vector<CocoImageRecord>& images,
                          const std::vector<std::string>& class_names);

// Note [Synthetic detection pictures]
// make_synthetic_detection_images draws pictures in which a detector has something to find and
// nothing else: a smooth grey background (a random grey level, a gradient, a faint tint and a
// little noise, the same on all three channels, so its channels differ by at most 20) with 1 to
// max_objects shapes of three classes -- "square" (label 0), "disk" (1), "triangle" (2, apex up)
// -- each of a side between size / 6 and size / 2.5 pixels, fully inside the picture, in a
// saturated colour (HSV with full saturation and a value of at least 0.7, so its channels differ
// by at least 178). Shapes are drawn with hard edges, later ones over earlier ones, and a box is
// the tight box of the pixels its shape set (max ends exclusive). A placement is redrawn (up to
// 100 times, then the object is left out) when its box overlaps an earlier box by more than 30%
// of the smaller of the two, so each object keeps most of its box free of any other object.
// All randomness comes from std::mt19937_64 through explicit arithmetic (never the
// std::uniform_*_distribution classes, whose results differ between standard libraries), and
// picture i of a split has a generator of its own, seeded from (seed, split, i): the pictures are
// the same on every platform, and the first n pictures do not depend on how many are made.

/// What make_synthetic_detection_images draws (Note [Synthetic detection pictures]).
struct SyntheticDetectionOptions {
  /// Side of the square pictures in pixels (at least 12).
  int64_t size = 64;
  /// Most objects in a picture (at least 1); each picture has 1..max_objects.
  int64_t max_objects = 3;
  /// The seed of the whole set.
  uint64_t seed = 0;
  /// Which split of the seed's set: splits draw different pictures (the tool uses 0 for train
  /// and 1 for val).
  uint64_t split = 0;
};

/// Synthetic detection pictures and their annotations.
struct SyntheticDetectionSet {
  /// uint8 HWC RGB pictures, size x size.
  std::vector<Image> images;
  /// One record per picture: file_name "000000.jpg", "000001.jpg", ..., boxes and labels.
  std::vector<CocoImageRecord> records;
  /// {"square", "disk", "triangle"}.
  std::vector<std::string> class_names;
};

/// `count` synthetic detection pictures (Note [Synthetic detection pictures]). Throws ValueError
/// for a negative count, a size below 12 or max_objects below 1.
SyntheticDetectionSet make_synthetic_detection_images(int64_t count,
                                                      const SyntheticDetectionOptions& options);

// Note [Box-aware augmentation]
// A detection transform changes an image and its boxes together, as ChainerCV's pairs of
// transforms do (flip with flip_bbox, resize with resize_bbox), on the arrays of one example
// (Note [Detection examples]): image uint8 (H, W, C), bbox (R, 4) (y_min, x_min, y_max, x_max)
// with the max ends exclusive, label (R,). Boxes are continuous coordinates, so:
//   - a horizontal flip maps a column coordinate x to W - x: (y_min, x_min, y_max, x_max)
//     becomes (y_min, W - x_max, y_max, W - x_min) (a vertical flip likewise with H), and
//     flipping twice gives the boxes back (exactly for whole and half pixels; other coordinates
//     may move by float32's rounding);
//   - a resize from h x w to H x W resamples the image with transforms::resample (bilinear,
//     antialiased when shrinking), whose output row i covers input rows [i h / H, (i + 1) h / H):
//     the boxes' y coordinates are multiplied by H / h and their x coordinates by W / w;
//   - resize_detection_to_fit makes pictures of any size one size, to batch them, without
//     cropping or distorting: the picture is scaled to the largest size of its aspect ratio that
//     fits in H x W (fit_size: each side the rounded product, at least 1), placed at the
//     top-left corner of an H x W image filled with `fill`, and its boxes are scaled by the same
//     per-axis factors (fitted height / h, fitted width / w). The origin stays where it was, so a
//     detector's boxes on the padded picture map back to the original by dividing by those
//     factors (ChainerCV's and PFDet's detectors scale, then pad at the bottom and right).
// Every transform first clips the boxes to its input picture (y to [0, h], x to [0, w]: so that
// no box reaches the padding) and drops, with their labels, the boxes left without area (y_max <=
// y_min or x_max <= x_min): a box wholly outside the picture (COCO's boxes are not clipped: Note
// [Reading COCO annotations]) or a degenerate one; it drops any box that has lost its area in
// float32 after moving too. The results are CPU arrays: the image uint8 (H', W', C),
// bbox float32 (R', 4) and label int32 (R',), the surviving boxes in their input order. A
// function given an image that is not uint8 (H, W, C), boxes that are not (R, 4) of a real dtype,
// labels that are not (R,) of an integer dtype, or a size below 1 throws (ShapeError, DtypeError,
// ValueError) naming itself and the values.

/// One detection example's arrays (Note [Detection examples]).
struct DetectionExample {
  /// uint8 (H, W, C).
  Array image;
  /// (R, 4) boxes (y_min, x_min, y_max, x_max), max ends exclusive; float32 in results.
  Array bbox;
  /// (R,) classes; int32 in results.
  Array label;

  /// The example of a dataset's {image, bbox, label} (ValueError for another number of arrays).
  static DetectionExample from_example(const Example& example);
  /// {image, bbox, label}.
  Example to_example() const { return {image, bbox, label}; }
};

/// `bbox` (R, 4) of a height x width picture flipped vertically (y_flip) and/or horizontally
/// (x_flip), as ChainerCV's flip_bbox: float32 (R, 4) on the CPU (Note [Box-aware augmentation]).
Array flip_bbox(const Array& bbox, int64_t height, int64_t width, bool y_flip = false,
                bool x_flip = true);

/// `bbox` (R, 4) of a picture of in_size (height, width) scaled to out_size, as ChainerCV's
/// resize_bbox: y by out_size[0] / in_size[0], x by out_size[1] / in_size[1]; float32 (R, 4).
Array resize_bbox(const Array& bbox, std::array<int64_t, 2> in_size,
                  std::array<int64_t, 2> out_size);

/// The boxes of a height x width picture clipped to it, without those left with no area, and
/// their labels: {float32 (R', 4), int32 (R',)} (Note [Box-aware augmentation]).
std::pair<Array, Array> clip_bbox(const Array& bbox, const Array& label, int64_t height,
                                  int64_t width);

/// The example mirrored left-right (x_flip) and/or upside down (y_flip), boxes with it, then
/// clipped (Note [Box-aware augmentation]).
DetectionExample flip_detection(const DetectionExample& example, bool y_flip = false,
                                bool x_flip = true);

/// flip_detection (horizontal) with probability p, else the example clipped. One number is drawn
/// from `generator` (next_uint64) in either case, so the same seed gives the same flips.
DetectionExample random_flip_detection(const DetectionExample& example, Generator& generator,
                                       double p = 0.5);

/// The example resized to height x width (the aspect ratio is not kept), its boxes scaled by
/// the exact factors, then clipped (Note [Box-aware augmentation]).
DetectionExample resize_detection(const DetectionExample& example, int64_t height, int64_t width);

/// The size {H', W'} of a height x width picture scaled by min(max_height / height, max_width /
/// width): each side rounded to the nearest integer, at least 1 and at most the bound.
std::array<int64_t, 2> fit_size(int64_t height, int64_t width, int64_t max_height,
                                int64_t max_width);

/// The example scaled to fit_size and padded at the bottom and right with `fill` to height x
/// width (Note [Box-aware augmentation]), to batch pictures of different sizes.
DetectionExample resize_detection_to_fit(const DetectionExample& example, int64_t height,
                                         int64_t width, uint8_t fill = 0);

/// What augment_detection does to each example.
struct DetectionAugmentOptions {
  /// The probability of a horizontal flip (0 never flips; a number is drawn either way).
  double flip_probability = 0.5;
  /// The output size; 0 and 0 keep each picture's size (both or neither must be 0).
  int64_t height = 0;
  int64_t width = 0;
  /// With a size: true scales to fit and pads (resize_detection_to_fit), false stretches
  /// (resize_detection).
  bool keep_aspect_ratio = true;
  /// The padding's value when keep_aspect_ratio.
  uint8_t fill = 0;
};

/// random_flip_detection with options.flip_probability, then the resize the options ask for
/// (or a clip, without one).
DetectionExample augment_detection(const DetectionExample& example,
                                   const DetectionAugmentOptions& options, Generator& generator);

// Note [Seeded detection augmentation]
// TransformedDetectionDataset applies a transform to each example of a detection dataset as it is
// read (Chainer's TransformDataset). A random transform draws from a kusari Generator that the
// dataset seeds for each read from (seed, draw, i) (transforms::example_seed), where `draw` counts
// the reads of example i so far: the iterators read each example once per epoch, so draw is the
// epoch, every epoch sees new flips, and the draws of example i do not depend on the other
// examples, on worker threads or on the order of reading. example(i, draw) gives a given draw
// without counting. reset_draws() starts the count again (e.g. to replay a run).

/// A detection dataset whose examples go through a transform (Note [Seeded detection
/// augmentation]).
class TransformedDetectionDataset : public Dataset {
 public:
  /// A transform of one example, drawing any randomness from the generator.
  using Transform = std::function<DetectionExample(const DetectionExample&, Generator&)>;

  /// Applies `transform` to the examples {image, bbox, label} of `dataset`.
  TransformedDetectionDataset(std::shared_ptr<const Dataset> dataset, Transform transform,
                              uint64_t seed = 0);
  /// Applies augment_detection with `options`.
  TransformedDetectionDataset(std::shared_ptr<const Dataset> dataset,
                              DetectionAugmentOptions options, uint64_t seed = 0);

  int64_t size() const override { return size_; }
  /// example(i, n) for the n-th read of example i (n = 0, 1, ...); negative i counts from the
  /// end.
  Example get_example(int64_t i) const override;
  /// Example i transformed with the draws of its read `draw`, without counting a read.
  Example example(int64_t i, uint64_t draw) const;
  /// Sets every example's count of reads back to 0.
  void reset_draws();

  /// The dataset whose examples are transformed.
  const std::shared_ptr<const Dataset>& base() const { return dataset_; }
  uint64_t seed() const { return seed_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  Transform transform_;
  uint64_t seed_;
  int64_t size_;
  std::unique_ptr<std::atomic<uint64_t>[]> draws_;  // reads of each example so far
};

}  // namespace kusari
