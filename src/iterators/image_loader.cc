#include "kusari/iterators/image_loader.h"

#include <algorithm>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "iterators/slot_workers.h"
#include "kusari/core/error.h"
#include "kusari/datasets/sub_dataset.h"

namespace kusari {
namespace {

// Where example i of the loader's dataset comes from: a file of an ImageFileDataset reached
// through zero or more SubDatasets, or (files == nullptr) the dataset's own get_example.
struct Source {
  const ImageFileDataset* files = nullptr;
  std::vector<const SubDataset*> chain;

  int64_t file_index(int64_t i) const {
    for (const SubDataset* s : chain) i = s->base_index(i);
    return i;
  }
};

Source find_source(const Dataset* d) {
  Source s;
  while (const auto* sub = dynamic_cast<const SubDataset*>(d)) {
    s.chain.push_back(sub);
    d = sub->base().get();
  }
  s.files = dynamic_cast<const ImageFileDataset*>(d);
  if (s.files == nullptr) s.chain.clear();
  return s;
}

struct Loaded {
  Image image;
  std::optional<int32_t> label;
  std::string name;  // the file, or "example i" (for shape errors)
};

Loaded load_one(const Dataset& dataset, const Source& source, const ImageLoaderOptions& o,
                uint64_t seed, int64_t index, int64_t epoch) {
  transforms::Rng rng(transforms::example_seed(seed, epoch, index));
  Loaded out;
  if (source.files != nullptr) {
    const int64_t fi = source.file_index(index);
    out.name = source.files->path(fi);
    out.label = source.files->label(fi);
    const std::vector<uint8_t> bytes = read_file_bytes(out.name);
    if (o.transform) {
      out.image =
          o.transform->decode_and_apply(bytes.data(), bytes.size(), out.name,
                                        source.files->decode_options(), rng, o.reduced_decode);
    } else {
      out.image =
          decode_image(bytes.data(), bytes.size(), out.name, source.files->decode_options());
    }
    return out;
  }
  out.name = detail::concat("example ", index);
  Example ex = dataset.get_example(index);
  KUSARI_CHECK(!ex.empty(), ValueError, "ImageLoader: example ", index,
               " is empty; expected {image[, label]}");
  out.image = image_from_array(ex[0]);
  if (ex.size() > 1) out.label = ex[1].astype(int32).item<int32_t>();
  if (o.transform) o.transform->apply(out.image, rng);
  return out;
}

Shape image_shape(const Image& img) {
  return img.planar ? Shape{img.channels, img.height, img.width}
                    : Shape{img.height, img.width, img.channels};
}

}  // namespace

/// One planned batch: slot k receives example indices[k] of epoch epochs[k].
struct ImageLoader::Job {
  std::vector<int64_t> indices;
  std::vector<int64_t> epochs;
  uint64_t seed = 0;  // the loader's transform seed when the job was planned
  // Guarded by the workers' mutex (detail::SlotWorkers) until `complete`.
  size_t next_claim = 0;
  size_t finished = 0;
  bool complete = false;
  bool has_labels = false;
  Array images;  // (B, ...), allocated by the first finished example
  Array labels;  // (B,) int32
  Shape example_shape;
  std::string first_name;
  std::exception_ptr error;
  int64_t error_index = -1;
};

/// The worker threads: they take examples from the oldest job first.
class ImageLoader::Workers : public detail::SlotWorkers<Job> {
 public:
  Workers(const ImageLoader& owner, int n)
      : owner_(owner), source_(find_source(owner.dataset_.get())) {
    start(n);
  }
  ~Workers() override { stop(); }

  const Source& source() const { return source_; }

 private:
  void fill(Job& job, size_t k, std::unique_lock<std::mutex>& lock) override {
    lock.unlock();
    std::exception_ptr error;
    Loaded item;
    try {
      item = load_one(*owner_.dataset_, source_, owner_.options_, job.seed, job.indices[k],
                      job.epochs[k]);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (!error) {
      try {
        place(job, k, item, lock);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error && !job.error) {
      job.error = error;
      job.error_index = job.indices[k];
    }
  }

  // Writes one example into its slot; called with the lock held, copies without it.
  void place(Job& job, size_t k, const Loaded& item, std::unique_lock<std::mutex>& lock) {
    const Shape shape = image_shape(item.image);
    const Dtype dtype = item.image.is_float ? float32 : uint8;
    const auto batch = static_cast<int64_t>(job.indices.size());
    if (!job.images.defined()) {
      Shape bshape = shape;
      bshape.insert(0, batch);
      job.images = Array::empty(bshape, dtype, Device::cpu());
      job.labels = Array::zeros({batch}, int32, Device::cpu());
      job.example_shape = shape;
      job.first_name = item.name;
      job.has_labels = item.label.has_value();
    }
    KUSARI_CHECK(shape == job.example_shape && dtype == job.images.dtype(), ShapeError,
                 "ImageLoader: ", item.name, " became a ", dtype_name(dtype), " image of shape ",
                 shape, " but ", job.first_name, " in the same batch became ",
                 dtype_name(job.images.dtype()), " ", job.example_shape,
                 "; give a transform that makes every image one size (e.g. RandomResizedCrop or "
                 "Resize + CenterCrop)");
    KUSARI_CHECK(item.label.has_value() == job.has_labels, ValueError, "ImageLoader: ", item.name,
                 item.label ? " has a label but " : " has no label but ", job.first_name,
                 " in the same batch has", job.has_labels ? "" : " none");
    const Array images = job.images;
    const Array labels = job.labels;
    lock.unlock();
    const size_t bytes = static_cast<size_t>(item.image.size()) * itemsize(dtype);
    char* dst = static_cast<char*>(images.raw_data()) + bytes * k;
    std::memcpy(dst,
                item.image.is_float ? static_cast<const void*>(item.image.values.data())
                                    : static_cast<const void*>(item.image.pixels.data()),
                bytes);
    if (item.label) static_cast<int32_t*>(labels.raw_data())[k] = *item.label;
    lock.lock();
  }

  const ImageLoader& owner_;
  Source source_;
};

ImageLoader::ImageLoader(std::shared_ptr<Dataset> dataset, ImageLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  const char* fn = "ImageLoader";
  KUSARI_CHECK(dataset_, ValueError, fn, ": the dataset is null");
  const int64_t n = dataset_->size();
  const int64_t b = options_.batch_size;
  KUSARI_CHECK(b > 0, ValueError, fn, ": batch_size must be positive, got ", b);
  KUSARI_CHECK(!options_.repeat || n > 0, ValueError, fn,
               ": the dataset is empty; a repeating loader needs examples");
  // Note [Batch larger than the dataset]
  KUSARI_CHECK(
      !options_.repeat || b <= n, ValueError, fn, ": batch_size ", b,
      " is larger than the dataset (", n,
      " examples); a repeating loader would cover several epochs in one batch. Use a batch_size of "
      "at most ",
      n, ", or repeat=false");
  KUSARI_CHECK(options_.n_workers >= 0, ValueError, fn,
               ": n_workers must be >= 0 (0: one per hardware thread), got ", options_.n_workers);
  KUSARI_CHECK(options_.n_prefetch >= 1, ValueError, fn, ": n_prefetch must be at least 1, got ",
               options_.n_prefetch);
  n_workers_ = options_.n_workers > 0
                   ? options_.n_workers
                   : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  reseed(options_.seed ? *options_.seed : default_generator().next_uint64());
}

ImageLoader::~ImageLoader() {
  finalize();
}

void ImageLoader::plan_ahead() {
  IteratorState s = planned_.empty() ? state_ : planned_.back().next_state;
  while (static_cast<int>(planned_.size()) < options_.n_prefetch) {
    if (!planned_.empty() && !planned_.back().job) return;  // exhausted: nothing more to plan
    const int64_t epoch = s.epoch;
    const int64_t position = s.current_position;
    const int64_t n = s.epoch_size(dataset_->size());
    std::optional<std::vector<int64_t>> indices = advance_iterator_state(
        s, options_.batch_size, options_.repeat, dataset_->size(), "ImageLoader");
    Planned p{s, nullptr};
    if (indices && !indices->empty()) {
      auto job = std::make_shared<Job>();
      job->indices = std::move(*indices);
      job->epochs.resize(job->indices.size());
      job->seed = transform_seed_;
      // Examples after a wrap belong to the next epoch (Note [ImageLoader pipeline]).
      const auto before_wrap = static_cast<size_t>(std::max<int64_t>(0, n - position));
      for (size_t k = 0; k < job->epochs.size(); ++k) {
        job->epochs[k] = (options_.repeat && k >= before_wrap) ? epoch + 1 : epoch;
      }
      if (!workers_) workers_ = std::make_unique<Workers>(*this, n_workers_);
      workers_->submit(job);
      p.job = std::move(job);
    }
    planned_.push_back(std::move(p));
  }
}

void ImageLoader::drop_planned() {
  for (Planned& p : planned_) {
    if (p.job && workers_) workers_->cancel(p.job);
  }
  // A worker still on an example of a dropped job finishes it; the job (shared) outlives it.
  planned_.clear();
}

std::shared_ptr<ImageLoader::Job> ImageLoader::take_next() {
  plan_ahead();
  Planned current = std::move(planned_.front());
  planned_.pop_front();
  previous_epoch_detail_ = epoch_detail();
  state_ = std::move(current.next_state);
  if (!current.job) return nullptr;
  plan_ahead();  // keep n_prefetch batches in flight while this one finishes
  workers_->wait(current.job);
  Job& job = *current.job;
  if (job.error) {
    try {
      std::rethrow_exception(job.error);
    } catch (const IOError& e) {
      std::throw_with_nested(
          IOError(detail::concat("ImageLoader: example ", job.error_index, ": ", e.what())));
    } catch (const ShapeError& e) {
      std::throw_with_nested(
          ShapeError(detail::concat("ImageLoader: example ", job.error_index, ": ", e.what())));
    } catch (const ValueError& e) {
      std::throw_with_nested(
          ValueError(detail::concat("ImageLoader: example ", job.error_index, ": ", e.what())));
    } catch (const std::exception& e) {
      std::throw_with_nested(
          Error(detail::concat("ImageLoader: example ", job.error_index, ": ", e.what())));
    }
  }
  return current.job;
}

std::vector<Array> ImageLoader::next_batch() {
  std::shared_ptr<Job> job = take_next();
  if (!job) return {};
  std::vector<Array> out{job->images.to_device(options_.device)};
  if (job->has_labels) out.push_back(job->labels.to_device(options_.device));
  return out;
}

std::vector<Example> ImageLoader::next() {
  std::shared_ptr<Job> job = take_next();
  if (!job) return {};
  std::vector<Example> out(job->indices.size());
  for (size_t k = 0; k < out.size(); ++k) {
    const std::vector<Index> at{static_cast<int64_t>(k)};
    out[k].push_back(job->images.at(at));
    if (job->has_labels) out[k].push_back(job->labels.at(at));
  }
  return out;
}

Example ImageLoader::load_example(int64_t index, int64_t epoch) const {
  KUSARI_CHECK(index >= 0 && index < dataset_->size(), IndexError,
               "ImageLoader::load_example: index ", index, " is out of range for a dataset of ",
               dataset_->size(), " examples");
  Loaded item =
      load_one(*dataset_, find_source(dataset_.get()), options_, transform_seed_, index, epoch);
  Example ex{image_to_array(item.image)};
  if (item.label) ex.push_back(Array::scalar(*item.label, int32, Device::cpu()));
  return ex;
}

void ImageLoader::reset() {
  drop_planned();
  state_ = initial_iterator_state(state_.generator, options_.shuffle, dataset_->size());
  previous_epoch_detail_ = -1.0;
}

void ImageLoader::reseed(uint64_t seed) {
  drop_planned();
  state_.generator = Generator(seed);
  // The transforms draw from their own per-example generators (Note [Seeded transforms]).
  transform_seed_ = transforms::example_seed(seed, -1, -1);
  reset();
}

void ImageLoader::finalize() {
  drop_planned();
  workers_.reset();
}

void ImageLoader::serialize(Serializer& serializer) {
  if (serializer.is_loading()) drop_planned();
  serialize_iterator_state(serializer, state_, previous_epoch_detail_, options_.batch_size,
                           options_.shuffle, dataset_->size(), "order", "ImageLoader");
  if (!serializer.is_loading() || serializer.contains("transform_seed")) {
    auto seed = std::bit_cast<int64_t>(transform_seed_);
    serializer("transform_seed", seed);
    transform_seed_ = std::bit_cast<uint64_t>(seed);
  }
}

}  // namespace kusari
