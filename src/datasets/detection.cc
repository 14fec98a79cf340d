// CocoDetectionDataset, write_coco_detection, make_synthetic_detection_images and the box-aware
// augmentation (Notes [Detection examples], [Reading COCO annotations], [Synthetic detection
// pictures], [Box-aware augmentation] and [Seeded detection augmentation] in detection.h).
#include "kusari/datasets/detection.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_map>
#include <utility>

#include "datasets/dataset_util.h"
#include "kusari/core/error.h"
#include "kusari/datasets/transforms.h"

namespace kusari {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
// The writer keeps COCO's order of keys (images, annotations, categories; id first).
using ordered_json = nlohmann::ordered_json;

// A JSON value as it appears in a message: compact, cut after 60 characters.
std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Reads the values of one annotation file; every failure is an IOError naming the file and the
// entry ("annotations[12].bbox").
class CocoReader {
 public:
  CocoReader(const char* fn, const std::string& file) : fn_(fn), file_(file) {}

  json parse() const {
    std::error_code ec;
    KUSARI_CHECK(!fs::is_directory(file_, ec), IOError, fn_, ": the annotation file ", file_,
                 " is a directory, expected a COCO instances JSON file");
    std::ifstream in(file_, std::ios::binary);
    KUSARI_CHECK(in.good(), IOError, fn_, ": cannot open the annotation file ", file_, ": ",
                 std::strerror(errno));
    // The polygons of COCO's masks are most of its files (and of the memory a parsed file takes);
    // the boxes need none of them, so they are skipped as they are read.
    const json::parser_callback_t skip_masks = [](int depth, json::parse_event_t event,
                                                  json& parsed) {
      return !(depth == 3 && event == json::parse_event_t::key && parsed == "segmentation");
    };
    json root;
    try {
      root = json::parse(in, skip_masks);
    } catch (const json::exception& e) {
      KUSARI_THROW(IOError, fn_, ": ", file_, " is not valid JSON: ", e.what());
    }
    KUSARI_CHECK(root.is_object(), IOError, fn_, ": ", file_, " holds ", root.type_name(),
                 ", expected a JSON object with images, annotations and categories");
    return root;
  }

  // obj[key] of the entry `where`; an error when obj is not an object or lacks the key.
  const json& member(const json& obj, const std::string& where, const char* key) const {
    KUSARI_CHECK(obj.is_object(), IOError, fn_, ": ", file_, ": ", where, " is ", shown(obj),
                 ", expected a JSON object");
    const auto it = obj.find(key);
    KUSARI_CHECK(it != obj.end(), IOError, fn_, ": ", file_, ": ", where, " has no key '", key,
                 "'");
    return *it;
  }

  // The array obj[key] (obj is the file's top-level object).
  const json& array(const json& root, const char* key) const {
    const json& v = member(root, "the top-level object", key);
    KUSARI_CHECK(v.is_array(), IOError, fn_, ": ", file_, ": '", key, "' is ", v.type_name(),
                 ", expected an array");
    return v;
  }

  int64_t integer(const json& v, const std::string& where) const {
    KUSARI_CHECK(v.is_number_integer(), IOError, fn_, ": ", file_, ": ", where, " is ", shown(v),
                 ", expected an integer");
    return v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
  }

  std::string string(const json& v, const std::string& where) const {
    KUSARI_CHECK(v.is_string(), IOError, fn_, ": ", file_, ": ", where, " is ", shown(v),
                 ", expected a string");
    return v.get<std::string>();
  }

  // iscrowd: 0/1 (COCO) or a JSON boolean.
  bool flag(const json& v, const std::string& where) const {
    if (v.is_boolean()) return v.get<bool>();
    return integer(v, where) != 0;
  }

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    KUSARI_THROW(IOError, fn_, ": ", file_, ": ", where, " ", what);
  }

 private:
  const char* fn_;
  const std::string& file_;
};

std::string entry(const char* array, size_t i) {
  return std::string(array) + "[" + std::to_string(i) + "]";
}

// A JSON number that is an integer when the value is one (COCO files write 12 rather than 12.0).
ordered_json json_number(double v) {
  if (std::nearbyint(v) == v && std::abs(v) < 9.0e15) return static_cast<int64_t>(v);
  return v;
}

}  // namespace

// --- CocoDetectionDataset ------------------------------------------------------------------------

CocoDetectionDataset::CocoDetectionDataset(const std::string& annotation_json,
                                           std::string image_root, DecodeOptions options,
                                           CocoDetectionOptions opts)
    : root_(std::move(image_root)), options_(options) {
  const CocoReader r("CocoDetectionDataset", annotation_json);
  const json root = r.parse();

  // Categories, sorted by id, get labels 0..K-1.
  const json& categories = r.array(root, "categories");
  std::map<int64_t, std::pair<std::string, size_t>> by_id;  // id -> (name, entry)
  for (size_t k = 0; k < categories.size(); ++k) {
    const std::string where = entry("categories", k);
    const int64_t id = r.integer(r.member(categories[k], where, "id"), where + ".id");
    const std::string name = r.string(r.member(categories[k], where, "name"), where + ".name");
    const auto [it, fresh] = by_id.emplace(id, std::make_pair(name, k));
    if (!fresh) {
      r.fail(where, "repeats the category id " + std::to_string(id) + " of " +
                        entry("categories", it->second.second));
    }
  }
  std::unordered_map<int64_t, int32_t> label_of;
  for (const auto& [id, named] : by_id) {
    label_of.emplace(id, static_cast<int32_t>(classes_.size()));
    classes_.push_back(named.first);
    category_ids_.push_back(id);
  }

  const json& images = r.array(root, "images");
  std::unordered_map<int64_t, size_t> index_of;
  images_.resize(images.size());
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string where = entry("images", i);
    Entry& e = images_[i];
    e.id = r.integer(r.member(images[i], where, "id"), where + ".id");
    e.file_name = r.string(r.member(images[i], where, "file_name"), where + ".file_name");
    const auto [it, fresh] = index_of.emplace(e.id, i);
    if (!fresh) {
      r.fail(where,
             "repeats the image id " + std::to_string(e.id) + " of " + entry("images", it->second));
    }
  }

  // A file of images without annotations (COCO's test-dev image_info files) has no boxes at all.
  static const json kNoAnnotations = json::array();
  const json& annotations =
      root.contains("annotations") ? r.array(root, "annotations") : kNoAnnotations;
  for (size_t a = 0; a < annotations.size(); ++a) {
    const std::string where = entry("annotations", a);
    const json& ann = annotations[a];
    const int64_t image = r.integer(r.member(ann, where, "image_id"), where + ".image_id");
    const int64_t category = r.integer(r.member(ann, where, "category_id"), where + ".category_id");
    const json& bbox = r.member(ann, where, "bbox");
    const auto image_it = index_of.find(image);
    if (image_it == index_of.end()) {
      r.fail(where, "names image_id " + std::to_string(image) + ", which is not in images");
    }
    const auto label_it = label_of.find(category);
    if (label_it == label_of.end()) {
      r.fail(where,
             "names category_id " + std::to_string(category) + ", which is not in categories");
    }
    if (!bbox.is_array() || bbox.size() != 4 ||
        !std::all_of(bbox.begin(), bbox.end(), [](const json& v) { return v.is_number(); })) {
      r.fail(where + ".bbox", "is " + shown(bbox) + ", expected 4 numbers [x, y, width, height]");
    }
    const auto crowd = ann.find("iscrowd");
    if (opts.skip_crowd && crowd != ann.end() && r.flag(*crowd, where + ".iscrowd")) continue;
    const double x = bbox[0].get<double>(), y = bbox[1].get<double>();
    const double w = bbox[2].get<double>(), h = bbox[3].get<double>();
    if (!(w >= 1.0 && h >= 1.0)) continue;  // degenerate: Note [Reading COCO annotations]
    Entry& e = images_[image_it->second];
    e.boxes.insert(e.boxes.end(), {static_cast<float>(y), static_cast<float>(x),
                                   static_cast<float>(y + h), static_cast<float>(x + w)});
    e.labels.push_back(label_it->second);
  }

  if (opts.skip_images_without_boxes) {
    std::erase_if(images_, [](const Entry& e) { return e.labels.empty(); });
  }
}

int64_t CocoDetectionDataset::checked_index(int64_t i, const char* fn) const {
  return detail::checked_image_index(i, size(), fn);
}

Example CocoDetectionDataset::get_example(int64_t i) const {
  const int64_t j = checked_index(i, "CocoDetectionDataset::get_example");
  return {image_to_array(decode_image(path(j), options_)), boxes(j), labels(j)};
}

std::string CocoDetectionDataset::path(int64_t i) const {
  const Entry& e = images_[static_cast<size_t>(checked_index(i, "CocoDetectionDataset::path"))];
  const fs::path p(e.file_name);
  if (p.is_absolute() || root_.empty()) return e.file_name;
  return (fs::path(root_) / p).string();
}

Array CocoDetectionDataset::boxes(int64_t i) const {
  const Entry& e = images_[static_cast<size_t>(checked_index(i, "CocoDetectionDataset::boxes"))];
  return Array::from_vector(e.boxes, Shape{static_cast<int64_t>(e.labels.size()), 4},
                            Device::cpu());
}

Array CocoDetectionDataset::labels(int64_t i) const {
  const Entry& e = images_[static_cast<size_t>(checked_index(i, "CocoDetectionDataset::labels"))];
  return Array::from_vector(e.labels, Shape{static_cast<int64_t>(e.labels.size())}, Device::cpu());
}

int64_t CocoDetectionDataset::image_id(int64_t i) const {
  return images_[static_cast<size_t>(checked_index(i, "CocoDetectionDataset::image_id"))].id;
}

int64_t CocoDetectionDataset::category_id(int32_t label) const {
  const auto k = static_cast<int64_t>(classes_.size());
  KUSARI_CHECK(label >= 0 && label < k, IndexError, "CocoDetectionDataset::category_id: label ",
               label, " is out of range for a dataset of ", k, " classes");
  return category_ids_[static_cast<size_t>(label)];
}

// --- write_coco_detection ------------------------------------------------------------------------

void write_coco_detection(const std::string& annotation_json,
                          const std::vector<CocoImageRecord>& images,
                          const std::vector<std::string>& class_names) {
  const char* fn = "write_coco_detection";
  ordered_json categories = ordered_json::array();
  for (size_t k = 0; k < class_names.size(); ++k) {
    categories.push_back({{"id", static_cast<int64_t>(k) + 1}, {"name", class_names[k]}});
  }
  ordered_json image_list = ordered_json::array();
  ordered_json annotations = ordered_json::array();
  const auto n_classes = static_cast<int64_t>(class_names.size());
  for (size_t i = 0; i < images.size(); ++i) {
    const CocoImageRecord& rec = images[i];
    const int64_t id = static_cast<int64_t>(i) + 1;
    image_list.push_back(
        {{"id", id}, {"file_name", rec.file_name}, {"height", rec.height}, {"width", rec.width}});
    KUSARI_CHECK(rec.bbox.defined() == rec.label.defined(), ValueError, fn, ": image ", i, " (",
                 rec.file_name, ") has ",
                 rec.bbox.defined() ? "a bbox but no label" : "a label but no bbox",
                 "; give both (or neither, for an image without objects)");
    if (!rec.bbox.defined()) continue;
    KUSARI_CHECK(rec.bbox.ndim() == 2 && rec.bbox.dim(1) == 4, ValueError, fn, ": image ", i, " (",
                 rec.file_name, "): bbox has shape ", rec.bbox.shape(), ", expected (R, 4)");
    KUSARI_CHECK(rec.label.ndim() == 1 && rec.label.dim(0) == rec.bbox.dim(0), ValueError, fn,
                 ": image ", i, " (", rec.file_name, "): label has shape ", rec.label.shape(),
                 ", expected (", rec.bbox.dim(0), ",) to match bbox ", rec.bbox.shape());
    KUSARI_CHECK(is_integral(rec.label.dtype()), ValueError, fn, ": image ", i, " (", rec.file_name,
                 "): label is ", dtype_name(rec.label.dtype()), ", expected an integer dtype");
    const std::vector<double> box = rec.bbox.to_vector<double>();
    const std::vector<int64_t> label = rec.label.to_vector<int64_t>();
    for (size_t r = 0; r < label.size(); ++r) {
      KUSARI_CHECK(label[r] >= 0 && label[r] < n_classes, ValueError, fn, ": image ", i, " (",
                   rec.file_name, "): label[", r, "] is ", label[r], ", expected 0..",
                   n_classes - 1, " (", n_classes, " class names)");
      const double y_min = box[4 * r], x_min = box[4 * r + 1];
      const double h = box[4 * r + 2] - y_min, w = box[4 * r + 3] - x_min;
      annotations.push_back({{"id", static_cast<int64_t>(annotations.size()) + 1},
                             {"image_id", id},
                             {"category_id", label[r] + 1},
                             {"bbox", ordered_json::array({json_number(x_min), json_number(y_min),
                                                           json_number(w), json_number(h)})},
                             {"area", json_number(w * h)},
                             {"iscrowd", 0}});
    }
  }
  const ordered_json root = {{"info", {{"description", "written by kusari::write_coco_detection"}}},
                             {"licenses", ordered_json::array()},
                             {"images", std::move(image_list)},
                             {"annotations", std::move(annotations)},
                             {"categories", std::move(categories)}};
  const std::string text = root.dump() + "\n";
  write_file_bytes(annotation_json, std::vector<uint8_t>(text.begin(), text.end()));
}

// --- make_synthetic_detection_images -------------------------------------------------------------

namespace {

using detail::splitmix64;

// std::mt19937_64 (whose output the standard fixes) with explicit arithmetic on top: Note
// [Synthetic detection pictures].
class ShapeRng {
 public:
  explicit ShapeRng(uint64_t seed) : gen_(seed) {}
  // An integer in [lo, hi] (the modulo's bias is below 2^-50 for these ranges).
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(gen_() % static_cast<uint64_t>(hi - lo + 1));
  }
  // A double in [0, 1).
  double unit() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 gen_;
};

// A saturated colour: HSV with S = 1 and V in [0.7, 1].
std::array<uint8_t, 3> saturated_colour(ShapeRng& rng) {
  const double h = rng.unit() * 6.0;
  const double v = 0.7 + 0.3 * rng.unit();
  const int sector = std::min(static_cast<int>(h), 5);
  const double f = h - sector;
  const double rgb[6][3] = {{v, v * f, 0},       {v * (1 - f), v, 0}, {0, v, v * f},
                            {0, v * (1 - f), v}, {v * f, 0, v},       {v, 0, v * (1 - f)}};
  std::array<uint8_t, 3> c{};
  for (int k = 0; k < 3; ++k) c[k] = static_cast<uint8_t>(std::lround(rgb[sector][k] * 255.0));
  return c;
}

// Whether pixel (r, c) of an s x s cell belongs to shape `cls` (0 square, 1 disk, 2 triangle
// with its apex up), in integer arithmetic on doubled coordinates (pixel centres).
bool in_shape(int cls, int64_t r, int64_t c, int64_t s) {
  const int64_t dy = 2 * r - (s - 1), dx = 2 * c - (s - 1);
  switch (cls) {
    case 0:
      return true;
    case 1:
      return dy * dy + dx * dx <= s * s;
    default:
      return std::abs(dx) <= r;
  }
}

struct PixelBox {
  int64_t y0, x0, y1, x1;  // [y0, y1) x [x0, x1)
  int64_t area() const { return (y1 - y0) * (x1 - x0); }
};

// Whether two boxes overlap by more than 30% of the smaller one.
bool too_close(const PixelBox& a, const PixelBox& b) {
  const int64_t h = std::min(a.y1, b.y1) - std::max(a.y0, b.y0);
  const int64_t w = std::min(a.x1, b.x1) - std::max(a.x0, b.x0);
  if (h <= 0 || w <= 0) return false;
  return 10 * h * w > 3 * std::min(a.area(), b.area());
}

}  // namespace

SyntheticDetectionSet make_synthetic_detection_images(int64_t count,
                                                      const SyntheticDetectionOptions& options) {
  const char* fn = "make_synthetic_detection_images";
  const int64_t size = options.size;
  KUSARI_CHECK(count >= 0, ValueError, fn, ": count is ", count, ", expected 0 or more");
  KUSARI_CHECK(size >= 12, ValueError, fn, ": size is ", size, ", expected at least 12 pixels");
  KUSARI_CHECK(options.max_objects >= 1, ValueError, fn, ": max_objects is ", options.max_objects,
               ", expected at least 1");
  const int64_t min_side = (size + 5) / 6;  // ceil(size / 6)
  const int64_t max_side = 2 * size / 5;    // floor(size / 2.5)
  constexpr int kAttempts = 100;

  SyntheticDetectionSet set;
  set.class_names = {"square", "disk", "triangle"};
  const uint64_t split_seed = splitmix64(splitmix64(options.seed) ^ options.split);
  for (int64_t i = 0; i < count; ++i) {
    ShapeRng rng(splitmix64(split_seed ^ static_cast<uint64_t>(i)));
    Image img = Image::zeros(size, size, 3);

    // The background: grey level, gradient, tint, then per-pixel noise shared by the channels.
    const int64_t base = rng.between(80, 176);
    const int64_t grad_y = rng.between(-40, 40), grad_x = rng.between(-40, 40);
    int64_t tint[3];
    for (int64_t& t : tint) t = rng.between(-10, 10);
    for (int64_t y = 0; y < size; ++y) {
      for (int64_t x = 0; x < size; ++x) {
        const int64_t v =
            base + grad_y * y / (size - 1) + grad_x * x / (size - 1) + rng.between(-4, 4);
        for (int64_t k = 0; k < 3; ++k) {
          img.pixels[static_cast<size_t>((y * size + x) * 3 + k)] =
              static_cast<uint8_t>(std::clamp<int64_t>(v + tint[k], 0, 255));
        }
      }
    }

    // The objects: placed, checked against the earlier boxes, then drawn.
    const int64_t n_objects = rng.between(1, options.max_objects);
    std::vector<PixelBox> boxes;
    std::vector<int32_t> labels;
    for (int64_t o = 0; o < n_objects; ++o) {
      for (int attempt = 0; attempt < kAttempts; ++attempt) {
        const int cls = static_cast<int>(rng.between(0, 2));
        const int64_t s = rng.between(min_side, max_side);
        const int64_t top = rng.between(0, size - s), left = rng.between(0, size - s);
        const std::array<uint8_t, 3> colour = saturated_colour(rng);
        PixelBox box{size, size, 0, 0};
        for (int64_t r = 0; r < s; ++r) {
          for (int64_t c = 0; c < s; ++c) {
            if (!in_shape(cls, r, c, s)) continue;
            box = {std::min(box.y0, top + r), std::min(box.x0, left + c),
                   std::max(box.y1, top + r + 1), std::max(box.x1, left + c + 1)};
          }
        }
        if (std::any_of(boxes.begin(), boxes.end(),
                        [&](const PixelBox& b) { return too_close(b, box); })) {
          continue;
        }
        for (int64_t r = 0; r < s; ++r) {
          for (int64_t c = 0; c < s; ++c) {
            if (!in_shape(cls, r, c, s)) continue;
            uint8_t* p = &img.pixels[static_cast<size_t>(((top + r) * size + left + c) * 3)];
            std::copy(colour.begin(), colour.end(), p);
          }
        }
        boxes.push_back(box);
        labels.push_back(cls);
        break;
      }
    }

    CocoImageRecord rec;
    char name[32];
    std::snprintf(name, sizeof(name), "%06lld.jpg", static_cast<long long>(i));
    rec.file_name = name;
    rec.height = size;
    rec.width = size;
    std::vector<float> flat;
    for (const PixelBox& b : boxes) {
      flat.insert(flat.end(), {static_cast<float>(b.y0), static_cast<float>(b.x0),
                               static_cast<float>(b.y1), static_cast<float>(b.x1)});
    }
    const auto r = static_cast<int64_t>(boxes.size());
    rec.bbox = Array::from_vector(flat, Shape{r, 4}, Device::cpu());
    rec.label = Array::from_vector(labels, Shape{r}, Device::cpu());
    set.images.push_back(std::move(img));
    set.records.push_back(std::move(rec));
  }
  return set;
}

// --- box-aware augmentation ----------------------------------------------------------------------

namespace {

// An example's boxes and labels on the host: box holds R * 4 values (y_min, x_min, y_max, x_max).
struct HostBoxes {
  std::vector<double> box;
  std::vector<int32_t> label;
  size_t count() const { return label.size(); }
};

void check_bbox(const char* fn, const Array& bbox) {
  KUSARI_CHECK(bbox.defined(), ValueError, fn,
               ": bbox is undefined, expected an (R, 4) array (y_min, x_min, y_max, x_max)");
  KUSARI_CHECK(bbox.ndim() == 2 && bbox.dim(1) == 4, ShapeError, fn, ": bbox has shape ",
               bbox.shape(), ", expected (R, 4) (y_min, x_min, y_max, x_max)");
  KUSARI_CHECK(bbox.dtype() != bool_, DtypeError, fn,
               ": bbox is bool, expected a real dtype (float32)");
}

// The checked host copies of bbox (R, 4) and label (R,).
HostBoxes host_boxes(const char* fn, const Array& bbox, const Array& label) {
  check_bbox(fn, bbox);
  KUSARI_CHECK(label.defined(), ValueError, fn, ": label is undefined, expected an (", bbox.dim(0),
               ",) array to match bbox ", bbox.shape());
  KUSARI_CHECK(label.ndim() == 1 && label.dim(0) == bbox.dim(0), ShapeError, fn,
               ": label has shape ", label.shape(), ", expected (", bbox.dim(0),
               ",) to match bbox ", bbox.shape());
  KUSARI_CHECK(is_integral(label.dtype()) && label.dtype() != bool_, DtypeError, fn, ": label is ",
               dtype_name(label.dtype()), ", expected an integer dtype (int32)");
  return {bbox.to_vector<double>(), label.to_vector<int32_t>()};
}

void check_size(const char* fn, const char* what, int64_t height, int64_t width) {
  KUSARI_CHECK(height >= 1 && width >= 1, ValueError, fn, ": ", what, " ", height, " x ", width,
               " is not positive, expected a height and a width of at least 1");
}

void check_image(const char* fn, const Array& image) {
  KUSARI_CHECK(image.defined(), ValueError, fn,
               ": image is undefined, expected a uint8 (H, W, C) array");
  KUSARI_CHECK(image.dtype() == uint8, DtypeError, fn, ": image is ", dtype_name(image.dtype()),
               ", expected a uint8 (H, W, C) array as the detection datasets give");
  KUSARI_CHECK(image.ndim() == 3, ShapeError, fn, ": image has shape ", image.shape(),
               ", expected (H, W, C)");
  check_size(fn, "the image's size", image.dim(0), image.dim(1));
}

// Keeps the boxes that have area once clipped to [0, height] x [0, width] (clipped).
void clip_boxes(HostBoxes& b, double height, double width) {
  size_t kept = 0;
  for (size_t r = 0; r < b.count(); ++r) {
    const double y0 = std::clamp(b.box[4 * r], 0.0, height);
    const double x0 = std::clamp(b.box[4 * r + 1], 0.0, width);
    const double y1 = std::clamp(b.box[4 * r + 2], 0.0, height);
    const double x1 = std::clamp(b.box[4 * r + 3], 0.0, width);
    // NaN coordinates compare false and drop the box too.
    if (!(y1 > y0 && x1 > x0)) continue;
    b.box[4 * kept] = y0;
    b.box[4 * kept + 1] = x0;
    b.box[4 * kept + 2] = y1;
    b.box[4 * kept + 3] = x1;
    b.label[kept] = b.label[r];
    ++kept;
  }
  b.box.resize(4 * kept);
  b.label.resize(kept);
}

// {float32 (R, 4), int32 (R,)} of the host boxes, dropping the boxes that float32 leaves without
// area.
std::pair<Array, Array> boxes_to_arrays(const HostBoxes& b) {
  std::vector<float> box;
  std::vector<int32_t> label;
  for (size_t r = 0; r < b.count(); ++r) {
    const std::array<float, 4> v = {
        static_cast<float>(b.box[4 * r]), static_cast<float>(b.box[4 * r + 1]),
        static_cast<float>(b.box[4 * r + 2]), static_cast<float>(b.box[4 * r + 3])};
    if (!(v[2] > v[0] && v[3] > v[1])) continue;
    box.insert(box.end(), v.begin(), v.end());
    label.push_back(b.label[r]);
  }
  const auto n = static_cast<int64_t>(label.size());
  return {Array::from_vector(box, Shape{n, 4}, Device::cpu()),
          Array::from_vector(label, Shape{n}, Device::cpu())};
}

void flip_host(HostBoxes& b, double height, double width, bool y_flip, bool x_flip) {
  for (size_t r = 0; r < b.count(); ++r) {
    double* v = &b.box[4 * r];
    if (y_flip) {
      const double y0 = height - v[2], y1 = height - v[0];
      v[0] = y0;
      v[2] = y1;
    }
    if (x_flip) {
      const double x0 = width - v[3], x1 = width - v[1];
      v[1] = x0;
      v[3] = x1;
    }
  }
}

// Multiplies y by to_h / from_h and x by to_w / from_w.
void scale_host(HostBoxes& b, double from_h, double from_w, double to_h, double to_w) {
  for (size_t r = 0; r < b.count(); ++r) {
    double* v = &b.box[4 * r];
    v[0] = v[0] * to_h / from_h;
    v[2] = v[2] * to_h / from_h;
    v[1] = v[1] * to_w / from_w;
    v[3] = v[3] * to_w / from_w;
  }
}

DetectionExample make_example(Array image, const HostBoxes& b) {
  auto [bbox, label] = boxes_to_arrays(b);
  return {std::move(image), std::move(bbox), std::move(label)};
}

// The uint8 (H, W, C) image resampled to height x width (Note [Box-aware augmentation]).
Image resized_image(const Array& image, int64_t height, int64_t width) {
  const Image in = image_from_array(image);
  transforms::CropPlan plan;
  plan.height = static_cast<double>(in.height);
  plan.width = static_cast<double>(in.width);
  plan.out_height = height;
  plan.out_width = width;
  return transforms::resample(in, plan);
}

double unit_draw(Generator& generator) {
  return static_cast<double>(generator.next_uint64() >> 11) * 0x1.0p-53;  // [0, 1)
}

void check_augment_options(const char* fn, const DetectionAugmentOptions& o) {
  KUSARI_CHECK(o.flip_probability >= 0 && o.flip_probability <= 1, ValueError, fn,
               ": flip_probability is ", o.flip_probability, ", expected a probability in [0, 1]");
  KUSARI_CHECK((o.height == 0 && o.width == 0) || (o.height >= 1 && o.width >= 1), ValueError, fn,
               ": the size ", o.height, " x ", o.width,
               " is not positive, expected a height and a width of at least 1 (or both 0 to keep "
               "each picture's size)");
}

}  // namespace

DetectionExample DetectionExample::from_example(const Example& example) {
  KUSARI_CHECK(example.size() == 3, ValueError, "DetectionExample::from_example: the example has ",
               example.size(), " arrays, expected 3 {image, bbox, label}");
  return {example[0], example[1], example[2]};
}

Array flip_bbox(const Array& bbox, int64_t height, int64_t width, bool y_flip, bool x_flip) {
  const char* fn = "flip_bbox";
  check_bbox(fn, bbox);
  check_size(fn, "the picture's size", height, width);
  const int64_t n = bbox.dim(0);
  HostBoxes b{bbox.to_vector<double>(), std::vector<int32_t>(static_cast<size_t>(n))};
  flip_host(b, static_cast<double>(height), static_cast<double>(width), y_flip, x_flip);
  std::vector<float> out(b.box.begin(), b.box.end());
  return Array::from_vector(out, Shape{n, 4}, Device::cpu());
}

Array resize_bbox(const Array& bbox, std::array<int64_t, 2> in_size,
                  std::array<int64_t, 2> out_size) {
  const char* fn = "resize_bbox";
  check_bbox(fn, bbox);
  check_size(fn, "in_size", in_size[0], in_size[1]);
  check_size(fn, "out_size", out_size[0], out_size[1]);
  const int64_t n = bbox.dim(0);
  HostBoxes b{bbox.to_vector<double>(), std::vector<int32_t>(static_cast<size_t>(n))};
  scale_host(b, static_cast<double>(in_size[0]), static_cast<double>(in_size[1]),
             static_cast<double>(out_size[0]), static_cast<double>(out_size[1]));
  std::vector<float> out(b.box.begin(), b.box.end());
  return Array::from_vector(out, Shape{n, 4}, Device::cpu());
}

std::pair<Array, Array> clip_bbox(const Array& bbox, const Array& label, int64_t height,
                                  int64_t width) {
  const char* fn = "clip_bbox";
  HostBoxes b = host_boxes(fn, bbox, label);
  check_size(fn, "the picture's size", height, width);
  clip_boxes(b, static_cast<double>(height), static_cast<double>(width));
  return boxes_to_arrays(b);
}

DetectionExample flip_detection(const DetectionExample& example, bool y_flip, bool x_flip) {
  const char* fn = "flip_detection";
  check_image(fn, example.image);
  HostBoxes b = host_boxes(fn, example.bbox, example.label);
  const int64_t h = example.image.dim(0), w = example.image.dim(1), c = example.image.dim(2);
  clip_boxes(b, static_cast<double>(h), static_cast<double>(w));
  flip_host(b, static_cast<double>(h), static_cast<double>(w), y_flip, x_flip);
  const Image in = image_from_array(example.image);
  Image out = Image::zeros(h, w, c);
  const auto row_bytes = static_cast<size_t>(w * c);
  for (int64_t y = 0; y < h; ++y) {
    const uint8_t* src = in.pixels.data() + static_cast<size_t>(y_flip ? h - 1 - y : y) * row_bytes;
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(y) * row_bytes;
    if (!x_flip) {
      std::memcpy(dst, src, row_bytes);
      continue;
    }
    for (int64_t x = 0; x < w; ++x) {
      std::memcpy(dst + x * c, src + (w - 1 - x) * c, static_cast<size_t>(c));
    }
  }
  return make_example(image_to_array(out), b);
}

DetectionExample random_flip_detection(const DetectionExample& example, Generator& generator,
                                       double p) {
  KUSARI_CHECK(p >= 0 && p <= 1, ValueError, "random_flip_detection: p is ", p,
               ", expected a probability in [0, 1]");
  const bool flip = unit_draw(generator) < p;
  if (flip) return flip_detection(example, false, true);
  return flip_detection(example, false, false);
}

DetectionExample resize_detection(const DetectionExample& example, int64_t height, int64_t width) {
  const char* fn = "resize_detection";
  check_image(fn, example.image);
  HostBoxes b = host_boxes(fn, example.bbox, example.label);
  check_size(fn, "the size", height, width);
  const int64_t h = example.image.dim(0), w = example.image.dim(1);
  clip_boxes(b, static_cast<double>(h), static_cast<double>(w));
  scale_host(b, static_cast<double>(h), static_cast<double>(w), static_cast<double>(height),
             static_cast<double>(width));
  return make_example(image_to_array(resized_image(example.image, height, width)), b);
}

std::array<int64_t, 2> fit_size(int64_t height, int64_t width, int64_t max_height,
                                int64_t max_width) {
  check_size("fit_size", "the picture's size", height, width);
  check_size("fit_size", "the bound", max_height, max_width);
  const double scale = std::min(static_cast<double>(max_height) / static_cast<double>(height),
                                static_cast<double>(max_width) / static_cast<double>(width));
  const auto side = [scale](int64_t n, int64_t bound) {
    return std::clamp<int64_t>(std::llround(static_cast<double>(n) * scale), 1, bound);
  };
  return {side(height, max_height), side(width, max_width)};
}

DetectionExample resize_detection_to_fit(const DetectionExample& example, int64_t height,
                                         int64_t width, uint8_t fill) {
  const char* fn = "resize_detection_to_fit";
  check_image(fn, example.image);
  HostBoxes b = host_boxes(fn, example.bbox, example.label);
  check_size(fn, "the size", height, width);
  const int64_t h = example.image.dim(0), w = example.image.dim(1), c = example.image.dim(2);
  const auto [fh, fw] = fit_size(h, w, height, width);
  clip_boxes(b, static_cast<double>(h), static_cast<double>(w));
  scale_host(b, static_cast<double>(h), static_cast<double>(w), static_cast<double>(fh),
             static_cast<double>(fw));
  const Image fitted = resized_image(example.image, fh, fw);
  Image out = Image::zeros(height, width, c);
  std::fill(out.pixels.begin(), out.pixels.end(), fill);
  for (int64_t y = 0; y < fh; ++y) {
    std::memcpy(out.pixels.data() + static_cast<size_t>(y * width * c),
                fitted.pixels.data() + static_cast<size_t>(y * fw * c),
                static_cast<size_t>(fw * c));
  }
  return make_example(image_to_array(out), b);
}

DetectionExample augment_detection(const DetectionExample& example,
                                   const DetectionAugmentOptions& options, Generator& generator) {
  check_augment_options("augment_detection", options);
  DetectionExample out = random_flip_detection(example, generator, options.flip_probability);
  if (options.height == 0) return out;
  if (options.keep_aspect_ratio) {
    return resize_detection_to_fit(out, options.height, options.width, options.fill);
  }
  return resize_detection(out, options.height, options.width);
}

TransformedDetectionDataset::TransformedDetectionDataset(std::shared_ptr<const Dataset> dataset,
                                                         Transform transform, uint64_t seed)
    : dataset_(std::move(dataset)), transform_(std::move(transform)), seed_(seed) {
  KUSARI_CHECK(dataset_ != nullptr, ValueError,
               "TransformedDetectionDataset: the dataset is null, expected a detection dataset");
  KUSARI_CHECK(static_cast<bool>(transform_), ValueError,
               "TransformedDetectionDataset: the transform is empty, expected a function");
  size_ = dataset_->size();
  draws_ = std::make_unique<std::atomic<uint64_t>[]>(static_cast<size_t>(size_));
  reset_draws();
}

TransformedDetectionDataset::TransformedDetectionDataset(std::shared_ptr<const Dataset> dataset,
                                                         DetectionAugmentOptions options,
                                                         uint64_t seed)
    : TransformedDetectionDataset(
          std::move(dataset),
          [options](const DetectionExample& e, Generator& g) {
            return augment_detection(e, options, g);
          },
          seed) {
  check_augment_options("TransformedDetectionDataset", options);
}

Example TransformedDetectionDataset::get_example(int64_t i) const {
  const int64_t j =
      detail::checked_image_index(i, size_, "TransformedDetectionDataset::get_example");
  const uint64_t draw = draws_[static_cast<size_t>(j)].fetch_add(1, std::memory_order_relaxed);
  return example(j, draw);
}

Example TransformedDetectionDataset::example(int64_t i, uint64_t draw) const {
  const int64_t j = detail::checked_image_index(i, size_, "TransformedDetectionDataset::example");
  Generator generator(transforms::example_seed(seed_, static_cast<int64_t>(draw), j));
  const DetectionExample in = DetectionExample::from_example(dataset_->get_example(j));
  return transform_(in, generator).to_example();
}

void TransformedDetectionDataset::reset_draws() {
  for (int64_t i = 0; i < size_; ++i) draws_[static_cast<size_t>(i)].store(0);
}

}  // namespace kusari
