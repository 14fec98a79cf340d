// CocoDetectionDataset, write_coco_detection and make_synthetic_detection_images (Notes [Detection
// examples], [Reading COCO annotations] and [Synthetic detection pictures] in detection.h).
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

}  // namespace kusari
