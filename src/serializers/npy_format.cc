#include "serializers/npy_format.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "kusari/core/error.h"

namespace kusari::detail {

static_assert(std::endian::native == std::endian::little,
              "the npz serializers assume a little-endian host (x86-64, AArch64, ppc64le)");

// Note [NPY dtypes]
// NumPy names element types with a type string: byte order ('<' little, '>' big, '|' not
// applicable), kind and size. kusari writes '|b1' bool, '|u1' uint8, '<i4' int32, '<i8' int64,
// '<f2' float16, '<f4' float32 and '<f8' float64. NumPy has no bfloat16, so a bfloat16 array is
// written as '<f4' (exact: every bfloat16 value is a float32 value); loading it back into a
// bfloat16 array rounds nothing, while loading it into an undefined array gives float32.
// Reading accepts those codes in either byte order (big-endian data is byte-swapped) and widens
// the integer types kusari lacks where every value fits: int8, int16 and uint16 become int32,
// uint32 becomes int64. A 0-d unicode ('<U') or bytes ('|S') array -- how Chainer stores a
// Python str -- becomes a 1-d uint8 array of its UTF-8 bytes, which is how kusari's Serializer
// stores strings. Everything else (uint64, long double, complex, datetime, structured and
// object arrays, which need Python's pickle) is rejected with an error that names the type.
// '=' (native order) is rejected for multi-byte types: in a file it does not say which order
// the writer's machine had.

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kAlign = 64;

// --- a small parser for the Python literal in the header -----------------------------------------

struct PyValue {
  enum class Kind { kStr, kInt, kBool, kNone, kTuple, kList, kDict };
  Kind kind = Kind::kNone;
  std::string str;
  int64_t num = 0;
  bool flag = false;
  std::vector<PyValue> items;     // tuple / list elements, dict values
  std::vector<std::string> keys;  // dict keys (strings only)
};

class PyLiteralParser {
 public:
  PyLiteralParser(const std::string& text, const std::string& where) : s_(text), where_(where) {}

  PyValue parse_all() {
    PyValue v = value(0);
    skip_space();
    if (i_ != s_.size()) fail("unexpected text after the dictionary");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    KUSARI_THROW(IOError, where_, ": malformed NPY header (", what, " at character ", i_,
                 "): ", s_);
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  bool accept(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(std::string("expected '") + c + "'");
  }
  bool keyword(const char* word) {
    const size_t n = std::strlen(word);
    if (s_.compare(i_, n, word) == 0) {
      i_ += n;
      return true;
    }
    return false;
  }

  PyValue value(int depth) {
    if (depth > 16) fail("nesting too deep");
    skip_space();
    if (i_ >= s_.size()) fail("unexpected end");
    PyValue v;
    const char c = s_[i_];
    if (c == '\'' || c == '"') {
      v.kind = PyValue::Kind::kStr;
      v.str = string_literal();
    } else if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      v.kind = c == '(' ? PyValue::Kind::kTuple : PyValue::Kind::kList;
      ++i_;
      while (!accept(close)) {
        v.items.push_back(value(depth + 1));
        if (!accept(',')) {
          expect(close);
          break;
        }
      }
    } else if (c == '{') {
      v.kind = PyValue::Kind::kDict;
      ++i_;
      while (!accept('}')) {
        skip_space();
        if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) fail("expected a string key");
        v.keys.push_back(string_literal());
        expect(':');
        v.items.push_back(value(depth + 1));
        if (!accept(',')) {
          expect('}');
          break;
        }
      }
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = PyValue::Kind::kInt;
      v.num = integer();
    } else if (keyword("True")) {
      v.kind = PyValue::Kind::kBool;
      v.flag = true;
    } else if (keyword("False")) {
      v.kind = PyValue::Kind::kBool;
    } else if (keyword("None")) {
      v.kind = PyValue::Kind::kNone;
    } else {
      fail("unexpected character");
    }
    return v;
  }

  std::string string_literal() {
    const char quote = s_[i_++];
    std::string out;
    while (true) {
      if (i_ >= s_.size()) fail("unterminated string");
      char c = s_[i_++];
      if (c == quote) break;
      if (c == '\\') {
        if (i_ >= s_.size()) fail("unterminated string");
        c = s_[i_++];
      }
      out.push_back(c);
    }
    return out;
  }

  int64_t integer() {
    bool negative = false;
    if (s_[i_] == '-') {
      negative = true;
      ++i_;
    }
    if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9') fail("expected a digit");
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const uint64_t d = static_cast<uint64_t>(s_[i_++] - '0');
      if (v > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - d) / 10)
        fail("integer too large");
      v = v * 10 + d;
    }
    if (i_ < s_.size() && (s_[i_] == 'L' || s_[i_] == 'l')) ++i_;  // Python 2 long literals
    return negative ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  }

  const std::string& s_;
  const std::string& where_;
  size_t i_ = 0;
};

// --- the element type of a file ----------------------------------------------------------------

// How the elements stored in a file become a kusari array.
enum class Conversion {
  kNone,     // the bytes are the array's bytes
  kBool,     // bytes normalised to 0 / 1
  kWiden,    // integer widening (int8/int16/uint16 -> int32, uint32 -> int64)
  kUnicode,  // 0-d '<U' string -> UTF-8 bytes
  kBytes,    // 0-d '|S' string -> its bytes
};

struct FileType {
  char kind = 0;      // 'b', 'u', 'i', 'f', 'U', 'S'
  size_t size = 0;    // bytes per element (for 'U': 4 per character)
  bool swap = false;  // big-endian data on this little-endian host
  Dtype dtype = Dtype::kFloat32;
  Conversion conversion = Conversion::kNone;
};

// The size of the units whose bytes the byte order applies to.
size_t element_unit(const FileType& t) {
  if (t.kind == 'U') return 4;
  if (t.kind == 'S') return 1;
  return t.size;
}

FileType parse_descr(const std::string& descr, const std::string& where) {
  auto reject = [&](const std::string& why) {
    KUSARI_THROW(
        IOError, where, ": unsupported NPY dtype '", descr, "': ", why,
        " (supported: bool, uint8, int8/16/32/64, uint16/32, float16/32/64, and 0-d strings)");
  };
  size_t i = 0;
  char order = '|';
  if (!descr.empty() &&
      (descr[0] == '<' || descr[0] == '>' || descr[0] == '|' || descr[0] == '=')) {
    order = descr[0];
    i = 1;
  }
  if (i >= descr.size()) reject("empty type string");
  FileType t;
  t.kind = descr[i++];
  switch (t.kind) {
    case 'c':
      reject("complex numbers are not supported");
      break;
    case 'O':
      reject(
          "object arrays hold pickled Python objects, which kusari cannot read (Chainer stores "
          "None "
          "this way, e.g. for a parameter that was never initialised; skip such keys with "
          "ignore_names)");
      break;
    case 'M':
    case 'm':
      reject("datetime and timedelta are not supported");
      break;
    case 'V':
      reject("structured (void) types are not supported");
      break;
    default:
      break;
  }
  size_t count = 0;
  if (i >= descr.size()) reject("the type string has no size");
  for (; i < descr.size(); ++i) {
    if (descr[i] < '0' || descr[i] > '9' || count > (size_t{1} << 32))
      reject("malformed type string");
    count = count * 10 + static_cast<size_t>(descr[i] - '0');
  }
  t.size = t.kind == 'U' ? 4 * count : count;
  switch (t.kind) {
    case 'b':
      if (count != 1) reject("bool must have size 1");
      t.dtype = Dtype::kBool;
      t.conversion = Conversion::kBool;
      break;
    case 'u':
      if (count == 8)
        reject(
            "uint64 has no kusari dtype that holds all its values; convert it to int64 in NumPy");
      if (count != 1 && count != 2 && count != 4) reject("unknown unsigned integer size");
      t.dtype = count == 1 ? Dtype::kUInt8 : count == 2 ? Dtype::kInt32 : Dtype::kInt64;
      t.conversion = count == 1 ? Conversion::kNone : Conversion::kWiden;
      break;
    case 'i':
      if (count != 1 && count != 2 && count != 4 && count != 8) reject("unknown integer size");
      t.dtype = count == 8 ? Dtype::kInt64 : Dtype::kInt32;
      t.conversion = count < 4 ? Conversion::kWiden : Conversion::kNone;
      break;
    case 'f':
      if (count != 2 && count != 4 && count != 8)
        reject("only float16, float32 and float64 have kusari dtypes");
      t.dtype = count == 2 ? Dtype::kFloat16 : count == 4 ? Dtype::kFloat32 : Dtype::kFloat64;
      break;
    case 'U':
      t.dtype = Dtype::kUInt8;
      t.conversion = Conversion::kUnicode;
      break;
    case 'S':
      t.dtype = Dtype::kUInt8;
      t.conversion = Conversion::kBytes;
      break;
    default:
      reject("unknown type kind");
  }
  const size_t unit = element_unit(t);
  if (unit > 1) {
    if (order == '=' || order == '|')
      reject("multi-byte data needs an explicit byte order '<' or '>'");
    t.swap = order == '>';
  }
  return t;
}

void byte_swap(unsigned char* p, size_t count, size_t unit) {
  for (size_t k = 0; k < count; ++k, p += unit) std::reverse(p, p + unit);
}

template <typename From, typename To>
void widen(const unsigned char* src, To* dst, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    From v;
    std::memcpy(&v, src + k * sizeof(From), sizeof(From));
    dst[k] = static_cast<To>(v);
  }
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) cp = 0xfffd;  // not a character: replacement
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

std::string shape_literal(const Shape& shape) {
  std::string s = "(";
  for (int i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace

Dtype npy_storage_dtype(Dtype dtype) {
  return dtype == Dtype::kBFloat16 ? Dtype::kFloat32 : dtype;
}

const char* npy_descr(Dtype storage_dtype) {
  switch (storage_dtype) {
    case Dtype::kBool:
      return "|b1";
    case Dtype::kUInt8:
      return "|u1";
    case Dtype::kInt32:
      return "<i4";
    case Dtype::kInt64:
      return "<i8";
    case Dtype::kFloat16:
      return "<f2";
    case Dtype::kFloat32:
      return "<f4";
    case Dtype::kFloat64:
      return "<f8";
    case Dtype::kBFloat16:
      break;
  }
  KUSARI_ASSERT(false, "npy_descr: dtype ", dtype_name(storage_dtype), " has no NPY type string");
  return "";
}

std::string npy_preamble(const Array& a) {
  KUSARI_ASSERT(a.defined(), "npy_preamble: undefined array");
  const Dtype storage = npy_storage_dtype(a.dtype());
  std::string dict = std::string("{'descr': '") + npy_descr(storage) +
                     "', 'fortran_order': False, 'shape': " + shape_literal(a.shape()) + ", }";
  // Version 1.0 stores the header length in 2 bytes; the header (with its newline) is padded with
  // spaces so that the data starts at a multiple of 64 bytes, as NumPy does.
  const size_t unpadded = kMagicSize + 2 + 2 + dict.size() + 1;
  dict.append((kAlign - unpadded % kAlign) % kAlign, ' ');
  dict.push_back('\n');
  KUSARI_ASSERT(dict.size() <= 0xffff, "npy_preamble: header too long");
  std::string preamble(kMagic, kMagicSize);
  preamble.push_back('\x01');
  preamble.push_back('\x00');
  preamble.push_back(static_cast<char>(dict.size() & 0xff));
  preamble.push_back(static_cast<char>(dict.size() >> 8));
  preamble += dict;
  return preamble;
}

uint64_t npy_encoded_size(const Array& a) {
  return npy_preamble(a).size() +
         static_cast<uint64_t>(a.size()) * itemsize(npy_storage_dtype(a.dtype()));
}

NpyEncoded npy_encode(const Array& a) {
  KUSARI_ASSERT(a.defined(), "npy_encode: undefined array");
  NpyEncoded e;
  e.preamble = npy_preamble(a);
  e.data = a.to_device(Device::cpu()).astype(npy_storage_dtype(a.dtype())).contiguous();
  return e;
}

void npy_write(const NpyEncoded& encoded, const ByteSink& sink) {
  sink(encoded.preamble.data(), encoded.preamble.size());
  if (encoded.data.nbytes() > 0)
    sink(encoded.data.raw_data(), static_cast<size_t>(encoded.data.nbytes()));
}

Array npy_decode(const ByteSource& source, uint64_t total_size, const std::string& where) {
  auto truncated = [&](const std::string& what) {
    KUSARI_THROW(IOError, where, ": truncated NPY data: ", what);
  };
  if (total_size < kMagicSize + 4) truncated("only " + std::to_string(total_size) + " bytes");
  unsigned char head[kMagicSize + 2];
  source(head, sizeof(head));
  if (std::memcmp(head, kMagic, kMagicSize) != 0) {
    KUSARI_THROW(IOError, where,
                 ": not an NPY array (bad magic: the data does not start with \"\\x93NUMPY\")");
  }
  const int major = head[kMagicSize], minor = head[kMagicSize + 1];
  size_t len_bytes = 0;
  if (major == 1) {
    len_bytes = 2;
  } else if (major == 2 || major == 3) {
    len_bytes = 4;
  } else {
    KUSARI_THROW(IOError, where, ": unsupported NPY format version ", major, ".", minor,
                 " (1.0 to 3.0 are read)");
  }
  unsigned char len_buf[4] = {0, 0, 0, 0};
  source(len_buf, len_bytes);
  const uint64_t header_len =
      static_cast<uint64_t>(len_buf[0]) | (static_cast<uint64_t>(len_buf[1]) << 8) |
      (static_cast<uint64_t>(len_buf[2]) << 16) | (static_cast<uint64_t>(len_buf[3]) << 24);
  const uint64_t preamble = kMagicSize + 2 + len_bytes + header_len;
  if (preamble > total_size) {
    truncated("the header needs " + std::to_string(preamble) + " bytes but only " +
              std::to_string(total_size) + " are present");
  }
  std::string header(header_len, '\0');
  source(header.data(), header.size());

  const PyValue dict = PyLiteralParser(header, where).parse_all();
  if (dict.kind != PyValue::Kind::kDict) {
    KUSARI_THROW(IOError, where, ": malformed NPY header (not a dictionary): ", header);
  }
  const PyValue* descr = nullptr;
  const PyValue* fortran = nullptr;
  const PyValue* shape_value = nullptr;
  for (size_t k = 0; k < dict.keys.size(); ++k) {
    const std::string& key = dict.keys[k];
    if (key == "descr") {
      descr = &dict.items[k];
    } else if (key == "fortran_order") {
      fortran = &dict.items[k];
    } else if (key == "shape") {
      shape_value = &dict.items[k];
    } else {
      KUSARI_THROW(IOError, where, ": malformed NPY header (unexpected key '", key, "'): ", header);
    }
  }
  if (!descr || !fortran || !shape_value) {
    KUSARI_THROW(
        IOError, where,
        ": malformed NPY header (it needs 'descr', 'fortran_order' and 'shape'): ", header);
  }
  if (descr->kind == PyValue::Kind::kList) {
    KUSARI_THROW(IOError, where,
                 ": unsupported NPY dtype: structured arrays (record types) are not supported");
  }
  if (descr->kind != PyValue::Kind::kStr || fortran->kind != PyValue::Kind::kBool ||
      shape_value->kind != PyValue::Kind::kTuple) {
    KUSARI_THROW(IOError, where,
                 ": malformed NPY header (descr must be a string, fortran_order a bool, shape a "
                 "tuple): ",
                 header);
  }
  const FileType type = parse_descr(descr->str, where);
  const bool fortran_order = fortran->flag;

  std::vector<int64_t> dims;
  for (const PyValue& d : shape_value->items) {
    if (d.kind != PyValue::Kind::kInt || d.num < 0) {
      KUSARI_THROW(
          IOError, where,
          ": malformed NPY header (shape entries must be non-negative integers): ", header);
    }
    dims.push_back(d.num);
  }
  if (dims.size() > static_cast<size_t>(kMaxNdim)) {
    KUSARI_THROW(IOError, where, ": the array has ", dims.size(),
                 " dimensions; kusari arrays have at most ", kMaxNdim);
  }
  uint64_t count = 1;
  bool overflow = false;
  for (int64_t d : dims) {
    if (d != 0 && count > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      overflow = true;
    count *= static_cast<uint64_t>(d);
  }
  if (overflow || (type.size > 0 && count > (total_size - preamble) / type.size)) {
    truncated("the header describes shape " + shape_literal(Shape(dims)) + " of '" + descr->str +
              "' but only " + std::to_string(total_size - preamble) + " bytes of data follow it");
  }
  const uint64_t nbytes = count * type.size;
  if (type.conversion == Conversion::kUnicode || type.conversion == Conversion::kBytes) {
    if (!dims.empty()) {
      KUSARI_THROW(IOError, where, ": string arrays ('", descr->str,
                   "') are only read as 0-d values (how Chainer "
                   "stores a str); this one has shape ",
                   shape_literal(Shape(dims)));
    }
  }

  // In Fortran order the file holds the transpose in C order: read that, then transpose back.
  Shape file_shape(dims);
  if (fortran_order) std::reverse(file_shape.begin(), file_shape.end());

  Array out;
  if (type.conversion == Conversion::kNone && !type.swap) {
    out = Array::empty(file_shape, type.dtype, Device::cpu());
    if (nbytes > 0) source(out.raw_data(), static_cast<size_t>(nbytes));
  } else if (type.conversion == Conversion::kBool) {
    out = Array::empty(file_shape, Dtype::kBool, Device::cpu());
    auto* p = static_cast<unsigned char*>(out.raw_data());
    if (nbytes > 0) source(p, static_cast<size_t>(nbytes));
    for (uint64_t k = 0; k < count; ++k) p[k] = p[k] != 0 ? 1 : 0;
  } else {
    std::vector<unsigned char> buf(static_cast<size_t>(nbytes));
    if (nbytes > 0) source(buf.data(), buf.size());
    const size_t unit = element_unit(type);
    if (type.swap) byte_swap(buf.data(), buf.size() / unit, unit);
    const size_t n = static_cast<size_t>(count);
    switch (type.conversion) {
      case Conversion::kNone:
        out = Array::from_buffer(buf.data(), file_shape, type.dtype, Device::cpu());
        break;
      case Conversion::kWiden:
        out = Array::empty(file_shape, type.dtype, Device::cpu());
        if (type.kind == 'i' && type.size == 1) widen<int8_t>(buf.data(), out.data<int32_t>(), n);
        if (type.kind == 'i' && type.size == 2) widen<int16_t>(buf.data(), out.data<int32_t>(), n);
        if (type.kind == 'u' && type.size == 2) widen<uint16_t>(buf.data(), out.data<int32_t>(), n);
        if (type.kind == 'u' && type.size == 4) widen<uint32_t>(buf.data(), out.data<int64_t>(), n);
        break;
      case Conversion::kUnicode: {
        std::string utf8;
        for (size_t k = 0; k + 4 <= buf.size(); k += 4) {
          uint32_t cp;
          std::memcpy(&cp, buf.data() + k, 4);
          if (cp == 0) break;  // NumPy pads with NULs and strips them when reading
          append_utf8(utf8, cp);
        }
        out = Array::from_buffer(utf8.data(), {static_cast<int64_t>(utf8.size())}, Dtype::kUInt8,
                                 Device::cpu());
        break;
      }
      case Conversion::kBytes: {
        size_t len = buf.size();
        while (len > 0 && buf[len - 1] == 0) --len;
        out = Array::from_buffer(buf.data(), {static_cast<int64_t>(len)}, Dtype::kUInt8,
                                 Device::cpu());
        break;
      }
      case Conversion::kBool:
        break;  // handled above
    }
  }
  if (fortran_order && out.ndim() > 1) out = out.transpose().copy();
  return out;
}

}  // namespace kusari::detail
