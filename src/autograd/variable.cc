#include "kusari/autograd/variable.h"

#include <atomic>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "autograd/graph_access.h"

namespace kusari {

Variable::Variable(Array data, bool requires_grad)
    : impl_(std::make_shared<detail::VariableImpl>()) {
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

detail::VariableImpl& Variable::impl() const {
  KUSARI_CHECK(impl_, ValueError, "Variable: this variable is undefined (default-constructed)");
  return *impl_;
}

Array Variable::grad() const {
  return impl().grad ? impl().grad->data : Array();
}

Variable Variable::grad_var() const {
  return impl().grad ? Variable(impl().grad) : Variable();
}

void Variable::set_grad(const Array& grad) {
  if (!grad.defined()) {
    impl().grad.reset();
    return;
  }
  KUSARI_CHECK(grad.shape() == shape(), ShapeError, "Variable::set_grad: gradient of shape ",
               grad.shape(), " for a variable of shape ", shape());
  impl().grad = Variable(grad).impl_ptr();
}

void Variable::set_grad_var(const Variable& grad) {
  if (!grad.defined()) {
    impl().grad.reset();
    return;
  }
  KUSARI_CHECK(grad.shape() == shape(), ShapeError, "Variable::set_grad_var: gradient of shape ",
               grad.shape(), " for a variable of shape ", shape());
  impl().grad = grad.impl_ptr();
}

void Variable::cleargrad() {
  impl().grad.reset();
}

void Variable::zerograd() {
  detail::VariableImpl& im = impl();
  if (im.grad_buffer.defined()) {
    Array buffer = im.grad_buffer;  // a handle to the same memory
    buffer.fill(0);
    im.grad = Variable(std::move(buffer)).impl_ptr();
    return;
  }
  im.grad = Variable(Array::zeros_like(data())).impl_ptr();
}

void Variable::set_data(Array data) {
  detail::VariableImpl& im = impl();
  KUSARI_CHECK(im.source == nullptr, ValueError, "Variable::set_data: the parameter ",
               im.name.empty() ? "" : im.name + " ",
               "is sharded over the processes (zero_stage 3) and its data is gathered when read; "
               "assign values into data() instead of replacing the array (Note [Sharded parameters])");
  const Array& b = im.grad_buffer;
  if (b.defined() && (!data.defined() || data.shape() != b.shape() || data.dtype() != b.dtype() ||
                      data.device() != b.device())) {
    im.grad_buffer = Array();
  }
  im.data = std::move(data);
}

namespace detail {
namespace {

std::atomic<int64_t> g_live_grad_ready_hooks{0};
std::atomic<int64_t> g_next_grad_ready_hook_id{1};

}  // namespace

int64_t live_grad_ready_hooks() { return g_live_grad_ready_hooks.load(std::memory_order_relaxed); }

GradReadyHooks::GradReadyHooks(const GradReadyHooks& other) : list(other.list) {
  g_live_grad_ready_hooks += static_cast<int64_t>(list.size());
}

GradReadyHooks& GradReadyHooks::operator=(const GradReadyHooks& other) {
  if (this != &other) {
    g_live_grad_ready_hooks += static_cast<int64_t>(other.list.size()) - static_cast<int64_t>(list.size());
    list = other.list;
  }
  return *this;
}

GradReadyHooks::~GradReadyHooks() { g_live_grad_ready_hooks -= static_cast<int64_t>(list.size()); }

void GradReadyHooks::add(int64_t id, GradReadyHook hook) {
  list.emplace_back(id, std::move(hook));
  ++g_live_grad_ready_hooks;
}

bool GradReadyHooks::remove(int64_t id) {
  for (auto it = list.begin(); it != list.end(); ++it) {
    if (it->first == id) {
      list.erase(it);
      --g_live_grad_ready_hooks;
      return true;
    }
  }
  return false;
}

}  // namespace detail

int64_t Variable::add_grad_ready_hook(GradReadyHook hook) {
  KUSARI_CHECK(hook, ValueError, "Variable::add_grad_ready_hook: the hook is empty");
  const int64_t id = detail::g_next_grad_ready_hook_id++;
  impl().grad_ready_hooks.add(id, std::move(hook));
  return id;
}

bool Variable::remove_grad_ready_hook(int64_t id) { return impl().grad_ready_hooks.remove(id); }

void Variable::unchain() {
  impl().creator.reset();
}

void Variable::unchain_backward() {
  std::vector<std::shared_ptr<detail::VariableImpl>> stack{impl_};
  std::unordered_set<detail::VariableImpl*> seen;
  while (!stack.empty()) {
    auto v = std::move(stack.back());
    stack.pop_back();
    if (!v || !seen.insert(v.get()).second) continue;
    if (v->creator) {
      for (auto& in : detail::GraphAccess::inputs(*v->creator)) stack.push_back(in);
      v->creator.reset();
    }
  }
}

std::string Variable::to_string() const {
  if (!impl_) return "variable(undefined)";
  std::ostringstream os;
  os << "variable";
  if (!impl_->name.empty()) os << " " << impl_->name;
  os << "(" << (impl_->data.defined() ? data().to_string() : std::string("uninitialized"));
  if (impl_->creator) os << ", creator=" << impl_->creator->name();
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Variable& v) {
  return os << v.to_string();
}

namespace detail {

bool VariableImpl::grad_in_buffer() const {
  return grad && grad->data.same_view(grad_buffer);
}

}  // namespace detail

Parameter::Parameter(Array data) : Variable(std::move(data), true) {
  impl_->device = impl_->data.device();
}

Parameter::Parameter(std::shared_ptr<Initializer> initializer, std::optional<Shape> shape,
                     Device device) {
  impl_ = std::make_shared<detail::VariableImpl>();
  impl_->requires_grad = true;
  impl_->initializer = std::move(initializer);
  impl_->device = device;
  if (shape) initialize(*shape);
}

Parameter Parameter::from_variable(const Variable& v) {
  Parameter p;
  p.impl_ = v.impl_ptr();
  return p;
}

void Parameter::initialize(const Shape& shape) {
  detail::VariableImpl& im = impl();
  Array a = Array::empty(shape, dtype(), im.device);
  if (im.initializer) {
    (*im.initializer)(a);
  } else {
    // Chainer fills parameters that have no initializer with NaN, so forgetting one is loud.
    a.fill(std::numeric_limits<double>::quiet_NaN());
  }
  if (im.memory_format != MemoryFormat::kContiguous && a.ndim() == 4)
    a = a.to_memory_format(im.memory_format);
  im.data = std::move(a);
  im.grad.reset();
  im.grad_buffer = Array();
  im.loaded_from.clear();
}

std::string Parameter::shape_origin() const {
  const std::string& key = impl().loaded_from;
  return key.empty() ? std::string() : " (its shape came from the snapshot entry '" + key + "')";
}

void Parameter::to_device(Device device) {
  detail::VariableImpl& im = impl();
  im.device = device;
  if (im.grad_buffer.defined() && im.grad_buffer.device() != device) im.grad_buffer = Array();
  if (im.data.defined()) im.data = im.data.to_device(device);
  if (im.grad) im.grad = Variable(im.grad->data.to_device(device)).impl_ptr();
}

void Parameter::set_grad_buffer(Array buffer) {
  detail::VariableImpl& im = impl();
  if (!buffer.defined()) {
    im.grad_buffer = Array();
    return;
  }
  const std::string who =
      im.name.empty() ? std::string("the parameter") : "parameter '" + im.name + "'";
  KUSARI_CHECK(im.data.defined(), ValueError, "Parameter::set_grad_buffer: ", who,
               " is not initialized yet; bind a gradient buffer once it has a shape");
  KUSARI_CHECK(buffer.shape() == im.data.shape(), ShapeError, "Parameter::set_grad_buffer: ", who,
               " has shape ", im.data.shape(), " but the buffer has shape ", buffer.shape(),
               " (they must be equal)");
  KUSARI_CHECK(buffer.dtype() == im.data.dtype(), DtypeError, "Parameter::set_grad_buffer: ", who,
               " has dtype ", dtype_name(im.data.dtype()), " but the buffer has dtype ",
               dtype_name(buffer.dtype()), " (they must be equal)");
  KUSARI_CHECK(buffer.device() == im.data.device(), DeviceError,
               "Parameter::set_grad_buffer: ", who, " is on ", im.data.device(),
               " but the buffer is on ", buffer.device(), " (they must be on the same device)");
  KUSARI_CHECK(buffer.is_contiguous(), ValueError, "Parameter::set_grad_buffer: the buffer for ",
               who, " (shape ", buffer.shape(),
               ") is not contiguous; backward writes gradients as contiguous arrays");
  if (buffer.shares_memory_with(im.data)) {
    // Both ranges in elements of the same allocation; the data's extent is bounded by its strides.
    int64_t lo = im.data.offset(), hi = im.data.offset();
    for (int d = 0; d < im.data.ndim(); ++d) {
      const int64_t reach = (im.data.shape()[d] - 1) * im.data.strides()[d];
      (reach < 0 ? lo : hi) += reach;
    }
    const bool apart = buffer.size() == 0 || im.data.size() == 0 ||
                       buffer.offset() + buffer.size() <= lo || hi < buffer.offset();
    KUSARI_CHECK(apart, ValueError, "Parameter::set_grad_buffer: the buffer overlaps the data of ",
                 who, "; gradients would overwrite the parameter");
  }
  im.grad_buffer = std::move(buffer);
}

Dtype Parameter::dtype() const {
  const detail::VariableImpl& im = impl();
  if (im.data.defined()) return im.data.dtype();
  if (im.dtype) return *im.dtype;
  return im.initializer ? im.initializer->dtype() : Dtype::kFloat32;
}

void Parameter::to_dtype(Dtype dtype) {
  detail::VariableImpl& im = impl();
  KUSARI_CHECK(
      is_floating(dtype), DtypeError, "Parameter::to_dtype: parameter '", im.name,
      "' can only be converted to a floating dtype (float16, bfloat16, float32 or float64), got ",
      dtype_name(dtype));
  im.dtype = dtype;
  if (im.grad_buffer.defined() && im.grad_buffer.dtype() != dtype) im.grad_buffer = Array();
  if (im.data.defined() && im.data.dtype() != dtype) im.data = im.data.astype(dtype);
  if (im.grad && im.grad->data.defined() && im.grad->data.dtype() != dtype) {
    im.grad = Variable(im.grad->data.astype(dtype)).impl_ptr();
  }
}

void Parameter::to_memory_format(MemoryFormat format) {
  detail::VariableImpl& im = impl();
  im.memory_format = format;
  if (!im.data.defined() || im.data.ndim() != 4) return;
  im.data = im.data.to_memory_format(format);
  if (im.grad && im.grad->data.defined() && !im.grad_in_buffer()) {
    im.grad = Variable(im.grad->data.to_memory_format(format)).impl_ptr();
  }
}

}  // namespace kusari
