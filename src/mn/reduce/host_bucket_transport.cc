// The bucket transport of the CPU communicators: MPI's non-blocking allreduce, started from the
// gradient-ready hooks and moved on by them (Note [Overlapped gradient reduction] in
// bucket_reducer.h).
#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "kusari/core/routines.h"
#include "mn/comm/mpi_util.h"
#include "mn/reduce/bucket_reducer.h"

namespace kusari::mn::detail {

namespace {

constexpr const char* kWhat = "multi_node_mean_grad (overlap)";

class HostBucketTransport : public BucketTransport {
 public:
  /// `communicate` false: "dummy" (buckets are filled and read back, never sent). `cast`: the
  /// kind sends gradients in allreduce_grad_dtype ("flat"; "naive" sends each in its own).
  HostBucketTransport(Communicator& comm, bool communicate, bool cast)
      : comm_(comm), name_(comm.name()), communicate_(communicate), cast_(cast) {
    // The buckets' collectives get a communicator of their own: a model may run collectives of
    // its own during backward (MultiNodeBatchNormalization), which must not interleave with
    // them in another order on another rank. (Collective: every rank makes the optimizer.)
    if (communicate_) {
      KUSARI_MPI_CHECK(MPI_Comm_dup(to_comm(comm.mpi_comm_handle()), &dup_));
      int level = MPI_THREAD_SINGLE;
      KUSARI_MPI_CHECK(MPI_Query_thread(&level));
      threaded_ = level == MPI_THREAD_MULTIPLE;
    }
  }

  ~HostBucketTransport() override {
    abandon();
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
      }
      changed_.notify_all();
      worker_.join();
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (dup_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&dup_);
  }

  std::string name() const override { return name_; }

  Device device_for(const NamedParams& params) const override {
    for (const auto& [path, p] : params) {
      KUSARI_CHECK(p.data().device().is_cpu(), DeviceError, "'", name_, "': ", kWhat,
                   " reduces gradients on the CPU, but ", path, " is on ", p.data().device(),
                   " (use an NCCL communicator for a model on a GPU, or overlap=false)");
    }
    return Device::cpu();
  }

  Dtype wire_dtype(Dtype grad_dtype) const override {
    return cast_ ? comm_.options().allreduce_grad_dtype.value_or(grad_dtype) : grad_dtype;
  }

  int64_t align_bytes() const override { return 64; }  // (as the flat buffer: cache lines)

  void prepare(int, Device) override {}

  void launch(int, Array& flat) override {
    if (!communicate_) return;
    const Dtype dtype = flat.dtype();
    Piece piece{static_cast<char*>(flat.raw_data()), 0, mpi_datatype(dtype),
                mpi_op(ReduceOp::kSum, dtype)};
    const int64_t item = static_cast<int64_t>(itemsize(dtype));
    // In pieces that fit an MPI count, as allreduce_host cuts them.
    std::vector<Piece> pieces;
    const int64_t size = allreduce_piece_elements(flat.size());
    for (int64_t done = 0; done < flat.size();) {
      piece.count = static_cast<int>(std::min(flat.size() - done, size));
      pieces.push_back(piece);
      piece.data += piece.count * item;
      done += piece.count;
    }
    if (!threaded_) {
      for (const Piece& p : pieces) start(p);
      return;
    }
    if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.insert(queue_.end(), pieces.begin(), pieces.end());
    }
    changed_.notify_all();
  }

  void progress() override {
    if (threaded_ || requests_.empty()) return;  // (the worker tests them)
    int all_done = 0;
    KUSARI_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &all_done,
                                 MPI_STATUSES_IGNORE));
    if (all_done) requests_.clear();
  }

  void wait(int) override {
    park_worker();
    std::exception_ptr failure = std::exchange(failure_, nullptr);
    wait_requests(requests_.data(), static_cast<int>(requests_.size()), kWhat);
    requests_.clear();
    unpark_worker();
    if (failure) std::rethrow_exception(failure);
  }

  bool averages(Dtype) const override { return !communicate_; }

  void divide(Array& flat) const override {
    const double scale = 1.0 / comm_.size();
    // As the kind's own mean: "naive" averages each gradient with allreduce(kMean), which scales
    // 16-bit values in float32; "flat" scales its buffer in place.
    if (!cast_ && is_half_precision(flat.dtype())) {
      flat.assign(flat.astype(Dtype::kFloat32) * scale);
    } else {
      multiply_to(flat, scale);
    }
  }

  void abandon() noexcept override {
    park_worker();
    failure_ = nullptr;
    if (requests_.empty()) {
      unpark_worker();
      return;
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      try {
        wait_requests(requests_.data(), static_cast<int>(requests_.size()), kWhat);
      } catch (...) {
      }
    }
    requests_.clear();
    unpark_worker();
  }

  bool progress_thread() const override { return threaded_; }

 private:
  /// A piece of a bucket: one MPI_Iallreduce.
  struct Piece {
    char* data = nullptr;
    int count = 0;
    MPI_Datatype type;
    MPI_Op op;
  };

  void start(const Piece& p) {
    MPI_Request request = MPI_REQUEST_NULL;
    KUSARI_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p.data, p.count, p.type, p.op, dup_, &request));
    requests_.push_back(request);
  }

  // Note [Progress thread]
  // MPI moves a non-blocking collective only while some thread is inside MPI. When the program
  // initialised MPI with MPI_THREAD_MULTIPLE, a worker thread starts each bucket's collective as
  // soon as the hook queues it and then tests the requests every 200 microseconds, sleeping in
  // between (a blocking MPI call would spin a core that backward needs); so the transfers and
  // sums go on while backward computes, on whatever core the system gives the worker. Only the
  // worker touches the requests until the update parks it (park_worker: it starts what is
  // queued and stops), and then the update waits for them itself through wait_requests. Under
  // MPI_THREAD_SERIALIZED (kusari's own initialisation) no second thread may call MPI while the
  // program might (a model's own collectives during backward), so the hooks start and test the
  // requests themselves (Note [Overlapped gradient reduction]).
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return stop_ || parked_request_ || !queue_.empty() || open_; });
      if (stop_) return;
      if (!queue_.empty()) {  // (started without the lock: a hook may queue the next meanwhile)
        std::deque<Piece> todo;
        todo.swap(queue_);
        lock.unlock();
        std::exception_ptr failure;
        try {
          for (const Piece& p : todo) start(p);
        } catch (...) {
          failure = std::current_exception();
        }
        lock.lock();
        if (failure) failure_ = failure;
        open_ = !requests_.empty();
        continue;
      }
      if (parked_request_) {
        parked_ = true;
        changed_.notify_all();
        changed_.wait(lock, [&] { return stop_ || !parked_request_; });
        parked_ = false;
        changed_.notify_all();
        open_ = !requests_.empty();
        continue;
      }
      if (!open_) continue;
      lock.unlock();
      int all_done = 0;
      const int code = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &all_done,
                                   MPI_STATUSES_IGNORE);
      if (!all_done) std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock.lock();
      if (code != MPI_SUCCESS) {
        try {
          check_mpi(code, "MPI_Testall");
        } catch (...) {
          failure_ = std::current_exception();
        }
        open_ = false;
      } else if (all_done) {
        requests_.clear();
        open_ = false;
      }
    }
  }

  /// Makes the worker start what is queued and stop touching the requests (no worker: nothing).
  void park_worker() noexcept {
    if (!worker_.joinable()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    parked_request_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return parked_; });
  }
  /// Lets the worker go on, and waits until it has left its parked state (else a park that
  /// follows at once would find it still parked, with new pieces queued and not started).
  void unpark_worker() noexcept {
    if (!worker_.joinable()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    parked_request_ = false;
    changed_.notify_all();
    changed_.wait(lock, [&] { return !parked_; });
  }

  Communicator& comm_;
  std::string name_;
  bool communicate_;
  bool cast_;
  MPI_Comm dup_ = MPI_COMM_NULL;
  std::vector<MPI_Request> requests_;
  /// MPI_THREAD_MULTIPLE: the worker of Note [Progress thread] and what it shares.
  bool threaded_ = false;
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Piece> queue_;
  bool open_ = false, stop_ = false, parked_request_ = false, parked_ = false;
  std::exception_ptr failure_;
};

}  // namespace

std::unique_ptr<BucketTransport> make_host_bucket_transport(Communicator& comm) {
  const std::string name = comm.name();
  if (name == "naive") return std::make_unique<HostBucketTransport>(comm, true, false);
  if (name == "flat") return std::make_unique<HostBucketTransport>(comm, true, true);
  if (name == "dummy") return std::make_unique<HostBucketTransport>(comm, false, true);
  return nullptr;
}

}  // namespace kusari::mn::detail
