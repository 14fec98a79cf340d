#include "serializers/zip.h"

#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "kusari/core/error.h"

namespace kusari::detail {

namespace {

constexpr uint16_t kDosDate1980 = (0 << 9) | (1 << 5) | 1;  // 1980-01-01
constexpr uint32_t kExternalAttrRegularFile = 0100644u << 16;
constexpr size_t kEndRecordSize = 22;

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

// The message of a libzip error code (with the system error, where it has one).
std::string zip_error_text(zip_error_t* error) {
  return zip_error_strerror(error);
}

std::string zip_error_text(int code) {
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  std::string text = zip_error_strerror(&error);
  zip_error_fini(&error);
  return text;
}

// The archive being written: a libzip write source over an AtomicOutputFile. libzip writes the
// local headers, seeks back to complete them, and appends the central directory; committing the
// file is left to the caller once zip_close has succeeded. See Note [npz through libzip].
struct ArchiveSink {
  AtomicOutputFile& out;
  zip_error_t error;
  std::exception_ptr exception;  // an IOError of the file, raised again after zip_close
  bool removed = false;          // libzip found no members and asked to remove the archive
};

zip_int64_t archive_callback(void* userdata, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
  auto& sink = *static_cast<ArchiveSink*>(userdata);
  try {
    switch (cmd) {
      case ZIP_SOURCE_SUPPORTS:
        return ZIP_SOURCE_SUPPORTS_WRITABLE;
      case ZIP_SOURCE_STAT:
        // A new archive: there is nothing to read, so libzip starts an empty one.
        zip_error_set(&sink.error, ZIP_ER_READ, ENOENT);
        return -1;
      case ZIP_SOURCE_BEGIN_WRITE:
      case ZIP_SOURCE_COMMIT_WRITE:
      case ZIP_SOURCE_ROLLBACK_WRITE:  // AtomicOutputFile removes its temporary file
      case ZIP_SOURCE_FREE:
        return 0;
      case ZIP_SOURCE_REMOVE:
        sink.removed = true;
        return 0;
      case ZIP_SOURCE_WRITE:
        sink.out.write(data, static_cast<size_t>(len));
        return static_cast<zip_int64_t>(len);
      case ZIP_SOURCE_SEEK_WRITE: {
        const zip_int64_t to =
            zip_source_seek_compute_offset(sink.out.tell(), sink.out.size(), data, len, &sink.error);
        if (to < 0) return -1;
        sink.out.seek(static_cast<uint64_t>(to));
        return 0;
      }
      case ZIP_SOURCE_TELL_WRITE:
        return static_cast<zip_int64_t>(sink.out.tell());
      case ZIP_SOURCE_ERROR:
        return zip_error_to_data(&sink.error, data, len);
      default:
        // Reading the archive back: never needed, since every member is new.
        zip_error_set(&sink.error, ZIP_ER_OPNOTSUPP, 0);
        return -1;
    }
  } catch (...) {
    sink.exception = std::current_exception();
    zip_error_set(&sink.error, ZIP_ER_WRITE, 0);
    return -1;
  }
}

}  // namespace

// --- ZipWriter ----------------------------------------------------------------------------------

/// A member being written: the libzip read source of its bytes.
struct ZipWriter::Member {
  std::string name;
  uint64_t size = 0;
  bool compress = false;
  bool tell_size = true;
  std::function<ZipMemberBytes()> produce;
  ZipMemberBytes bytes;  // while libzip reads the member
  size_t piece = 0;      // the piece being read, and how far
  size_t offset = 0;
  uint64_t produced = 0;
  zip_error_t error;
  std::exception_ptr exception;  // raised by produce (e.g. copying an array off a GPU)

  Member() { zip_error_init(&error); }
  ~Member() { zip_error_fini(&error); }

  zip_int64_t read(void* dst, size_t len) {
    auto* out = static_cast<char*>(dst);
    size_t done = 0;
    while (done < len && piece < bytes.pieces.size()) {
      const auto& [data, n] = bytes.pieces[piece];
      const size_t take = std::min(len - done, n - offset);
      std::memcpy(out + done, static_cast<const char*>(data) + offset, take);
      done += take;
      offset += take;
      if (offset == n) {
        ++piece;
        offset = 0;
      }
    }
    produced += done;
    KUSARI_ASSERT(done > 0 || produced == size, "ZipWriter: member '", name, "' produced ",
                  produced, " bytes but was declared with ", size);
    return static_cast<zip_int64_t>(done);
  }
};

namespace {

zip_int64_t member_callback(void* userdata, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
  auto& m = *static_cast<ZipWriter::Member*>(userdata);
  try {
    switch (cmd) {
      case ZIP_SOURCE_SUPPORTS:
        return zip_source_make_command_bitmap(ZIP_SOURCE_OPEN, ZIP_SOURCE_READ, ZIP_SOURCE_CLOSE,
                                              ZIP_SOURCE_STAT, ZIP_SOURCE_ERROR, ZIP_SOURCE_FREE,
                                              ZIP_SOURCE_SUPPORTS, -1);
      case ZIP_SOURCE_STAT: {
        auto* st = static_cast<zip_stat_t*>(data);
        zip_stat_init(st);
        if (m.tell_size) {
          st->size = m.size;
          st->valid |= ZIP_STAT_SIZE;
        }
        return sizeof(zip_stat_t);
      }
      case ZIP_SOURCE_OPEN:
        m.bytes = m.produce();
        m.piece = m.offset = 0;
        m.produced = 0;
        return 0;
      case ZIP_SOURCE_READ:
        return m.read(data, static_cast<size_t>(len));
      case ZIP_SOURCE_CLOSE:
        m.bytes = ZipMemberBytes{};  // the member is written: release its bytes
        return 0;
      case ZIP_SOURCE_FREE:
        return 0;  // the Member belongs to the ZipWriter
      case ZIP_SOURCE_ERROR:
        return zip_error_to_data(&m.error, data, len);
      default:
        zip_error_set(&m.error, ZIP_ER_OPNOTSUPP, 0);
        return -1;
    }
  } catch (...) {
    m.exception = std::current_exception();
    m.bytes = ZipMemberBytes{};
    zip_error_set(&m.error, ZIP_ER_INTERNAL, 0);
    return -1;
  }
}

}  // namespace

ZipWriter::ZipWriter(AtomicOutputFile& out, std::string caller, bool force_zip64)
    : out_(out), caller_(std::move(caller)), force_zip64_(force_zip64) {}

ZipWriter::~ZipWriter() = default;

void ZipWriter::add(const std::string& name, uint64_t size, bool compress,
                    std::function<ZipMemberBytes()> produce) {
  auto m = std::make_unique<Member>();
  m->name = name;
  m->size = size;
  m->compress = compress;
  m->tell_size = !force_zip64_;
  m->produce = std::move(produce);
  members_.push_back(std::move(m));
}

void ZipWriter::finish() {
  ArchiveSink sink{out_, {}, nullptr, false};
  zip_error_init(&sink.error);
  auto fail = [&](const std::string& what, zip_error_t* error) {
    const std::string text = zip_error_text(error);
    zip_error_fini(&sink.error);
    KUSARI_THROW(IOError, caller_, ": writing '", out_.path(), "' failed while ", what, ": ",
                 text, "; the previous contents of '", out_.path(), "' (if any) are unchanged");
  };

  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* source = zip_source_function_create(archive_callback, &sink, &error);
  if (!source) fail("starting the archive", &error);
  zip_t* archive = zip_open_from_source(source, ZIP_CREATE | ZIP_TRUNCATE, &error);
  if (!archive) {
    zip_source_free(source);
    fail("starting the archive", &error);
  }
  zip_error_fini(&error);

  // Discards the archive (and with it every member source) on the way out of a failure.
  auto discard = [&] {
    zip_discard(archive);
    zip_error_fini(&sink.error);
  };
  for (const auto& m : members_) {
    zip_source_t* member = zip_source_function(archive, member_callback, m.get());
    zip_int64_t index = member ? zip_file_add(archive, m->name.c_str(), member, ZIP_FL_ENC_UTF_8) : -1;
    if (index < 0) {
      if (member) zip_source_free(member);
      const std::string text = zip_error_text(zip_get_error(archive));
      discard();
      KUSARI_THROW(ValueError, caller_, ": cannot write '", out_.path(), "': cannot add the member '",
                   m->name, "': ", text, " (names must be valid UTF-8)");
    }
    const auto i = static_cast<zip_uint64_t>(index);
    if (zip_set_file_compression(archive, i, m->compress ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) < 0 ||
        zip_file_set_dostime(archive, i, 0, kDosDate1980, 0) < 0 ||
        zip_file_set_external_attributes(archive, i, 0, ZIP_OPSYS_UNIX,
                                         kExternalAttrRegularFile) < 0) {
      const std::string text = zip_error_text(zip_get_error(archive));
      discard();
      KUSARI_THROW(IOError, caller_, ": cannot write '", out_.path(), "': member '", m->name,
                   "': ", text);
    }
  }

  if (zip_close(archive) < 0) {
    // Raise what a member or the file raised itself, where it did.
    std::exception_ptr cause = sink.exception;
    for (const auto& m : members_) {
      if (!cause && m->exception) cause = m->exception;
    }
    const std::string text = zip_error_text(zip_get_error(archive));
    discard();
    if (cause) std::rethrow_exception(cause);
    KUSARI_THROW(IOError, caller_, ": writing '", out_.path(), "' failed: ", text,
                 "; the previous contents of '", out_.path(), "' (if any) are unchanged");
  }
  zip_error_fini(&sink.error);
  if (sink.removed) {
    // An archive of no members: the end-of-central-directory record alone.
    const char end[kEndRecordSize] = {'P', 'K', 5, 6};
    out_.write(end, sizeof(end));
  }
}

// --- ZipReader ----------------------------------------------------------------------------------

ZipReader::ZipReader(std::shared_ptr<const InputFile> file, std::string caller)
    : file_(std::move(file)), caller_(std::move(caller)) {
  const InputFile& f = *file_;
  const std::string where = caller_ + ": '" + f.path() + "'";
  auto not_zip = [&](const std::string& why) {
    std::string hint;
    if (f.size() >= 6) {
      char magic[6];
      f.read_at(0, magic, 6, "file signature");
      if (std::memcmp(magic, "\x93NUMPY", 6) == 0)
        hint = " (it is a single .npy array; use read_npy)";
    }
    KUSARI_THROW(IOError, where, " is not a valid npz (ZIP) archive: ", why, hint);
  };
  if (f.size() < kEndRecordSize) not_zip("it has only " + std::to_string(f.size()) + " bytes");

  // libzip takes its own descriptor (and closes it); InputFile keeps reading with pread.
  const int fd = ::dup(f.fd());
  if (fd < 0) {
    const int err = errno;
    KUSARI_THROW(IOError, where, ": cannot read it: ", std::strerror(err));
  }
  int code = 0;
  archive_ = zip_fdopen(fd, 0, &code);
  if (!archive_) {
    ::close(fd);
    switch (code) {
      case ZIP_ER_NOZIP:
        not_zip(
            "no end-of-central-directory record was found (the file is truncated, or it is not a "
            "ZIP file)");
        break;
      case ZIP_ER_MULTIDISK:
        KUSARI_THROW(IOError, where, ": multi-disk (split) ZIP archives are not supported");
      case ZIP_ER_INCONS:
        KUSARI_THROW(IOError, where, " is truncated or corrupt: its central directory is ",
                     "inconsistent (", zip_error_text(code), ")");
      default:
        KUSARI_THROW(IOError, where, " cannot be read as a ZIP archive: ", zip_error_text(code));
    }
  }
  const zip_int64_t n = zip_get_num_entries(archive_, 0);
  entries_.reserve(static_cast<size_t>(std::max<zip_int64_t>(n, 0)));
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    const auto index = static_cast<zip_uint64_t>(i);
    constexpr zip_uint64_t kNeeded =
        ZIP_STAT_NAME | ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD;
    if (zip_stat_index(archive_, index, 0, &st) < 0 || (st.valid & kNeeded) != kNeeded) {
      const std::string text = zip_error_text(zip_get_error(archive_));
      zip_discard(archive_);
      KUSARI_THROW(IOError, where, " is corrupt: central directory entry ", i, " of ", n,
                   " is malformed (", text, ")");
    }
    ZipEntry e;
    e.name = st.name;
    e.index = index;
    e.method = st.comp_method;
    e.encrypted = (st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE;
    e.compressed_size = st.comp_size;
    e.uncompressed_size = st.size;
    entries_.push_back(std::move(e));
  }
}

ZipReader::~ZipReader() {
  zip_discard(archive_);
}

// --- MemberReader -------------------------------------------------------------------------------

ZipReader::MemberReader::MemberReader(const ZipReader& zip, const ZipEntry& entry)
    : zip_(zip), entry_(entry), lock_(zip.mutex_) {
  const std::string& path = zip_.file().path();
  if (entry_.encrypted) {
    KUSARI_THROW(IOError, zip_.caller(), ": '", path, "': member '", entry_.name,
                 "' is encrypted; encrypted archives are not supported");
  }
  if (entry_.method != ZIP_CM_STORE && entry_.method != ZIP_CM_DEFLATE) {
    KUSARI_THROW(IOError, zip_.caller(), ": '", path, "': member '", entry_.name,
                 "' uses unsupported compression method ", entry_.method, " (",
                 method_name(entry_.method), "); npz members must be stored (0) or deflated (8)");
  }
  if (entry_.method == ZIP_CM_STORE && entry_.compressed_size != entry_.uncompressed_size) {
    corrupt("a stored member has compressed size " + std::to_string(entry_.compressed_size) +
            " but uncompressed size " + std::to_string(entry_.uncompressed_size));
  }
  // Deflate expands at most about 1032:1; a larger declared size is corruption, and believing it
  // would make the caller allocate memory for data that cannot exist.
  if (entry_.method == ZIP_CM_DEFLATE &&
      entry_.uncompressed_size / 1032 > entry_.compressed_size + 1) {
    corrupt("it declares " + std::to_string(entry_.uncompressed_size) + " bytes from only " +
            std::to_string(entry_.compressed_size) +
            " compressed bytes, more than deflate can produce");
  }
  file_ = zip_fopen_index(zip_.archive_, entry_.index, 0);
  if (!file_) {
    corrupt("its local header cannot be read (" + zip_error_text(zip_get_error(zip_.archive_)) +
            "; the archive is truncated or corrupt)");
  }
}

ZipReader::MemberReader::~MemberReader() {
  if (file_) zip_fclose(file_);
}

void ZipReader::MemberReader::corrupt(const std::string& what) const {
  KUSARI_THROW(IOError, zip_.caller(), ": '", zip_.file().path(), "' is corrupt: member '",
               entry_.name, "': ", what);
}

void ZipReader::MemberReader::read_failed() const {
  zip_error_t* error = zip_file_get_error(file_);
  switch (zip_error_code_zip(error)) {
    case ZIP_ER_CRC:
      corrupt("CRC-32 mismatch: its data is damaged");
    case ZIP_ER_ZLIB:
    case ZIP_ER_COMPRESSED_DATA:
      corrupt("invalid deflate data (" + zip_error_text(error) + ")");
    case ZIP_ER_EOF:
      corrupt("its data runs past the end of the file (the archive is truncated)");
    case ZIP_ER_INCONS:
      corrupt("its data does not match its declared size (" + zip_error_text(error) + ")");
    default:
      KUSARI_THROW(IOError, zip_.caller(), ": reading member '", entry_.name, "' of '",
                   zip_.file().path(), "' failed: ", zip_error_text(error));
  }
}

void ZipReader::MemberReader::read(void* dst, size_t n) {
  if (n > remaining()) {
    corrupt("needed " + std::to_string(n) + " more bytes but only " + std::to_string(remaining()) +
            " of its declared " + std::to_string(entry_.uncompressed_size) + " remain");
  }
  auto* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    // At most 1 GiB per call: libzip 1.7 hands a larger request to zlib in one piece, whose
    // 32-bit counts then wrap (a 4 GiB deflated member came back one byte long).
    const size_t want = std::min<size_t>(n - done, size_t{1} << 30);
    const zip_int64_t got = zip_fread(file_, out + done, want);
    if (got < 0) read_failed();
    if (got == 0) {
      corrupt("its data ends after " + std::to_string(produced_ + done) + " of its declared " +
              std::to_string(entry_.uncompressed_size) + " bytes");
    }
    done += static_cast<size_t>(got);
  }
  produced_ += n;
}

void ZipReader::MemberReader::finish() {
  // Read whatever the caller did not need (e.g. padding after an array), then once more: libzip
  // checks the CRC-32 and the size when it reaches the end of the member.
  std::vector<char> scratch;
  while (remaining() > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining(), 1 << 18));
    scratch.resize(take);
    read(scratch.data(), take);
  }
  char extra;
  const zip_int64_t got = zip_fread(file_, &extra, 1);
  if (got < 0) read_failed();
  if (got > 0) corrupt("it holds more data than its declared size");
}

}  // namespace kusari::detail
