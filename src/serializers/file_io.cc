#include "serializers/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "kusari/core/error.h"

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

}  // namespace

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
    : path_(path), caller_(caller) {
  KUSARI_CHECK(!path.empty(), IOError, caller, ": the file name is empty");
  KUSARI_CHECK(path.back() != '/', IOError, caller, ": '", path, "' names a directory, not a file");
  const size_t slash = path.find_last_of('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  temp_path_ = parent_directory(path) + "/." + base + ".tmp.XXXXXX";
  std::vector<char> templ(temp_path_.begin(), temp_path_.end());
  templ.push_back('\0');
  const int fd = ::mkostemp(templ.data(), O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    KUSARI_THROW(IOError, caller, ": cannot create a temporary file in '", parent_directory(path),
                 "' to write '", path, "': ", errno_text(err));
  }
  temp_path_.assign(templ.data());
  // mkstemp creates the file with mode 0600; give it the mode a plain open(2) would have given.
  struct stat st {};
  const mode_t mode =
      ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : (0666 & ~current_umask());
  (void)::fchmod(fd, mode);
  file_ = ::fdopen(fd, "wb");
  if (!file_) {
    const int err = errno;
    ::close(fd);
    ::unlink(temp_path_.c_str());
    KUSARI_THROW(IOError, caller, ": cannot open a temporary file to write '", path,
                 "': ", errno_text(err));
  }
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
}

AtomicOutputFile::~AtomicOutputFile() {
  if (file_) std::fclose(file_);
  if (!committed_) ::unlink(temp_path_.c_str());
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
  // Make the rename itself durable; a failure here does not undo the (complete) new file.
  const int dir = ::open(parent_directory(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    (void)::fsync(dir);
    ::close(dir);
  }
}

}  // namespace kusari::detail
