// Worker threads that fill the slots of queued batch jobs, the oldest job first, one slot per
// claim: the pool behind MultithreadIterator and ImageLoader.
//
// A Job has `indices` (one slot each) and the bookkeeping fields next_claim, finished and
// complete, which the workers' mutex guards. A worker claims slot k under the mutex and calls
// fill(job, k, lock) with the mutex held; fill may release it while it works (each slot belongs
// to one worker alone) and holds it again when it returns. When the last slot is finished the job
// is marked complete under the mutex, which orders every slot's writes before the owner's reads
// after wait().
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kusari::detail {

template <typename Job>
class SlotWorkers {
 public:
  SlotWorkers(const SlotWorkers&) = delete;
  SlotWorkers& operator=(const SlotWorkers&) = delete;
  virtual ~SlotWorkers() { stop(); }

  /// Queues `job` behind the others (a job of no slots is complete at once).
  void submit(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (job->indices.empty()) {
        job->complete = true;
        return;
      }
      queue_.push_back(job);
    }
    work_cv_.notify_all();
  }

  /// Takes the job off the queue; slots that workers are filling right now still finish.
  void cancel(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.erase(std::remove(queue_.begin(), queue_.end(), job), queue_.end());
  }

  /// Blocks until every slot of `job` is filled.
  void wait(const std::shared_ptr<Job>& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return job->complete; });
  }

  /// True when every slot of `job` is filled (never waits).
  bool complete(const std::shared_ptr<Job>& job) {
    std::lock_guard<std::mutex> lock(mutex_);
    return job->complete;
  }

  /// After cancel(): blocks until the slots that workers had claimed are finished, so that
  /// nothing writes into the job's memory any more.
  void settle(const std::shared_ptr<Job>& job) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return job->finished == job->next_claim; });
  }

 protected:
  SlotWorkers() = default;

  /// Starts `n` workers; the derived class calls it once its own members are ready, and calls
  /// stop() in its destructor, before those members go away.
  void start(int n) {
    try {
      threads_.reserve(static_cast<size_t>(n));
      for (int t = 0; t < n; ++t) threads_.emplace_back([this] { run(); });
    } catch (...) {
      stop();
      throw;
    }
  }

  /// Stops and joins the workers (queued jobs are dropped); safe to call twice.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      queue_.clear();
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

  /// Fills slot k of `job`, as the file's comment says; it records its own errors in the job
  /// (an exception leaving it ends the program, as any on a worker thread would).
  virtual void fill(Job& job, size_t k, std::unique_lock<std::mutex>& lock) = 0;

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      std::shared_ptr<Job> job = queue_.front();
      const size_t k = job->next_claim++;
      if (job->next_claim == job->indices.size()) queue_.pop_front();
      fill(*job, k, lock);
      if (++job->finished == job->indices.size()) job->complete = true;
      done_cv_.notify_all();  // (wait() and settle())
    }
  }

  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kusari::detail
