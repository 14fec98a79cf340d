// Internal NPY format (NumPy's .npy, version 1.0 written; 1.0, 2.0 and 3.0 read) encoder and
// decoder, working on byte streams so that npz members are never held twice in memory. Not part
// of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "kusari/core/array.h"

namespace kusari::detail {

/// Reads exactly `n` bytes into `dst` (throws IOError when the stream ends first).
using ByteSource = std::function<void(void* dst, size_t n)>;
/// Appends `n` bytes.
using ByteSink = std::function<void(const void* data, size_t n)>;

/// The dtype an array of `dtype` is stored as (float32 for bfloat16, which NumPy lacks).
Dtype npy_storage_dtype(Dtype dtype);
/// NumPy's type string of a storable dtype ("<f4", "|b1", ...).
const char* npy_descr(Dtype storage_dtype);

/// An array prepared for writing: its NPY preamble and its host, C-order bytes.
struct NpyEncoded {
  std::string preamble;  // magic, version, header length, header dict, padding
  Array data;            // contiguous CPU array in npy_storage_dtype
  uint64_t size() const { return preamble.size() + static_cast<uint64_t>(data.nbytes()); }
};

/// The NPY preamble of `a`: it depends only on its shape and dtype.
std::string npy_preamble(const Array& a);
/// The size in bytes of `a` written as NPY, found without copying its data.
uint64_t npy_encoded_size(const Array& a);
/// Prepares `a` (any device, layout or dtype) for writing as NPY.
NpyEncoded npy_encode(const Array& a);
/// Writes an encoded array to `sink`.
void npy_write(const NpyEncoded& encoded, const ByteSink& sink);

/// Decodes one NPY stream of `total_size` bytes read from `source`. `where` names the file (and
/// member) in error messages. Reads only the bytes the array needs; the caller decides what to do
/// with any rest. See Note [NPY dtypes].
Array npy_decode(const ByteSource& source, uint64_t total_size, const std::string& where);

}  // namespace kusari::detail
