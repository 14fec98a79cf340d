#include "kusari/iterators/multithread_iterator.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "iterators/slot_workers.h"
#include "kusari/core/error.h"

namespace kusari {

/// One batch to load: slot k receives dataset->get_example(indices[k]).
struct MultithreadIterator::Job {
  std::vector<int64_t> indices;
  std::vector<Example> results;
  std::vector<std::exception_ptr> errors;
  // Guarded by the workers' mutex (detail::SlotWorkers).
  size_t next_claim = 0;
  size_t finished = 0;
  bool complete = false;
};

/// Worker threads that load queued jobs in FIFO order, one example per claim.
class MultithreadIterator::WorkerPool : public detail::SlotWorkers<Job> {
 public:
  WorkerPool(std::shared_ptr<Dataset> dataset, int n_threads) : dataset_(std::move(dataset)) {
    start(n_threads);
  }
  ~WorkerPool() override { stop(); }

 private:
  void fill(Job& job, size_t k, std::unique_lock<std::mutex>& lock) override {
    lock.unlock();
    try {
      job.results[k] = dataset_->get_example(job.indices[k]);
    } catch (...) {
      job.errors[k] = std::current_exception();
    }
    lock.lock();
  }

  std::shared_ptr<Dataset> dataset_;
};

namespace {

// Rethrows the exception in `error` with `prefix` before its message and the original nested;
// kusari's error types keep their type so that callers can still catch them by type.
[[noreturn]] void rethrow_with_prefix(const std::exception_ptr& error, const std::string& prefix) {
  try {
    std::rethrow_exception(error);
  } catch (const ShapeError& e) {
    std::throw_with_nested(ShapeError(prefix + e.what()));
  } catch (const DtypeError& e) {
    std::throw_with_nested(DtypeError(prefix + e.what()));
  } catch (const DeviceError& e) {
    std::throw_with_nested(DeviceError(prefix + e.what()));
  } catch (const ValueError& e) {
    std::throw_with_nested(ValueError(prefix + e.what()));
  } catch (const IndexError& e) {
    std::throw_with_nested(IndexError(prefix + e.what()));
  } catch (const NotImplementedError& e) {
    std::throw_with_nested(NotImplementedError(prefix + e.what()));
  } catch (const IOError& e) {
    std::throw_with_nested(IOError(prefix + e.what()));
  } catch (const GradientError& e) {
    std::throw_with_nested(GradientError(prefix + e.what()));
  } catch (const CommunicatorError& e) {
    std::throw_with_nested(CommunicatorError(prefix + e.what()));
  } catch (const std::exception& e) {
    std::throw_with_nested(Error(prefix + e.what()));
  } catch (...) {
    std::throw_with_nested(Error(prefix + "an exception that is not a std::exception"));
  }
}

}  // namespace

MultithreadIterator::MultithreadIterator(std::shared_ptr<Dataset> dataset, int64_t batch_size,
                                         bool repeat, bool shuffle, std::optional<uint64_t> seed,
                                         int n_threads)
    : dataset_(std::move(dataset)), batch_size_(batch_size), repeat_(repeat), shuffle_(shuffle) {
  KUSARI_CHECK(dataset_, ValueError, "MultithreadIterator: the dataset is null");
  KUSARI_CHECK(batch_size_ > 0, ValueError,
               "MultithreadIterator: batch_size must be positive, got ", batch_size_);
  KUSARI_CHECK(!repeat_ || dataset_->size() > 0, ValueError,
               "MultithreadIterator: the dataset is empty; a repeating iterator needs examples");
  // Note [Batch larger than the dataset]
  KUSARI_CHECK(!repeat_ || batch_size_ <= dataset_->size(), ValueError,
               "MultithreadIterator: batch_size ", batch_size_, " is larger than the dataset (",
               dataset_->size(),
               " examples); a repeating iterator would cover several epochs in "
               "one batch. Use a batch_size of at most ",
               dataset_->size(), ", or repeat=false");
  KUSARI_CHECK(n_threads >= 0, ValueError,
               "MultithreadIterator: n_threads must be >= 0 (0: one per hardware thread), got ",
               n_threads);
  n_threads_ = n_threads > 0 ? n_threads
                             : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  state_.generator = Generator(seed ? *seed : default_generator().next_uint64());
  reset();
}

MultithreadIterator::~MultithreadIterator() {
  finalize();
}

void MultithreadIterator::prefetch() {
  IteratorState next_state = state_;
  std::optional<std::vector<int64_t>> indices = advance_iterator_state(
      next_state, batch_size_, repeat_, dataset_->size(), "MultithreadIterator");
  Prefetch p{std::move(next_state), nullptr};
  if (indices && !indices->empty()) {
    auto job = std::make_shared<Job>();
    job->results.resize(indices->size());
    job->errors.resize(indices->size());
    job->indices = std::move(*indices);
    if (!pool_) pool_ = std::make_unique<WorkerPool>(dataset_, n_threads_);
    pool_->submit(job);
    p.job = std::move(job);
  }
  prefetch_ = std::move(p);
}

void MultithreadIterator::drop_prefetch() {
  if (prefetch_ && prefetch_->job && pool_) pool_->cancel(prefetch_->job);
  prefetch_.reset();
}

std::vector<Example> MultithreadIterator::next() {
  if (!prefetch_) prefetch();
  Prefetch current = std::move(*prefetch_);
  prefetch_.reset();
  previous_epoch_detail_ = epoch_detail();
  state_ = std::move(current.next_state);
  if (!current.job) return {};
  // Queue the following batch now, so the workers go straight on to it.
  prefetch();
  pool_->wait(current.job);
  Job& job = *current.job;
  for (size_t k = 0; k < job.errors.size(); ++k) {
    if (job.errors[k]) {
      rethrow_with_prefix(
          job.errors[k],
          detail::concat("MultithreadIterator: dataset->get_example(", job.indices[k],
                         ") failed (example ", k, " of a batch of ", job.indices.size(), "): "));
    }
  }
  return std::move(job.results);
}

void MultithreadIterator::reset() {
  drop_prefetch();
  state_ = initial_iterator_state(state_.generator, shuffle_, dataset_->size());
  previous_epoch_detail_ = -1.0;
}

void MultithreadIterator::reseed(uint64_t seed) {
  drop_prefetch();
  state_.generator = Generator(seed);
  reset();
}

void MultithreadIterator::finalize() {
  drop_prefetch();
  pool_.reset();
}

void MultithreadIterator::serialize(Serializer& serializer) {
  if (serializer.is_loading()) drop_prefetch();
  serialize_iterator_state(serializer, state_, previous_epoch_detail_, batch_size_, shuffle_,
                           dataset_->size(), "_order", "MultithreadIterator");
}

}  // namespace kusari
