#include "kusari/autograd/variable.h"

#include <limits>
#include <sstream>
#include <unordered_set>

#include "autograd/graph_access.h"

namespace kusari {

Variable::Variable(Array data, bool requires_grad) : impl_(std::make_shared<detail::VariableImpl>()) {
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

detail::VariableImpl& Variable::impl() const {
  KUSARI_CHECK(impl_, ValueError, "Variable: this variable is undefined (default-constructed)");
  return *impl_;
}

Array Variable::grad() const { return impl().grad ? impl().grad->data : Array(); }

Variable Variable::grad_var() const { return impl().grad ? Variable(impl().grad) : Variable(); }

void Variable::set_grad(const Array& grad) {
  if (!grad.defined()) {
    impl().grad.reset();
    return;
  }
  KUSARI_CHECK(grad.shape() == shape(), ShapeError, "Variable::set_grad: gradient of shape ", grad.shape(),
               " for a variable of shape ", shape());
  impl().grad = Variable(grad).impl_ptr();
}

void Variable::set_grad_var(const Variable& grad) {
  if (!grad.defined()) {
    impl().grad.reset();
    return;
  }
  KUSARI_CHECK(grad.shape() == shape(), ShapeError, "Variable::set_grad_var: gradient of shape ", grad.shape(),
               " for a variable of shape ", shape());
  impl().grad = grad.impl_ptr();
}

void Variable::cleargrad() { impl().grad.reset(); }

void Variable::zerograd() { impl().grad = Variable(Array::zeros_like(data())).impl_ptr(); }

void Variable::unchain() { impl().creator.reset(); }

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
  os << "(" << (impl_->data.defined() ? impl_->data.to_string() : std::string("uninitialized"));
  if (impl_->creator) os << ", creator=" << impl_->creator->name();
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Variable& v) { return os << v.to_string(); }

Parameter::Parameter(Array data) : Variable(std::move(data), true) { impl_->device = impl_->data.device(); }

Parameter::Parameter(std::shared_ptr<Initializer> initializer, std::optional<Shape> shape, Device device) {
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
  im.data = std::move(a);
  im.grad.reset();
}

void Parameter::to_device(Device device) {
  detail::VariableImpl& im = impl();
  im.device = device;
  if (im.data.defined()) im.data = im.data.to_device(device);
  if (im.grad) im.grad = Variable(im.grad->data.to_device(device)).impl_ptr();
}

Dtype Parameter::dtype() const {
  const detail::VariableImpl& im = impl();
  if (im.data.defined()) return im.data.dtype();
  if (im.dtype) return *im.dtype;
  return im.initializer ? im.initializer->dtype() : Dtype::kFloat32;
}

void Parameter::to_dtype(Dtype dtype) {
  detail::VariableImpl& im = impl();
  KUSARI_CHECK(is_floating(dtype), DtypeError, "Parameter::to_dtype: parameter '", im.name,
               "' can only be converted to a floating dtype (float16, bfloat16, float32 or float64), got ",
               dtype_name(dtype));
  im.dtype = dtype;
  if (im.data.defined() && im.data.dtype() != dtype) im.data = im.data.astype(dtype);
  if (im.grad && im.grad->data.defined() && im.grad->data.dtype() != dtype) {
    im.grad = Variable(im.grad->data.astype(dtype)).impl_ptr();
  }
}

}  // namespace kusari
