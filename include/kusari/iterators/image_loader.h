// ImageLoader: batches of decoded, transformed images made by worker threads ahead of time
// (the role of Chainer's MultiprocessIterator and PyTorch's DataLoader, with threads).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "kusari/datasets/transforms.h"
#include "kusari/iterators/iterator.h"
#include "kusari/iterators/iterator_state.h"

namespace kusari {

// Note [ImageLoader pipeline]
// The order of batches comes from the state machine SerialIterator uses (Note [Iterator state
// machine]), run in the calling thread; only the work on examples runs on the workers. A batch
// is planned n_prefetch batches ahead: its indices, and for each example the epoch it belongs to
// (the examples after a wrap belong to the next epoch). A planned batch is a job in a FIFO; each
// worker claims one example at a time from the oldest job, reads the file, decodes it and runs
// the transform with a generator seeded by example_seed(transform_seed, epoch, index) (Note
// [Seeded transforms]), then writes the result straight into its slot of the job's batch array
// (allocated by the first example to finish, with that example's shape; a later example of
// another shape is an error naming its file and both shapes); a final Normalize step writes its
// values there itself (Normalize::apply_into), with no image of its own. So the batches are the
// same for any number of workers and the same as a serial loop that applies the transform to
// each index in turn; they differ from run to run only through the seed.
//
// Files: when the dataset is an ImageFileDataset -- or a SubDataset (e.g. from scatter_dataset or
// split_dataset) of one, at any depth -- the worker reads path(i) itself and decodes through
// Compose::decode_and_apply, so a random crop of a JPEG is decoded at the smallest DCT size that
// covers it. Any other dataset's examples must be {uint8 (H, W, C) image[, integer label]}; the
// transform then runs on a copy of the image.
//
// Errors: the first exception of a batch (an unreadable file, a corrupt JPEG) is rethrown from
// the next() that hands over that batch, with the dataset index in front of the original message
// (which names the file); the batch counts as consumed, as in MultithreadIterator.
//
// Batches: on the CPU each batch is a fresh array that the workers write into. On a GPU see Note
// [ImageLoader on a GPU]. ImageLoaderOptions::dtype converts normalised batches (float32 by
// default) on either device.
//
// Snapshots: serialize() stores SerialIterator's keys (Note [Iterator snapshots], order under
// "order") plus "transform_seed"; a loader resumed from a snapshot yields the batches the saved
// one would have yielded next. reset(), reseed(), loading a snapshot and finalize() drop the
// planned batches; workers finish at most the example they are on.

// Note [ImageLoader on a GPU]
// With a CUDA device the batches reach the GPU without a fresh allocation or a host wait per
// batch:
//   - a ring of n_prefetch + 2 slots of page-locked host memory (cuda::pinned_empty), each the
//     size of a batch, allocated once (by the first example that knows the shape) and reused:
//     batch j is written into slot j mod ring size by the workers. The slots hold the batches
//     planned, the one being handed out and the one before it, whose copy may still be queued
//     behind the compute stream's work when its slot comes round;
//   - as soon as a batch is complete -- when it is handed out, and for the batches behind it that
//     are complete by then -- its copy to the GPU is queued on the loader's UploadStream into a
//     fresh array of the device's pool, so batch j + 1 crosses the bus while the model computes on
//     batch j (Note [Upload stream]);
//   - handing out a batch makes the compute stream wait for its copy's event (the host does not
//     wait), then runs what remains on the compute stream: with normalize_on_device the
//     transform's last step, a Normalize, as one kernel from the uint8 batch into `dtype`
//     (transforms::Normalize::apply_batch; the workers run the steps before it, so a quarter of
//     float32's bytes cross the bus); otherwise the conversion to `dtype`, if any;
//   - a slot is rewritten only after the copy from it is done (its event, waited for on the host
//     when the slot comes round again: by then the copy has long finished).
// The values are those of the CPU loader bit for bit: the kernel maps each byte through the table
// Normalize::apply uses and rounds to `dtype` as astype does. next() yields views into the GPU
// batch. An HWC Normalize gives (B, H, W, C) batches, which transpose({0, 3, 1, 2}) views as a
// channels-last NCHW array without a copy.

/// How an ImageLoader batches, orders and transforms a dataset.
struct ImageLoaderOptions {
  /// Examples per batch (the last batch of a non-repeating loader may be shorter).
  int64_t batch_size = 32;
  /// Go on epoch after epoch (true) or stop after one.
  bool repeat = true;
  /// Visit each epoch in a new random order.
  bool shuffle = true;
  /// Seeds the order and the transforms; absent: one draw of the default generator.
  std::optional<uint64_t> seed;
  /// Worker threads (0: one per hardware thread).
  int n_workers = 0;
  /// Batches planned and being loaded ahead of the one in use (at least 1).
  int n_prefetch = 2;
  /// Applied to every image; null keeps the decoded uint8 HWC images (which must then all have
  /// one size).
  std::shared_ptr<const transforms::Compose> transform;
  /// Decode JPEGs at a reduced DCT size when the transform's first step allows it.
  bool reduced_decode = true;
  /// Where next_batch() puts its arrays (a CUDA device: Note [ImageLoader on a GPU]).
  Device device = Device::cpu();
  /// On a CUDA device: run the transform's last step, which must be a Normalize, on the GPU
  /// (the workers make uint8 HWC images; Note [ImageLoader on a GPU]).
  bool normalize_on_device = false;
  /// The floating dtype of normalised image batches (float32, bfloat16 or float16); uint8
  /// batches stay uint8.
  Dtype dtype = float32;
};

/// Loads, decodes and transforms images on worker threads, batch after batch; see Note
/// [ImageLoader pipeline]. As an Iterator (Trainer, StandardUpdater, Evaluator) next() yields
/// the examples {image, label} of a batch as views into one batch array; next_batch() yields
/// the stacked arrays {images (B, ...), labels (B,)} directly.
class ImageLoader : public Iterator {
 public:
  ImageLoader(std::shared_ptr<Dataset> dataset, ImageLoaderOptions options);
  /// Stops and joins the workers.
  ~ImageLoader() override;
  ImageLoader(const ImageLoader&) = delete;
  ImageLoader& operator=(const ImageLoader&) = delete;

  /// The next batch as examples (views into the batch array); empty at the end of a
  /// non-repeating loader.
  std::vector<Example> next() override;
  /// The next batch as {images (B, ...), labels (B,)} on options.device ({images} for a dataset
  /// without labels); empty at the end of a non-repeating loader.
  std::vector<Array> next_batch();

  int64_t epoch() const override { return state_.epoch; }
  double epoch_detail() const override { return state_.epoch_detail(dataset_->size()); }
  double previous_epoch_detail() const override { return previous_epoch_detail_; }
  bool is_new_epoch() const override { return state_.is_new_epoch; }
  int64_t batch_size() const override { return options_.batch_size; }
  bool repeat() const override { return options_.repeat; }
  /// Position of the next example within the current epoch's order.
  int64_t current_position() const { return state_.current_position; }
  /// The current epoch's order (empty without shuffling).
  std::vector<int64_t> order() const {
    return state_.order ? *state_.order : std::vector<int64_t>{};
  }
  /// The seed of the per-example transform generators.
  uint64_t transform_seed() const { return transform_seed_; }
  /// Number of worker threads.
  int n_workers() const { return n_workers_; }
  /// Host batch buffers allocated so far: on a GPU the ring's page-locked slots (a fixed number
  /// once every slot has been used: Note [ImageLoader on a GPU]); on the CPU one per batch.
  int64_t host_batch_allocations() const;
  const std::shared_ptr<Dataset>& dataset() const { return dataset_; }
  const ImageLoaderOptions& options() const { return options_; }

  /// Back to epoch 0, position 0, with a new order; drops the planned batches.
  void reset() override;
  /// A new seed for the order and the transforms, then reset().
  void reseed(uint64_t seed) override;
  /// Stops and joins the workers; a later next() starts them again.
  void finalize() override;
  /// Saves or loads the position; see Note [ImageLoader pipeline].
  void serialize(Serializer& serializer) override;

  /// Example `index` of the dataset as the workers make it in `epoch`: the transformed image
  /// (and its label when the dataset has labels), computed in the calling thread.
  Example load_example(int64_t index, int64_t epoch) const;

 private:
  struct Job;
  class Workers;
  struct Planned {
    IteratorState next_state;
    std::shared_ptr<Job> job;  // null once a non-repeating loader is exhausted
  };

  struct Ring;

  void plan_ahead();
  void drop_planned();
  std::shared_ptr<Job> take_next();
  /// The batch arrays {images[, labels]} of a complete job, on options_.device.
  std::vector<Array> deliver(Job& job);
  /// GPU: queues the copy of a complete job's batch (Note [ImageLoader on a GPU]).
  void upload(Job& job);

  std::shared_ptr<Dataset> dataset_;
  ImageLoaderOptions options_;
  /// What the workers apply: options_.transform without a final Normalize (which the workers run
  /// while writing into the batch, or the GPU with normalize_on_device).
  std::shared_ptr<const transforms::Compose> worker_transform_;
  std::shared_ptr<const transforms::Normalize> device_normalize_;
  /// A final Normalize the workers run while writing into the batch (not normalize_on_device).
  std::shared_ptr<const transforms::Normalize> host_normalize_;
  std::unique_ptr<Ring> ring_;  // GPU only
  int n_workers_ = 1;
  uint64_t transform_seed_ = 0;
  IteratorState state_;
  double previous_epoch_detail_ = -1.0;
  std::deque<Planned> planned_;
  mutable std::atomic<int64_t> host_allocations_{0};
  std::unique_ptr<Workers> workers_;
};

}  // namespace kusari
