// Internal file helpers for the npz serializers: a read-only file with positioned reads and an
// atomically replaced output file. Not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

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
// does not make it look like a snapshot to code that globs for "snapshot_iter_*". While it is
// being written the temporary file is locked (flock) and listed as this process's own, and a
// successful commit() removes what interrupted writes of the same target left behind; see
// Note [Stale temporary files].

// Note [Stale temporary files]
// A writer killed between creating its temporary file and renaming it (SIGKILL, the OOM killer, a
// job's time limit, a node that fails) leaves ".<target>.tmp.XXXXXX" behind, and nothing else
// ever removes it: a preempted job that snapshots a large model fills its quota with them (40
// kills during the snapshots of a model of 3,000 units left 1.6 GB). So the writers remove them
// through remove_stale_temporary_files (kusari/serializers/npz.h): AtomicOutputFile::commit those
// of its own target, the snapshot extension those of its file name pattern when it starts and
// after each write, the multi-node checkpointer this rank's when it starts and at each garbage
// collection.
// Several processes may write into one folder (the ranks of a job, each under its own names; by
// mistake, two jobs under the same names), so a file is removed only when it cannot belong to a
// write that is still running:
//  - its name is exactly a dot, a target name that the caller owns, ".tmp." and six letters or
//    digits (what mkstemp draws): other names -- another rank's, another extension's, a log's --
//    are never touched;
//  - it was last modified before the caller's reference time (the start of the write that
//    cleans up, or of the extension): a running write keeps touching its file, and a file created
//    an instant ago, before its writer has locked it, is left alone;
//  - it is not the temporary file of a write running in this process (their inodes are listed);
//  - no process holds its lock: AtomicOutputFile holds flock(LOCK_EX) on its temporary file from
//    its creation until it is renamed or removed, the kernel drops the lock however the writer
//    dies, and the cleaner removes a file only while holding that lock itself (taken without
//    waiting). Where the file system cannot lock (flock fails with another error than
//    EWOULDBLOCK), the other rules decide.
// A writer whose fresh file was removed in the instant before it took the lock notices (its name
// no longer leads to its file) and creates another one.

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
  // A second descriptor of the temporary file that holds its lock until the file is renamed or
  // removed (closing file_ must not release it; Note [Stale temporary files]).
  int lock_fd_ = -1;
  // The temporary file's device and inode, listed as written by this process while it is open.
  uint64_t dev_ = 0, ino_ = 0;
  // When the write began: temporary files of the same target last modified before it are stale.
  std::filesystem::file_time_type started_;
  uint64_t pos_ = 0;
  uint64_t end_ = 0;
  bool committed_ = false;
};

/// The target of a temporary file name of AtomicOutputFile: "snapshot_iter_100" for
/// ".snapshot_iter_100.tmp.Ab12Cd" (a dot, the target, ".tmp." and the six letters or digits
/// that mkstemp draws); nullopt for any other name.
std::optional<std::string> temporary_file_target(std::string_view name);

}  // namespace kusari::detail
