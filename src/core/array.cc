#include "kusari/core/array.h"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "kernels/creation.h"
#include "kusari/core/random.h"
#include "kusari/core/routines.h"

namespace kusari {

namespace {
constexpr size_t kSmallHostArrayBytes = 512;
}  // namespace

Array::Array(std::shared_ptr<void> data, size_t alloc_nbytes, Device device, Dtype dtype, Shape shape, Strides strides,
             int64_t offset)
    : data_(std::move(data)),
      alloc_nbytes_(alloc_nbytes),
      shape_(shape),
      strides_(strides),
      offset_(offset),
      device_(device),
      dtype_(dtype) {}

// --- creation ---------------------------------------------------------------------------------

// Note [Memory formats]
// An array may carry channels-last strides: a 4-d (N, C, H, W) array whose memory is NHWC
// (strides (H*W*C, 1, W*C, C)), as in PyTorch. Shapes stay NCHW everywhere, so every shape-based
// operation (reshape, transpose, indexing, reductions) keeps its meaning; only the layout differs.
//   - memory_format() says kChannelsLast for a 4-d array that is dense in NHWC order and not also
//     C-contiguous: when both hold (length-1 axes make e.g. (N, C, 1, 1) both), contiguous wins.
//   - Allocation keeps the layout: empty_like / zeros_like / ones_like / full_like and astype
//     follow memory_format(); unary elementwise outputs follow the input; binary and where
//     outputs are channels-last when every operand of the output's full shape is channels-last
//     (broadcast operands such as a (1, C, 1, 1) bias do not vote), else contiguous
//     (routines::output_format, PyTorch's suggest_memory_format rule). Gradients of such ops
//     are computed by the same ops, so they come out channels-last too.
//   - A convolution's output is channels-last when x or the filter is (PyTorch's rule: a
//     channels-last network whose first input has one channel, which is both layouts at once,
//     still runs channels-last from its second convolution on); its gradient of x takes gy's
//     layout, the gradient of a filter is channels-last when x or gy is. Pooling outputs (and
//     their gradients of x) take x's layout. cuDNN is told the layout (NHWC descriptors); on the
//     CPU oneDNN reads and writes NHWC memory as it is (Note [oneDNN layouts]) and pooling has
//     NHWC loops of its own (Note [CPU pooling]; on the GPU Note [GPU pooling layouts]), so no
//     layout is copied; only the im2col convolution (float64, or without oneDNN) computes in NCHW
//     and copies into the channels-last output.
//   - The strided loops order the axes by the output's strides before merging them
//     (Note [Strided loops], Note [Strided indexing on the GPU]), so an elementwise op on
//     channels-last arrays is one contiguous pass.
//   - Link::to_memory_format moves 4-d parameters (convolution filters) to channels-last;
//     update_parameter updates a channels-last parameter in place through its dense NHWC view.

const char* memory_format_name(MemoryFormat format) {
  return format == MemoryFormat::kChannelsLast ? "channels_last" : "contiguous";
}

Strides memory_format_strides(const Shape& shape, MemoryFormat format) {
  if (format == MemoryFormat::kContiguous) return contiguous_strides(shape);
  KUSARI_CHECK(shape.size() == 4, ShapeError, "channels_last: needs a 4-d (N, C, H, W) shape, got ", shape);
  const int64_t c = shape[1], h = shape[2], w = shape[3];
  return Strides{h * w * c, 1, w * c, c};
}

Array Array::empty(const Shape& shape, Dtype dtype, Device device, MemoryFormat format) {
  int64_t elements = 1;
  bool overflow = false, has_zero = false;
  for (int64_t d : shape) {
    KUSARI_CHECK(d >= 0, ShapeError, "Array::empty: negative dimension in shape ", shape);
    has_zero = has_zero || d == 0;
    overflow = overflow || __builtin_mul_overflow(elements, d, &elements);
  }
  KUSARI_CHECK(!overflow || has_zero, ShapeError, "Array::empty: shape ", shape,
               " has more elements than a 64-bit count holds");
  if (format != MemoryFormat::kContiguous) {
    Array a = empty(shape, dtype, device);
    a.strides_ = memory_format_strides(shape, format);
    return a;
  }
  const size_t nbytes = static_cast<size_t>(shape.numel()) * kusari::itemsize(dtype);
  if (device.is_cpu() && nbytes <= kSmallHostArrayBytes) {
    // Note [Small host arrays]
    // Small CPU arrays (scalars, per-op temporaries) dominate the per-op overhead of tiny
    // models; they get their control block and data in one allocation.
    struct alignas(16) Block {
      std::byte bytes[16];
    };
    auto blocks = std::make_shared<Block[]>(std::max<size_t>((nbytes + 15) / 16, 1));
    std::shared_ptr<void> data(blocks, blocks.get());
    return Array(std::move(data), nbytes, device, dtype, shape, contiguous_strides(shape), 0);
  }
  Backend& backend = device.backend();
  void* p = backend.allocate(device.index(), nbytes);
  const int index = device.index();
  std::shared_ptr<void> data(p, [&backend, index, nbytes](void* q) { backend.deallocate(index, q, nbytes); });
  return Array(std::move(data), nbytes, device, dtype, shape, contiguous_strides(shape), 0);
}

Array Array::zeros(const Shape& shape, Dtype dtype, Device device) { return full(shape, 0, dtype, device); }

Array Array::ones(const Shape& shape, Dtype dtype, Device device) { return full(shape, 1, dtype, device); }

Array Array::full(const Shape& shape, Scalar value, Dtype dtype, Device device) {
  Array a = empty(shape, dtype, device);
  a.fill(value);
  return a;
}

Array Array::empty_like(const Array& like) {
  return empty(like.shape(), like.dtype(), like.device(), like.memory_format());
}
Array Array::zeros_like(const Array& like) { return full_like(like, 0); }
Array Array::ones_like(const Array& like) { return full_like(like, 1); }
Array Array::full_like(const Array& like, Scalar value) {
  Array a = empty_like(like);
  a.fill(value);
  return a;
}

Array Array::scalar(Scalar value, Dtype dtype, Device device) { return full({}, value, dtype, device); }

Array Array::arange(double start, double stop, double step, Dtype dtype, Device device) {
  KUSARI_CHECK(step != 0.0, ValueError, "Array::arange: step must not be zero");
  int64_t n = static_cast<int64_t>(std::ceil((stop - start) / step));
  if (n < 0) n = 0;
  Array a = empty({n}, dtype, device);
  if (n > 0) kernels::arange(device, a, start, step);
  return a;
}

Array Array::arange(int64_t stop, Dtype dtype, Device device) {
  return arange(0.0, static_cast<double>(stop), 1.0, dtype, device);
}

Array Array::from_buffer(const void* src, const Shape& shape, Dtype dtype, Device device) {
  Array a = empty(shape, dtype, device);
  if (a.nbytes() > 0) device.backend().copy_from_host(device.index(), a.raw_data(), src, a.nbytes());
  return a;
}

Array Array::from_blob(std::shared_ptr<void> owner, void* data, const Shape& shape, Dtype dtype) {
  const size_t nbytes = static_cast<size_t>(shape.numel()) * kusari::itemsize(dtype);
  // Alias `owner`'s control block so the view keeps it alive while pointing at `data`.
  std::shared_ptr<void> aliased(std::move(owner), data);
  return Array(std::move(aliased), nbytes, Device::cpu(), dtype, shape, contiguous_strides(shape), 0);
}

Array Array::from_blob(std::shared_ptr<void> owner, void* data, const Shape& shape, const Strides& strides,
                       Dtype dtype, Device device) {
  KUSARI_CHECK(strides.size() == shape.size(), ShapeError, "Array::from_blob: ", strides.size(),
               " strides for the shape ", shape, "; expected one per axis");
  // The elements reach from the lowest to the highest offset the strides give; the allocation
  // starts at the lowest, and the view's offset is the first element's distance from it.
  int64_t low = 0, high = 0;
  if (shape.numel() > 0) {
    for (int i = 0; i < shape.size(); ++i) {
      const int64_t reach = (shape[i] - 1) * strides[i];
      (reach < 0 ? low : high) += reach;
    }
  }
  const size_t item = kusari::itemsize(dtype);
  char* base = static_cast<char*>(data) + low * static_cast<int64_t>(item);
  const size_t nbytes = static_cast<size_t>(high - low + 1) * item;
  std::shared_ptr<void> aliased(std::move(owner), base);
  return Array(std::move(aliased), nbytes, device, dtype, shape, strides, -low);
}

Array Array::from(std::initializer_list<double> values, std::optional<Shape> shape, Dtype dtype, Device device) {
  std::vector<double> v(values);
  Array a = from_vector(v, shape, Device::cpu());
  return a.astype(dtype).to_device(device);
}

Array Array::uniform(const Shape& shape, double low, double high, Dtype dtype, Device device, Generator* gen) {
  Array a = empty(shape, dtype, device);
  if (a.size() > 0) kernels::random_uniform(device, a, low, high, gen ? *gen : default_generator());
  return a;
}

Array Array::normal(const Shape& shape, double mean, double stddev, Dtype dtype, Device device, Generator* gen) {
  Array a = empty(shape, dtype, device);
  if (a.size() > 0) kernels::random_normal(device, a, mean, stddev, gen ? *gen : default_generator());
  return a;
}

// --- properties ---------------------------------------------------------------------------------

int64_t Array::dim(int axis) const { return shape_[normalize_axis(axis, ndim(), "Array::dim")]; }

bool Array::is_contiguous() const {
  int64_t expected = 1;
  for (int i = ndim() - 1; i >= 0; --i) {
    if (shape_[i] == 1) continue;
    if (shape_[i] == 0) return true;
    if (strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

bool Array::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::kContiguous) return is_contiguous();
  if (ndim() != 4) return false;
  // Dense in the axis order C, W, H, N (innermost first), skipping length-1 axes.
  int64_t expected = 1;
  for (int d : {1, 3, 2, 0}) {
    if (shape_[d] == 1) continue;
    if (shape_[d] == 0) return true;
    if (strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

MemoryFormat Array::memory_format() const {
  if (ndim() != 4 || is_contiguous()) return MemoryFormat::kContiguous;
  return is_contiguous(MemoryFormat::kChannelsLast) ? MemoryFormat::kChannelsLast : MemoryFormat::kContiguous;
}

void Array::check_dtype_for_access(Dtype requested) const {
  KUSARI_CHECK(requested == dtype_, DtypeError, "Array::data<", dtype_name(requested), ">: the array's dtype is ",
               dtype_name(dtype_));
}

// --- views --------------------------------------------------------------------------------------

Array Array::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  KUSARI_ASSERT(shape.size() == strides.size());
  return Array(data_, alloc_nbytes_, device_, dtype_, shape, strides, offset);
}

namespace {

// Strides for viewing an array (shape, strides) as new_shape without copying, if possible
// (the same element order in C order). Returns false when a copy is needed.
bool reshape_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides& out) {
  // Drop length-1 axes of the old shape.
  Shape os, ost;
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] != 1) {
      os.push_back(shape[i]);
      ost.push_back(strides[i]);
    }
  }
  out.resize(new_shape.size());
  int oi = 0, ni = 0;
  const int on = os.size(), nn = new_shape.size();
  while (ni < nn) {
    if (new_shape[ni] == 1) {
      out[ni] = 1;
      ++ni;
      continue;
    }
    if (oi >= on) return false;
    // Group old axes [oi, oj) and new axes [ni, nj) with the same product.
    int oj = oi + 1, nj = ni + 1;
    int64_t op = os[oi], np = new_shape[ni];
    while (op != np) {
      if (op < np) {
        if (oj >= on) return false;
        op *= os[oj++];
      } else {
        if (nj >= nn) return false;
        np *= new_shape[nj++];
      }
    }
    // The old group must be contiguous within itself.
    for (int k = oi; k + 1 < oj; ++k) {
      if (ost[k] != ost[k + 1] * os[k + 1]) return false;
    }
    // New strides: C order within the group, ending with the group's innermost stride.
    int64_t st = ost[oj - 1];
    for (int k = nj - 1; k >= ni; --k) {
      out[k] = st;
      st *= new_shape[k];
    }
    oi = oj;
    ni = nj;
  }
  return oi == on;
}

}  // namespace

Array Array::reshape(const Shape& shape_in) const {
  Shape shape = shape_in;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KUSARI_CHECK(infer < 0, ShapeError, "reshape: only one dimension can be -1, got ", shape_in);
      infer = i;
    } else {
      KUSARI_CHECK(shape[i] >= 0, ShapeError, "reshape: invalid dimension ", shape[i], " in ", shape_in);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    KUSARI_CHECK(known != 0 && size() % known == 0, ShapeError, "reshape: cannot reshape array of shape ", shape_,
                 " (", size(), " elements) into ", shape_in);
    shape[infer] = size() / known;
  }
  KUSARI_CHECK(shape.numel() == size(), ShapeError, "reshape: cannot reshape array of shape ", shape_, " (", size(),
               " elements) into shape ", shape_in, " (", shape.numel(), " elements)");
  if (is_contiguous()) return as_strided(shape, contiguous_strides(shape), offset_);
  Strides st;
  if (size() > 0 && reshape_strides(shape_, strides_, shape, st)) return as_strided(shape, st, offset_);
  return copy().as_strided(shape, contiguous_strides(shape), 0);
}

Array Array::transpose(const Axes& axes) const {
  const int n = ndim();
  Axes perm;
  if (axes.empty()) {
    for (int i = n - 1; i >= 0; --i) perm.push_back(i);
  } else {
    KUSARI_CHECK(axes.size() == n, ValueError, "transpose: axes ", axes, " do not match an array of ", n,
                 " dimensions");
    bool seen[kMaxNdim] = {};
    for (int64_t a : axes) {
      int ax = normalize_axis(a, n, "transpose");
      KUSARI_CHECK(!seen[ax], ValueError, "transpose: axis ", ax, " repeated in ", axes);
      seen[ax] = true;
      perm.push_back(ax);
    }
  }
  Shape s;
  Strides st;
  for (int i = 0; i < n; ++i) {
    s.push_back(shape_[perm[i]]);
    st.push_back(strides_[perm[i]]);
  }
  return as_strided(s, st, offset_);
}

Array Array::swapaxes(int a, int b) const {
  a = normalize_axis(a, ndim(), "swapaxes");
  b = normalize_axis(b, ndim(), "swapaxes");
  Axes perm;
  for (int i = 0; i < ndim(); ++i) perm.push_back(i);
  std::swap(perm[a], perm[b]);
  return transpose(perm);
}

Array Array::broadcast_to(const Shape& shape) const {
  const int n = shape.size();
  KUSARI_CHECK(n >= ndim(), ShapeError, "broadcast_to: cannot broadcast shape ", shape_, " to ", shape,
               " (fewer dimensions)");
  Strides st;
  st.resize(n);
  for (int i = 0; i < n; ++i) {
    int j = i - (n - ndim());
    if (j < 0) {
      st[i] = 0;
      continue;
    }
    KUSARI_CHECK(shape_[j] == shape[i] || shape_[j] == 1, ShapeError, "broadcast_to: cannot broadcast shape ", shape_,
                 " to ", shape, " (axis ", i, ": ", shape_[j], " vs ", shape[i], ")");
    st[i] = (shape_[j] == shape[i]) ? strides_[j] : 0;
  }
  return as_strided(shape, st, offset_);
}

Array Array::squeeze(const Axes& axes) const {
  bool drop[kMaxNdim] = {};
  if (axes.empty()) {
    for (int i = 0; i < ndim(); ++i) drop[i] = shape_[i] == 1;
  } else {
    for (int64_t a : axes) {
      int ax = normalize_axis(a, ndim(), "squeeze");
      KUSARI_CHECK(shape_[ax] == 1, ShapeError, "squeeze: cannot remove axis ", ax, " of length ", shape_[ax],
                   " from shape ", shape_);
      drop[ax] = true;
    }
  }
  Shape s;
  Strides st;
  for (int i = 0; i < ndim(); ++i) {
    if (!drop[i]) {
      s.push_back(shape_[i]);
      st.push_back(strides_[i]);
    }
  }
  return as_strided(s, st, offset_);
}

Array Array::expand_dims(int axis) const {
  int ax = normalize_axis(axis, ndim() + 1, "expand_dims");
  Shape s = shape_;
  Strides st = strides_;
  s.insert(ax, 1);
  st.insert(ax, 1);
  return as_strided(s, st, offset_);
}

Array Array::at(const std::vector<Index>& indices) const {
  // Count the axes the indices consume, to expand an ellipsis.
  int consumed = 0, ellipses = 0;
  for (const Index& ix : indices) {
    if (std::holds_alternative<int64_t>(ix) || std::holds_alternative<Slice>(ix)) ++consumed;
    if (std::holds_alternative<Ellipsis>(ix)) ++ellipses;
  }
  KUSARI_CHECK(ellipses <= 1, IndexError, "get_item: an index can only have a single ellipsis");
  KUSARI_CHECK(consumed <= ndim(), IndexError, "get_item: too many indices (", consumed, ") for an array of ", ndim(),
               " dimensions (shape ", shape_, ")");
  Shape s;
  Strides st;
  int64_t off = offset_;
  int axis = 0;
  auto take_slice = [&](const Slice& sl, int ax) {
    const int64_t len = shape_[ax];
    KUSARI_CHECK(sl.step != 0, ValueError, "get_item: slice step cannot be zero");
    int64_t start, stop;
    if (sl.step > 0) {
      start = sl.start ? *sl.start : 0;
      stop = sl.stop ? *sl.stop : len;
      if (start < 0) start += len;
      if (stop < 0) stop += len;
      start = std::clamp<int64_t>(start, 0, len);
      stop = std::clamp<int64_t>(stop, 0, len);
    } else {
      start = sl.start ? *sl.start : len - 1;
      stop = sl.stop ? *sl.stop : -len - 1;
      if (start < 0) start += len;
      if (sl.stop && stop < 0) stop += len;
      if (!sl.stop) stop = -1;
      start = std::clamp<int64_t>(start, -1, len - 1);
      stop = std::clamp<int64_t>(stop, -1, len - 1);
    }
    int64_t n = 0;
    if (sl.step > 0 && stop > start) n = (stop - start + sl.step - 1) / sl.step;
    if (sl.step < 0 && start > stop) n = (start - stop + (-sl.step) - 1) / (-sl.step);
    if (n > 0) off += start * strides_[ax];
    s.push_back(n);
    st.push_back(strides_[ax] * sl.step);
  };
  for (const Index& ix : indices) {
    if (const int64_t* i = std::get_if<int64_t>(&ix)) {
      const int64_t len = shape_[axis];
      KUSARI_CHECK(*i >= -len && *i < len, IndexError, "get_item: index ", *i, " is out of bounds for axis ", axis,
                   " with size ", len);
      off += (*i < 0 ? *i + len : *i) * strides_[axis];
      ++axis;
    } else if (const Slice* sl = std::get_if<Slice>(&ix)) {
      take_slice(*sl, axis);
      ++axis;
    } else if (std::holds_alternative<NewAxis>(ix)) {
      s.push_back(1);
      st.push_back(0);
    } else {  // Ellipsis
      int full = ndim() - consumed;
      for (int k = 0; k < full; ++k, ++axis) {
        s.push_back(shape_[axis]);
        st.push_back(strides_[axis]);
      }
    }
  }
  for (; axis < ndim(); ++axis) {
    s.push_back(shape_[axis]);
    st.push_back(strides_[axis]);
  }
  return as_strided(s, st, off);
}

// --- copies ------------------------------------------------------------------------------------

Array Array::copy() const {
  Array out = empty(shape_, dtype_, device_);
  if (size() > 0) kernels::copy(device_, *this, out);
  return out;
}

Array Array::contiguous() const { return is_contiguous() ? *this : copy(); }

Array Array::to_memory_format(MemoryFormat format) const {
  if (format == MemoryFormat::kContiguous) return contiguous();
  KUSARI_CHECK(ndim() == 4, ShapeError, "Array::to_memory_format(", memory_format_name(format),
               "): needs a 4-d (N, C, H, W) array, got shape ", shape_);
  if (is_contiguous(format)) return *this;
  Array out = empty(shape_, dtype_, device_, format);
  if (size() > 0) kernels::copy(device_, *this, out);
  return out;
}

Array Array::astype(Dtype dtype, bool copy_always) const {
  if (dtype == dtype_ && !copy_always) return *this;
  Array out = empty(shape_, dtype, device_, memory_format());
  if (size() > 0) kernels::copy(device_, *this, out);
  return out;
}

Array Array::to_device(Device device) const {
  if (device == device_) return *this;
  // A channels-last array is dense, so its bytes travel as they are (Note [Memory formats]).
  const MemoryFormat format = memory_format();
  Array src = format == MemoryFormat::kChannelsLast ? *this : contiguous();
  Array out = empty(shape_, dtype_, device, format);
  const size_t n = static_cast<size_t>(nbytes());
  if (n == 0) return out;
  if (device_.is_cpu()) {
    device.backend().copy_from_host(device.index(), out.raw_data(), src.raw_data(), n);
  } else if (device.is_cpu()) {
    device_.backend().copy_to_host(device_.index(), out.raw_data(), src.raw_data(), n);
  } else {
    KUSARI_CHECK(device.type() == device_.type(), DeviceError, "to_device: cannot copy from ", device_, " to ",
                 device);
    device.backend().copy_between_devices(device.index(), out.raw_data(), device_.index(), src.raw_data(), n);
  }
  return out;
}

void Array::assign(const Array& src) {
  KUSARI_CHECK(src.device() == device_, DeviceError, "Array::assign: source on ", src.device(),
               " but destination on ", device_, " (move it with to_device first)");
  Array b = src.broadcast_to(shape_);
  if (size() > 0) kernels::copy(device_, b, *this);
}

void Array::fill(Scalar value) {
  if (size() > 0) kernels::fill(device_, *this, value);
}

Array Array::host_contiguous(Dtype dtype) const {
  Array h = to_device(Device::cpu()).astype(dtype);
  return h.contiguous();
}

// --- printing ---------------------------------------------------------------------------------

namespace {

void format_value(std::ostream& os, double v, Dtype dtype) {
  if (dtype == Dtype::kBool) {
    os << (v != 0 ? "True" : "False");
  } else if (is_integral(dtype)) {
    os << static_cast<int64_t>(v);
  } else if (std::isnan(v)) {
    os << "nan";
  } else if (std::isinf(v)) {
    os << (v > 0 ? "inf" : "-inf");
  } else {
    std::ostringstream tmp;
    tmp << std::setprecision(dtype == Dtype::kFloat64 ? 8 : 6) << v;
    std::string s = tmp.str();
    if (s.find_first_of(".e") == std::string::npos) s += ".";
    os << s;
  }
}

void format_rec(std::ostream& os, const std::vector<double>& v, const Shape& shape, const Strides& st, int axis,
                int64_t off, Dtype dtype, bool summarize, int indent) {
  if (axis == shape.size()) {
    format_value(os, v[off], dtype);
    return;
  }
  os << "[";
  const int64_t n = shape[axis];
  constexpr int64_t kEdge = 3;
  const bool innermost = axis + 1 == shape.size();
  // Between elements: ", " in the innermost axis, else a comma, one newline per remaining axis
  // and the indentation.
  auto separator = [&](int newlines) {
    if (innermost) {
      os << ", ";
    } else {
      os << ',' << std::string(static_cast<size_t>(newlines), '\n') << std::string(static_cast<size_t>(indent + 1), ' ');
    }
  };
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdge && i == kEdge) {
      os << "...";
      i = n - kEdge - 1;
      separator(1);
      continue;
    }
    format_rec(os, v, shape, st, axis + 1, off + i * st[axis], dtype, summarize, indent + 1);
    if (i + 1 < n) separator(shape.size() - axis - 1);
  }
  os << "]";
}

}  // namespace

std::string Array::to_string() const {
  if (!defined()) return "array(undefined)";
  std::vector<double> v = to_vector<double>();
  std::ostringstream os;
  os << "array(";
  if (size() == 0) {
    os << "[]";
  } else {
    format_rec(os, v, shape_, contiguous_strides(shape_), 0, 0, dtype_, size() > 1000, 6);
  }
  os << ", shape=" << shape_ << ", dtype=" << dtype_name(dtype_);
  if (!device_.is_cpu()) os << ", device=" << device_;
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Array& a) { return os << a.to_string(); }

}  // namespace kusari
