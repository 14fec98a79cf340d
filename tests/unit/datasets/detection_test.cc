// COCO-style detection datasets: reading hand-written annotation files (label mapping, crowd and
// degenerate boxes, images without boxes), round trips through write_coco_detection, errors that
// name the file and the entry, the synthetic detection pictures, and the box-aware augmentation
// (flips, resizes, clipping, the transformed dataset).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "image_test_util.h"
#include "kusari/datasets/detection.h"
#include "test_util.h"

namespace kusari {
namespace {

using testing::TempDir;
using testing::test_picture;
using testing::ThrowsWith;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// An instances file of three images (ids 42, 7, 13, in that order) and three categories with
// non-contiguous ids listed out of order: dog (2) -> label 0, cat (5) -> 1, bird (9) -> 2.
const char* const kImages = R"([
  {"id": 42, "file_name": "a.jpg", "height": 40, "width": 50},
  {"id": 7, "file_name": "sub/b.jpg", "height": 30, "width": 30},
  {"id": 13, "file_name": "c.jpg", "height": 20, "width": 20}])";
const char* const kCategories =
    R"([{"id": 5, "name": "cat"}, {"id": 2, "name": "dog"}, {"id": 9, "name": "bird"}])";
const char* const kAnnotations = R"([
  {"id": 1, "image_id": 42, "category_id": 9, "bbox": [10.5, 4, 20, 8.25], "area": 165, "iscrowd": 0},
  {"id": 2, "image_id": 42, "category_id": 2, "bbox": [0, 0, 5, 6], "area": 30, "iscrowd": 1},
  {"id": 3, "image_id": 7, "category_id": 5, "bbox": [1, 2, 3, 4], "segmentation": [[1, 2, 4, 2, 4, 6]]},
  {"id": 4, "image_id": 7, "category_id": 2, "bbox": [1, 2, 0.5, 4], "iscrowd": 0},
  {"id": 5, "image_id": 42, "category_id": 2, "bbox": [3, 1, 2, 0], "iscrowd": 0},
  {"id": 6, "image_id": 42, "category_id": 2, "bbox": [30, 20, 10, 10], "iscrowd": 0}])";

std::string coco_json(const std::string& images, const std::string& annotations,
                      const std::string& categories) {
  return R"({"info": {}, "images": )" + images + R"(, "annotations": )" + annotations +
         R"(, "categories": )" + categories + "}";
}

TEST(CocoDetectionDatasetTest, ReadsBoxesLabelsAndCategoriesOfAHandWrittenFile) {
  TempDir dir;
  const std::string file = dir.file("instances.json");
  write_text(file, coco_json(kImages, kAnnotations, kCategories));
  write_jpeg(dir.file("a.jpg"), test_picture(40, 50, 3), 95);

  const CocoDetectionDataset ds(file, dir.path().string());
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"dog", "cat", "bird"}));
  EXPECT_EQ(ds.category_id(0), 2);
  EXPECT_EQ(ds.category_id(1), 5);
  EXPECT_EQ(ds.category_id(2), 9);
  // The images keep the file's order.
  EXPECT_EQ(ds.image_id(0), 42);
  EXPECT_EQ(ds.image_id(1), 7);
  EXPECT_EQ(ds.image_id(-1), 13);
  EXPECT_EQ(ds.path(1), (dir.path() / "sub/b.jpg").string());

  // Image 42: the crowd box and the box of height 0 are dropped; [x, y, w, h] becomes
  // (y, x, y + h, x + w).
  const Array b0 = ds.boxes(0);
  EXPECT_EQ(b0.dtype(), float32);
  EXPECT_EQ(b0.shape(), (Shape{2, 4}));
  EXPECT_EQ(b0.to_vector<float>(), (std::vector<float>{4, 10.5f, 12.25f, 30.5f, 20, 30, 30, 40}));
  EXPECT_EQ(ds.labels(0).dtype(), int32);
  EXPECT_EQ(ds.labels(0).to_vector<int32_t>(), (std::vector<int32_t>{2, 0}));
  // Image 7: the box 0.5 pixels wide is dropped; a missing iscrowd means 0.
  EXPECT_EQ(ds.boxes(1).to_vector<float>(), (std::vector<float>{2, 1, 6, 4}));
  EXPECT_EQ(ds.labels(1).to_vector<int32_t>(), (std::vector<int32_t>{1}));
  // Image 13 has no box.
  EXPECT_EQ(ds.boxes(2).shape(), (Shape{0, 4}));
  EXPECT_EQ(ds.labels(2).shape(), (Shape{0}));

  const Example ex = ds.get_example(0);
  ASSERT_EQ(ex.size(), 3u);
  EXPECT_EQ(ex[0].dtype(), uint8);
  EXPECT_EQ(ex[0].shape(), (Shape{40, 50, 3}));
  EXPECT_EQ(ex[1].to_vector<float>(), b0.to_vector<float>());
  EXPECT_EQ(ex[2].to_vector<int32_t>(), (std::vector<int32_t>{2, 0}));

  DecodeOptions grey;
  grey.channels = 1;
  const CocoDetectionDataset grey_ds(file, dir.path().string(), grey);
  EXPECT_EQ(grey_ds.get_example(-3)[0].shape(), (Shape{40, 50, 1}));
}

TEST(CocoDetectionDatasetTest, CrowdBoxesAndImagesWithoutBoxesFollowTheOptions) {
  TempDir dir;
  const std::string file = dir.file("instances.json");
  write_text(file, coco_json(kImages, kAnnotations, kCategories));

  CocoDetectionOptions keep_crowd;
  keep_crowd.skip_crowd = false;
  const CocoDetectionDataset with_crowd(file, dir.path().string(), {}, keep_crowd);
  EXPECT_EQ(with_crowd.boxes(0).to_vector<float>(),
            (std::vector<float>{4, 10.5f, 12.25f, 30.5f, 0, 0, 6, 5, 20, 30, 30, 40}));
  EXPECT_EQ(with_crowd.labels(0).to_vector<int32_t>(), (std::vector<int32_t>{2, 0, 0}));

  CocoDetectionOptions only_boxed;
  only_boxed.skip_images_without_boxes = true;
  const CocoDetectionDataset boxed(file, dir.path().string(), {}, only_boxed);
  ASSERT_EQ(boxed.size(), 2);
  EXPECT_EQ(boxed.image_id(0), 42);
  EXPECT_EQ(boxed.image_id(1), 7);

  // A file without annotations (COCO's test-dev image lists) has images without boxes.
  write_text(file,
             R"({"images": )" + std::string(kImages) + R"(, "categories": )" + kCategories + "}");
  const CocoDetectionDataset unannotated(file, "");
  EXPECT_EQ(unannotated.size(), 3);
  EXPECT_EQ(unannotated.boxes(0).shape(), (Shape{0, 4}));
  EXPECT_EQ(unannotated.path(0), "a.jpg");
}

TEST(CocoDetectionDatasetTest, IndicesAndLabelsOutOfRangeAreErrors) {
  TempDir dir;
  const std::string file = dir.file("instances.json");
  write_text(file, coco_json(kImages, kAnnotations, kCategories));
  const CocoDetectionDataset ds(file, dir.path().string());
  EXPECT_TRUE(ThrowsWith<IndexError>(
      [&] { ds.get_example(3); }, {"CocoDetectionDataset::get_example", "index 3", "of 3 images"}));
  EXPECT_TRUE(ThrowsWith<IndexError>([&] { ds.boxes(-4); },
                                     {"CocoDetectionDataset::boxes", "index -4", "of 3 images"}));
  EXPECT_TRUE(ThrowsWith<IndexError>(
      [&] { ds.category_id(3); }, {"CocoDetectionDataset::category_id", "label 3", "3 classes"}));
  // A missing image file is the decoder's IOError naming the file.
  EXPECT_TRUE(ThrowsWith<IOError>([&] { ds.get_example(1); }, {"b.jpg"}));
}

TEST(CocoDetectionDatasetTest, BadFilesAreErrorsNamingTheFileAndTheEntry) {
  TempDir dir;
  const std::string file = dir.file("instances.json");
  const auto fails = [&](const std::string& text, std::initializer_list<std::string_view> parts) {
    write_text(file, text);
    return ThrowsWith<IOError>([&] { (void)CocoDetectionDataset(file, dir.path().string()); },
                               parts);
  };
  const std::string fn = "CocoDetectionDataset";
  EXPECT_TRUE(ThrowsWith<IOError>([&] { (void)CocoDetectionDataset(dir.file("missing.json"), ""); },
                                  {fn, dir.file("missing.json"), "cannot open"}));
  EXPECT_TRUE(ThrowsWith<IOError>([&] { (void)CocoDetectionDataset(dir.path().string(), ""); },
                                  {fn, dir.path().string(), "is a directory"}));
  EXPECT_TRUE(fails(R"({"images": [)", {fn, file, "not valid JSON"}));
  EXPECT_TRUE(fails("[1, 2]", {fn, file, "expected a JSON object"}));
  EXPECT_TRUE(fails(R"({"annotations": [], "categories": []})", {fn, file, "'images'"}));
  EXPECT_TRUE(fails(R"({"images": [], "annotations": []})", {fn, file, "'categories'"}));
  EXPECT_TRUE(fails(R"({"images": {}, "categories": []})", {fn, file, "'images'", "array"}));
  EXPECT_TRUE(fails(coco_json(R"([{"id": 1, "file_name": "a.jpg"}, {"id": 2}])", "[]", kCategories),
                    {fn, file, "images[1]", "'file_name'"}));
  EXPECT_TRUE(fails(coco_json(R"([{"id": "one", "file_name": "a.jpg"}])", "[]", kCategories),
                    {fn, file, "images[0].id", "\"one\"", "integer"}));
  EXPECT_TRUE(
      fails(coco_json(R"([{"id": 3, "file_name": "a.jpg"}, {"id": 3, "file_name": "b.jpg"}])", "[]",
                      kCategories),
            {fn, file, "images[1]", "repeats the image id 3", "images[0]"}));
  EXPECT_TRUE(fails(coco_json(kImages, "[]", R"([{"id": 1, "name": "a"}, {"id": 1, "name": "b"}])"),
                    {fn, file, "categories[1]", "repeats the category id 1"}));
  EXPECT_TRUE(
      fails(coco_json(kImages, "[]", R"([{"id": 1}])"), {fn, file, "categories[0]", "'name'"}));
  EXPECT_TRUE(fails(coco_json(kImages, "[]", R"([{"id": 1, "name": 7}])"),
                    {fn, file, "categories[0].name", "string"}));
  EXPECT_TRUE(fails(coco_json(kImages,
                              R"([{"image_id": 42, "category_id": 2, "bbox": [1, 1, 2, 2]},
                                  {"image_id": 7, "category_id": 2, "bbox": [1, 1, 2, 2]},
                                  {"image_id": 99, "category_id": 2, "bbox": [1, 1, 2, 2]}])",
                              kCategories),
                    {fn, file, "annotations[2]", "image_id 99", "not in images"}));
  EXPECT_TRUE(
      fails(coco_json(kImages, R"([{"image_id": 42, "category_id": 77, "bbox": [1, 1, 2, 2]}])",
                      kCategories),
            {fn, file, "annotations[0]", "category_id 77", "not in categories"}));
  EXPECT_TRUE(fails(coco_json(kImages,
                              R"([{"image_id": 42, "category_id": 2, "bbox": [1, 1, 2, 2]},
                                  {"image_id": 42, "category_id": 2, "bbox": [1, 2, 3]}])",
                              kCategories),
                    {fn, file, "annotations[1].bbox", "[1,2,3]", "4 numbers"}));
  EXPECT_TRUE(
      fails(coco_json(kImages, R"([{"image_id": 42, "category_id": 2, "bbox": [1, "2", 3, 4]}])",
                      kCategories),
            {fn, file, "annotations[0].bbox", "4 numbers"}));
  EXPECT_TRUE(fails(coco_json(kImages, R"([{"image_id": 42, "category_id": 2}])", kCategories),
                    {fn, file, "annotations[0]", "'bbox'"}));
  EXPECT_TRUE(fails(coco_json(kImages, R"([{"image_id": 42, "category_id": 2, "bbox": [1, 1, 2, 2],
                                            "iscrowd": "no"}])",
                              kCategories),
                    {fn, file, "annotations[0].iscrowd"}));
}

// --- writing -------------------------------------------------------------------------------------

TEST(CocoDetectionDatasetTest, WriteCocoDetectionRoundTrips) {
  TempDir dir;
  const std::string file = dir.file("annotations/instances.json");
  std::filesystem::create_directories(dir.path() / "annotations");
  std::vector<CocoImageRecord> records(3);
  records[0] = {
      "x.jpg", 30, 40,
      Array::from({1, 2, 11, 22, 0.5, 1.25, 29.75, 39.5}, Shape{2, 4}, float32, Device::cpu()),
      Array::from_vector(std::vector<int32_t>{1, 0}, std::nullopt, Device::cpu())};
  records[1] = {"y.jpg", 10, 10, Array::zeros({0, 4}, float32, Device::cpu()),
                Array::zeros({0}, int32, Device::cpu())};
  records[2] = {"z.png", 8, 9, Array(), Array()};  // no arrays: no objects
  write_coco_detection(file, records, {"thing", "stuff"});

  const CocoDetectionDataset ds(file, dir.path().string());
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"thing", "stuff"}));
  EXPECT_EQ(ds.category_id(0), 1);
  EXPECT_EQ(ds.category_id(1), 2);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(ds.image_id(i), i + 1);
  EXPECT_EQ(ds.path(2), (dir.path() / "z.png").string());
  EXPECT_EQ(ds.boxes(0).to_vector<float>(), records[0].bbox.to_vector<float>());
  EXPECT_EQ(ds.labels(0).to_vector<int32_t>(), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(ds.boxes(1).shape(), (Shape{0, 4}));
  EXPECT_EQ(ds.boxes(2).shape(), (Shape{0, 4}));
  // No temporary file is left next to the written one.
  int files = 0;
  for ([[maybe_unused]] const auto& f :
       std::filesystem::directory_iterator(dir.path() / "annotations"))
    ++files;
  EXPECT_EQ(files, 1);
}

TEST(CocoDetectionDatasetTest, WriteCocoDetectionChecksItsRecords) {
  TempDir dir;
  const std::string file = dir.file("instances.json");
  const auto record = [](Array bbox, Array label) {
    return std::vector<CocoImageRecord>{{"ok.jpg", 4, 4, Array(), Array()},
                                        {"bad.jpg", 4, 4, std::move(bbox), std::move(label)}};
  };
  const Array box = Array::from({0, 0, 2, 2}, Shape{1, 4}, float32, Device::cpu());
  const Array label = Array::zeros({1}, int32, Device::cpu());
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { write_coco_detection(file, record(box.reshape({4}), label), {"a"}); },
      {"write_coco_detection", "image 1", "bad.jpg", "(R, 4)"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        write_coco_detection(file, record(box, Array::zeros({2}, int32, Device::cpu())), {"a"});
      },
      {"write_coco_detection", "image 1", "label has shape"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        write_coco_detection(file, record(box, Array::full({1}, 1, int32, Device::cpu())), {"a"});
      },
      {"write_coco_detection", "image 1", "label[0] is 1", "expected 0..0"}));
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { write_coco_detection(file, record(box, Array()), {"a"}); },
                             {"write_coco_detection", "image 1", "a bbox but no label"}));
  EXPECT_FALSE(std::filesystem::exists(file));
}

// --- synthetic pictures --------------------------------------------------------------------------

using Rgb = std::array<uint8_t, 3>;

Rgb pixel(const Image& img, int64_t y, int64_t x) {
  const uint8_t* p = &img.pixels[static_cast<size_t>((y * img.width + x) * img.channels)];
  return {p[0], p[1], p[2]};
}

int spread(const Rgb& c) {
  return *std::max_element(c.begin(), c.end()) - *std::min_element(c.begin(), c.end());
}

struct Box {
  int64_t y0, x0, y1, x1;
};

std::vector<Box> boxes_of(const CocoImageRecord& rec) {
  const std::vector<float> b = rec.bbox.to_vector<float>();
  std::vector<Box> out;
  for (size_t r = 0; r + 3 < b.size(); r += 4) {
    out.push_back({static_cast<int64_t>(b[r]), static_cast<int64_t>(b[r + 1]),
                   static_cast<int64_t>(b[r + 2]), static_cast<int64_t>(b[r + 3])});
  }
  return out;
}

bool intersect(const Box& a, const Box& b) {
  return std::min(a.y1, b.y1) > std::max(a.y0, b.y0) && std::min(a.x1, b.x1) > std::max(a.x0, b.x0);
}

TEST(SyntheticDetectionTest, TheSameSeedGivesTheSamePictures) {
  SyntheticDetectionOptions o;
  o.seed = 3;
  const SyntheticDetectionSet a = make_synthetic_detection_images(6, o);
  const SyntheticDetectionSet b = make_synthetic_detection_images(6, o);
  const SyntheticDetectionSet prefix = make_synthetic_detection_images(3, o);
  o.seed = 4;
  const SyntheticDetectionSet other_seed = make_synthetic_detection_images(6, o);
  o.seed = 3;
  o.split = 1;
  const SyntheticDetectionSet other_split = make_synthetic_detection_images(6, o);
  ASSERT_EQ(a.images.size(), 6u);
  EXPECT_EQ(a.class_names, (std::vector<std::string>{"square", "disk", "triangle"}));
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(a.images[i].pixels, b.images[i].pixels) << "picture " << i;
    EXPECT_EQ(a.records[i].bbox.to_vector<float>(), b.records[i].bbox.to_vector<float>());
    EXPECT_EQ(a.records[i].label.to_vector<int32_t>(), b.records[i].label.to_vector<int32_t>());
    if (i < 3) EXPECT_EQ(a.images[i].pixels, prefix.images[i].pixels) << "picture " << i;
    EXPECT_NE(a.images[i].pixels, other_seed.images[i].pixels) << "picture " << i;
    EXPECT_NE(a.images[i].pixels, other_split.images[i].pixels) << "picture " << i;
  }
  EXPECT_EQ(a.records[4].file_name, "000004.jpg");
}

TEST(SyntheticDetectionTest, PictureZeroOfSeedZeroIsTheSameOnEveryPlatform) {
  // The generator uses std::mt19937_64 and integer arithmetic only (Note [Synthetic detection
  // pictures]), so these values hold for every compiler and standard library.
  const SyntheticDetectionSet s = make_synthetic_detection_images(1, {});
  EXPECT_EQ(s.records[0].bbox.to_vector<float>(),
            (std::vector<float>{42, 31, 61, 50, 41, 13, 62, 34, 25, 9, 46, 30}));
  EXPECT_EQ(s.records[0].label.to_vector<int32_t>(), (std::vector<int32_t>{2, 0, 1}));
}

TEST(SyntheticDetectionTest, BoxesAreInsideAndTightAroundTheirShapes) {
  SyntheticDetectionOptions o;
  o.size = 64;
  o.max_objects = 4;
  o.seed = 11;
  const SyntheticDetectionSet set = make_synthetic_detection_images(40, o);
  std::array<int, 3> per_class{};
  int isolated = 0;
  for (size_t i = 0; i < set.images.size(); ++i) {
    const Image& img = set.images[i];
    const CocoImageRecord& rec = set.records[i];
    SCOPED_TRACE("picture " + std::to_string(i));
    ASSERT_EQ(img.height, 64);
    ASSERT_EQ(img.width, 64);
    ASSERT_EQ(img.channels, 3);
    EXPECT_EQ(rec.height, 64);
    EXPECT_EQ(rec.bbox.dtype(), float32);
    EXPECT_EQ(rec.label.dtype(), int32);
    const std::vector<Box> boxes = boxes_of(rec);
    const std::vector<int32_t> labels = rec.label.to_vector<int32_t>();
    ASSERT_EQ(labels.size(), boxes.size());
    EXPECT_GE(boxes.size(), 1u);
    EXPECT_LE(boxes.size(), 4u);
    for (size_t r = 0; r < boxes.size(); ++r) {
      const Box& b = boxes[r];
      EXPECT_TRUE(b.y0 >= 0 && b.x0 >= 0 && b.y1 <= 64 && b.x1 <= 64);
      // Sides between size / 6 and size / 2.5 (a triangle of an even side loses its top row).
      EXPECT_TRUE(b.y1 - b.y0 >= 10 && b.y1 - b.y0 <= 25 && b.x1 - b.x0 >= 11 && b.x1 - b.x0 <= 25);
      ASSERT_TRUE(labels[r] >= 0 && labels[r] < 3);
      ++per_class[static_cast<size_t>(labels[r])];
    }
    // Every pixel of a shape (a saturated colour) lies in a box; the background is grey.
    for (int64_t y = 0; y < 64; ++y) {
      for (int64_t x = 0; x < 64; ++x) {
        const bool boxed = std::any_of(boxes.begin(), boxes.end(), [&](const Box& b) {
          return y >= b.y0 && y < b.y1 && x >= b.x0 && x < b.x1;
        });
        const int s = spread(pixel(img, y, x));
        if (!boxed) EXPECT_LE(s, 20) << "at (" << y << ", " << x << ")";
        if (s > 20) EXPECT_GE(s, 178) << "at (" << y << ", " << x << ")";
      }
    }
    // A box that meets no other box: its shape's colour (at the box centre) reaches each of its
    // four sides and nothing just outside them.
    for (size_t r = 0; r < boxes.size(); ++r) {
      const Box& b = boxes[r];
      bool alone = true;
      for (size_t q = 0; q < boxes.size(); ++q)
        alone = alone && (q == r || !intersect(b, boxes[q]));
      if (!alone) continue;
      ++isolated;
      const Rgb colour = pixel(img, (b.y0 + b.y1) / 2, (b.x0 + b.x1) / 2);
      EXPECT_GE(spread(colour), 178);
      const auto row_has = [&](int64_t y) {
        if (y < 0 || y >= 64) return false;
        for (int64_t x = b.x0; x < b.x1; ++x)
          if (pixel(img, y, x) == colour) return true;
        return false;
      };
      const auto column_has = [&](int64_t x) {
        if (x < 0 || x >= 64) return false;
        for (int64_t y = b.y0; y < b.y1; ++y)
          if (pixel(img, y, x) == colour) return true;
        return false;
      };
      EXPECT_TRUE(row_has(b.y0) && row_has(b.y1 - 1) && column_has(b.x0) && column_has(b.x1 - 1));
      EXPECT_FALSE(row_has(b.y0 - 1) || row_has(b.y1) || column_has(b.x0 - 1) || column_has(b.x1));
      if (labels[r] == 0) {  // a square fills its box
        for (int64_t y = b.y0; y < b.y1; ++y)
          for (int64_t x = b.x0; x < b.x1; ++x) ASSERT_EQ(pixel(img, y, x), colour);
      }
    }
  }
  EXPECT_GT(isolated, 30);
  for (int n : per_class) EXPECT_GT(n, 10);
}

TEST(SyntheticDetectionTest, WrittenSetLoadsAsACocoDetectionDataset) {
  // What make_detection_set does: JPEGs and an instances file, then read back.
  TempDir dir;
  SyntheticDetectionOptions o;
  o.seed = 5;
  const SyntheticDetectionSet set = make_synthetic_detection_images(8, o);
  std::filesystem::create_directories(dir.path() / "train");
  for (size_t i = 0; i < set.images.size(); ++i)
    write_jpeg((dir.path() / "train" / set.records[i].file_name).string(), set.images[i], 95);
  write_coco_detection(dir.file("instances_train.json"), set.records, set.class_names);

  const CocoDetectionDataset ds(dir.file("instances_train.json"), (dir.path() / "train").string());
  ASSERT_EQ(ds.size(), 8);
  EXPECT_EQ(ds.classes(), set.class_names);
  for (int64_t i = 0; i < ds.size(); ++i) {
    SCOPED_TRACE("picture " + std::to_string(i));
    const CocoImageRecord& rec = set.records[static_cast<size_t>(i)];
    const Example ex = ds.get_example(i);
    ASSERT_EQ(ex[0].shape(), (Shape{64, 64, 3}));
    EXPECT_EQ(ex[1].to_vector<float>(), rec.bbox.to_vector<float>());
    EXPECT_EQ(ex[2].to_vector<int32_t>(), rec.label.to_vector<int32_t>());
    // The centre of each box keeps the shape's colour through JPEG (up to its rounding).
    const Image decoded = image_from_array(ex[0]);
    const Image& drawn = set.images[static_cast<size_t>(i)];
    for (const Box& b : boxes_of(rec)) {
      const Rgb want = pixel(drawn, (b.y0 + b.y1) / 2, (b.x0 + b.x1) / 2);
      const Rgb got = pixel(decoded, (b.y0 + b.y1) / 2, (b.x0 + b.x1) / 2);
      for (int k = 0; k < 3; ++k) EXPECT_NEAR(got[k], want[k], 24);
    }
  }
}

TEST(SyntheticDetectionTest, BadOptionsAreErrors) {
  SyntheticDetectionOptions o;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { make_synthetic_detection_images(-1, o); },
                                     {"make_synthetic_detection_images", "count is -1"}));
  o.size = 11;
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { make_synthetic_detection_images(1, o); },
                             {"make_synthetic_detection_images", "size is 11", "at least 12"}));
  o.size = 12;
  o.max_objects = 0;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { make_synthetic_detection_images(1, o); },
                                     {"make_synthetic_detection_images", "max_objects is 0"}));
  o.max_objects = 5;
  EXPECT_EQ(make_synthetic_detection_images(3, o).images.size(), 3u);  // the smallest size works
}

// --- box-aware augmentation (Note [Box-aware augmentation]) --------------------------------------

Array box_array(const std::vector<float>& v) {
  return Array::from_vector(v, Shape{static_cast<int64_t>(v.size() / 4), 4}, Device::cpu());
}

Array label_array(const std::vector<int32_t>& v) {
  return Array::from_vector(v, Shape{static_cast<int64_t>(v.size())}, Device::cpu());
}

DetectionExample picture_with_boxes(int64_t height, int64_t width, const std::vector<float>& box,
                                    const std::vector<int32_t>& label, int seed = 0) {
  return {image_to_array(test_picture(height, width, 3, seed)), box_array(box), label_array(label)};
}

TEST(DetectionAugmentationTest, FlippingTwiceGivesTheExampleBack) {
  const DetectionExample ex =
      picture_with_boxes(9, 13, {1, 2, 4, 5, 0, 0.5f, 9, 13, 3.5f, 7, 8, 12.5f}, {2, 0, 1});
  for (const auto& [y_flip, x_flip] :
       std::vector<std::pair<bool, bool>>{{false, true}, {true, false}, {true, true}}) {
    SCOPED_TRACE(std::to_string(y_flip) + " " + std::to_string(x_flip));
    const DetectionExample once = flip_detection(ex, y_flip, x_flip);
    EXPECT_NE(once.image.to_vector<uint8_t>(), ex.image.to_vector<uint8_t>());
    const DetectionExample twice = flip_detection(once, y_flip, x_flip);
    EXPECT_EQ(twice.image.shape(), ex.image.shape());
    EXPECT_EQ(twice.image.to_vector<uint8_t>(), ex.image.to_vector<uint8_t>());
    EXPECT_EQ(twice.bbox.to_vector<float>(), ex.bbox.to_vector<float>());
    EXPECT_EQ(twice.label.to_vector<int32_t>(), ex.label.to_vector<int32_t>());
  }
}

TEST(DetectionAugmentationTest, FlippedBoxesAndPixelsWorkedByHand) {
  // A 6 x 10 picture; the box covers rows 1..3 and columns 2..4.
  const DetectionExample ex = picture_with_boxes(6, 10, {1, 2, 4, 5}, {7});
  const DetectionExample h = flip_detection(ex);  // horizontal: x -> 10 - x
  EXPECT_EQ(h.bbox.dtype(), float32);
  EXPECT_EQ(h.bbox.to_vector<float>(), (std::vector<float>{1, 5, 4, 8}));
  EXPECT_EQ(h.label.dtype(), int32);
  EXPECT_EQ(h.label.to_vector<int32_t>(), (std::vector<int32_t>{7}));
  const DetectionExample v = flip_detection(ex, /*y_flip=*/true, /*x_flip=*/false);  // y -> 6 - y
  EXPECT_EQ(v.bbox.to_vector<float>(), (std::vector<float>{2, 2, 5, 5}));
  EXPECT_EQ(flip_bbox(ex.bbox, 6, 10).to_vector<float>(), (std::vector<float>{1, 5, 4, 8}));
  EXPECT_EQ(flip_bbox(ex.bbox, 6, 10, true, true).to_vector<float>(),
            (std::vector<float>{2, 5, 5, 8}));
  // Pixel (y, x) of the mirrored picture is pixel (y, 9 - x) of the original.
  const std::vector<uint8_t> in = ex.image.to_vector<uint8_t>();
  const std::vector<uint8_t> out = h.image.to_vector<uint8_t>();
  ASSERT_EQ(h.image.shape(), (Shape{6, 10, 3}));
  for (int y = 0; y < 6; ++y) {
    for (int x = 0; x < 10; ++x) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(out[static_cast<size_t>((y * 10 + x) * 3 + c)],
                  in[static_cast<size_t>((y * 10 + 9 - x) * 3 + c)]);
      }
    }
  }
}

TEST(DetectionAugmentationTest, ResizeScalesBoxesByTheExactFactors) {
  // 10 x 20 -> 25 x 8: y times 2.5, x times 0.4.
  const DetectionExample ex = picture_with_boxes(10, 20, {2, 5, 6, 15, 0, 0, 10, 20}, {1, 0});
  const DetectionExample r = resize_detection(ex, 25, 8);
  EXPECT_EQ(r.image.shape(), (Shape{25, 8, 3}));
  EXPECT_EQ(r.image.dtype(), uint8);
  EXPECT_EQ(r.bbox.to_vector<float>(), (std::vector<float>{5, 2, 15, 6, 0, 0, 25, 8}));
  EXPECT_EQ(r.label.to_vector<int32_t>(), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(resize_bbox(ex.bbox, {10, 20}, {25, 8}).to_vector<float>(), r.bbox.to_vector<float>());
  // Factors that are not exact in binary: (y, x) -> (y * 7 / 3, x * 5 / 9), as float32.
  const DetectionExample odd = picture_with_boxes(3, 9, {1, 2, 2, 7}, {0});
  const DetectionExample ro = resize_detection(odd, 7, 5);
  EXPECT_EQ(ro.bbox.to_vector<float>(),
            (std::vector<float>{static_cast<float>(7.0 / 3), static_cast<float>(10.0 / 9),
                                static_cast<float>(14.0 / 3), static_cast<float>(35.0 / 9)}));
  // The image is resampled: a picture of one colour keeps it.
  Image flat = Image::zeros(10, 20, 3);
  std::fill(flat.pixels.begin(), flat.pixels.end(), uint8_t{77});
  const DetectionExample rf =
      resize_detection({image_to_array(flat), box_array({}), label_array({})}, 7, 31);
  for (uint8_t v : rf.image.to_vector<uint8_t>()) ASSERT_EQ(v, 77);
  EXPECT_EQ(rf.bbox.shape(), (Shape{0, 4}));
  EXPECT_EQ(rf.label.shape(), (Shape{0}));
}

TEST(DetectionAugmentationTest, BoxesOutsideThePictureAreDroppedWithTheirLabels) {
  // On a 10 x 10 picture: a box sticking out at the top left (clipped), one wholly below the
  // picture, one of no height, and one sticking out at the bottom right (clipped).
  const std::vector<float> box = {-5, -5, 3, 4, 12, 0, 15, 5, 2, 2, 2, 8, 5, 5, 20, 20};
  const std::vector<int32_t> label = {0, 1, 2, 3};
  const auto [cb, cl] = clip_bbox(box_array(box), label_array(label), 10, 10);
  EXPECT_EQ(cb.to_vector<float>(), (std::vector<float>{0, 0, 3, 4, 5, 5, 10, 10}));
  EXPECT_EQ(cl.to_vector<int32_t>(), (std::vector<int32_t>{0, 3}));

  const DetectionExample ex = picture_with_boxes(10, 10, box, label);
  const DetectionExample f = flip_detection(ex);
  EXPECT_EQ(f.bbox.to_vector<float>(), (std::vector<float>{0, 6, 3, 10, 5, 0, 10, 5}));
  EXPECT_EQ(f.label.to_vector<int32_t>(), (std::vector<int32_t>{0, 3}));
  const DetectionExample r = resize_detection(ex, 20, 5);
  EXPECT_EQ(r.bbox.to_vector<float>(), (std::vector<float>{0, 0, 6, 2, 10, 2.5f, 20, 5}));
  EXPECT_EQ(r.label.to_vector<int32_t>(), (std::vector<int32_t>{0, 3}));
  // Every box gone leaves (0, 4) and (0,).
  const auto [nb, nl] = clip_bbox(box_array({-3, -3, -1, -1}), label_array({4}), 10, 10);
  EXPECT_EQ(nb.shape(), (Shape{0, 4}));
  EXPECT_EQ(nl.shape(), (Shape{0}));
}

TEST(DetectionAugmentationTest, ResizeToFitKeepsTheAspectRatioAndPadsBottomAndRight) {
  EXPECT_EQ(fit_size(20, 40, 32, 32), (std::array<int64_t, 2>{16, 32}));
  EXPECT_EQ(fit_size(40, 20, 32, 32), (std::array<int64_t, 2>{32, 16}));
  EXPECT_EQ(fit_size(10, 10, 32, 48), (std::array<int64_t, 2>{32, 32}));
  EXPECT_EQ(fit_size(3, 1000, 10, 10), (std::array<int64_t, 2>{1, 10}));  // at least 1 pixel
  // 20 x 40 into 32 x 32: scaled by 0.8 to 16 x 32, rows 16..31 filled.
  const DetectionExample ex = picture_with_boxes(20, 40, {5, 10, 15, 30, 25, 0, 30, 5}, {2, 1});
  const DetectionExample r = resize_detection_to_fit(ex, 32, 32, 9);
  ASSERT_EQ(r.image.shape(), (Shape{32, 32, 3}));
  EXPECT_EQ(r.bbox.to_vector<float>(), (std::vector<float>{4, 8, 12, 24}));
  EXPECT_EQ(r.label.to_vector<int32_t>(), (std::vector<int32_t>{2}));  // the box below is dropped
  const std::vector<uint8_t> px = r.image.to_vector<uint8_t>();
  for (size_t k = 16 * 32 * 3; k < px.size(); ++k) ASSERT_EQ(px[k], 9) << k;
  // The fitted part is the stretched resize of the picture to 16 x 32.
  const std::vector<uint8_t> fitted = resize_detection(ex, 16, 32).image.to_vector<uint8_t>();
  EXPECT_TRUE(std::equal(fitted.begin(), fitted.end(), px.begin()));
}

TEST(DetectionAugmentationTest, RandomFlipsFollowTheGenerator) {
  const DetectionExample ex = picture_with_boxes(8, 12, {1, 1, 5, 4}, {0});
  const std::vector<float> flipped = {1, 8, 5, 11};
  Generator a(5), b(5);
  int flips = 0;
  for (int k = 0; k < 40; ++k) {
    const DetectionExample ra = random_flip_detection(ex, a);
    const DetectionExample rb = random_flip_detection(ex, b);
    EXPECT_EQ(ra.bbox.to_vector<float>(), rb.bbox.to_vector<float>());
    EXPECT_EQ(ra.image.to_vector<uint8_t>(), rb.image.to_vector<uint8_t>());
    flips += ra.bbox.to_vector<float>() == flipped;
  }
  EXPECT_GT(flips, 5);
  EXPECT_LT(flips, 35);
  // p = 0 and p = 1 still draw one number each.
  Generator g(1);
  EXPECT_EQ(random_flip_detection(ex, g, 0.0).bbox.to_vector<float>(), ex.bbox.to_vector<float>());
  EXPECT_EQ(random_flip_detection(ex, g, 1.0).bbox.to_vector<float>(), flipped);
  EXPECT_EQ(g.offset(), 2u);
}

// Detection examples of different sizes, made on demand.
class PicturesOfManySizes : public Dataset {
 public:
  int64_t size() const override { return 4; }
  Example get_example(int64_t i) const override {
    const int64_t h = 10 + 7 * i, w = 30 - 5 * i;
    return picture_with_boxes(h, w, {1, 2, 6, 9, 0, 0, static_cast<float>(h), 3}, {1, 2},
                              static_cast<int>(i))
        .to_example();
  }
};

TEST(TransformedDetectionDatasetTest, AugmentsEachReadWithItsOwnDraws) {
  auto base = std::make_shared<PicturesOfManySizes>();
  DetectionAugmentOptions o;
  o.height = 24;
  o.width = 24;
  TransformedDetectionDataset ds(base, o, /*seed=*/3);
  ASSERT_EQ(ds.size(), 4);
  for (int64_t i = 0; i < 4; ++i) {
    const Example ex = ds.get_example(i);
    ASSERT_EQ(ex.size(), 3u);
    EXPECT_EQ(ex[0].shape(), (Shape{24, 24, 3}));
    EXPECT_EQ(ex[1].dtype(), float32);
    EXPECT_EQ(ex[2].to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
    for (size_t k = 0; k < 8; ++k) {
      const float v = ex[1].to_vector<float>()[k];
      EXPECT_GE(v, 0);
      EXPECT_LE(v, 24);
    }
    // The read was draw 0; the next is draw 1.
    EXPECT_EQ(ex[1].to_vector<float>(), ds.example(i, 0)[1].to_vector<float>());
    EXPECT_EQ(ds.get_example(i)[1].to_vector<float>(), ds.example(i, 1)[1].to_vector<float>());
  }
  // Another dataset of the same seed reads the same examples, in any order; draws differ.
  TransformedDetectionDataset again(base, o, 3);
  int differ = 0;
  for (int64_t i = 3; i >= 0; --i) {
    EXPECT_EQ(again.get_example(i)[0].to_vector<uint8_t>(),
              ds.example(i, 0)[0].to_vector<uint8_t>());
  }
  for (uint64_t draw = 0; draw < 16; ++draw) {
    differ += ds.example(0, draw)[1].to_vector<float>() != ds.example(0, 0)[1].to_vector<float>();
  }
  EXPECT_GT(differ, 0);
  ds.reset_draws();
  EXPECT_EQ(ds.get_example(-1)[1].to_vector<float>(), ds.example(3, 0)[1].to_vector<float>());
  // A transform of one's own.
  TransformedDetectionDataset stretched(
      base, [](const DetectionExample& e, Generator&) { return resize_detection(e, 5, 6); });
  EXPECT_EQ(stretched.get_example(2)[0].shape(), (Shape{5, 6, 3}));
  EXPECT_TRUE(ThrowsWith<IndexError>([&] { ds.get_example(4); },
                                     {"TransformedDetectionDataset::get_example", "index 4"}));
}

TEST(DetectionAugmentationTest, BadInputsAreErrorsNamingTheFunctionAndTheValues) {
  const DetectionExample ex = picture_with_boxes(6, 8, {1, 1, 3, 3, 2, 2, 4, 4}, {0, 1});
  DetectionExample bad = ex;
  bad.bbox = ex.bbox.reshape({8});
  EXPECT_TRUE(ThrowsWith<ShapeError>([&] { flip_detection(bad); },
                                     {"flip_detection", "bbox has shape (8,)", "expected (R, 4)"}));
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] {
        flip_bbox(box_array({1, 2, 3, 4}).reshape({2, 2}), 5, 5);
      },
      {"flip_bbox", "bbox has shape (2, 2)"}));
  bad = ex;
  bad.label = label_array({0, 1, 2});
  EXPECT_TRUE(ThrowsWith<ShapeError>(
      [&] { resize_detection(bad, 4, 4); },
      {"resize_detection", "label has shape (3,)", "expected (2,)", "bbox (2, 4)"}));
  EXPECT_TRUE(ThrowsWith<ShapeError>([&] { clip_bbox(ex.bbox, label_array({0}), 6, 8); },
                                     {"clip_bbox", "label has shape (1,)", "expected (2,)"}));
  bad = ex;
  bad.label = ex.label.astype(float32);
  EXPECT_TRUE(ThrowsWith<DtypeError>([&] { flip_detection(bad); },
                                     {"flip_detection", "label is float32", "integer"}));
  bad = ex;
  bad.image = ex.image.astype(float32);
  EXPECT_TRUE(ThrowsWith<DtypeError>([&] { flip_detection(bad); },
                                     {"flip_detection", "image is float32", "uint8 (H, W, C)"}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { resize_detection(ex, 0, 5); },
                                     {"resize_detection", "0 x 5", "at least 1"}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { resize_detection_to_fit(ex, 4, -2); },
                                     {"resize_detection_to_fit", "4 x -2", "at least 1"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        resize_bbox(ex.bbox, {6, 8}, {0, 0});
      },
      {"resize_bbox", "out_size 0 x 0"}));
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { fit_size(0, 3, 4, 4); }, {"fit_size", "0 x 3"}));
  Generator g;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { random_flip_detection(ex, g, 1.5); },
                                     {"random_flip_detection", "p is 1.5"}));
  DetectionAugmentOptions o;
  o.height = 8;
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { TransformedDetectionDataset(std::make_shared<PicturesOfManySizes>(), o); },
      {"TransformedDetectionDataset", "8 x 0"}));
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] {
        DetectionExample::from_example({ex.image, ex.bbox});
      },
      {"DetectionExample::from_example", "has 2 arrays"}));
}

}  // namespace
}  // namespace kusari
