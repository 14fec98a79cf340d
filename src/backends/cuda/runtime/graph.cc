// CUDA graphs: record a step's GPU work once, replay it with one launch (kusari/core/cuda.h).
//
// Note [CUDA graphs]
// A training step of a small model is a few dozen kernels of a few microseconds each; queuing
// them costs the host more than the GPU needs to run them (the MNIST MLP: ~0.27 ms of launches for
// well under 0.1 ms of GPU work). Graph::capture runs the step's host code once while the
// device's compute stream is in capture mode, so each launch, cuBLAS/cuDNN call, memset and
// event becomes a node of a graph instead of running; cudaGraphInstantiate turns it into an
// executable graph, and replay() is one cudaGraphLaunch on the compute stream, ordered with the
// eager work before and after it like any kernel (Note [One compute stream per device]).
//   - Addresses are frozen: the memory of arrays made during the capture belongs to the graph
//     (Note [Graph memory pools]) and every replay writes the same places, so the Variables the
//     capture left behind (the loss, the parameters' gradients) read the new values after a
//     replay. Inputs are arrays made before the capture, refilled with assign() between replays.
//   - Host values are frozen too: scalars computed on the host while capturing (a learning rate,
//     a bias correction, a batch size) are kernel arguments of the graph. That is why the
//     optimizer update is best left outside: it is a handful of fused kernels whose arguments
//     change every step (Adam's bias correction).
//   - Capture mode is relaxed, so that the memory pool may call cudaMalloc while capturing; the
//     operations that cannot be recorded are refused by the backend with a DeviceError naming
//     them (Note [What a captured graph may not do]), and the capture is then abandoned whole.
//   - A graph must be captured from eager state that already exists: run one eager step first,
//     so that lazy parameters, optimizer state, the cuBLAS handle and workspace and cuDNN's
//     algorithm caches are made outside the capture.
//
// Note [What a captured graph may not do]
// Checked by the backend (check_not_capturing) because CUDA would otherwise fail late and
// obscurely, or record something wrong:
//   - host-to-device copies: a graph copies from the host address it recorded, on every replay;
//   - device-to-host copies and synchronize(): nothing has run yet, there is nothing to read;
//   - random numbers: the Philox counter advances on the host (Note [Philox]), so every replay
//     would draw the same numbers;
//   - copies between GPUs: the capture records one device's stream.
// Index checks of take/add_at read a flag on the host (Note [Device-side argument errors]); in a
// capture they are skipped, the kernels still skip the bad indices.
#include <cuda_runtime.h>

#include <utility>

#include "backends/cuda/runtime/cuda_backend.h"
#include "backends/cuda/runtime/memory_pool.h"
#include "core/cuda_runtime.h"
#include "kusari/core/cuda.h"
#include "kusari/core/error.h"

namespace kusari::cuda {

namespace {

// A recorded graph of one device (the implementation behind cuda::Graph).
class CudaGraph final : public Graph::Impl {
 public:
  ~CudaGraph() override { release(); }

  void capture(Device device, const std::function<void()>& fn) override;
  void replay() override;
  bool captured() const override { return exec_ != nullptr; }
  Device device() const override { return Device::cuda(device_); }
  int64_t num_nodes() const override { return static_cast<int64_t>(nodes_); }
  void reset() override { release(); }

 private:
  void release() noexcept {
    if (device_ < 0) return;
    // Replays in flight may still use the graph's memory: let them finish before it returns to
    // the device's pool. (Never throws: it also runs from the destructor.)
    cudaError_t status = cudaSuccess;
    if (exec_) {
      status = cudaStreamSynchronize(compute_stream(device_));
      cudaGraphExecDestroy(exec_);
    }
    if (graph_) cudaGraphDestroy(graph_);
    if (status != cudaSuccess) cudaGetLastError();
    memory_pool().release_private(device_, memory_);
    memory_.reset();
    exec_ = nullptr;
    graph_ = nullptr;
    nodes_ = 0;
    device_ = -1;
  }

  int device_ = -1;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  size_t nodes_ = 0;
  std::shared_ptr<MemoryPool::PrivatePool> memory_;
};

void CudaGraph::capture(Device device, const std::function<void()>& fn) {
  const int d = device.index();
  check_device_index(d, "cuda::Graph::capture");
  KUSARI_CHECK(!capturing(d), DeviceError, "cuda::Graph::capture: cuda:", d,
               " is already capturing a graph (captures do not nest)");
  release();
  set_device(d);
  cudaStream_t stream = compute_stream(d);
  // Errors of earlier eager work surface here, not as a failed capture.
  KUSARI_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::shared_ptr<MemoryPool::PrivatePool> memory = memory_pool().begin_capture(d);
  KUSARI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  cudaGraph_t graph = nullptr;
  auto abandon = [&] {
    // End the capture whatever happened (an invalidated capture still has to be ended), and
    // give the memory back: nothing recorded is kept.
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(stream, &partial) != cudaSuccess) cudaGetLastError();
    if (partial) cudaGraphDestroy(partial);
    memory_pool().end_capture(d);
    memory_pool().release_private(d, memory);
  };
  try {
    fn();
  } catch (...) {
    abandon();
    throw;
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  memory_pool().end_capture(d);
  if (ended != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    memory_pool().release_private(d, memory);
    KUSARI_THROW(DeviceError, "cuda::Graph::capture: the capture on cuda:", d, " failed (",
                 cudaGetErrorName(ended), ": ", cudaGetErrorString(ended),
                 "); the captured function did something a graph cannot record, e.g. CUDA work "
                 "on another stream that was not ordered with the compute stream by events");
  }
  size_t nodes = 0;
  cudaGraphExec_t exec = nullptr;
  cudaError_t status = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (status == cudaSuccess) status = cudaGraphInstantiate(&exec, graph, 0);
  if (status != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    memory_pool().release_private(d, memory);
    check_cuda(status, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  device_ = d;
  graph_ = graph;
  exec_ = exec;
  nodes_ = nodes;
  memory_ = std::move(memory);
}

void CudaGraph::replay() {
  check_not_capturing(device_, "replaying a graph", "graphs do not nest");
  set_device(device_);
  KUSARI_CUDA_CHECK(cudaGraphLaunch(exec_, compute_stream(device_)));
}

}  // namespace

std::unique_ptr<Graph::Impl> make_graph() { return std::make_unique<CudaGraph>(); }

}  // namespace kusari::cuda
