// Array: an n-dimensional view (dtype, shape, strides, offset) of shared device memory.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "kusari/core/device.h"
#include "kusari/core/dtype.h"
#include "kusari/core/memory_format.h"
#include "kusari/core/scalar.h"
#include "kusari/core/shape.h"

namespace kusari {

class Generator;

/// A Python-style slice `start:stop:step`; an absent bound means "from the end that fits the step".
struct Slice {
  std::optional<int64_t> start;
  std::optional<int64_t> stop;
  int64_t step = 1;
  Slice() = default;
  Slice(std::optional<int64_t> start_, std::optional<int64_t> stop_, int64_t step_ = 1)
      : start(start_), stop(stop_), step(step_) {}
};

/// `NewAxis{}` inserts a dimension of length 1 (NumPy's `None`).
struct NewAxis {};
/// `Ellipsis{}` stands for as many full slices as needed (NumPy's `...`).
struct Ellipsis {};

/// One entry of an indexing expression: an integer, a slice, a new axis or an ellipsis.
using Index = std::variant<int64_t, Slice, NewAxis, Ellipsis>;

/// An n-dimensional array. Copying an Array copies the view, not the data (like a NumPy view);
/// use copy() for a deep copy. An Array made by Array() is undefined (defined() == false).
class Array {
 public:
  Array() = default;

  // --- creation ---------------------------------------------------------------------------------
  /// Uninitialised memory of the given shape, laid out in `format` (kChannelsLast needs 4 axes).
  static Array empty(const Shape& shape, Dtype dtype = float32, Device device = default_device(),
                     MemoryFormat format = MemoryFormat::kContiguous);
  static Array zeros(const Shape& shape, Dtype dtype = float32, Device device = default_device());
  static Array ones(const Shape& shape, Dtype dtype = float32, Device device = default_device());
  static Array full(const Shape& shape, Scalar value, Dtype dtype = float32, Device device = default_device());
  /// Same shape, dtype and device as `like`, and its memory format (like.memory_format()).
  static Array empty_like(const Array& like);
  static Array zeros_like(const Array& like);
  static Array ones_like(const Array& like);
  static Array full_like(const Array& like, Scalar value);
  /// A 0-d array holding `value`.
  static Array scalar(Scalar value, Dtype dtype = float32, Device device = default_device());
  /// [start, stop) in steps of `step`, like numpy.arange.
  static Array arange(double start, double stop, double step = 1.0, Dtype dtype = float32,
                      Device device = default_device());
  static Array arange(int64_t stop, Dtype dtype = int64, Device device = default_device());
  /// Copies `n` host elements at `src` (of the given dtype) into a new array.
  static Array from_buffer(const void* src, const Shape& shape, Dtype dtype, Device device = default_device());
  /// Wraps existing host memory without copying; `owner` keeps it alive.
  static Array from_blob(std::shared_ptr<void> owner, void* data, const Shape& shape, Dtype dtype);
  /// Wraps existing memory of `device` without copying, laid out with `strides` (in elements;
  /// negative ones too), `data` pointing at the first element; `owner` keeps it alive. For
  /// memory shared with another library (NumPy's buffers, DLPack tensors).
  static Array from_blob(std::shared_ptr<void> owner, void* data, const Shape& shape, const Strides& strides,
                         Dtype dtype, Device device);
  /// Copies a vector into a new array; the shape defaults to 1-d.
  template <typename T>
  static Array from_vector(const std::vector<T>& values, std::optional<Shape> shape = std::nullopt,
                           Device device = default_device());
  /// A float32 (or `dtype`) array from a list: `Array::from({1, 2, 3, 4}, {2, 2})`.
  static Array from(std::initializer_list<double> values, std::optional<Shape> shape = std::nullopt,
                    Dtype dtype = float32, Device device = default_device());
  /// Uniform numbers in [low, high) from `gen` (the default generator when null).
  static Array uniform(const Shape& shape, double low = 0.0, double high = 1.0, Dtype dtype = float32,
                       Device device = default_device(), Generator* gen = nullptr);
  /// Normal numbers with the given mean and standard deviation.
  static Array normal(const Shape& shape, double mean = 0.0, double stddev = 1.0, Dtype dtype = float32,
                      Device device = default_device(), Generator* gen = nullptr);

  // --- properties -------------------------------------------------------------------------------
  bool defined() const { return static_cast<bool>(data_); }
  const Shape& shape() const { return shape_; }
  const Strides& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  Dtype dtype() const { return dtype_; }
  Device device() const { return device_; }
  int ndim() const { return shape_.size(); }
  /// Number of elements.
  int64_t size() const { return shape_.numel(); }
  int64_t itemsize() const { return static_cast<int64_t>(kusari::itemsize(dtype_)); }
  int64_t nbytes() const { return size() * itemsize(); }
  /// Length of axis `axis` (negative counts from the end).
  int64_t dim(int axis) const;
  /// True when the elements are laid out in C order without gaps.
  bool is_contiguous() const;
  /// True when the elements are laid out densely in `format` (length-1 axes are ignored, so a
  /// (N, C, 1, 1) or (1, C, 1, 1) array can be both contiguous and channels-last).
  bool is_contiguous(MemoryFormat format) const;
  /// The array's layout: kChannelsLast for a 4-d array that is channels-last and not also
  /// C-contiguous (contiguous wins when both hold, as in PyTorch), else kContiguous (also for
  /// arrays with other strides, whose copies are made contiguous).
  MemoryFormat memory_format() const;

  /// Pointer to the first element (device memory for a GPU array).
  void* raw_data() const { return static_cast<char*>(data_.get()) + offset_ * itemsize(); }
  /// Typed pointer to the first element; throws DtypeError if T does not match the dtype.
  template <typename T>
  T* data() const {
    check_dtype_for_access(dtype_of<std::remove_const_t<T>>);
    return static_cast<T*>(raw_data());
  }
  /// The shared allocation this view points into.
  const std::shared_ptr<void>& storage() const { return data_; }
  /// True when both views point into the same allocation.
  bool shares_memory_with(const Array& other) const { return data_ && data_ == other.data_; }
  /// True when both are the same view: the same memory, offset, dtype, shape and strides.
  bool same_view(const Array& other) const {
    return data_ && data_ == other.data_ && offset_ == other.offset_ && dtype_ == other.dtype_ &&
           shape_ == other.shape_ && strides_ == other.strides_;
  }

  // --- views (no copy) -----------------------------------------------------------------------------
  /// A view with a new shape; one entry may be -1. Copies only when the strides do not allow a view.
  Array reshape(const Shape& shape) const;
  /// Permutes the axes; no axes reverses them.
  Array transpose(const Axes& axes = {}) const;
  Array swapaxes(int a, int b) const;
  /// A view broadcast to `shape` (new leading axes and length-1 axes get stride 0).
  Array broadcast_to(const Shape& shape) const;
  /// Removes the given length-1 axes (all of them when none are given).
  Array squeeze(const Axes& axes = {}) const;
  /// Inserts a length-1 axis at `axis`.
  Array expand_dims(int axis) const;
  /// NumPy basic indexing: `x.at({1, Slice(0, 3), NewAxis{}})`.
  Array at(const std::vector<Index>& indices) const;
  /// x[i] along the first axis.
  Array operator[](int64_t i) const { return at({i}); }
  /// A flat view when possible (else a contiguous copy).
  Array flatten() const { return reshape({size()}); }

  // --- copies -----------------------------------------------------------------------------------------
  /// A contiguous deep copy.
  Array copy() const;
  /// This array if already contiguous, else a contiguous copy.
  Array contiguous() const;
  /// This array if already laid out in `format` (is_contiguous(format)), else a copy in it.
  /// kChannelsLast needs a 4-d array.
  Array to_memory_format(MemoryFormat format) const;
  /// Converts the dtype, keeping the memory format (returns this array when already `dtype` and
  /// `copy` is false).
  Array astype(Dtype dtype, bool copy = false) const;
  /// The array on `device` (this array when already there).
  Array to_device(Device device) const;
  /// Copies `src` (broadcast to this shape, converted to this dtype) into this array's memory.
  void assign(const Array& src);
  /// Sets every element to `value`.
  void fill(Scalar value);

  // --- host access ------------------------------------------------------------------------------------
  /// The only element of a 1-element array, converted to T.
  template <typename T>
  T item() const;
  /// The elements in C order converted to T (copied to the host if needed).
  template <typename T>
  std::vector<T> to_vector() const;
  /// NumPy-like text, e.g. "array([[1, 2], [3, 4]], dtype=float32)".
  std::string to_string() const;

  // --- for backends and tests ------------------------------------------------------------------------
  /// A view with explicit geometry into the same memory (no checks beyond the allocation's bounds).
  Array as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;

 private:
  void check_dtype_for_access(Dtype requested) const;
  /// A contiguous CPU copy converted to `dtype` (this array itself when it already is one).
  Array host_contiguous(Dtype dtype) const;
  Array(std::shared_ptr<void> data, size_t alloc_nbytes, Device device, Dtype dtype, Shape shape, Strides strides,
        int64_t offset);

  std::shared_ptr<void> data_;
  size_t alloc_nbytes_ = 0;
  Shape shape_;
  Strides strides_;
  int64_t offset_ = 0;  // in elements
  Device device_;
  Dtype dtype_ = Dtype::kFloat32;
};

std::ostream& operator<<(std::ostream& os, const Array& a);

template <typename T>
Array Array::from_vector(const std::vector<T>& values, std::optional<Shape> shape, Device device) {
  Shape s = shape ? *shape : Shape{static_cast<int64_t>(values.size())};
  KUSARI_CHECK(s.numel() == static_cast<int64_t>(values.size()), ShapeError, "Array::from_vector: ",
               values.size(), " values do not fill shape ", s);
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> bytes(values.begin(), values.end());
    return from_buffer(bytes.data(), s, Dtype::kBool, device);
  } else {
    return from_buffer(values.data(), s, dtype_of<T>, device);
  }
}

template <typename T>
std::vector<T> Array::to_vector() const {
  Array h = host_contiguous(dtype_of<T>);
  const T* p = static_cast<const T*>(h.raw_data());
  return std::vector<T>(p, p + h.size());
}

template <typename T>
T Array::item() const {
  KUSARI_CHECK(size() == 1, ShapeError, "Array::item: the array has ", size(), " elements (shape ", shape_,
               "); item() needs exactly one");
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(to_vector<double>()[0]);
  } else if constexpr (std::is_same_v<T, bool>) {
    return to_vector<bool>()[0];
  } else {
    return static_cast<T>(to_vector<int64_t>()[0]);
  }
}

}  // namespace kusari
