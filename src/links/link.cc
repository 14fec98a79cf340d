#include "kusari/links/link.h"

#include <algorithm>

#include "kusari/core/routines.h"

namespace kusari {

Variable Link::forward(const Variable&) {
  KUSARI_THROW(NotImplementedError, type_name(), " (link '", name_,
               "') does not define forward(const Variable&); call its own forward method instead");
}

Variable Link::forward_batch(const std::vector<Variable>& batch) {
  KUSARI_CHECK(batch.size() == 1, ValueError, type_name(), "::forward_batch: got a batch of ",
               batch.size(),
               " arrays, but the default forward_batch passes exactly one to forward(); override "
               "forward_batch "
               "(e.g. use links::Classifier for (x, t) batches)");
  return forward(batch[0]);
}

Parameter Link::add_param(const std::string& name, Parameter param) {
  KUSARI_CHECK(!name.empty() && name.find('/') == std::string::npos, ValueError, type_name(),
               "::add_param: invalid parameter name '", name, "' (non-empty, without '/')");
  param.impl().name = name;
  if (!param.is_initialized()) param.impl().device = device_;
  for (auto& [n, p] : params_) {
    if (n == name) {
      p = param;
      return param;
    }
  }
  params_.emplace_back(name, param);
  return param;
}

void Link::add_persistent(const std::string& name, Array value) {
  for (auto& [n, a] : persistents_) {
    if (n == name) {
      a = std::move(value);
      return;
    }
  }
  persistents_.emplace_back(name, std::move(value));
}

Array& Link::persistent(const std::string& name) {
  for (auto& [n, a] : persistents_) {
    if (n == name) return a;
  }
  KUSARI_THROW(ValueError, type_name(), ": no persistent value named '", name, "'");
}

const Array& Link::persistent(const std::string& name) const {
  return const_cast<Link*>(this)->persistent(name);
}

void Link::add_link_impl(const std::string& name, std::shared_ptr<Link> link) {
  KUSARI_CHECK(link, ValueError, type_name(), "::add_link: the link '", name, "' is null");
  KUSARI_CHECK(!name.empty() && name.find('/') == std::string::npos, ValueError, type_name(),
               "::add_link: invalid child name '", name, "' (non-empty, without '/')");
  for (const auto& [n, c] : children_) {
    KUSARI_CHECK(n != name, ValueError, type_name(), "::add_link: a child named '", name,
                 "' already exists");
  }
  link->name_ = name;
  children_.emplace_back(name, std::move(link));
}

void Link::collect_params(const std::string& prefix, bool include_uninit,
                          std::vector<std::pair<std::string, Parameter>>& out) const {
  for (const auto& [n, p] : params_) {
    if (include_uninit || p.is_initialized()) out.emplace_back(prefix + n, p);
  }
  for (const auto& [n, c] : children_) c->collect_params(prefix + n + "/", include_uninit, out);
}

std::vector<std::pair<std::string, Parameter>> Link::namedparams(bool include_uninit) const {
  std::vector<std::pair<std::string, Parameter>> out;
  collect_params("/", include_uninit, out);
  return out;
}

void Link::for_each_param(const std::function<void(const Parameter&)>& fn,
                          bool include_uninit) const {
  for (const auto& [n, p] : params_) {
    if (include_uninit || p.is_initialized()) fn(p);
  }
  for (const auto& [n, c] : children_) c->for_each_param(fn, include_uninit);
}

std::vector<Parameter> Link::params(bool include_uninit) const {
  std::vector<Parameter> out;
  for (auto& [n, p] : namedparams(include_uninit)) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Link*>> Link::namedlinks(bool skipself) {
  std::vector<std::pair<std::string, Link*>> out;
  if (!skipself) out.emplace_back("/", this);
  std::vector<std::pair<std::string, Link*>> stack;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it)
    stack.emplace_back("/" + it->first, it->second.get());
  while (!stack.empty()) {
    auto [path, link] = stack.back();
    stack.pop_back();
    out.emplace_back(path, link);
    for (auto it = link->children_.rbegin(); it != link->children_.rend(); ++it) {
      stack.emplace_back(path + "/" + it->first, it->second.get());
    }
  }
  return out;
}

std::vector<std::pair<std::string, Array*>> Link::namedpersistents() {
  std::vector<std::pair<std::string, Array*>> out;
  for (auto& [path, link] : namedlinks()) {
    const std::string prefix = path == "/" ? "/" : path + "/";
    for (auto& [n, a] : link->persistents_) out.emplace_back(prefix + n, &a);
  }
  return out;
}

int64_t Link::count_params() const {
  int64_t n = 0;
  for (const auto& [path, p] : namedparams(false)) n += p.size();
  return n;
}

void Link::cleargrads() {
  for (auto& [n, p] : namedparams()) p.cleargrad();
}

void Link::zerograds() {
  for (auto& [n, p] : namedparams(false)) p.zerograd();
}

void Link::copyparams(const Link& other, bool copy_persistent) {
  auto mine = namedparams();
  auto theirs = other.namedparams();
  KUSARI_CHECK(mine.size() == theirs.size(), ValueError, type_name(),
               "::copyparams: this link has ", mine.size(), " parameters but the source has ",
               theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    KUSARI_CHECK(mine[i].first == theirs[i].first, ValueError, type_name(),
                 "::copyparams: parameter ", i, " is '", mine[i].first, "' here but '",
                 theirs[i].first, "' in the source");
    Parameter& p = mine[i].second;
    const Parameter& q = theirs[i].second;
    if (!q.is_initialized()) continue;
    if (!p.is_initialized()) p.initialize(q.shape());
    Array dst = p.data();  // a handle to the same memory
    dst.assign(q.data().to_device(dst.device()).astype(dst.dtype()));
  }
  if (copy_persistent) {
    auto pm = namedpersistents();
    auto pt = const_cast<Link&>(other).namedpersistents();
    KUSARI_CHECK(pm.size() == pt.size(), ValueError, type_name(),
                 "::copyparams: different persistent values");
    for (size_t i = 0; i < pm.size(); ++i) {
      Array& dst = *pm[i].second;
      const Array& src = *pt[i].second;
      if (!src.defined()) continue;  // not sized in the source (like an uninitialised parameter)
      if (dst.defined() && src.defined() && dst.shape() == src.shape()) {
        dst.assign(src.to_device(dst.device()).astype(dst.dtype()));
      } else {
        dst = src.copy();
      }
    }
  }
}

void Link::addgrads(const Link& other) {
  auto mine = namedparams(false);
  auto theirs = other.namedparams(false);
  KUSARI_CHECK(mine.size() == theirs.size(), ValueError, type_name(),
               "::addgrads: different parameter sets");
  for (size_t i = 0; i < mine.size(); ++i) {
    Array g = theirs[i].second.grad();
    if (!g.defined()) continue;
    g = g.to_device(mine[i].second.data().device());
    Array cur = mine[i].second.grad();
    mine[i].second.set_grad(cur.defined() ? add(cur, g) : g.copy());
  }
}

void Link::to_device(Device device) {
  device_ = device;
  for (auto& [n, p] : params_) p.to_device(device);
  for (auto& [n, a] : persistents_) {
    if (a.defined()) a = a.to_device(device);
  }
  for (auto& [n, c] : children_) c->to_device(device);
}

void Link::to_memory_format(MemoryFormat format) {
  for (auto& [n, p] : params_) p.to_memory_format(format);
  for (auto& [n, c] : children_) c->to_memory_format(format);
}

std::string Link::describe() const {
  return name_.empty() ? std::string(type_name()) : std::string(type_name()) + " '" + name_ + "'";
}

void Link::check_link_dtype(Dtype dtype) const {
  KUSARI_CHECK(is_floating(dtype), DtypeError, describe(),
               "::to_dtype: a link's parameters need a floating dtype ",
               "(float16, bfloat16, float32 or float64), got ", dtype_name(dtype));
}

void Link::to_dtype(Dtype dtype) {
  check_link_dtype(dtype);
  convert_dtype(dtype);
}

void Link::convert_dtype(Dtype dtype) {
  for (auto& [n, p] : params_) p.to_dtype(dtype);
  for (auto& [n, a] : persistents_) {
    if (a.defined() && is_floating(a.dtype()) && a.dtype() != dtype) a = a.astype(dtype);
  }
  for (auto& [n, c] : children_) c->to_dtype(dtype);
}

void Link::disable_update() {
  for (auto& [n, p] : namedparams()) p.impl().update_enabled = false;
}

void Link::enable_update() {
  for (auto& [n, p] : namedparams()) p.impl().update_enabled = true;
}

void Link::serialize(Serializer& s) {
  for (auto& [n, p] : params_) {
    Array a = p.is_initialized() ? p.data() : Array();
    s(n, a);
    if (s.is_loading() && a.defined() && !p.is_initialized()) {
      // A lazily sized parameter takes its shape from the file.
      // It keeps the dtype it would have been created in (Note [Link dtype]).
      const bool planned = p.impl().dtype || p.initializer();
      p.impl().data = a.to_device(p.device()).astype(planned ? p.dtype() : a.dtype()).copy();
      p.impl().loaded_from = s.path() + n;
    }
  }
  for (auto& [n, a] : persistents_) {
    const bool was_defined = a.defined();
    s(n, a);
    // A persistent that was not sized yet (e.g. a lazy BatchNormalization's avg_mean) is loaded
    // on the CPU; it belongs on the link's device like the values that were sized.
    if (s.is_loading() && !was_defined && a.defined()) a = a.to_device(device_);
  }
  for (auto& [n, c] : children_) {
    auto child = s.child(n);
    c->serialize(*child);
  }
}

Sequential& Sequential::add(std::shared_ptr<Link> link) {
  steps_.emplace_back(static_cast<int>(size()), nullptr);
  append(std::move(link));
  return *this;
}

Sequential& Sequential::add(std::function<Variable(const Variable&)> fn) {
  KUSARI_CHECK(fn, ValueError, "Sequential::add: the function is empty");
  steps_.emplace_back(-1, std::move(fn));
  return *this;
}

Variable Sequential::forward(const Variable& x) {
  Variable h = x;
  for (auto& [index, fn] : steps_)
    h = index >= 0 ? (*this)[static_cast<size_t>(index)].forward(h) : fn(h);
  return h;
}

}  // namespace kusari
