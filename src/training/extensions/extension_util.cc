#include "training/extensions/extension_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#include "kusari/core/error.h"
#include "kusari/training/terminal.h"

namespace kusari::training::detail {

void write_file_atomically(const std::string& path, std::string_view data, const char* fn) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  KUSARI_CHECK(!ec, IOError, fn, ": cannot create the folder '", dir.string(), "' for '", path,
               "': ", ec.message());
  // mkstemp gives a unique name, so concurrent writers (e.g. ranks sharing a folder) never collide.
  std::string base = ".";
  base += target.filename().string();
  base += ".tmp.XXXXXX";
  const std::string tmpl = (dir / base).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  KUSARI_CHECK(fd >= 0, IOError, fn, ": cannot create a temporary file next to '", path,
               "': ", std::strerror(errno));
  const std::string tmp(name.data());
  auto fail = [&](const char* what) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    KUSARI_THROW(IOError, fn, ": ", what, " '", tmp, "' (for '", path, "'): ", std::strerror(err));
  };
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write");
    }
    done += static_cast<size_t>(n);
  }
  // mkstemp creates the file as 0600; logs and plots are meant to be read by others too.
  ::fchmod(fd, 0644);
  if (::fsync(fd) != 0) fail("cannot flush");
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    KUSARI_THROW(IOError, fn, ": cannot close '", tmp, "' (for '", path,
                 "'): ", std::strerror(err));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    KUSARI_THROW(IOError, fn, ": cannot rename '", tmp, "' to '", path, "': ", std::strerror(err));
  }
}

bool is_terminal(const std::ostream& out, std::optional<bool> override_terminal) {
  if (override_terminal) return *override_terminal;
  return is_terminal_output(out);
}

std::string format_g(double value, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*g", precision, value);
  return buf;
}

std::string format_timedelta(double seconds) {
  if (!std::isfinite(seconds)) return seconds > 0 ? "inf" : "nan";
  const bool negative = seconds < 0;
  // timedelta keeps whole microseconds.
  long long us = std::llround(std::abs(seconds) * 1e6);
  const long long days = us / 86400000000LL;
  us -= days * 86400000000LL;
  const long long h = us / 3600000000LL;
  us -= h * 3600000000LL;
  const long long m = us / 60000000LL;
  us -= m * 60000000LL;
  const long long s = us / 1000000LL;
  us -= s * 1000000LL;
  std::string out = negative ? "-" : "";
  if (days != 0) out += std::to_string(days) + (days == 1 ? " day, " : " days, ");
  char buf[64];
  if (us != 0) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld.%06lld", h, m, s, us);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", h, m, s);
  }
  return out + buf;
}

void serialize_optional(Serializer& s, const std::string& key, std::optional<double>& value) {
  if (s.is_loading()) {
    if (s.contains(key)) {
      double v = 0;
      s(key, v);
      value = v;
    }
  } else if (value) {
    double v = *value;
    s(key, v);
  }
}

}  // namespace kusari::training::detail
