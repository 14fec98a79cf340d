// The bucket transport of the CPU communicators: MPI's non-blocking allreduce, started from the
// gradient-ready hooks and moved on by them (Note [Overlapped gradient reduction] in
// bucket_reducer.h).
#include <mpi.h>

#include <cstring>
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
    }
  }

  ~HostBucketTransport() override {
    abandon();
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
    const MPI_Datatype type = mpi_datatype(dtype);
    const MPI_Op op = mpi_op(ReduceOp::kSum, dtype);
    char* p = static_cast<char*>(flat.raw_data());
    const int64_t item = static_cast<int64_t>(itemsize(dtype));
    // In pieces that fit an MPI count, as allreduce_host cuts them.
    for (int64_t done = 0; done < flat.size();) {
      const int count = static_cast<int>(std::min(flat.size() - done, max_chunk_elements()));
      MPI_Request request = MPI_REQUEST_NULL;
      KUSARI_MPI_CHECK(
          MPI_Iallreduce(MPI_IN_PLACE, p + done * item, count, type, op, dup_, &request));
      requests_.push_back(request);
      done += count;
    }
  }

  void progress() override {
    if (requests_.empty()) return;
    int all_done = 0;
    KUSARI_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &all_done,
                                 MPI_STATUSES_IGNORE));
    if (all_done) requests_.clear();
  }

  void wait(int) override {
    wait_requests(requests_.data(), static_cast<int>(requests_.size()), kWhat);
    requests_.clear();
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
    if (requests_.empty()) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      try {
        wait_requests(requests_.data(), static_cast<int>(requests_.size()), kWhat);
      } catch (...) {
      }
    }
    requests_.clear();
  }

 private:
  Communicator& comm_;
  std::string name_;
  bool communicate_;
  bool cast_;
  MPI_Comm dup_ = MPI_COMM_NULL;
  std::vector<MPI_Request> requests_;
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
