// Internal ZIP archive reader and writer for .npz files (PKWARE APPNOTE 6.3: local file headers,
// central directory, end-of-central-directory record, ZIP64 extensions). Members are stored
// (method 0) or deflated (method 8, raw deflate through zlib). Not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "serializers/file_io.h"

namespace kusari::detail {

// Note [ZIP64 in npz files]
// A ZIP archive stores sizes and offsets in 32-bit fields and the number of members in 16-bit
// fields. A large model (a 1.2 GiB embedding table is one array) or a snapshot with more than
// 65535 arrays overflows them, so the writer adds ZIP64 records exactly when needed:
// - a member whose size (or deflate's worst-case compressed size) does not fit in 32 bits gets a
//   ZIP64 extra field in its local header (both sizes, 32-bit fields set to 0xFFFFFFFF) and in its
//   central directory entry; whether it is needed is decided before the data is written, since
//   the local header precedes the data;
// - a member whose local header starts at or beyond 4 GiB gets its offset in a central ZIP64
//   extra field;
// - more than 65534 members, or a central directory beyond or larger than 4 GiB, adds the ZIP64
//   end-of-central-directory record and locator before the classic record, whose overflowing
//   fields then hold 0xFFFF / 0xFFFFFFFF.
// This is what Python's zipfile (and so NumPy) reads and writes. The reader accepts ZIP64 records
// wherever the specification allows them. Dates are fixed at 1980-01-01 00:00 so that saving the
// same arrays twice gives byte-identical files.

/// One member of an archive, as described by the central directory.
struct ZipEntry {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint64_t local_header_offset = 0;
};

/// Writes a ZIP archive member by member into an AtomicOutputFile.
class ZipWriter {
 public:
  /// `force_zip64` writes every ZIP64 record even when not needed (for tests).
  ZipWriter(AtomicOutputFile& out, std::string caller, bool force_zip64 = false);
  ~ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  /// Starts a member of exactly `size` uncompressed bytes; `compress` deflates it (stored
  /// instead when kusari was built without zlib, see Note [npz without zlib]).
  void begin_member(const std::string& name, uint64_t size, bool compress);
  /// Appends data to the current member.
  void write(const void* data, size_t n);
  /// Finishes the current member and patches its local header with the CRC and sizes.
  void end_member();
  /// Writes the central directory and the end records. The archive is complete afterwards.
  void finish();

 private:
  struct Deflater;
  void emit(const void* data, size_t n);

  AtomicOutputFile& out_;
  std::string caller_;
  bool force_zip64_;
  std::vector<ZipEntry> entries_;
  std::vector<bool> local_zip64_;
  bool in_member_ = false;
  uint64_t written_ = 0;  // uncompressed bytes of the current member
  uint32_t crc_ = 0;
  std::unique_ptr<Deflater> deflater_;
  bool finished_ = false;
};

/// Reads the central directory of a ZIP archive and streams its members.
class ZipReader {
 public:
  /// Parses the end records and the central directory of `file`; throws IOError when they are
  /// missing, truncated or malformed.
  explicit ZipReader(std::shared_ptr<const InputFile> file, std::string caller);

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const InputFile& file() const { return *file_; }
  const std::string& caller() const { return caller_; }

  /// Streams one member's uncompressed bytes, checking its size and CRC-32.
  class MemberReader {
   public:
    MemberReader(const ZipReader& zip, const ZipEntry& entry);
    ~MemberReader();
    MemberReader(const MemberReader&) = delete;
    MemberReader& operator=(const MemberReader&) = delete;
    /// Reads exactly `n` more uncompressed bytes; throws IOError when the member ends first or
    /// its data is corrupt.
    void read(void* dst, size_t n);
    /// Uncompressed bytes not yet read.
    uint64_t remaining() const { return entry_.uncompressed_size - produced_; }
    /// Checks that the whole member was read and that its CRC-32 matches.
    void finish();

   private:
    struct Inflater;
    [[noreturn]] void corrupt(const std::string& what) const;

    const ZipReader& zip_;
    ZipEntry entry_;
    uint64_t data_offset_ = 0;
    uint64_t consumed_ = 0;  // compressed bytes taken from the file
    uint64_t produced_ = 0;  // uncompressed bytes handed out
    uint32_t crc_ = 0;
    std::unique_ptr<Inflater> inflater_;
  };

 private:
  std::shared_ptr<const InputFile> file_;
  std::string caller_;
  std::vector<ZipEntry> entries_;
  uint64_t data_end_ = 0;  // where member data must end: the start of the central directory
};

}  // namespace kusari::detail
