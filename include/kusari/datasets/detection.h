// Object detection datasets: COCO-style annotation files (reading and writing) and a generator of
// synthetic detection pictures (coloured shapes on a grey background) for trying detectors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kusari/core/array.h"
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

}  // namespace kusari
