#include "kusari/mn/benchmark.h"

#include "core/cuda_runtime.h"
#include "kusari/core/error.h"
#include "mn/nccl_library.h"

namespace kusari::mn {

struct GpuTimer::Impl {
  std::unique_ptr<cuda::EventTimer> timer;
};

GpuTimer::GpuTimer(Device device) : impl_(std::make_unique<Impl>()) {
  KUSARI_CHECK(device.is_cuda(), DeviceError, "GpuTimer: needs a CUDA device, got ", device);
  impl_->timer = cuda::require_runtime("GpuTimer").make_event_timer(device.index());
}

GpuTimer::~GpuTimer() = default;

void GpuTimer::start() { impl_->timer->start(); }

void GpuTimer::stop() { impl_->timer->stop(); }

double GpuTimer::seconds() { return impl_->timer->seconds(); }

std::string nccl_version() {
  std::string why;
  const detail::NcclLibrary* nccl = detail::nccl_library(&why);
  return nccl ? nccl->version() : "no NCCL (" + why + ")";
}

int gradient_chunks(const Communicator& comm) {
  int chunks = 0;
  if (const detail::NcclLibrary* nccl = detail::nccl_library()) {
    if (nccl->gradient_chunks(comm, &chunks)) return chunks;
  }
  return 0;
}

void allreduce_in_pieces(Communicator& comm, Array& x, int pieces) {
  const detail::NcclLibrary* nccl = detail::nccl_library();
  if (nccl && nccl->allreduce_in_pieces(comm, x, pieces)) return;
  KUSARI_THROW(CommunicatorError, "allreduce_in_pieces: needs an NCCL communicator, got '",
               comm.name(), "'");
}

std::string gradient_chunk_setting(const Communicator& comm) {
  std::string setting;
  if (const detail::NcclLibrary* nccl = detail::nccl_library()) {
    if (nccl->chunk_setting(comm, &setting)) return setting;
  }
  return "";
}

}  // namespace kusari::mn
