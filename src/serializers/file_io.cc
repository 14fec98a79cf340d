#include "serializers/file_io.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "kusari/core/error.h"
#include "kusari/serializers/npz.h"

namespace kusari::detail {

namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The process's umask without changing it (umask(2) can only be read by setting it, which would
// race with other threads creating files). Linux reports it in /proc/self/status.
mode_t current_umask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Umask:", 0) == 0)
      return static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8));
  }
  return 022;
}

// The temporary files that AtomicOutputFiles of this process are writing, by (device, inode):
// a cleaner in this process must not even open them, since on file systems that emulate flock
// with POSIX locks (NFS) closing its descriptor would drop the writer's lock.
class LiveTemporaries {
 public:
  void add(uint64_t dev, uint64_t ino) {
    std::lock_guard<std::mutex> lock(mutex_);
    files_.emplace(dev, ino);
  }
  void remove(uint64_t dev, uint64_t ino) {
    std::lock_guard<std::mutex> lock(mutex_);
    files_.erase({dev, ino});
  }
  bool contains(uint64_t dev, uint64_t ino) {
    std::lock_guard<std::mutex> lock(mutex_);
    return files_.count({dev, ino}) > 0;
  }

 private:
  std::mutex mutex_;
  std::set<std::pair<uint64_t, uint64_t>> files_;
};

LiveTemporaries& live_temporaries() {
  static LiveTemporaries* live = new LiveTemporaries;  // never destroyed: writers may outlive exit
  return *live;
}

// flock(2) retried when a signal interrupts it; 0 or -1 with errno.
int lock_file(int fd, int operation) {
  int r;
  do {
    r = ::flock(fd, operation);
  } while (r != 0 && errno == EINTR);
  return r;
}

constexpr std::string_view kTempInfix = ".tmp.";
constexpr size_t kTempRandomChars = 6;  // mkstemp's "XXXXXX"

bool is_alphanumeric(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

}  // namespace

std::optional<std::string> temporary_file_target(std::string_view name) {
  const size_t suffix = kTempInfix.size() + kTempRandomChars;
  if (name.size() < 2 + suffix || name[0] != '.') return std::nullopt;
  const std::string_view infix = name.substr(name.size() - suffix, kTempInfix.size());
  if (infix != kTempInfix) return std::nullopt;
  for (char c : name.substr(name.size() - kTempRandomChars)) {
    if (!is_alphanumeric(c)) return std::nullopt;
  }
  return std::string(name.substr(1, name.size() - 1 - suffix));
}

// --- InputFile --------------------------------------------------------------------------------

InputFile::InputFile(const std::string& path, const std::string& caller)
    : path_(path), caller_(caller) {
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) {
    const int err = errno;
    KUSARI_THROW(IOError, caller, ": cannot open '", path, "' for reading: ", errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    KUSARI_THROW(IOError, caller, ": cannot read '", path, "': ", errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    KUSARI_THROW(IOError, caller, ": '", path, "' is ",
                 S_ISDIR(st.st_mode) ? "a directory" : "not a regular file",
                 ", not an npz/npy file");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_at(uint64_t offset, void* dst, size_t n, const char* what) const {
  if (offset > size_ || n > size_ - offset) {
    KUSARI_THROW(IOError, caller_, ": '", path_, "' is truncated or corrupt: the ", what,
                 " at byte ", offset, " needs ", n, " bytes but the file has only ", size_,
                 " bytes");
  }
  char* p = static_cast<char*>(dst);
  size_t done = 0;
  while (done < n) {
    // Linux transfers at most about 2 GiB per call; larger requests simply loop.
    const ssize_t r = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      KUSARI_THROW(IOError, caller_, ": reading the ", what, " of '", path_,
                   "' failed: ", errno_text(err));
    }
    if (r == 0) {
      KUSARI_THROW(IOError, caller_, ": '", path_,
                   "' is truncated: the file ended while reading the ", what, " (", done, " of ", n,
                   " bytes at byte ", offset, ")");
    }
    done += static_cast<size_t>(r);
  }
}

// --- AtomicOutputFile ---------------------------------------------------------------------------

AtomicOutputFile::AtomicOutputFile(const std::string& path, const std::string& caller)
    : path_(path), caller_(caller), started_(std::filesystem::file_time_type::clock::now()) {
  KUSARI_CHECK(!path.empty(), IOError, caller, ": the file name is empty");
  KUSARI_CHECK(path.back() != '/', IOError, caller, ": '", path, "' names a directory, not a file");
  const size_t slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string templ_path = parent_directory(path) + "/." + base + ".tmp.XXXXXX";
  // Create the temporary file and lock it (Note [Stale temporary files]); a cleaner that took a
  // file created an instant ago is noticed, and another name is drawn.
  for (int attempt = 0;; ++attempt) {
    std::vector<char> templ(templ_path.begin(), templ_path.end());
    templ.push_back('\0');
    const int fd = ::mkostemp(templ.data(), O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      KUSARI_THROW(IOError, caller, ": cannot create a temporary file in '", parent_directory(path),
                   "' to write '", path, "': ", errno_text(err));
    }
    temp_path_.assign(templ.data());
    struct stat own {};
    (void)::fstat(fd, &own);
    dev_ = static_cast<uint64_t>(own.st_dev);
    ino_ = static_cast<uint64_t>(own.st_ino);
    live_temporaries().add(dev_, ino_);
    (void)lock_file(fd, LOCK_EX);  // where the file system cannot lock, the other rules protect it
    struct stat named {};
    if (::stat(temp_path_.c_str(), &named) == 0 && named.st_dev == own.st_dev &&
        named.st_ino == own.st_ino) {
      lock_fd_ = fd;
      break;
    }
    live_temporaries().remove(dev_, ino_);
    ::close(fd);
    KUSARI_CHECK(attempt < 10, IOError, caller, ": the temporary files created in '",
                 parent_directory(path), "' to write '", path,
                 "' keep disappearing (another process removes them)");
  }
  // mkstemp creates the file with mode 0600; give it the mode a plain open(2) would have given.
  struct stat st {};
  const mode_t mode =
      ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : (0666 & ~current_umask());
  (void)::fchmod(lock_fd_, mode);
  // The stream writes through a second descriptor of the same open file, so that closing it
  // before the rename keeps the lock (held by lock_fd_).
  const int fd = ::fcntl(lock_fd_, F_DUPFD_CLOEXEC, 0);
  file_ = fd >= 0 ? ::fdopen(fd, "wb") : nullptr;
  if (!file_) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(temp_path_.c_str());
    ::close(lock_fd_);
    live_temporaries().remove(dev_, ino_);
    KUSARI_THROW(IOError, caller, ": cannot open a temporary file to write '", path,
                 "': ", errno_text(err));
  }
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
}

AtomicOutputFile::~AtomicOutputFile() {
  if (file_) std::fclose(file_);
  if (lock_fd_ >= 0) {
    if (!committed_) ::unlink(temp_path_.c_str());
    ::close(lock_fd_);
    live_temporaries().remove(dev_, ino_);
  }
}

void AtomicOutputFile::fail(const std::string& what, int err) {
  KUSARI_THROW(IOError, caller_, ": writing '", path_, "' failed while ", what, ": ",
               errno_text(err), "; the previous contents of '", path_, "' (if any) are unchanged");
}

void AtomicOutputFile::write(const void* data, size_t n) {
  KUSARI_ASSERT(file_ && !committed_, "AtomicOutputFile::write after commit");
  if (n == 0) return;
  if (std::fwrite(data, 1, n, file_) != n) fail("writing data", errno);
  pos_ += n;
  end_ = std::max(end_, pos_);
}

void AtomicOutputFile::seek(uint64_t offset) {
  KUSARI_ASSERT(file_ && !committed_ && offset <= end_,
                "AtomicOutputFile::seek outside the written range");
  if (::fseeko(file_, static_cast<off_t>(offset), SEEK_SET) != 0) fail("seeking", errno);
  pos_ = offset;
}

void AtomicOutputFile::commit() {
  KUSARI_ASSERT(file_ && !committed_, "AtomicOutputFile::commit called twice");
  if (std::fflush(file_) != 0) fail("flushing", errno);
  if (::fsync(::fileno(file_)) != 0 && errno != EINVAL && errno != EROFS)
    fail("syncing to disk", errno);
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0) fail("closing", errno);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    KUSARI_THROW(IOError, caller_, ": cannot rename the temporary file '", temp_path_, "' to '",
                 path_, "': ", errno_text(err), "; the previous contents of '", path_,
                 "' (if any) are unchanged");
  }
  committed_ = true;
  ::close(lock_fd_);
  lock_fd_ = -1;
  live_temporaries().remove(dev_, ino_);
  // Make the rename itself durable; a failure here does not undo the (complete) new file.
  const int dir = ::open(parent_directory(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
  // What interrupted writes of this target left behind (Note [Stale temporary files]).
  const size_t slash = path_.find_last_of('/');
  const std::string base = slash == std::string::npos ? path_ : path_.substr(slash + 1);
  remove_stale_temporary_files(
      parent_directory(path_), [&base](const std::string& target) { return target == base; },
      started_);
}

}  // namespace kusari::detail

namespace kusari {

std::vector<std::string> remove_stale_temporary_files(
    const std::string& dir, const std::function<bool(const std::string& target)>& owns,
    std::filesystem::file_time_type modified_before) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path path = it->path();
    const std::string name = path.filename().string();
    const std::optional<std::string> target = detail::temporary_file_target(name);
    if (!target || !owns(*target)) continue;
    struct stat before {};
    if (::lstat(path.c_str(), &before) != 0 || !S_ISREG(before.st_mode)) continue;
    std::error_code time_ec;
    const fs::file_time_type modified = fs::last_write_time(path, time_ec);
    if (time_ec || modified >= modified_before) continue;
    if (detail::live_temporaries().contains(static_cast<uint64_t>(before.st_dev),
                                            static_cast<uint64_t>(before.st_ino))) {
      continue;
    }
    // Read-write where possible: NFS's emulation of flock needs it for an exclusive lock.
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    if (detail::lock_file(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
      ::close(fd);  // a running writer holds it
      continue;
    }
    struct stat opened {}, now {};
    if (::fstat(fd, &opened) == 0 && ::lstat(path.c_str(), &now) == 0 &&
        opened.st_dev == now.st_dev && opened.st_ino == now.st_ino &&
        opened.st_ino == before.st_ino && ::unlink(path.c_str()) == 0) {
      removed.push_back(name);
    }
    ::close(fd);
  }
  return removed;
}

}  // namespace kusari
