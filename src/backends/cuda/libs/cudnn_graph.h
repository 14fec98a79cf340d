// cuDNN's graph API (the "backend" API of cudnn_graph.h): descriptors as owned objects, and
// execution plans for a single convolution, found through cuDNN's engine heuristics. See Note
// [cuDNN graph API convolutions] in cudnn_graph.cc. Only compiled when KUSARI_HAVE_CUDA.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kusari::cuda::cudnn_graph {

/// One backend descriptor, destroyed with the object.
class Descriptor {
 public:
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept : d_(other.d_) { other.d_ = nullptr; }
  Descriptor& operator=(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }

  /// Sets an attribute (throws DeviceError naming `name` when cuDNN refuses it).
  Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                  int64_t count, const void* values);
  Descriptor& set_int64(cudnnBackendAttributeName_t name, int64_t value);
  Descriptor& set_int64s(cudnnBackendAttributeName_t name, const int64_t* values, int64_t count);
  Descriptor& set_descriptor(cudnnBackendAttributeName_t name, const Descriptor& value);
  /// Finalizes; throws DeviceError naming `what` when cuDNN refuses.
  void finalize(const char* what);
  /// Finalizes; returns cuDNN's status instead of throwing (for candidates that may not apply).
  cudnnStatus_t try_finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

/// Which convolution a graph computes.
enum class ConvDirection { kForward, kBackwardData, kBackwardFilter };

/// A tensor of a convolution: (n, c, h, w) or (o, c / groups, kh, kw) dims, element strides, and
/// the alignment in bytes of its data pointer.
struct TensorSpec {
  std::array<int64_t, 4> dims{};
  std::array<int64_t, 4> strides{};
  int64_t alignment = 16;
};

/// Everything that decides a convolution's execution plan.
struct ConvProblem {
  ConvDirection direction = ConvDirection::kForward;
  cudnnDataType_t data_type = CUDNN_DATA_FLOAT;
  cudnnDataType_t compute_type = CUDNN_DATA_FLOAT;
  TensorSpec x, w, y;
  std::array<int64_t, 2> pad{}, stride{}, dilation{};
  /// float32 data may use TF32 tensor cores.
  bool allow_tf32 = true;
  /// Only engines cuDNN does not mark non-deterministic.
  bool deterministic = false;
  /// The output is added to (beta = 1) instead of overwritten.
  bool accumulate = false;
};

/// A finalized execution plan of one convolution.
class ConvPlan {
 public:
  ConvPlan(Descriptor plan, int64_t workspace, std::string engine)
      : plan_(std::move(plan)), workspace_(workspace), engine_(std::move(engine)) {}
  /// Scratch bytes the plan needs.
  int64_t workspace() const { return workspace_; }
  /// The engine, for messages and logs ("engine 12" plus its notes).
  const std::string& engine() const { return engine_; }
  /// Runs the convolution on the handle's stream: x, w, y are the forward's names (for the
  /// backward passes dx, w, dy and x, dw, dy respectively).
  void execute(cudnnHandle_t handle, void* x, void* w, void* y, void* workspace) const;

 private:
  Descriptor plan_;
  int64_t workspace_;
  std::string engine_;
};

/// The execution plans cuDNN's heuristics propose for `problem`, best first, that pass the
/// filters (TF32, determinism, no run-time compiled engine, no engine that rounds its inputs
/// down) and need at most `max_workspace` bytes; at most `max_plans` of them. Empty when cuDNN
/// has none (the caller then uses the legacy API).
std::vector<std::shared_ptr<const ConvPlan>> conv_plans(cudnnHandle_t handle,
                                                        const ConvProblem& problem,
                                                        int64_t max_workspace, int max_plans);

}  // namespace kusari::cuda::cudnn_graph
