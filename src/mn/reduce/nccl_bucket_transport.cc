// The bucket transport of the NCCL communicators: each bucket handed from the compute stream to
// the communication stream with an event and reduced there (Note [Overlapped gradient
// reduction] in bucket_reducer.h, Note [Communication stream] in nccl_communicator.cc). Only
// compiled with CUDA and NCCL.
#include "kusari/config.h"

#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL

#include "backends/cuda/runtime/cuda_backend.h"
#include "kusari/core/routines.h"
#include "mn/comm/nccl_communicator.h"
#include "mn/reduce/bucket_reducer.h"

namespace kusari::mn::detail {

namespace {

constexpr const char* kWhat = "multi_node_mean_grad (overlap)";

class NcclBucketTransport : public BucketTransport {
 public:
  explicit NcclBucketTransport(NcclCommunicator& comm) : comm_(comm) {}
  ~NcclBucketTransport() override {
    abandon();
    NcclCommunicator::destroy_events(events_);
  }

  std::string name() const override { return comm_.name(); }

  Device device_for(const NamedParams& params) const override {
    const Device d = params.front().second.data().device();
    for (const auto& [path, p] : params) {
      const Device here = p.data().device();
      KUSARI_CHECK(here == d, DeviceError, comm_.name(), ": ", kWhat, ": ", path, " is on ", here,
                   " but ", params.front().first, " is on ", d, " (the model must be on one GPU)");
    }
    KUSARI_CHECK(d.is_cuda(), CommunicatorError, comm_.name(), ": ", kWhat,
                 " needs the model on a GPU, but it is on ", d,
                 " (move the model with to_device(Device::cuda(comm->intra_rank())), or use "
                 "'flat' or 'naive' on the CPU)");
    return d;
  }

  Dtype wire_dtype(Dtype grad_dtype) const override {
    return comm_.options().allreduce_grad_dtype.value_or(grad_dtype);
  }

  int64_t align_bytes() const override { return 256; }  // (as the memory pool aligns arrays)
  int64_t buffer_multiple() const override { return comm_.buffer_multiple(); }

  void prepare(int count, Device device) override {
    abandon();
    comm_.ensure_nccl(device, kWhat);  // (collective the first time: every rank plans together)
    comm_.ensure_events(events_, count);
  }

  void launch(int k, Array& flat) override {
    // compute: ... the copies into the bucket, record(packed k); NCCL: wait(packed k),
    // collectives, record(done k). The compute stream goes on with backward.
    comm_.mark_packed(events_, k);
    comm_.begin_chunk(events_, k);
    comm_.reduce_buffer(flat.raw_data(), flat.size(), flat.dtype(), ReduceOp::kMean, kWhat);
    comm_.end_chunk(events_, k, /*compute_waits=*/false);
    launched_ = k + 1;
  }

  void wait(int count) override {
    if (count == 0) return;
    // The buckets ran in order on the one NCCL stream: the last one's done event covers all.
    KUSARI_CUDA_CHECK(cudaStreamWaitEvent(cuda::compute_stream(comm_.device()),
                                          events_.done[static_cast<size_t>(count - 1)], 0));
    launched_ = 0;
    comm_.wait_chunks(events_, count, kWhat);  // (the timeout's watch, when one is set)
  }

  bool averages(Dtype wire) const override { return comm_.averages_on_wire(wire); }

  void divide(Array& flat) const override { multiply_to(flat, 1.0 / comm_.size()); }

  void abandon() noexcept override {
    if (launched_ == 0) return;
    // The compute stream waits for the collectives before anything reuses the buckets.
    cudaStreamWaitEvent(cuda::compute_stream(comm_.device()),
                        events_.done[static_cast<size_t>(launched_ - 1)], 0);
    launched_ = 0;
  }

 private:
  NcclCommunicator& comm_;
  NcclCommunicator::ChunkEvents events_;
  int launched_ = 0;
};

}  // namespace

/// The transport of an NCCL communicator's buckets; null for another communicator.
std::unique_ptr<BucketTransport> make_nccl_bucket_transport(Communicator& comm) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (!nccl) return nullptr;
  return std::make_unique<NcclBucketTransport>(*nccl);
}

}  // namespace kusari::mn::detail

#endif  // KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
