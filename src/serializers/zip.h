// Internal ZIP archive reader and writer for .npz files, built on libzip. Not part of the public
// API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "serializers/file_io.h"

struct zip;
struct zip_file;

namespace kusari::detail {

// Note [npz through libzip]
// libzip reads and writes the ZIP container of npz files: local headers, the central directory,
// ZIP64 records (added exactly when a size, an offset or the member count needs them, which is
// what Python's zipfile and so NumPy read), CRC-32 and raw deflate through zlib. kusari keeps
// three things around it:
// - The archive is written through a libzip source of our own (zip_source_function) onto an
//   AtomicOutputFile, not through zip_open(path): libzip's own temporary file is neither synced
//   to disk nor hidden from "snapshot_iter_*" globs, see Note [Atomic file replacement].
// - Members are libzip sources too, pulled one after the other when the archive is written, and a
//   member's bytes are produced only when libzip opens it and released when it closes it. So a
//   model on a GPU reaches the host one array at a time and a large model is never held twice.
//   Each member states its exact size up front, which is how libzip decides before writing the
//   data whether the local header needs ZIP64 fields.
// - Every member gets the date 1980-01-01 00:00 and mode 0644, so that saving the same arrays
//   twice gives byte-identical files; libzip would otherwise stamp the current time.
// libzip writes no archive at all when it has no members (it removes the file instead); an npz of
// no arrays is the 22-byte end-of-central-directory record alone, which ZipWriter writes itself.

/// One member of an archive, as described by the central directory.
struct ZipEntry {
  std::string name;
  uint64_t index = 0;  // libzip's index of the member
  uint16_t method = 0;
  bool encrypted = false;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
};

/// The bytes of one member: `pieces` in order, kept alive by `owner` until libzip has read them.
struct ZipMemberBytes {
  std::shared_ptr<const void> owner;
  std::vector<std::pair<const void*, size_t>> pieces;
};

/// Writes a ZIP archive into an AtomicOutputFile (which the caller commits). See Note [npz
/// through libzip].
class ZipWriter {
 public:
  /// `force_zip64` gives every member ZIP64 fields in its local header even when not needed (for
  /// tests): the member's size is then not told to libzip in advance.
  ZipWriter(AtomicOutputFile& out, std::string caller, bool force_zip64 = false);
  ~ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  /// Adds a member of exactly `size` uncompressed bytes, deflated when `compress`. `produce` is
  /// called when finish() reaches the member, and its bytes are released when the member is done.
  void add(const std::string& name, uint64_t size, bool compress,
           std::function<ZipMemberBytes()> produce);
  /// Writes every member, the central directory and the end records into the output file.
  void finish();

  struct Member;

 private:
  AtomicOutputFile& out_;
  std::string caller_;
  bool force_zip64_;
  std::vector<std::unique_ptr<Member>> members_;
};

/// Reads the central directory of a ZIP archive and streams its members.
class ZipReader {
 public:
  /// Opens the archive in `file`; throws IOError naming `caller` and the file when it is not a
  /// ZIP archive or its directory is truncated or malformed.
  ZipReader(std::shared_ptr<const InputFile> file, std::string caller);
  ~ZipReader();
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  const std::vector<ZipEntry>& entries() const { return entries_; }
  const InputFile& file() const { return *file_; }
  const std::string& caller() const { return caller_; }

  /// Streams one member's uncompressed bytes; libzip checks its size and CRC-32. One member of an
  /// archive is read at a time (libzip's archive handle is not shared between threads): a
  /// MemberReader holds the archive's lock while it lives.
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
    /// Reads the rest and checks that the member ends at its declared size with a matching
    /// CRC-32.
    void finish();

   private:
    [[noreturn]] void corrupt(const std::string& what) const;
    [[noreturn]] void read_failed() const;

    const ZipReader& zip_;
    ZipEntry entry_;
    std::unique_lock<std::mutex> lock_;
    zip_file* file_ = nullptr;
    uint64_t produced_ = 0;  // uncompressed bytes handed out
  };

 private:
  std::shared_ptr<const InputFile> file_;
  std::string caller_;
  zip* archive_ = nullptr;
  std::vector<ZipEntry> entries_;
  mutable std::mutex mutex_;
};

}  // namespace kusari::detail
