#include "serializers/zip.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "kusari/config.h"
#include "kusari/core/error.h"

#if KUSARI_HAVE_ZLIB
#include <zlib.h>
#endif

namespace kusari::detail {

// Note [npz without zlib]
// zlib is an optional dependency of the build. Without it kusari still reads and writes npz files
// whose members are stored (method 0), which NumPy reads as well; writing with compression
// requested stores the members instead (the file is larger but equally valid), and reading a
// deflated member raises an IOError that says the build lacks zlib. CRC-32 then comes from a
// small table-driven implementation instead of zlib's.

namespace {

constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr size_t kLocalHeaderSize = 30;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr uint32_t kMax32 = 0xffffffffu;
constexpr uint16_t kMax16 = 0xffffu;
constexpr uint16_t kVersionDefault = 20;  // 2.0: deflate
constexpr uint16_t kVersionZip64 = 45;    // 4.5: ZIP64
constexpr uint16_t kMadeByUnix = 3 << 8;
constexpr uint16_t kFlagEncrypted = 0x0001;
constexpr uint16_t kFlagUtf8 = 0x0800;
constexpr uint16_t kDosDate1980 = (0 << 9) | (1 << 5) | 1;  // 1980-01-01
constexpr uint32_t kExternalAttrRegularFile = 0100644u << 16;
constexpr size_t kChunk = size_t{1} << 18;

void put16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>(v >> 8));
}
void put32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t get16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
uint32_t get32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t get64(const unsigned char* p) {
  return get32(p) | (static_cast<uint64_t>(get32(p + 4)) << 32);
}

uint32_t clamp32(uint64_t v) {
  return v >= kMax32 ? kMax32 : static_cast<uint32_t>(v);
}

// An upper bound of raw deflate's output for `n` input bytes (zlib's deflateBound plus margin).
uint64_t deflate_bound(uint64_t n) {
  return n + (n >> 12) + (n >> 14) + (n >> 25) + 64;
}

const char* method_name(uint16_t method) {
  switch (method) {
    case 1:
      return "shrink";
    case 6:
      return "implode";
    case 9:
      return "deflate64";
    case 12:
      return "bzip2";
    case 14:
      return "lzma";
    case 93:
      return "zstandard";
    case 95:
      return "xz";
    case 99:
      return "AES encryption";
    default:
      return "unknown";
  }
}

bool is_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

}  // namespace

// --- ZipWriter ----------------------------------------------------------------------------------

#if KUSARI_HAVE_ZLIB
struct ZipWriter::Deflater {
  z_stream zs{};
  bool initialized = false;
  std::vector<unsigned char> buffer = std::vector<unsigned char>(kChunk);
  ~Deflater() {
    if (initialized) deflateEnd(&zs);
  }
};
#else
struct ZipWriter::Deflater {};
#endif

ZipWriter::ZipWriter(AtomicOutputFile& out, std::string caller, bool force_zip64)
    : out_(out), caller_(std::move(caller)), force_zip64_(force_zip64) {}

ZipWriter::~ZipWriter() = default;

void ZipWriter::emit(const void* data, size_t n) {
  out_.write(data, n);
}

void ZipWriter::begin_member(const std::string& name, uint64_t size, bool compress) {
  KUSARI_ASSERT(!in_member_ && !finished_, "ZipWriter::begin_member in the wrong state");
  KUSARI_CHECK(!name.empty() && name.size() <= kMax16, ValueError, caller_, ": cannot write '",
               out_.path(), "': the member name must have 1 to 65535 bytes, got ", name.size());
  ZipEntry e;
  e.name = name;
  e.flags = is_ascii(name) ? 0 : kFlagUtf8;
#if KUSARI_HAVE_ZLIB
  e.method = compress ? 8 : 0;
#else
  e.method = 0;  // see Note [npz without zlib]
#endif
  e.uncompressed_size = size;
  e.local_header_offset = out_.tell();
  const uint64_t bound = e.method == 8 ? deflate_bound(size) : size;
  const bool zip64 = force_zip64_ || size >= kMax32 || bound >= kMax32;

  std::string h;
  put32(h, kLocalHeaderSignature);
  put16(h, zip64 ? kVersionZip64 : kVersionDefault);
  put16(h, e.flags);
  put16(h, e.method);
  put16(h, 0);  // time 00:00:00
  put16(h, kDosDate1980);
  put32(h, 0);  // CRC-32, patched by end_member()
  put32(h, zip64 ? kMax32 : 0);
  put32(h, zip64 ? kMax32 : static_cast<uint32_t>(size));
  put16(h, static_cast<uint16_t>(name.size()));
  put16(h, zip64 ? 20 : 0);
  h += name;
  if (zip64) {
    put16(h, kZip64ExtraId);
    put16(h, 16);
    put64(h, size);
    put64(h, 0);  // compressed size, patched by end_member()
  }
  emit(h.data(), h.size());

#if KUSARI_HAVE_ZLIB
  if (e.method == 8) {
    deflater_ = std::make_unique<Deflater>();
    // Raw deflate (negative window bits): ZIP stores no zlib header or Adler-32 trailer.
    if (deflateInit2(&deflater_->zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -15, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK) {
      deflater_.reset();
      KUSARI_THROW(IOError, caller_, ": cannot start zlib compression for '", out_.path(), "'");
    }
    deflater_->initialized = true;
  }
#endif
  entries_.push_back(std::move(e));
  local_zip64_.push_back(zip64);
  in_member_ = true;
  written_ = 0;
  crc_ = 0;
}

void ZipWriter::write(const void* data, size_t n) {
  KUSARI_ASSERT(in_member_, "ZipWriter::write outside a member");
  const ZipEntry& e = entries_.back();
  KUSARI_ASSERT(written_ + n <= e.uncompressed_size, "ZipWriter::write: member '", e.name,
                "' exceeds its size");
  const auto* p = static_cast<const unsigned char*>(data);
  written_ += n;
  crc_ = crc32_update(crc_, p, n);
  if (e.method == 0) {
    emit(p, n);
    return;
  }
#if KUSARI_HAVE_ZLIB
  z_stream& zs = deflater_->zs;
  while (n > 0) {
    const size_t take = std::min<size_t>(n, size_t{1} << 30);
    zs.next_in = const_cast<unsigned char*>(p);
    zs.avail_in = static_cast<uInt>(take);
    while (zs.avail_in > 0) {
      zs.next_out = deflater_->buffer.data();
      zs.avail_out = static_cast<uInt>(deflater_->buffer.size());
      const int rc = deflate(&zs, Z_NO_FLUSH);
      KUSARI_ASSERT(rc == Z_OK || rc == Z_BUF_ERROR, "deflate failed with code ", rc);
      emit(deflater_->buffer.data(), deflater_->buffer.size() - zs.avail_out);
    }
    p += take;
    n -= take;
  }
#endif
}

void ZipWriter::end_member() {
  KUSARI_ASSERT(in_member_, "ZipWriter::end_member outside a member");
  ZipEntry& e = entries_.back();
  KUSARI_ASSERT(written_ == e.uncompressed_size, "ZipWriter: member '", e.name, "' got ", written_,
                " bytes but was declared with ", e.uncompressed_size);
#if KUSARI_HAVE_ZLIB
  if (e.method == 8) {
    z_stream& zs = deflater_->zs;
    zs.next_in = nullptr;
    zs.avail_in = 0;
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
      zs.next_out = deflater_->buffer.data();
      zs.avail_out = static_cast<uInt>(deflater_->buffer.size());
      rc = deflate(&zs, Z_FINISH);
      KUSARI_ASSERT(rc == Z_OK || rc == Z_STREAM_END || rc == Z_BUF_ERROR,
                    "deflate failed with code ", rc);
      emit(deflater_->buffer.data(), deflater_->buffer.size() - zs.avail_out);
    }
    deflater_.reset();
  }
#endif
  const bool zip64 = local_zip64_.back();
  const uint64_t data_offset =
      e.local_header_offset + kLocalHeaderSize + e.name.size() + (zip64 ? 20 : 0);
  e.compressed_size = out_.tell() - data_offset;
  e.crc32 = crc_;
  KUSARI_ASSERT(zip64 || e.compressed_size < kMax32, "ZipWriter: deflate exceeded its bound");
  std::string patch;
  put32(patch, e.crc32);
  if (!zip64) {
    put32(patch, static_cast<uint32_t>(e.compressed_size));
    put32(patch, static_cast<uint32_t>(e.uncompressed_size));
  }
  out_.write_at(e.local_header_offset + 14, patch.data(), patch.size());
  if (zip64) {
    std::string sizes;
    put64(sizes, e.uncompressed_size);
    put64(sizes, e.compressed_size);
    out_.write_at(e.local_header_offset + kLocalHeaderSize + e.name.size() + 4, sizes.data(),
                  sizes.size());
  }
  in_member_ = false;
}

void ZipWriter::finish() {
  KUSARI_ASSERT(!in_member_ && !finished_, "ZipWriter::finish in the wrong state");
  const uint64_t cd_offset = out_.tell();
  std::string h;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const ZipEntry& e = entries_[i];
    const bool sizes64 =
        local_zip64_[i] || e.uncompressed_size >= kMax32 || e.compressed_size >= kMax32;
    const bool offset64 = force_zip64_ || e.local_header_offset >= kMax32;
    const uint16_t version = sizes64 || offset64 ? kVersionZip64 : kVersionDefault;
    h.clear();
    put32(h, kCentralHeaderSignature);
    put16(h, kMadeByUnix | version);
    put16(h, version);
    put16(h, e.flags);
    put16(h, e.method);
    put16(h, 0);
    put16(h, kDosDate1980);
    put32(h, e.crc32);
    put32(h, sizes64 ? kMax32 : static_cast<uint32_t>(e.compressed_size));
    put32(h, sizes64 ? kMax32 : static_cast<uint32_t>(e.uncompressed_size));
    put16(h, static_cast<uint16_t>(e.name.size()));
    put16(h, static_cast<uint16_t>(
                 (sizes64 || offset64) ? 4 + 8 * ((sizes64 ? 2 : 0) + (offset64 ? 1 : 0)) : 0));
    put16(h, 0);  // comment length
    put16(h, 0);  // disk number start
    put16(h, 0);  // internal attributes
    put32(h, kExternalAttrRegularFile);
    put32(h, offset64 ? kMax32 : static_cast<uint32_t>(e.local_header_offset));
    h += e.name;
    if (sizes64 || offset64) {
      put16(h, kZip64ExtraId);
      put16(h, static_cast<uint16_t>(8 * ((sizes64 ? 2 : 0) + (offset64 ? 1 : 0))));
      if (sizes64) {
        put64(h, e.uncompressed_size);
        put64(h, e.compressed_size);
      }
      if (offset64) put64(h, e.local_header_offset);
    }
    emit(h.data(), h.size());
  }
  const uint64_t cd_size = out_.tell() - cd_offset;
  const uint64_t n = entries_.size();
  const bool zip64 = force_zip64_ || n >= kMax16 || cd_size >= kMax32 || cd_offset >= kMax32;
  h.clear();
  if (zip64) {
    const uint64_t record_offset = out_.tell();
    put32(h, kZip64EndSignature);
    put64(h, kZip64EndSize - 12);  // size of the rest of the record
    put16(h, kMadeByUnix | kVersionZip64);
    put16(h, kVersionZip64);
    put32(h, 0);  // this disk
    put32(h, 0);  // disk with the central directory
    put64(h, n);
    put64(h, n);
    put64(h, cd_size);
    put64(h, cd_offset);
    put32(h, kZip64LocatorSignature);
    put32(h, 0);
    put64(h, record_offset);
    put32(h, 1);  // total number of disks
  }
  put32(h, kEndSignature);
  put16(h, 0);
  put16(h, 0);
  const uint16_t n16 = zip64 ? kMax16 : static_cast<uint16_t>(n);
  put16(h, n16);
  put16(h, n16);
  put32(h, zip64 ? kMax32 : clamp32(cd_size));
  put32(h, zip64 ? kMax32 : clamp32(cd_offset));
  put16(h, 0);  // comment length
  emit(h.data(), h.size());
  finished_ = true;
}

// --- ZipReader ----------------------------------------------------------------------------------

ZipReader::ZipReader(std::shared_ptr<const InputFile> file, std::string caller)
    : file_(std::move(file)), caller_(std::move(caller)) {
  const InputFile& f = *file_;
  const std::string where = caller_ + ": '" + f.path() + "'";
  const uint64_t size = f.size();
  auto not_zip = [&](const std::string& why) {
    std::string hint;
    if (size >= 6) {
      char magic[6];
      f.read_at(0, magic, 6, "file signature");
      if (std::memcmp(magic, "\x93NUMPY", 6) == 0)
        hint = " (it is a single .npy array; use read_npy)";
    }
    KUSARI_THROW(IOError, where, " is not a valid npz (ZIP) archive: ", why, hint);
  };
  if (size < kEndSize) not_zip("it has only " + std::to_string(size) + " bytes");

  // The end-of-central-directory record is the last 22 bytes plus an optional comment of up to
  // 65535 bytes; search backwards for a signature whose comment length reaches the end exactly.
  const uint64_t tail_size = std::min<uint64_t>(size, kEndSize + kMax16);
  std::vector<unsigned char> tail(tail_size);
  f.read_at(size - tail_size, tail.data(), tail.size(), "end of the archive");
  int64_t found = -1;
  for (int64_t i = static_cast<int64_t>(tail_size - kEndSize); i >= 0; --i) {
    const unsigned char* p = tail.data() + i;
    if (get32(p) == kEndSignature &&
        static_cast<uint64_t>(i) + kEndSize + get16(p + 20) == tail_size) {
      found = i;
      break;
    }
  }
  if (found < 0) {
    not_zip(
        "no end-of-central-directory record was found (the file is truncated, or it is not a ZIP "
        "file)");
  }
  const uint64_t end_offset = size - tail_size + static_cast<uint64_t>(found);
  const unsigned char* end = tail.data() + found;
  uint64_t disk = get16(end + 4), cd_disk = get16(end + 6);
  uint64_t n_this_disk = get16(end + 8), n = get16(end + 10);
  uint64_t cd_size = get32(end + 12), cd_offset = get32(end + 16);
  uint64_t data_end = end_offset;  // the central directory must end before this

  if (end_offset >= kZip64LocatorSize) {
    unsigned char loc[kZip64LocatorSize];
    f.read_at(end_offset - kZip64LocatorSize, loc, sizeof(loc),
              "ZIP64 end-of-central-directory locator");
    if (get32(loc) == kZip64LocatorSignature) {
      const uint64_t record_offset = get64(loc + 8);
      KUSARI_CHECK(get32(loc + 4) == 0 && get32(loc + 16) <= 1, IOError, where,
                   ": multi-disk (split) ZIP archives are not supported");
      KUSARI_CHECK(record_offset <= end_offset - kZip64LocatorSize - kZip64EndSize, IOError, where,
                   " is corrupt: the ZIP64 end record offset ", record_offset,
                   " lies outside the archive");
      unsigned char rec[kZip64EndSize];
      f.read_at(record_offset, rec, sizeof(rec), "ZIP64 end-of-central-directory record");
      KUSARI_CHECK(get32(rec) == kZip64EndSignature, IOError, where,
                   " is corrupt: bad signature of the ZIP64 end-of-central-directory record");
      disk = get32(rec + 16);
      cd_disk = get32(rec + 20);
      n_this_disk = get64(rec + 24);
      n = get64(rec + 32);
      cd_size = get64(rec + 40);
      cd_offset = get64(rec + 48);
      data_end = record_offset;
    }
  }
  KUSARI_CHECK(disk == 0 && cd_disk == 0 && n_this_disk == n, IOError, where,
               ": multi-disk (split) ZIP archives are not supported");
  KUSARI_CHECK(cd_offset <= data_end && cd_size <= data_end - cd_offset, IOError, where,
               " is truncated or corrupt: its central directory (", cd_size, " bytes at byte ",
               cd_offset, ") does not fit before the end record at byte ", data_end);
  KUSARI_CHECK(n <= cd_size / kCentralHeaderSize, IOError, where, " is corrupt: ", n,
               " members cannot fit in a central directory of ", cd_size, " bytes");

  std::vector<unsigned char> cd(cd_size);
  f.read_at(cd_offset, cd.data(), cd.size(), "central directory");
  const unsigned char* p = cd.data();
  const unsigned char* const cd_end = cd.data() + cd.size();
  entries_.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    KUSARI_CHECK(cd_end - p >= static_cast<ptrdiff_t>(kCentralHeaderSize) &&
                     get32(p) == kCentralHeaderSignature,
                 IOError, where, " is corrupt: central directory entry ", i, " of ", n,
                 " is malformed");
    ZipEntry e;
    e.flags = get16(p + 8);
    e.method = get16(p + 10);
    e.crc32 = get32(p + 16);
    e.compressed_size = get32(p + 20);
    e.uncompressed_size = get32(p + 24);
    const size_t name_len = get16(p + 28), extra_len = get16(p + 30), comment_len = get16(p + 32);
    uint64_t disk_start = get16(p + 34);
    e.local_header_offset = get32(p + 42);
    KUSARI_CHECK(
        static_cast<size_t>(cd_end - p) >= kCentralHeaderSize + name_len + extra_len + comment_len,
        IOError, where, " is corrupt: central directory entry ", i, " runs past the directory");
    e.name.assign(reinterpret_cast<const char*>(p + kCentralHeaderSize), name_len);
    // ZIP64 extra field: 8-byte values for exactly those fields that hold 0xFFFFFFFF (0xFFFF).
    const unsigned char* x = p + kCentralHeaderSize + name_len;
    const unsigned char* const x_end = x + extra_len;
    bool need_u = e.uncompressed_size == kMax32, need_c = e.compressed_size == kMax32;
    bool need_o = e.local_header_offset == kMax32, need_d = disk_start == kMax16;
    while (x_end - x >= 4) {
      const uint16_t id = get16(x), len = get16(x + 2);
      const unsigned char* v = x + 4;
      KUSARI_CHECK(x_end - v >= len, IOError, where,
                   " is corrupt: a malformed extra field in member '", e.name, "'");
      if (id == kZip64ExtraId) {
        const unsigned char* const v_end = v + len;
        auto take64 = [&](uint64_t& field) {
          KUSARI_CHECK(v_end - v >= 8, IOError, where,
                       " is corrupt: the ZIP64 extra field of member '", e.name, "' is too short");
          field = get64(v);
          v += 8;
        };
        if (need_u) take64(e.uncompressed_size);
        if (need_c) take64(e.compressed_size);
        if (need_o) take64(e.local_header_offset);
        need_u = need_c = need_o = false;
        if (need_d) {
          KUSARI_CHECK(v_end - v >= 4, IOError, where,
                       " is corrupt: the ZIP64 extra field of member '", e.name, "' is too short");
          disk_start = get32(v);
          need_d = false;
        }
      }
      x += 4 + len;
    }
    // Without a ZIP64 extra field, 0xFFFFFFFF values are taken literally.
    KUSARI_CHECK(disk_start == 0, IOError, where,
                 ": multi-disk (split) ZIP archives are not supported");
    KUSARI_CHECK(e.local_header_offset < cd_offset, IOError, where, " is corrupt: member '", e.name,
                 "' starts at byte ", e.local_header_offset,
                 ", inside or after the central directory");
    p += kCentralHeaderSize + name_len + extra_len + comment_len;
    entries_.push_back(std::move(e));
  }
  data_end_ = cd_offset;
}

// --- MemberReader -------------------------------------------------------------------------------

#if KUSARI_HAVE_ZLIB
struct ZipReader::MemberReader::Inflater {
  z_stream zs{};
  bool initialized = false;
  bool ended = false;
  std::vector<unsigned char> buffer = std::vector<unsigned char>(kChunk);
  ~Inflater() {
    if (initialized) inflateEnd(&zs);
  }
};
#else
struct ZipReader::MemberReader::Inflater {};
#endif

ZipReader::MemberReader::MemberReader(const ZipReader& zip, const ZipEntry& entry)
    : zip_(zip), entry_(entry) {
  const InputFile& f = zip_.file();
  unsigned char h[kLocalHeaderSize];
  f.read_at(entry_.local_header_offset, h, sizeof(h), "local file header");
  if (get32(h) != kLocalHeaderSignature) corrupt("bad local file header signature");
  const size_t name_len = get16(h + 26), extra_len = get16(h + 28);
  std::string name(name_len, '\0');
  f.read_at(entry_.local_header_offset + kLocalHeaderSize, name.data(), name_len,
            "local file header");
  if (name != entry_.name) corrupt("the local header names it '" + name + "'");
  data_offset_ = entry_.local_header_offset + kLocalHeaderSize + name_len + extra_len;
  if (data_offset_ > zip_.data_end_ || entry_.compressed_size > zip_.data_end_ - data_offset_) {
    corrupt("its " + std::to_string(entry_.compressed_size) + " bytes of data starting at byte " +
            std::to_string(data_offset_) +
            " run past the central directory (the archive is truncated or corrupt)");
  }
  if (entry_.flags & kFlagEncrypted) {
    KUSARI_THROW(IOError, zip_.caller(), ": '", f.path(), "': member '", entry_.name,
                 "' is encrypted; encrypted archives are not supported");
  }
  if (entry_.method == 0) {
    if (entry_.compressed_size != entry_.uncompressed_size) {
      corrupt("a stored member has compressed size " + std::to_string(entry_.compressed_size) +
              " but uncompressed size " + std::to_string(entry_.uncompressed_size));
    }
    return;
  }
  if (entry_.method != 8) {
    KUSARI_THROW(IOError, zip_.caller(), ": '", f.path(), "': member '", entry_.name,
                 "' uses unsupported compression method ", entry_.method, " (",
                 method_name(entry_.method), "); npz members must be stored (0) or deflated (8)");
  }
  // Deflate expands at most about 1032:1; a larger declared size is corruption, and believing it
  // would make the caller allocate memory for data that cannot exist.
  if (entry_.uncompressed_size / 1032 > entry_.compressed_size + 1) {
    corrupt("it declares " + std::to_string(entry_.uncompressed_size) + " bytes from only " +
            std::to_string(entry_.compressed_size) +
            " compressed bytes, more than deflate can produce");
  }
#if KUSARI_HAVE_ZLIB
  inflater_ = std::make_unique<Inflater>();
  if (inflateInit2(&inflater_->zs, -15) != Z_OK) {
    KUSARI_THROW(IOError, zip_.caller(), ": cannot start zlib decompression for '", f.path(), "'");
  }
  inflater_->initialized = true;
#else
  KUSARI_THROW(
      IOError, zip_.caller(), ": '", f.path(), "': member '", entry_.name,
      "' is deflated (compressed), but this build of kusari has no zlib; rebuild with zlib "
      "(see Note [npz without zlib]) or save the file uncompressed");
#endif
}

ZipReader::MemberReader::~MemberReader() = default;

void ZipReader::MemberReader::corrupt(const std::string& what) const {
  KUSARI_THROW(IOError, zip_.caller(), ": '", zip_.file().path(), "' is corrupt: member '",
               entry_.name, "': ", what);
}

void ZipReader::MemberReader::read(void* dst, size_t n) {
  if (n > remaining()) {
    corrupt("needed " + std::to_string(n) + " more bytes but only " + std::to_string(remaining()) +
            " of its declared " + std::to_string(entry_.uncompressed_size) + " remain");
  }
  auto* out = static_cast<unsigned char*>(dst);
  if (entry_.method == 0) {
    zip_.file().read_at(data_offset_ + consumed_, out, n, "member data");
    consumed_ += n;
  } else {
#if KUSARI_HAVE_ZLIB
    Inflater& inf = *inflater_;
    z_stream& zs = inf.zs;
    size_t done = 0;
    while (done < n) {
      if (inf.ended) {
        corrupt("its deflate stream ends after " + std::to_string(produced_ + done) +
                " of its declared " + std::to_string(entry_.uncompressed_size) + " bytes");
      }
      if (zs.avail_in == 0 && consumed_ < entry_.compressed_size) {
        const size_t take = static_cast<size_t>(
            std::min<uint64_t>(inf.buffer.size(), entry_.compressed_size - consumed_));
        zip_.file().read_at(data_offset_ + consumed_, inf.buffer.data(), take, "member data");
        consumed_ += take;
        zs.next_in = inf.buffer.data();
        zs.avail_in = static_cast<uInt>(take);
      }
      const size_t want = std::min<size_t>(n - done, size_t{1} << 30);
      zs.next_out = out + done;
      zs.avail_out = static_cast<uInt>(want);
      const int rc = inflate(&zs, Z_NO_FLUSH);
      const size_t got = want - zs.avail_out;
      done += got;
      if (rc == Z_STREAM_END) {
        inf.ended = true;
      } else if (rc == Z_BUF_ERROR || (rc == Z_OK && got == 0 && zs.avail_in == 0)) {
        if (zs.avail_in == 0 && consumed_ >= entry_.compressed_size) {
          corrupt("its compressed data ends early (truncated deflate stream)");
        }
      } else if (rc != Z_OK) {
        corrupt(std::string("invalid deflate data (") + (zs.msg ? zs.msg : "zlib error") + ")");
      }
    }
#endif
  }
  crc_ = crc32_update(crc_, out, n);
  produced_ += n;
}

void ZipReader::MemberReader::finish() {
  // Read (and checksum) whatever the caller did not need, e.g. padding after an array.
  std::vector<unsigned char> scratch;
  while (remaining() > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining(), kChunk));
    scratch.resize(take);
    read(scratch.data(), take);
  }
#if KUSARI_HAVE_ZLIB
  if (inflater_) {
    Inflater& inf = *inflater_;
    z_stream& zs = inf.zs;
    while (!inf.ended) {
      if (zs.avail_in == 0 && consumed_ < entry_.compressed_size) {
        const size_t take = static_cast<size_t>(
            std::min<uint64_t>(inf.buffer.size(), entry_.compressed_size - consumed_));
        zip_.file().read_at(data_offset_ + consumed_, inf.buffer.data(), take, "member data");
        consumed_ += take;
        zs.next_in = inf.buffer.data();
        zs.avail_in = static_cast<uInt>(take);
      }
      unsigned char extra;
      zs.next_out = &extra;
      zs.avail_out = 1;
      const int rc = inflate(&zs, Z_NO_FLUSH);
      if (zs.avail_out == 0) corrupt("it holds more data than its declared size");
      if (rc == Z_STREAM_END) {
        inf.ended = true;
      } else if (rc == Z_BUF_ERROR ||
                 (rc == Z_OK && zs.avail_in == 0 && consumed_ >= entry_.compressed_size)) {
        if (zs.avail_in == 0 && consumed_ >= entry_.compressed_size) {
          corrupt("its compressed data ends early (truncated deflate stream)");
        }
      } else if (rc != Z_OK) {
        corrupt(std::string("invalid deflate data (") + (zs.msg ? zs.msg : "zlib error") + ")");
      }
    }
  }
#endif
  if (crc_ != entry_.crc32) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "stored 0x%08x, computed 0x%08x", entry_.crc32, crc_);
    corrupt(std::string("CRC-32 mismatch (") + buf + "): its data is damaged");
  }
}

}  // namespace kusari::detail
