#include "kusari/iterators/image_loader.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "iterators/slot_workers.h"
#include "kusari/core/cuda.h"
#include "kusari/core/error.h"
#include "kusari/datasets/sub_dataset.h"
#include "routines/image.h"

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

Loaded load_one(const Dataset& dataset, const Source& source, const transforms::Compose* transform,
                const ImageLoaderOptions& o, uint64_t seed, int64_t index, int64_t epoch) {
  transforms::Rng rng(transforms::example_seed(seed, epoch, index));
  Loaded out;
  if (source.files != nullptr) {
    const int64_t fi = source.file_index(index);
    out.name = source.files->path(fi);
    out.label = source.files->label(fi);
    const std::vector<uint8_t> bytes = read_file_bytes(out.name);
    if (transform != nullptr) {
      out.image =
          transform->decode_and_apply(bytes.data(), bytes.size(), out.name,
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
  if (transform != nullptr) transform->apply(out.image, rng);
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
  Array images;  // (B, ...), allocated by the first finished example (GPU: a view of the slot)
  Array labels;  // (B,) int32
  int slot = -1;  // GPU: the ring slot (Note [ImageLoader on a GPU])
  // GPU, once uploaded: the batch on the device, valid after the compute stream waited for the
  // slot's `copied` event.
  bool uploaded = false;
  Array device_images;
  Array device_labels;
  Shape example_shape;
  std::string first_name;
  std::exception_ptr error;
  int64_t error_index = -1;
};

/// The GPU side of the loader (Note [ImageLoader on a GPU]).
struct ImageLoader::Ring {
  struct Slot {
    Array host_images;  // (batch_size, ...) page-locked; workers write batches into it
    Array host_labels;  // (batch_size,) int32, page-locked
    cuda::Event copied;  // the last copy out of the slot
  };
  Ring(Device device, int n) : upload(device), slots(static_cast<size_t>(n)) {}

  cuda::UploadStream upload;
  std::vector<Slot> slots;
  size_t next = 0;  // the slot of the next planned job
  cuda::Event ready;  // the compute stream's work before a fresh device array is written
  Array table;        // the Normalize table on the device (normalize_on_device)
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
      item = load_one(*owner_.dataset_, source_, owner_.worker_transform_.get(), owner_.options_,
                      job.seed, job.indices[k], job.epochs[k]);
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

  // Writes one example into its slot; called with the lock held, copies without it. A final
  // Normalize run on the host writes its values straight into the slot (Note [ImageLoader
  // pipeline]).
  void place(Job& job, size_t k, const Loaded& item, std::unique_lock<std::mutex>& lock) {
    const transforms::Normalize* normalize = owner_.host_normalize_.get();
    Shape shape = image_shape(item.image);
    Dtype dtype = item.image.is_float ? float32 : uint8;
    if (normalize != nullptr) {
      KUSARI_CHECK(item.image.channels == static_cast<int64_t>(normalize->mean().size()),
                   ValueError, normalize->name(), ": ", item.name, " has ", item.image.channels,
                   " channels but mean and std have ", normalize->mean().size());
      shape = normalize->planar()
                  ? Shape{item.image.channels, item.image.height, item.image.width}
                  : Shape{item.image.height, item.image.width, item.image.channels};
      dtype = float32;
    }
    const auto batch = static_cast<int64_t>(job.indices.size());
    if (owner_.device_normalize_) {
      KUSARI_CHECK(dtype == uint8 && !item.image.planar &&
                       item.image.channels ==
                           static_cast<int64_t>(owner_.device_normalize_->mean().size()),
                   ValueError, "ImageLoader: ", item.name, " became a ", dtype_name(dtype), " ",
                   item.image.planar ? "CHW" : "HWC", " image of ", item.image.channels,
                   " channels before the last step, but normalize_on_device needs uint8 HWC "
                   "images of ", owner_.device_normalize_->mean().size(),
                   " channels there (the steps before Normalize must not convert or lay out)");
    }
    if (!job.images.defined()) {
      if (job.slot >= 0) {
        take_slot(job, shape, dtype, batch);
      } else {
        Shape bshape = shape;
        bshape.insert(0, batch);
        job.images = Array::empty(bshape, dtype, Device::cpu());
        job.labels = Array::zeros({batch}, int32, Device::cpu());
        ++owner_.host_allocations_;
      }
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
    if (normalize != nullptr) {
      normalize->apply_into(item.image, reinterpret_cast<float*>(dst));
    } else {
      std::memcpy(dst,
                  item.image.is_float ? static_cast<const void*>(item.image.values.data())
                                      : static_cast<const void*>(item.image.pixels.data()),
                  bytes);
    }
    if (item.label) static_cast<int32_t*>(labels.raw_data())[k] = *item.label;
    lock.lock();
  }

  // The job's batch arrays as views of its ring slot, whose buffers are (re)allocated when they
  // do not hold batch_size examples of this shape and dtype. Called with the lock held.
  void take_slot(Job& job, const Shape& shape, Dtype dtype, int64_t batch) {
    Ring::Slot& slot = owner_.ring_->slots[static_cast<size_t>(job.slot)];
    Shape full = shape;
    full.insert(0, owner_.options_.batch_size);
    if (!slot.host_images.defined() || slot.host_images.shape() != full ||
        slot.host_images.dtype() != dtype) {
      const Device gpu = owner_.options_.device;
      slot.host_images = cuda::pinned_empty(full, dtype, gpu);
      if (!slot.host_labels.defined()) {
        slot.host_labels = cuda::pinned_empty({owner_.options_.batch_size}, int32, gpu);
      }
      ++owner_.host_allocations_;
    }
    job.images = slot.host_images.at({Slice(0, batch)});
    job.labels = slot.host_labels.at({Slice(0, batch)});
    job.labels.fill(0);
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
  const Dtype dt = options_.dtype;
  KUSARI_CHECK(dt == float32 || dt == bfloat16 || dt == float16, DtypeError, fn,
               ": dtype must be float32, bfloat16 or float16 (the dtype of normalised batches), "
               "got ", dtype_name(dt));
  worker_transform_ = options_.transform;
  // A final Normalize on the host writes into the batch itself (Note [ImageLoader pipeline]).
  if (!options_.normalize_on_device && options_.transform && !options_.transform->steps().empty()) {
    const auto& steps = options_.transform->steps();
    host_normalize_ = std::dynamic_pointer_cast<const transforms::Normalize>(steps.back());
    if (host_normalize_) {
      std::vector<std::shared_ptr<const transforms::Transform>> before(steps.begin(), steps.end() - 1);
      worker_transform_ =
          before.empty() ? nullptr : std::make_shared<const transforms::Compose>(std::move(before));
    }
  }
  if (options_.normalize_on_device) {
    KUSARI_CHECK(options_.device.is_cuda(), ValueError, fn,
                 ": normalize_on_device runs the Normalize step on a GPU, but the device is ",
                 options_.device);
    const auto& steps = options_.transform ? options_.transform->steps()
                                           : std::vector<std::shared_ptr<const transforms::Transform>>{};
    device_normalize_ = steps.empty()
                            ? nullptr
                            : std::dynamic_pointer_cast<const transforms::Normalize>(steps.back());
    KUSARI_CHECK(device_normalize_ != nullptr, ValueError, fn,
                 ": normalize_on_device needs a transform whose last step is a Normalize, got ",
                 options_.transform ? options_.transform->name() : std::string("none"));
    std::vector<std::shared_ptr<const transforms::Transform>> before(steps.begin(), steps.end() - 1);
    worker_transform_ =
        before.empty() ? nullptr : std::make_shared<const transforms::Compose>(std::move(before));
  }
  if (options_.device.is_cuda()) {
    // The batches planned, the one handed out and the one before it, whose copy may still wait
    // behind the compute stream's work (Note [ImageLoader on a GPU]).
    ring_ = std::make_unique<Ring>(options_.device, options_.n_prefetch + 2);
  }
  reseed(options_.seed ? *options_.seed : default_generator().next_uint64());
}

int64_t ImageLoader::host_batch_allocations() const {
  return host_allocations_.load();
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
      if (ring_) {
        // The slot comes round again after its last copy (Note [ImageLoader on a GPU]).
        job->slot = static_cast<int>(ring_->next);
        ring_->next = (ring_->next + 1) % ring_->slots.size();
        ring_->slots[static_cast<size_t>(job->slot)].copied.synchronize();
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
  // A worker still on an example of a dropped job finishes it; the job (shared) outlives it. On a
  // GPU it writes into the job's ring slot, which must be quiet before the slot is used again,
  // and a batch already uploaded is released only after the compute stream waited for its copy
  // (Note [Caching memory pool]).
  for (Planned& p : planned_) {
    if (!p.job || !ring_) continue;
    if (workers_) workers_->settle(p.job);
    if (p.job->uploaded) ring_->slots[static_cast<size_t>(p.job->slot)].copied.block_compute();
  }
  planned_.clear();
}

void ImageLoader::upload(Job& job) {
  Ring& ring = *ring_;
  // Fresh arrays of the device's pool, written on the upload stream after the compute stream's
  // work so far (which may still read their blocks' previous arrays).
  job.device_images = Array::empty(job.images.shape(), job.images.dtype(), options_.device);
  if (job.has_labels) job.device_labels = Array::empty(job.labels.shape(), int32, options_.device);
  ring.ready.record_compute(options_.device);
  ring.upload.wait(ring.ready);
  ring.upload.copy(job.images, job.device_images);
  if (job.has_labels) ring.upload.copy(job.labels, job.device_labels);
  ring.upload.record(ring.slots[static_cast<size_t>(job.slot)].copied);
  job.uploaded = true;
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

std::vector<Array> ImageLoader::deliver(Job& job) {
  const Dtype dtype = options_.dtype;
  if (!ring_) {
    Array images = job.images;
    if (is_floating(images.dtype()) && images.dtype() != dtype) images = images.astype(dtype);
    std::vector<Array> out{images.to_device(options_.device)};
    if (job.has_labels) out.push_back(job.labels.to_device(options_.device));
    return out;
  }
  if (!job.uploaded) upload(job);
  ring_->slots[static_cast<size_t>(job.slot)].copied.block_compute();
  Array images = job.device_images;
  if (device_normalize_) {
    if (!ring_->table.defined()) ring_->table = device_normalize_->table().to_device(options_.device);
    images = routines::normalize_image_batch(images, ring_->table, dtype, device_normalize_->planar());
  } else if (is_floating(images.dtype()) && images.dtype() != dtype) {
    images = images.astype(dtype);
  }
  std::vector<Array> out{images};
  if (job.has_labels) out.push_back(job.device_labels);
  job.device_images = Array();
  job.device_labels = Array();
  // Queue the copies of the batches behind this one that are complete by now, so that they cross
  // the bus while the model computes on this one.
  for (Planned& p : planned_) {
    if (!p.job || p.job->uploaded) continue;
    if (!workers_->complete(p.job) || p.job->error) break;
    upload(*p.job);
  }
  return out;
}

std::vector<Array> ImageLoader::next_batch() {
  std::shared_ptr<Job> job = take_next();
  if (!job) return {};
  return deliver(*job);
}

std::vector<Example> ImageLoader::next() {
  std::shared_ptr<Job> job = take_next();
  if (!job) return {};
  const std::vector<Array> batch = deliver(*job);
  std::vector<Example> out(job->indices.size());
  for (size_t k = 0; k < out.size(); ++k) {
    const std::vector<Index> at{static_cast<int64_t>(k)};
    out[k].push_back(batch[0].at(at));
    if (job->has_labels) out[k].push_back(batch[1].at(at));
  }
  return out;
}

Example ImageLoader::load_example(int64_t index, int64_t epoch) const {
  KUSARI_CHECK(index >= 0 && index < dataset_->size(), IndexError,
               "ImageLoader::load_example: index ", index, " is out of range for a dataset of ",
               dataset_->size(), " examples");
  Loaded item = load_one(*dataset_, find_source(dataset_.get()), options_.transform.get(),
                         options_, transform_seed_, index, epoch);
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
  // The ring's host memory outlives the copies from it.
  if (ring_) ring_->upload.synchronize();
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
