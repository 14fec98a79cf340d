// Variable and Parameter: arrays that take part in define-by-run differentiation.
//
// Note [Graph ownership]
// A Variable is a handle to a VariableImpl, which holds the data, the gradient and a strong
// reference to the FunctionNode that created it. A FunctionNode holds strong references to its
// input VariableImpls (the graph's edges, and the inputs that backward rules read) and weak
// references to its outputs. So the graph lives exactly as long as some output Variable is held:
// dropping the loss frees the whole graph. Retained outputs are kept as arrays and turned back
// into Variables (with the same creator) on demand, so no output is kept alive by its own node.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kusari/core/array.h"

namespace kusari {

class FunctionNode;
class Initializer;
class Variable;

/// Called by Variable::backward once a leaf's gradient of that backward is final (see
/// Variable::add_grad_ready_hook); `leaf` is the variable the hook was added to.
using GradReadyHook = std::function<void(const Variable& leaf)>;

namespace detail {

/// The grad-ready hooks of one variable, with their ids. Every hook alive is counted (copies
/// included), so that backward skips the finality bookkeeping while no variable has one
/// (Note [Gradient-ready hooks] in src/autograd/backward.cc).
struct GradReadyHooks {
  std::vector<std::pair<int64_t, GradReadyHook>> list;
  GradReadyHooks() = default;
  GradReadyHooks(const GradReadyHooks& other);
  GradReadyHooks& operator=(const GradReadyHooks& other);
  ~GradReadyHooks();
  void add(int64_t id, GradReadyHook hook);
  bool remove(int64_t id);
};

/// Grad-ready hooks alive in the process (any variable).
int64_t live_grad_ready_hooks();

struct VariableImpl;

/// Where the values of a parameter whose data was released come from (sharded data parallelism,
/// stage 3: Note [Sharded parameters] in src/mn/reduce/sharded_update.cc). While a variable's
/// `source` is set, its data is a placeholder of the right shape, dtype and device, and
/// Variable::data() calls materialize() first, which puts the values back and clears `source`.
class DataSource {
 public:
  virtual void materialize(VariableImpl& impl) = 0;
  /// Called when the next function node is recorded, once asked for with call_at_next_node:
  /// every function that read data before it has finished (a safe moment to release data).
  virtual void at_next_node() {}

 protected:
  ~DataSource() = default;
};

/// Asks for source->at_next_node() when this thread next records a function node (once).
void call_at_next_node(DataSource* source);
/// Withdraws the requests of `source` (it is going away).
void cancel_calls_at_next_node(DataSource* source);

/// The state behind a Variable handle. See Note [Graph ownership].
struct VariableImpl {
  Array data;
  std::shared_ptr<VariableImpl> grad;
  std::shared_ptr<FunctionNode> creator;
  int64_t generation = 0;
  bool requires_grad = false;
  std::string name;
  // Parameters only: how to fill the data when it is first sized, and where.
  std::shared_ptr<Initializer> initializer;
  Device device;
  // Parameters only: the dtype set by Parameter::to_dtype, which a lazily sized parameter is
  // created in (unset: the initializer's). See Note [Link dtype].
  std::optional<Dtype> dtype;
  // Parameters only: the layout set by Parameter::to_memory_format, which a lazily sized 4-d
  // parameter is created in. See Note [Memory formats] in src/core/array.cc.
  MemoryFormat memory_format = MemoryFormat::kContiguous;
  // Parameters only: the snapshot entry a lazily sized parameter took its shape from (empty:
  // none), for the link's error when that shape does not fit its input.
  std::string loaded_from;
  // Set on leaves by backward(loss_scale=s); optimizers divide gradients by it.
  double loss_scale = 1.0;
  // Parameters only: false when the owning link disabled updates (Link::disable_update).
  bool update_enabled = true;
  // Parameters only: where backward puts this leaf's gradient (undefined: a fresh array). See
  // Note [Gradients in a persistent buffer] in src/autograd/backward.cc.
  Array grad_buffer;
  // Called when backward has finished this leaf's gradient (Variable::add_grad_ready_hook).
  GradReadyHooks grad_ready_hooks;
  // Parameters only: set while the data is released; data() materializes it (DataSource).
  DataSource* source = nullptr;

  /// True when the gradient is grad_buffer itself (the same memory, offset and geometry).
  bool grad_in_buffer() const;
};

}  // namespace detail

/// Options of Variable::backward().
struct BackwardOptions {
  /// Keep the gradients of intermediate variables (by default only leaves keep theirs).
  bool retain_grad = false;
  /// Record the backward computation so that gradients can be differentiated again.
  bool enable_double_backprop = false;
  /// Multiply the initial gradient by this factor (for float16 training); leaves remember it.
  std::optional<double> loss_scale;
  /// Keep the graph after backward (Chainer's behaviour: it lives as long as its variables).
  /// False frees each node's saved arrays as soon as its backward rule has run, so that memory
  /// falls during backward instead of peaking at its end (PyTorch's retain_graph=False); the
  /// graph cannot be differentiated again then. See Note [Freeing the graph during backward].
  bool retain_graph = true;
};

/// A node of the computational graph: an array, its gradient, and the function that made it.
/// Copies are handles to the same variable (like Python references).
class Variable {
 public:
  /// An undefined variable (defined() is false).
  Variable() = default;
  /// Wraps `data`; pass requires_grad = true for a leaf whose gradient you want.
  Variable(Array data, bool requires_grad = false);  // NOLINT: arrays convert implicitly
  explicit Variable(std::shared_ptr<detail::VariableImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return static_cast<bool>(impl_); }
  /// The values (a released parameter's are put back first: DataSource).
  const Array& data() const {
    detail::VariableImpl& im = impl();
    if (im.source != nullptr) [[unlikely]]
      im.source->materialize(im);
    return im.data;
  }
  /// Chainer's spelling of data().
  const Array& array() const { return data(); }
  /// Replaces the data (shape may change; the graph is not touched). A gradient buffer bound to
  /// a parameter (Parameter::set_grad_buffer) is unbound when the shape, dtype or device changes.
  void set_data(Array data);

  // (the geometry of a released parameter's placeholder is the parameter's: no values needed)
  const Shape& shape() const { return impl().data.shape(); }
  Dtype dtype() const { return impl().data.dtype(); }
  Device device() const { return impl().data.device(); }
  int ndim() const { return impl().data.ndim(); }
  int64_t size() const { return impl().data.size(); }

  /// The gradient array (undefined when none has been computed).
  Array grad() const;
  /// The gradient as a Variable (with a graph when computed with enable_double_backprop).
  Variable grad_var() const;
  void set_grad(const Array& grad);
  void set_grad_var(const Variable& grad);
  /// Drops the gradient (Chainer's cleargrad). A bound gradient buffer stays bound.
  void cleargrad();
  /// Sets the gradient to zeros of the data's shape: the bound gradient buffer filled with zeros
  /// when there is one (no allocation), else a new array.
  void zerograd();

  bool requires_grad() const { return impl().requires_grad; }
  void set_requires_grad(bool value) { impl().requires_grad = value; }
  /// The function that produced this variable (null for a leaf).
  FunctionNode* creator() const { return impl().creator.get(); }
  const std::shared_ptr<FunctionNode>& creator_ptr() const { return impl().creator; }
  int64_t generation() const { return impl().generation; }

  const std::string& name() const { return impl().name; }
  void set_name(std::string name) { impl().name = std::move(name); }

  /// Computes the gradients of this variable with respect to every variable it depends on
  /// (a scalar's gradient starts at 1; a non-scalar needs its grad set first).
  void backward(const BackwardOptions& options = {}) const;
  /// Adds `hook`, which every later backward() (Variable::backward, not kusari::grad) calls once
  /// this variable, a leaf with requires_grad, has received the last contribution of that
  /// backward to its gradient, with the gradient already summed: once per backward in which it
  /// got a gradient (a variable used several times: after the last use is differentiated; not at
  /// all when the loss does not depend on it), also when backward runs several times before an
  /// update (gradient accumulation: the gradient then holds the sum so far). Hooks run in the
  /// order they were added, on the thread running backward, while backward goes on for the rest
  /// of the graph; an exception from a hook ends that backward. Returns an id for
  /// remove_grad_ready_hook. See Note [Gradient-ready hooks] in src/autograd/backward.cc.
  int64_t add_grad_ready_hook(GradReadyHook hook);
  /// Removes the hook with id `id` (also from within a hook); false when this variable has none.
  bool remove_grad_ready_hook(int64_t id);
  /// Hooks added and not removed.
  int64_t grad_ready_hook_count() const {
    return static_cast<int64_t>(impl().grad_ready_hooks.list.size());
  }

  /// Cuts the link to the creator: this variable becomes a leaf (Chainer's unchain).
  void unchain();
  /// Cuts every link reachable backwards from this variable (Chainer's unchain_backward).
  void unchain_backward();
  /// A new leaf variable sharing this variable's data (PyTorch's detach).
  Variable detached() const { return Variable(data(), false); }

  /// True when both handles refer to the same variable.
  bool is(const Variable& other) const { return impl_ == other.impl_; }
  detail::VariableImpl& impl() const;
  const std::shared_ptr<detail::VariableImpl>& impl_ptr() const { return impl_; }

  std::string to_string() const;

 protected:
  std::shared_ptr<detail::VariableImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Variable& v);

/// Fills a parameter's array when the parameter is first sized (see links/initializers.h).
class Initializer {
 public:
  virtual ~Initializer() = default;
  /// Writes initial values into `array` (already allocated with the right shape).
  virtual void operator()(Array& array) const = 0;
  /// The dtype arrays are created with (float32 unless the initializer says otherwise).
  virtual Dtype dtype() const { return Dtype::kFloat32; }
};

/// A trainable Variable owned by a Link. It may be created without a shape and sized later
/// (lazy initialisation, e.g. Linear with in_size unknown until the first forward).
class Parameter : public Variable {
 public:
  /// An undefined handle.
  Parameter() = default;
  /// A parameter initialised from `data` (requires_grad is true).
  explicit Parameter(Array data);
  /// A parameter to be filled by `initializer`; sized now when `shape` is given, else later.
  explicit Parameter(std::shared_ptr<Initializer> initializer,
                     std::optional<Shape> shape = std::nullopt, Device device = default_device());
  /// Rewraps a Variable handle that refers to a parameter.
  static Parameter from_variable(const Variable& v);

  /// True once the data exists.
  bool is_initialized() const { return impl().data.defined(); }
  /// Allocates the data with `shape` and fills it with the initializer (dropping the gradient and
  /// unbinding a gradient buffer).
  void initialize(const Shape& shape);
  /// " (its shape came from the snapshot entry 'KEY')" when a lazily sized parameter was sized by
  /// a loaded value, else empty: the end of a link's shape error.
  std::string shape_origin() const;
  const std::shared_ptr<Initializer>& initializer() const { return impl().initializer; }
  /// The device the parameter lives (or will live) on.
  Device device() const { return is_initialized() ? impl().data.device() : impl().device; }
  /// Moves the data (and gradient) to `device`, or records it for a later initialize(). A bound
  /// gradient buffer on another device is unbound.
  void to_device(Device device);

  /// Binds a persistent gradient buffer (PyTorch's gradient_as_bucket_view): while the gradient
  /// is the buffer itself (after zerograd, or once a communicator has moved it there), backward
  /// adds further gradients into it in place instead of allocating; a first gradient is adopted
  /// as without a buffer. The buffer must be contiguous and have the parameter's shape, dtype
  /// and device, and must not overlap its data; an undefined array unbinds. Binding does not
  /// change the current gradient.
  /// The multi-node communicators bind every parameter to its view of one flat reduction buffer
  /// (Note [Gradients in the reduction buffer] in src/mn/gradient_buffer.cc). See
  /// Note [Gradients in a persistent buffer] in src/autograd/backward.cc.
  void set_grad_buffer(Array buffer);
  /// The bound gradient buffer (undefined when none is bound).
  Array grad_buffer() const { return impl().grad_buffer; }
  /// True when the gradient is the bound buffer itself (false when either is missing).
  bool grad_in_buffer() const { return impl().grad_in_buffer(); }
  /// The dtype the parameter has, or will be created in: the one given to to_dtype(), else the
  /// initializer's (float32 without one).
  Dtype dtype() const;
  /// Converts the data (and gradient) to the floating dtype `dtype`, or records it so that a
  /// later initialize() creates the data in it. See Note [Link dtype].
  void to_dtype(Dtype dtype);
  /// Lays a 4-d parameter's data (and gradient) out in `format`, or records it so that a later
  /// initialize() of a 4-d shape creates it so; parameters of another rank stay contiguous. A
  /// bound gradient buffer stays bound (backward adds into it whatever the layout).
  void to_memory_format(MemoryFormat format);
};

/// Computes d outputs / d inputs without touching any variable's grad (Chainer's chainer.grad).
/// grad_outputs may be empty (ones for scalar outputs). Inputs the outputs do not depend on get
/// an undefined Variable.
std::vector<Variable> grad(const std::vector<Variable>& outputs,
                           const std::vector<Variable>& inputs,
                           const std::vector<Variable>& grad_outputs = {},
                           bool enable_double_backprop = false);

}  // namespace kusari
