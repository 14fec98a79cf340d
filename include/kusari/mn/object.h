// Byte serialisation for the object collectives (send_obj, bcast_obj, gather_obj, ...).
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/core/error.h"

namespace kusari::mn {

/// Appends values to a byte buffer.
class ByteWriter {
 public:
  template <typename T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>, "ByteWriter::put needs a trivially copyable type");
    const size_t at = buf_.size();
    buf_.resize(at + sizeof(T));
    std::memcpy(buf_.data() + at, &v, sizeof(T));
  }
  void put_bytes(const std::vector<uint8_t>& b) {
    put<uint64_t>(b.size());
    buf_.insert(buf_.end(), b.begin(), b.end());
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  /// An array (any device): dtype, shape and contiguous host bytes.
  void put_array(const Array& a);
  template <typename T>
  void put_vector(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    for (const T& x : v) put(x);
  }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

/// Reads values back in the order they were written; a short buffer raises CommunicatorError.
class ByteReader {
 public:
  explicit ByteReader(const std::vector<uint8_t>& buf) : buf_(buf) {}
  template <typename T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>, "ByteReader::get needs a trivially copyable type");
    need(sizeof(T));
    T v;
    std::memcpy(&v, buf_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::vector<uint8_t> get_bytes() {
    const uint64_t n = get<uint64_t>();
    need(n);
    std::vector<uint8_t> b(buf_.begin() + static_cast<long>(pos_), buf_.begin() + static_cast<long>(pos_ + n));
    pos_ += n;
    return b;
  }
  std::string get_string() {
    const uint64_t n = get<uint64_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(buf_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  /// An array written by put_array, on the CPU.
  Array get_array();
  template <typename T>
  std::vector<T> get_vector() {
    const uint64_t n = get<uint64_t>();
    std::vector<T> v;
    v.reserve(n);
    for (uint64_t i = 0; i < n; ++i) v.push_back(get<T>());
    return v;
  }
  bool done() const { return pos_ == buf_.size(); }

 private:
  void need(uint64_t n) const {
    KUSARI_CHECK(pos_ + n <= buf_.size(), CommunicatorError, "object decoding: the message is truncated (needs ", n,
                 " more bytes at offset ", pos_, " of ", buf_.size(), ")");
  }
  const std::vector<uint8_t>& buf_;
  uint64_t pos_ = 0;
};

}  // namespace kusari::mn
