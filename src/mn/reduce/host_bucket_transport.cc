// The bucket transport of the CPU communicators: MPI's non-blocking allreduce, started from the
// gradient-ready hooks and moved on by them (Note [Overlapped gradient reduction] in
// bucket_reducer.h).
#include <mpi.h>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kusari/core/routines.h"
#include "kusari/core/threads.h"
#include "mn/comm/mpi_util.h"
#include "mn/reduce/bucket_reducer.h"

namespace kusari::mn::detail {

namespace {

constexpr const char* kWhat = "multi_node_mean_grad (overlap)";

/// Who moves the buckets' collectives on where MPI allows a second thread (Note [Progress
/// thread]): a progress thread that yields the core between tests, one that sleeps, or the hooks
/// on the thread that runs backward.
enum class Progress { kYield, kSleep, kHooks };

/// KUSARI_MN_PROGRESS=yield|sleep|hooks; unset (or empty), a thread that yields when this process
/// has a core to spare (cpu_share(ranks_on_host) above its compute threads), else the hooks.
Progress progress_mode(int ranks_on_host) {
  const char* env = std::getenv("KUSARI_MN_PROGRESS");
  if (env != nullptr && *env != '\0') {
    const std::string v = env;
    if (v == "yield") return Progress::kYield;
    if (v == "sleep") return Progress::kSleep;
    if (v == "hooks") return Progress::kHooks;
    KUSARI_THROW(ValueError, "KUSARI_MN_PROGRESS is '", v, "'; expected 'yield', 'sleep' or 'hooks'");
  }
  return cpu_share(ranks_on_host) > get_num_threads() ? Progress::kYield : Progress::kHooks;
}

/// True for the wire dtypes the transport averages itself (Note [Progress thread]).
bool divides_itself(Dtype wire) { return wire == Dtype::kFloat32 || wire == Dtype::kFloat64; }

/// Multiplies `n` elements of `dtype` (float32 or float64) at `data` by 1/size, as multiply_to
/// does (the factor in the element's type, one product per element, so the results are equal
/// bit for bit); a plain loop for the progress thread, which runs no kernel of the library (a
/// new thread's OpenMP team would take every core).
void scale_by_reciprocal(void* data, int64_t n, Dtype dtype, int size) {
  const double scale = 1.0 / size;
  if (dtype == Dtype::kFloat32) {
    float* p = static_cast<float*>(data);
    const float c = static_cast<float>(scale);
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * c;
  } else {
    double* p = static_cast<double*>(data);
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * scale;
  }
}

class HostBucketTransport : public BucketTransport {
 public:
  /// `communicate` false: "dummy" (buckets are filled and read back, never sent). `cast`: the
  /// kind sends gradients in allreduce_grad_dtype ("flat"; "naive" sends each in its own).
  HostBucketTransport(Communicator& comm, bool communicate, bool cast)
      : comm_(comm), name_(comm.name()), communicate_(communicate), cast_(cast) {
    progress_mode(comm.intra_size());  // (a bad KUSARI_MN_PROGRESS is an error here, on every rank)
    // The buckets' collectives get a communicator of their own: a model may run collectives of
    // its own during backward (MultiNodeBatchNormalization), which must not interleave with
    // them in another order on another rank. (Collective: every rank makes the optimizer.)
    if (communicate_) {
      KUSARI_MPI_CHECK(MPI_Comm_dup(to_comm(comm.mpi_comm_handle()), &dup_));
      int level = MPI_THREAD_SINGLE;
      KUSARI_MPI_CHECK(MPI_Query_thread(&level));
      thread_allowed_ = level == MPI_THREAD_MULTIPLE;
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

  bool fill(Array& segment, const Array& gradient) override {
    // With a progress thread, a plain copy goes to it (Note [Progress thread]); anything else
    // (a cast, a gradient in another memory format) is done here.
    if (!use_worker() || gradient.dtype() != segment.dtype() || !gradient.is_contiguous() ||
        !segment.is_contiguous() || gradient.size() != segment.size()) {
      segment.assign(gradient);
      return true;
    }
    Task task;
    task.copy_to = static_cast<char*>(segment.raw_data());
    task.copy_from = gradient;
    task.bytes = segment.nbytes();
    queue(std::move(task));
    return false;
  }

  void launch(int, Array& flat) override {
    if (!communicate_) return;
    Task task;
    task.bucket = flat;
    if (!use_worker()) {
      start(task);
      return;
    }
    queue(std::move(task));
  }

  void progress() override {
    if (worker_mode() || requests_.empty()) return;  // (the worker tests them)
    int all_done = 0;
    KUSARI_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &all_done,
                                 MPI_STATUSES_IGNORE));
    (void)all_done;  // (finished requests are null now; wait() averages their buckets)
  }

  void wait(int) override {
    park_worker();
    std::exception_ptr failure = std::exchange(failure_, nullptr);
    try {
      if (!failure) {
        // The buckets not finished by the worker: waited for, then averaged, in order.
        for (size_t f = divided_; f < flights_.size(); ++f) {
          Flight& flight = flights_[f];
          wait_requests(requests_.data() + flight.first, flight.count, kWhat);
          divide_flight(flight, /*on_worker=*/false);
        }
      } else {
        wait_requests(requests_.data(), static_cast<int>(requests_.size()), kWhat);
      }
    } catch (...) {
      clear_flights();
      unpark_worker();
      throw;
    }
    clear_flights();
    unpark_worker();
    if (failure) std::rethrow_exception(failure);
  }

  bool averages(Dtype wire) const override { return !communicate_ || divides_itself(wire); }

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
      clear_flights();
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
    clear_flights();
    unpark_worker();
  }

  bool progress_thread() const override { return worker_mode(); }
  bool progress_yields() const override { return worker_mode() && *mode_ == Progress::kYield; }

 private:
  /// What the worker does, in order: copy a gradient into its segment, or start a bucket.
  struct Task {
    char* copy_to = nullptr;
    Array copy_from;  // (kept alive until copied)
    int64_t bytes = 0;
    Array bucket;  // defined: start this bucket's collectives
  };
  /// A bucket in flight: its requests requests_[first, first + count) and its buffer.
  struct Flight {
    size_t first = 0;
    int count = 0;
    Array flat;
  };

  /// Starts the MPI_Iallreduce calls of task.bucket, in pieces that fit an MPI count (as
  /// allreduce_host cuts them).
  void start(const Task& task) {
    const Array& flat = task.bucket;
    const Dtype dtype = flat.dtype();
    const MPI_Datatype type = mpi_datatype(dtype);
    const MPI_Op op = mpi_op(ReduceOp::kSum, dtype);
    const int64_t item = static_cast<int64_t>(itemsize(dtype));
    const int64_t size = allreduce_piece_elements(flat.size());
    Flight flight;
    flight.first = requests_.size();
    flight.flat = flat;
    char* data = static_cast<char*>(flat.raw_data());
    for (int64_t done = 0; done < flat.size();) {
      const int count = static_cast<int>(std::min(flat.size() - done, size));
      MPI_Request request = MPI_REQUEST_NULL;
      KUSARI_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data + done * item, count, type, op, dup_, &request));
      requests_.push_back(request);
      ++flight.count;
      done += count;
    }
    flights_.push_back(std::move(flight));
  }

  /// Averages a finished bucket where this transport does (averages()): on the worker with a
  /// plain loop, on the program's thread with the library's multiply_to (its OpenMP threads).
  void divide_flight(Flight& flight, bool on_worker) {
    const Dtype dtype = flight.flat.dtype();
    if (divides_itself(dtype)) {
      if (on_worker) {
        scale_by_reciprocal(flight.flat.raw_data(), flight.flat.size(), dtype, comm_.size());
      } else {
        divide(flight.flat);
      }
    }
    ++divided_;
  }

  void clear_flights() noexcept {
    requests_.clear();
    flights_.clear();
    divided_ = 0;
  }

  /// Whether a progress thread moves the buckets on: decided at the first bucket of the first
  /// step (after the program has set its compute threads), then kept.
  bool use_worker() {
    if (!mode_) mode_ = thread_allowed_ ? progress_mode(comm_.intra_size()) : Progress::kHooks;
    return worker_mode();
  }
  bool worker_mode() const { return mode_.has_value() && *mode_ != Progress::kHooks; }

  /// Hands a task to the worker, starting it at the first.
  void queue(Task task) {
    if (!worker_.joinable()) {
      yield_between_tests_ = *mode_ == Progress::kYield;
      worker_ = std::thread([this] { work(); });
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    changed_.notify_all();
  }

  // Note [Progress thread]
  // MPI moves a non-blocking collective only while some thread is inside MPI. Under
  // MPI_THREAD_MULTIPLE (kusari's own initialisation, Note [Thread level] in mpi_util.cc) and
  // with a core to spare (cpu_share, the CPUs the process is bound to or, unbound, the host's
  // divided among its ranks, above its compute threads, kusari::get_num_threads(); e.g.
  // `mpiexec --map-by slot:PE=2` with one thread each), a worker thread does the buckets' work in
  // the order the hooks hand it over: it copies each new gradient into its segment of the bucket
  // (the hook only queues the copy, so backward goes on at once), starts each bucket's
  // collective once its gradients are in, and tests the requests until they are done, averaging
  // each bucket as soon as its collective has finished (float32 and float64; a 16-bit wire is
  // averaged by the update, in float32, as the kind's own mean). So the copies, transfers, sums
  // and the division go on while backward computes, on the spare core, and the update finds the
  // means ready except in the buckets still in flight, which it waits for and averages itself.
  // The worker tests again at once, yielding the core in between, since each test moves a
  // fragment of a large message (Note [Waits that move the operation] in nccl_wait.cc; polled
  // every 200 us, a 20 MB allreduce took 55 ms instead of 5 where shared memory has no single
  // copy). Without a core to spare a worker could only take turns with backward, so the hooks
  // copy, start and test themselves, between backward's layers, and the update averages, as
  // under MPI_THREAD_SERIALIZED, where no second thread may call MPI while the program might (a
  // model's own collectives during backward; Note [Overlapped gradient reduction]).
  // KUSARI_MN_PROGRESS=yield, sleep (a worker that sleeps 200 us between tests) or hooks chooses
  // either way; it is decided at the first bucket and kept. Only the worker touches the requests
  // until the update parks it (park_worker: it does what is queued and stops), and then the
  // update waits for them itself through wait_requests. A gradient whose copy was queued stays
  // the parameter's gradient until the update makes the segment its gradient (use_segment), so
  // nothing reads a segment before the worker has written it.
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return stop_ || parked_request_ || !queue_.empty() || open_; });
      if (stop_) return;
      if (!queue_.empty()) {  // (done without the lock: a hook may queue the next meanwhile)
        Task task = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        std::exception_ptr failure;
        try {
          if (task.bucket.defined()) {
            start(task);
          } else {
            std::memcpy(task.copy_to, task.copy_from.raw_data(), static_cast<size_t>(task.bytes));
          }
        } catch (...) {
          failure = std::current_exception();
        }
        task = Task();  // (the gradient may be freed now)
        lock.lock();
        if (failure && !failure_) failure_ = failure;
        open_ = divided_ < flights_.size() && !failure_;
        continue;
      }
      if (parked_request_) {
        parked_ = true;
        changed_.notify_all();
        changed_.wait(lock, [&] { return stop_ || !parked_request_; });
        parked_ = false;
        changed_.notify_all();
        open_ = divided_ < flights_.size() && !failure_;
        continue;
      }
      if (!open_) continue;
      lock.unlock();
      // The oldest bucket not yet averaged (testing it moves every collective in flight).
      Flight& flight = flights_[divided_];
      int done = 0;
      const int code = MPI_Testall(flight.count, requests_.data() + flight.first, &done,
                                   MPI_STATUSES_IGNORE);
      if (code == MPI_SUCCESS && done) {
        divide_flight(flight, /*on_worker=*/true);
      } else if (yield_between_tests_) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      lock.lock();
      if (code != MPI_SUCCESS) {
        try {
          check_mpi(code, "MPI_Testall");
        } catch (...) {
          failure_ = std::current_exception();
        }
        open_ = false;
      } else {
        open_ = divided_ < flights_.size();
      }
    }
  }

  /// Makes the worker do what is queued and stop touching the requests (no worker: nothing).
  void park_worker() noexcept {
    if (!worker_.joinable()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    parked_request_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return parked_; });
  }
  /// Lets the worker go on, and waits until it has left its parked state (else a park that
  /// follows at once would find it still parked, with new tasks queued and not done).
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
  /// The requests of the buckets in flight, and the buckets (in launch order).
  std::vector<MPI_Request> requests_;
  std::vector<Flight> flights_;
  /// flights_[0, divided_) are finished and averaged.
  size_t divided_ = 0;
  /// MPI_THREAD_MULTIPLE, so that a worker may move the buckets on; and who does (use_worker()).
  bool thread_allowed_ = false;
  std::optional<Progress> mode_;
  /// The worker of Note [Progress thread] and what it shares.
  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> queue_;
  bool open_ = false, stop_ = false, parked_request_ = false, parked_ = false;
  /// The worker's wait between tests: a yield, or a 200 us sleep (Note [Progress thread]).
  bool yield_between_tests_ = false;
  std::exception_ptr failure_;
};

}  // namespace

int cpu_share(int ranks_on_host) {
  cpu_set_t cpus;
  if (::sched_getaffinity(0, sizeof(cpus), &cpus) != 0) return 1;
  int share = CPU_COUNT(&cpus);
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (online > 0 && share >= online && ranks_on_host > 1) {
    share = static_cast<int>(online / ranks_on_host);  // (unbound: the host's ranks share them)
  }
  return std::max(share, 1);
}

std::unique_ptr<BucketTransport> make_host_bucket_transport(Communicator& comm) {
  const std::string name = comm.name();
  if (name == "naive") return std::make_unique<HostBucketTransport>(comm, true, false);
  if (name == "flat") return std::make_unique<HostBucketTransport>(comm, true, true);
  if (name == "dummy") return std::make_unique<HostBucketTransport>(comm, false, true);
  return nullptr;
}

}  // namespace kusari::mn::detail
