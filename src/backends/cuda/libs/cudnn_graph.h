// cuDNN's graph API (the "backend" API of cudnn_graph.h): descriptors as owned objects, operation
// graphs built one operation at a time, and their execution plans, found through cuDNN's engine
// heuristics; a single convolution is one such graph. See Note [cuDNN graph API convolutions] in
// cudnn_graph.cc. Only compiled when KUSARI_HAVE_CUDA.
#pragma once

#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backends/cuda/libs/cudnn_variant_pack.h"

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

/// Which engines a plan may use, from the notes cuDNN attaches to each engine.
struct EngineFilter {
  /// The data is float32 and may not go through TF32 tensor cores.
  bool forbid_tf32 = false;
  /// Only engines cuDNN does not mark non-deterministic.
  bool deterministic = false;
  /// Engines whose kernels are compiled at run time (NVRTC) on their first plan; cuDNN's fused
  /// attention is only such engines.
  bool allow_runtime_compilation = false;
  /// Engines that round their inputs to a narrower type before computing.
  bool allow_down_convert = false;
};

/// The largest power of two, at most 16, that divides the address (the alignment cuDNN is told;
/// 16 for a null pointer).
int64_t alignment(const void* p);

/// Whether KUSARI_CUDNN_DETERMINISTIC=1 asks for engines cuDNN does not mark non-deterministic
/// (read once).
bool deterministic_mode();

/// A finalized execution plan of an operation graph.
class Plan {
 public:
  /// `uids` are the graph's non-virtual tensors: what a variant pack must name.
  Plan(Descriptor plan, int64_t workspace, std::string engine, std::vector<int64_t> uids,
       std::shared_ptr<const void> keepalive);
  /// Scratch bytes the plan needs.
  int64_t workspace() const { return workspace_; }
  /// The engine, for messages and logs ("engine 12" plus its notes).
  const std::string& engine() const { return engine_; }
  /// Runs the graph on the handle's stream: `pointers[i]` is the tensor of unique id `uids[i]`
  /// (for a by-value tensor, a pointer to its host value), `what` names the graph in errors.
  /// The ids must be exactly the graph's non-virtual tensors (cuDNN refuses a pack with one
  /// more, with a bare "bad parameter"): a mismatch throws DeviceError naming the ids.
  void execute(cudnnHandle_t handle, const int64_t* uids, void* const* pointers, int64_t count,
               void* workspace, const char* what) const;

 private:
  Descriptor plan_;
  int64_t workspace_;
  std::string engine_;
  std::vector<int64_t> uids_;
  std::shared_ptr<const void> keepalive_;  // the graph's descriptors, for as long as the plan
};

/// An operation graph of tensors named by unique ids, built one operation at a time: tensors
/// first, then the operations that connect them (see Note [cuDNN fused attention] in
/// cudnn_attention.cc for a large one). Dims and strides are in elements.
class GraphBuilder {
 public:
  /// A tensor the caller passes at execution (its pointer is in the variant pack).
  void tensor(int64_t uid, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides,
              cudnnDataType_t type, int64_t alignment = 16);
  /// A tensor that lives only inside the graph.
  void virtual_tensor(int64_t uid, const std::vector<int64_t>& dims,
                      const std::vector<int64_t>& strides, cudnnDataType_t type);
  /// A scalar passed by value (a host pointer in the variant pack), of dims (1, 1, 1, 1).
  void scalar(int64_t uid, cudnnDataType_t type);
  /// y = mode(x[, b[, t]]); `axis` is GEN_INDEX's.
  void pointwise(cudnnPointwiseMode_t mode, int64_t y, int64_t x, int64_t b = -1, int64_t t = -1,
                 cudnnDataType_t compute = CUDNN_DATA_FLOAT, int64_t axis = -1);
  /// c = a @ b over the last two axes, batched over the others.
  void matmul(int64_t c, int64_t a, int64_t b);
  /// y = op(x) over the axes where y has extent 1 and x does not.
  void reduction(cudnnReduceTensorOp_t op, int64_t y, int64_t x);
  /// y = x seen with y's dims and strides (a transpose when the strides say so).
  void reshape(int64_t y, int64_t x);
  /// The execution plans cuDNN's heuristics propose for the graph, best first, that pass
  /// `filter` and need at most `max_workspace` bytes; at most `max_plans`. Empty when cuDNN
  /// cannot run the graph, and then `why` (when given) says what refused it.
  std::vector<std::shared_ptr<const Plan>> plans(cudnnHandle_t handle, const EngineFilter& filter,
                                                 int64_t max_workspace, int max_plans,
                                                 std::string* why = nullptr);

 private:
  const Descriptor& at(int64_t uid) const;
  std::set<int64_t> external_;  // the uids of the non-virtual tensors (a variant pack's)
  std::shared_ptr<std::map<int64_t, Descriptor>> tensors_ =
      std::make_shared<std::map<int64_t, Descriptor>>();
  // The operations' parameters (pointwise, matmul, reduction descriptors) and the operations.
  std::shared_ptr<std::vector<Descriptor>> params_ = std::make_shared<std::vector<Descriptor>>();
  std::shared_ptr<std::vector<Descriptor>> ops_ = std::make_shared<std::vector<Descriptor>>();
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
  explicit ConvPlan(std::shared_ptr<const Plan> plan) : plan_(std::move(plan)) {}
  /// Scratch bytes the plan needs.
  int64_t workspace() const { return plan_->workspace(); }
  /// The engine, for messages and logs ("engine 12" plus its notes).
  const std::string& engine() const { return plan_->engine(); }
  /// Runs the convolution on the handle's stream: x, w, y are the forward's names (for the
  /// backward passes dx, w, dy and x, dw, dy respectively).
  void execute(cudnnHandle_t handle, void* x, void* w, void* y, void* workspace) const;

 private:
  std::shared_ptr<const Plan> plan_;
};

/// The execution plans cuDNN's heuristics propose for `problem`, best first, that pass the
/// filters (TF32, determinism, no run-time compiled engine, no engine that rounds its inputs
/// down) and need at most `max_workspace` bytes; at most `max_plans` of them. Empty when cuDNN
/// has none (the caller then uses the legacy API).
std::vector<std::shared_ptr<const ConvPlan>> conv_plans(cudnnHandle_t handle,
                                                        const ConvProblem& problem,
                                                        int64_t max_workspace, int max_plans);

}  // namespace kusari::cuda::cudnn_graph
