// Links: building blocks of models that own parameters (Chainer's Link, Chain, ChainList).
//
// A model is a Chain whose children are registered with add_link; forward is ordinary code:
//
//   struct MLP : kusari::Chain {
//     std::shared_ptr<kusari::links::Linear> l1, l2;
//     MLP(int64_t units, int64_t out) {
//       l1 = add_link("l1", std::make_shared<kusari::links::Linear>(units));  // in_size inferred
//       l2 = add_link("l2", std::make_shared<kusari::links::Linear>(out));
//     }
//     kusari::Variable forward(const kusari::Variable& x) override {
//       return (*l2)(F::relu((*l1)(x)));
//     }
//   };
//
// Note [Link dtype]
// A model is put in a dtype the way it is put on a device: model->to_dtype(kusari::bfloat16)
// converts every parameter that has data (and its gradient) and records the dtype in the
// parameters that are sized later, so Linear(out_size) without an in_size creates W in bfloat16
// at its first forward (random initializers draw a 16-bit array as the float32 one, rounded, so
// a seed gives the float32 model's weights rounded whether the conversion came before or after). Floating-point persistent values follow the parameters;
// others (counters such as BatchNormalization's N) are left alone. A link may keep some of its
// values in a higher precision: BatchNormalization keeps its parameters and running statistics
// in float32 when asked for float16 or bfloat16 (Chainer's mixed16), and normalises a 16-bit
// input with them cast to its dtype. Only floating dtypes are accepted (DtypeError naming the
// link). Convert the model before its first update: an optimizer with use_fp32_update() keeps
// float32 master copies of 16-bit parameters from their first update on (Note [Float32 master
// weights]), and its other state follows the parameter it is made for.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kusari/autograd/variable.h"
#include "kusari/serializers/serializer.h"

namespace kusari {

/// A piece of a model: named parameters, named persistent arrays (e.g. running statistics) and
/// named child links. Parameter paths look like "/predictor/l1/W", as in Chainer.
class Link : public Serializable {
 public:
  Link() = default;
  ~Link() override = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // --- computation ---------------------------------------------------------------------------
  /// The link's computation on one input. Links with another signature leave it unimplemented.
  virtual Variable forward(const Variable& x);
  /// Called by the updater and evaluators with a converted batch (e.g. {x, t}); returns the
  /// loss. The default passes a one-element batch to forward().
  virtual Variable forward_batch(const std::vector<Variable>& batch);
  Variable operator()(const Variable& x) { return forward(x); }

  // --- registration ----------------------------------------------------------------------------
  /// Registers a parameter (or replaces one of the same name) and returns its handle.
  Parameter add_param(const std::string& name, Parameter param);
  /// Registers a persistent array: saved and moved with the link but not trained.
  void add_persistent(const std::string& name, Array value);
  /// The persistent array `name` (a reference into the link: assign to update it).
  Array& persistent(const std::string& name);
  const Array& persistent(const std::string& name) const;

  // --- traversal -------------------------------------------------------------------------------
  /// (path, parameter) for this link and all descendants, e.g. ("/l1/W", W).
  std::vector<std::pair<std::string, Parameter>> namedparams(bool include_uninit = true) const;
  std::vector<Parameter> params(bool include_uninit = true) const;
  /// Calls `fn` on each parameter of this link and its descendants, in namedparams() order,
  /// without making their paths (for code that runs every step).
  void for_each_param(const std::function<void(const Parameter&)>& fn, bool include_uninit = true) const;
  /// (path, link) for this link ("/") and all descendants.
  std::vector<std::pair<std::string, Link*>> namedlinks(bool skipself = false);
  /// (path, persistent) for this link and all descendants.
  std::vector<std::pair<std::string, Array*>> namedpersistents();
  /// Direct children in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Link>>>& children() const { return children_; }
  /// The name this link was registered under by its parent ("" for a root).
  const std::string& name() const { return name_; }
  /// Total number of parameter elements (initialised parameters only).
  int64_t count_params() const;

  // --- state ---------------------------------------------------------------------------------
  /// Drops every parameter's gradient.
  void cleargrads();
  /// Sets every parameter's gradient to zeros.
  void zerograds();
  /// Copies parameter (and persistent) values from a link of the same structure.
  void copyparams(const Link& other, bool copy_persistent = true);
  /// Adds other's gradients to this link's gradients.
  void addgrads(const Link& other);
  /// Moves parameters, gradients and persistents (and the children's) to `device`.
  virtual void to_device(Device device);
  Device device() const { return device_; }
  /// Converts the parameters and floating-point persistents (and the children's) to the
  /// floating dtype `dtype`; parameters sized later are created in it. See Note [Link dtype].
  virtual void to_dtype(Dtype dtype);
  /// Lays out the 4-d parameters (convolution filters; the children's too) in `format`, e.g.
  /// MemoryFormat::kChannelsLast for NHWC training on GPUs; other parameters and persistents stay
  /// as they are. Parameters sized later are created in it. Feed channels-last inputs
  /// (x.to_memory_format(...)) to keep the activations channels-last. See docs/cuda.md.
  virtual void to_memory_format(MemoryFormat format);
  /// Excludes this link's parameters (and descendants') from optimizer updates, or re-includes them.
  void disable_update();
  void enable_update();

  /// Saves or loads parameters, persistents and children (Chainer's key layout).
  void serialize(Serializer& serializer) override;

 protected:
  /// Registers a child link (a Chain's building block) and returns it, typed.
  template <typename L>
  std::shared_ptr<L> add_link(const std::string& name, std::shared_ptr<L> link) {
    add_link_impl(name, std::static_pointer_cast<Link>(link));
    return link;
  }
  void add_link_impl(const std::string& name, std::shared_ptr<Link> link);
  /// The class name used in error messages ("Linear", "MLP", ...).
  virtual const char* type_name() const { return "Link"; }
  /// "Linear 'l1'" (the type and, below the root, the name), for error messages.
  std::string describe() const;
  /// Throws DtypeError naming the link unless `dtype` is floating (the check of to_dtype()).
  void check_link_dtype(Dtype dtype) const;
  /// to_dtype() for this link's own parameters and persistents, and the children's to_dtype().
  void convert_dtype(Dtype dtype);

 private:
  void collect_params(const std::string& prefix, bool include_uninit,
                      std::vector<std::pair<std::string, Parameter>>& out) const;

  std::string name_;
  Device device_ = Device::cpu();
  std::vector<std::pair<std::string, Parameter>> params_;
  std::vector<std::pair<std::string, Array>> persistents_;
  std::vector<std::pair<std::string, std::shared_ptr<Link>>> children_;
};

/// A link whose children are registered by name (Chainer's Chain).
class Chain : public Link {
 public:
  using Link::add_link;

 protected:
  const char* type_name() const override { return "Chain"; }
};

/// A link with numbered children "0", "1", ... (Chainer's ChainList).
class ChainList : public Link {
 public:
  /// Appends a child and returns it, typed.
  template <typename L>
  std::shared_ptr<L> append(std::shared_ptr<L> link) {
    add_link_impl(std::to_string(children().size()), std::static_pointer_cast<Link>(link));
    return link;
  }
  size_t size() const { return children().size(); }
  Link& operator[](size_t i) const { return *children().at(i).second; }

 protected:
  const char* type_name() const override { return "ChainList"; }
};

/// Applies its links and plain functions in order (Chainer's Sequential).
class Sequential : public ChainList {
 public:
  Sequential() = default;
  /// Appends a link (its parameters become the sequence's).
  Sequential& add(std::shared_ptr<Link> link);
  /// Appends a function without parameters, e.g. F::relu.
  Sequential& add(std::function<Variable(const Variable&)> fn);
  Variable forward(const Variable& x) override;

 protected:
  const char* type_name() const override { return "Sequential"; }

 private:
  // Each step is either a child index or a function.
  std::vector<std::pair<int, std::function<Variable(const Variable&)>>> steps_;
};

}  // namespace kusari
