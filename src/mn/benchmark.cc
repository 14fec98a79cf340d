#include "kusari/mn/benchmark.h"

#include "kusari/config.h"
#include "kusari/core/error.h"

#if KUSARI_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
#include <nccl.h>

#include "mn/nccl_communicator.h"
#endif

namespace kusari::mn {

#if KUSARI_HAVE_CUDA

struct GpuTimer::Impl {
  int device = 0;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
};

GpuTimer::GpuTimer(Device device) : impl_(std::make_unique<Impl>()) {
  KUSARI_CHECK(device.is_cuda(), DeviceError, "GpuTimer: needs a CUDA device, got ", device);
  impl_->device = device.index();
  cuda::check_device_index(impl_->device, "GpuTimer");
  cuda::compute_stream(impl_->device);
  cuda::set_device(impl_->device);
  KUSARI_CUDA_CHECK(cudaEventCreate(&impl_->start));
  KUSARI_CUDA_CHECK(cudaEventCreate(&impl_->stop));
}

GpuTimer::~GpuTimer() {
  if (impl_->start) cudaEventDestroy(impl_->start);
  if (impl_->stop) cudaEventDestroy(impl_->stop);
}

void GpuTimer::start() {
  cuda::set_device(impl_->device);
  KUSARI_CUDA_CHECK(cudaEventRecord(impl_->start, cuda::compute_stream(impl_->device)));
}

void GpuTimer::stop() {
  cuda::set_device(impl_->device);
  KUSARI_CUDA_CHECK(cudaEventRecord(impl_->stop, cuda::compute_stream(impl_->device)));
}

double GpuTimer::seconds() {
  KUSARI_CUDA_CHECK(cudaEventSynchronize(impl_->stop));
  float ms = 0;
  KUSARI_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->start, impl_->stop));
  return ms * 1e-3;
}

#else

struct GpuTimer::Impl {};

GpuTimer::GpuTimer(Device device) {
  KUSARI_THROW(DeviceError, "GpuTimer: this kusari was built without CUDA");
}
GpuTimer::~GpuTimer() = default;
void GpuTimer::start() {}
void GpuTimer::stop() {}
double GpuTimer::seconds() {
  return 0;
}

#endif

std::string nccl_version() {
#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return ::kusari::detail::concat("NCCL ", v / 10000, ".", (v / 100) % 100, ".", v % 100);
#else
  return "no NCCL (built without CUDA and NCCL)";
#endif
}

int gradient_chunks(const Communicator& comm) {
#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
  if (const auto* nccl = dynamic_cast<const detail::NcclCommunicator*>(&comm)) {
    return nccl->last_gradient_chunks();
  }
#endif
  return 0;
}

void allreduce_in_pieces(Communicator& comm, Array& x, int pieces) {
#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
  if (auto* nccl = dynamic_cast<detail::NcclCommunicator*>(&comm)) {
    nccl->allreduce_in_pieces(x, pieces);
    return;
  }
#endif
  KUSARI_THROW(CommunicatorError, "allreduce_in_pieces: needs an NCCL communicator, got '",
               comm.name(), "'");
}

std::string gradient_chunk_setting(const Communicator& comm) {
#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL
  if (const auto* nccl = dynamic_cast<const detail::NcclCommunicator*>(&comm)) {
    return detail::chunk_bytes_name(nccl->chunk_bytes());
  }
#endif
  return "";
}

}  // namespace kusari::mn
