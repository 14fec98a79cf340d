// Internal file helpers for the npz serializers: a read-only file with positioned reads and an
// atomically replaced output file. Not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace kusari::detail {

/// A file opened for reading with positioned reads (pread); closed on destruction.
class InputFile {
 public:
  /// Opens `path`; throws IOError naming `caller` and the path when it cannot be opened.
  InputFile(const std::string& path, const std::string& caller);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  /// The size of the file in bytes (when it was opened).
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  /// The open descriptor (owned by this object).
  int fd() const { return fd_; }
  /// Reads exactly `n` bytes at `offset`; throws IOError ("truncated") when the file ends first.
  void read_at(uint64_t offset, void* dst, size_t n, const char* what) const;

 private:
  std::string path_;
  std::string caller_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Note [Atomic file replacement]
// save_npz must never leave a half-written file where a good snapshot used to be: a job killed
// while checkpointing (wall-clock limit, node failure) would otherwise lose both the old and the
// new snapshot. AtomicOutputFile writes to a fresh temporary file in the target's directory
// (same file system, so rename(2) is atomic), flushes and fsyncs it, and only then renames it over
// the target. If anything fails before commit() -- an exception while encoding, a full disk, a
// file-size limit -- the destructor removes the temporary file and the target is untouched.
// The temporary file gets the permissions the target would get from open(2) (0666 & ~umask), or
// the existing target's permissions, so replacing a file does not silently change its mode. Its
// name starts with a dot (".snapshot_iter_100.tmp.Ab12Cd") so that a crash that leaves it behind
// does not make it look like a snapshot to code that globs for "snapshot_iter_*".

/// An output file that replaces `path` only when commit() succeeds. See Note [Atomic file
/// replacement].
class AtomicOutputFile {
 public:
  /// Creates the temporary file beside `path`; throws IOError naming `caller` on failure.
  AtomicOutputFile(const std::string& path, const std::string& caller);
  /// Removes the temporary file unless commit() succeeded.
  ~AtomicOutputFile();
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  /// Writes `n` bytes at the current position.
  void write(const void* data, size_t n);
  /// The current position (bytes written so far, unless seek() moved it).
  uint64_t tell() const { return pos_; }
  /// The bytes written so far (the end of the file).
  uint64_t size() const { return end_; }
  /// Moves the position to `offset`, within what was written.
  void seek(uint64_t offset);
  /// Flushes, syncs and renames the temporary file over the target.
  void commit();
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);

  std::string path_;
  std::string temp_path_;
  std::string caller_;
  std::FILE* file_ = nullptr;
  uint64_t pos_ = 0;
  uint64_t end_ = 0;
  bool committed_ = false;
};

}  // namespace kusari::detail
