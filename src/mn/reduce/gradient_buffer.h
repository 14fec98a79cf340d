// The flat reduction buffer that a model's gradients live in, for the communicators that reduce
// all gradients in one buffer ("flat", "dummy" and the NCCL kinds). See Note [Gradients in the
// reduction buffer]. Plain C++ (no MPI, CUDA or NCCL), built and tested on every machine.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kusari/autograd/variable.h"

namespace kusari::mn::detail {

/// The gradients to reduce, as GradientSet::select lists them.
using NamedParams = std::vector<std::pair<std::string, Parameter>>;

/// The one dtype of every parameter and gradient of `params` when they share a floating dtype and
/// all lie on `device`; nullopt otherwise (the gradients cannot live in one buffer of `device`).
std::optional<Dtype> common_gradient_dtype(const NamedParams& params, Device device);

/// One flat buffer holding the gradients of a list of parameters, each in a segment of its own,
/// with every parameter's gradient buffer (Parameter::set_grad_buffer) bound to its segment. See
/// Note [Gradients in the reduction buffer].
class GradientBuffer {
 public:
  GradientBuffer() = default;
  GradientBuffer(const GradientBuffer&) = delete;
  GradientBuffer& operator=(const GradientBuffer&) = delete;
  /// Unbinds the parameters (release()).
  ~GradientBuffer() { release(); }

  /// Lays out the gradients of `params` (in this order; their gradients of dtype `dtype` on
  /// `device`, as common_gradient_dtype found) in one flat buffer: each segment starts at a
  /// multiple of `align_bytes`, the gaps are zeros, and the whole is padded with zeros to a
  /// multiple of `multiple` elements. The buffer is kept while the layout (the parameters
  /// themselves, their shapes, the dtype, device, alignment and multiple) stays the same, and
  /// allocated anew (zeroed; parameters of the old layout that are not in the new one are
  /// unbound) when it changes. Every parameter's gradient buffer is then its segment. Returns the
  /// indices of the parameters whose gradient is not their segment yet: the caller copies each
  /// of those gradients into view(i) and makes view(i) the gradient (adopt() does both on the
  /// host's side).
  std::vector<size_t> bind(const NamedParams& params, Dtype dtype, Device device,
                           int64_t align_bytes, int64_t multiple);
  /// True when bind() with these arguments would keep the current buffer (its size is then
  /// flat().size(), with no planning).
  bool matches(const NamedParams& params, Dtype dtype, Device device, int64_t align_bytes,
               int64_t multiple) const;
  /// Copies the gradient of params[i] into view(i) and makes view(i) its gradient.
  void adopt(const NamedParams& params, size_t i) const;
  /// Makes view(i) the gradient of params[i] (after the caller copied the gradient into it).
  /// The gradient Variable of each segment is made once per layout, so this is a pointer
  /// assignment (it runs for every parameter each step).
  void use_segment(const NamedParams& params, size_t i) const;

  /// True when the gradient of every parameter of `params` is still the Variable of its segment
  /// that the last bind() or use_segment() handed it, for the parameters of the current layout in
  /// its order: the layout holds and nothing needs copying. This is the check of every step, so
  /// it reads one pointer of each parameter and nothing of its arrays (Note [Gradients in the
  /// reduction buffer], "Every step").
  bool in_place(const NamedParams& params) const;
  /// The dtype and device of the buffer (while bound()).
  Dtype dtype() const { return dtype_; }
  Device device() const { return device_; }

  /// The whole buffer (undefined before the first bind).
  const Array& flat() const { return flat_; }
  /// The segment of the i-th parameter, shaped like it.
  const Array& view(size_t i) const { return views_[i]; }
  /// Where the i-th segment starts in flat(), in elements.
  int64_t offset(size_t i) const { return offsets_[i]; }
  /// Layouts built so far (diagnostics and tests).
  int64_t layout_builds() const { return layout_builds_; }
  /// True while a buffer is held.
  bool bound() const { return flat_.defined(); }
  /// Unbinds the parameters still bound to this buffer and drops it; their gradients stay (as
  /// views of the old buffer, which they keep alive). Never throws.
  void release() noexcept;

  /// The elements of the layout of `sizes` (segments aligned to `align` elements, then padded to
  /// a multiple of `multiple`); `offsets` receives where each segment starts.
  static int64_t plan(const std::vector<int64_t>& sizes, int64_t align, int64_t multiple,
                      std::vector<int64_t>* offsets);

 private:
  /// Unbinds the parameters of the current layout whose gradient buffer is still in flat_,
  /// except those in `keep`.
  void unbind_all_but(const std::vector<const kusari::detail::VariableImpl*>& keep) noexcept;

  Array flat_;
  std::vector<Array> views_;
  /// One gradient Variable per segment (wrapping views_[i]), handed to the parameters.
  std::vector<std::shared_ptr<kusari::detail::VariableImpl>> view_vars_;
  std::vector<int64_t> offsets_;
  /// The parameters of the layout (weak: the communicator must not keep a model alive) and their
  /// shapes; a parameter that died, or a new one at the same address, is a different layout.
  std::vector<std::weak_ptr<kusari::detail::VariableImpl>> ids_;
  std::vector<Shape> shapes_;
  Dtype dtype_ = Dtype::kFloat32;
  Device device_;
  int64_t align_bytes_ = 0;
  int64_t multiple_ = 0;
  int64_t layout_builds_ = 0;
};

}  // namespace kusari::mn::detail
