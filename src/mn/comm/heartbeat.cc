#include "mn/comm/heartbeat.h"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace kusari::mn::detail {
namespace {

// Everything the records need, fixed at start so that the SIGTERM handler formats a record
// without allocating (Note [Heartbeat files]).
struct HeartbeatFiles {
  char path[4096] = {};        // <dir>/rank.<r>.json
  char thread_tmp[4096] = {};  // <dir>/.rank.<r>.json.tmp
  char final_tmp[4096] = {};   // <dir>/.rank.<r>.json.end
  char host[256] = {};
  int rank = 0;
  int size = 1;
  long pid = 0;
};

HeartbeatFiles g_files;
std::atomic<bool> g_started{false};
std::atomic<bool> g_ended{false};  // a final record was (or is being) written
std::atomic<int64_t> g_iteration{-1};
std::atomic<int64_t> g_resumed_from{-1};
std::atomic<int64_t> g_iteration_set_ms{0};       // steady clock, when heartbeat_iteration ran
std::atomic<int64_t> g_quarter_interval_ms{250};
std::mutex g_mutex;
std::condition_variable g_wake;

// A bounded, allocation-free writer (async-signal-safe: only stores into `buf`).
struct Out {
  char* buf;
  size_t cap;
  size_t n = 0;
  void put(char c) {
    if (n + 1 < cap) buf[n++] = c;
  }
  void str(const char* s) {
    while (*s) put(*s++);
  }
  void json_str(const char* s) {
    put('"');
    for (; *s; ++s) {
      const unsigned char c = static_cast<unsigned char>(*s);
      if (c == '"' || c == '\\') {
        put('\\');
        put(static_cast<char>(c));
      } else if (c == '\n') {
        str("\\n");
      } else if (c < 0x20) {
        put(' ');
      } else {
        put(static_cast<char>(c));
      }
    }
    put('"');
  }
  void integer(int64_t v) {
    char digits[24];
    int k = 0;
    const bool negative = v < 0;
    uint64_t u = negative ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
    do {
      digits[k++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u);
    if (negative) put('-');
    while (k) put(digits[--k]);
  }
};

/// Formats one record into `buf` (NUL-terminated) and returns its length.
size_t format_record(char* buf, size_t cap, const char* state, const char* message) {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  Out o{buf, cap};
  o.str("{\"rank\":");
  o.integer(g_files.rank);
  o.str(",\"size\":");
  o.integer(g_files.size);
  o.str(",\"host\":");
  o.json_str(g_files.host);
  o.str(",\"pid\":");
  o.integer(g_files.pid);
  o.str(",\"time\":");
  o.integer(static_cast<int64_t>(now.tv_sec));
  o.put('.');
  const int64_t ms = now.tv_nsec / 1000000;
  o.put(static_cast<char>('0' + ms / 100));
  o.put(static_cast<char>('0' + ms / 10 % 10));
  o.put(static_cast<char>('0' + ms % 10));
  o.str(",\"iteration\":");
  o.integer(g_iteration.load());
  o.str(",\"resumed_from\":");
  o.integer(g_resumed_from.load());
  o.str(",\"state\":");
  o.json_str(state);
  o.str(",\"message\":");
  o.json_str(message);
  o.str("}\n");
  buf[o.n] = '\0';
  return o.n;
}

/// Writes a record to `tmp` and renames it over the heartbeat file (async-signal-safe). A record
/// of the beating thread is not renamed into place once a final record exists.
void write_record(const char* tmp, const char* state, const char* message, bool final_record) {
  char buf[2048];
  const size_t n = format_record(buf, sizeof(buf), state, message);
  const int fd = ::open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, buf + done, n - done);
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  ::close(fd);
  if (!final_record && g_ended.load()) {
    ::unlink(tmp);
    return;
  }
  ::rename(tmp, g_files.path);
}

void on_sigterm(int signo) {
  if (!g_ended.exchange(true)) write_record(g_files.final_tmp, "terminated", "", true);
  ::signal(signo, SIG_DFL);
  ::raise(signo);
}

double interval_seconds() {
  const char* env = std::getenv("KUSARI_HEARTBEAT_INTERVAL");
  const double v = env ? std::atof(env) : 1.0;
  return v > 0 ? v : 1.0;
}

}  // namespace

void start_heartbeat(int world_rank, int world_size) noexcept {
  const char* dir = std::getenv("KUSARI_HEARTBEAT_DIR");
  if (dir == nullptr || *dir == '\0') return;
  if (g_started.exchange(true)) return;
  g_files.rank = world_rank;
  g_files.size = world_size;
  g_files.pid = static_cast<long>(::getpid());
  if (::gethostname(g_files.host, sizeof(g_files.host) - 1) != 0) std::strcpy(g_files.host, "?");
  std::snprintf(g_files.path, sizeof(g_files.path), "%s/rank.%d.json", dir, world_rank);
  std::snprintf(g_files.thread_tmp, sizeof(g_files.thread_tmp), "%s/.rank.%d.json.tmp", dir, world_rank);
  std::snprintf(g_files.final_tmp, sizeof(g_files.final_tmp), "%s/.rank.%d.json.end", dir, world_rank);
  // Only a program that has no SIGTERM handler of its own gets this one.
  struct sigaction old {};
  if (::sigaction(SIGTERM, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction act {};
    act.sa_handler = on_sigterm;
    sigemptyset(&act.sa_mask);
    ::sigaction(SIGTERM, &act, nullptr);
  }
  g_quarter_interval_ms.store(static_cast<int64_t>(interval_seconds() * 250));
  write_record(g_files.thread_tmp, "running", "", false);
  try {
    std::thread([] {
      const auto every = std::chrono::duration<double>(interval_seconds());
      std::unique_lock<std::mutex> lock(g_mutex);
      while (!g_ended.load()) {
        g_wake.wait_for(lock, every);
        if (g_ended.load()) break;
        write_record(g_files.thread_tmp, "running", "", false);
      }
    }).detach();  // never joined: it ends with the process (exit paths must not wait for it)
  } catch (...) {
  }
}

bool heartbeat_wants_iteration() noexcept {
  if (!g_started.load() || g_ended.load()) return false;
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  return now - g_iteration_set_ms.load() >= g_quarter_interval_ms.load();
}

void heartbeat_iteration(int64_t iteration) noexcept {
  g_iteration.store(iteration);
  g_iteration_set_ms.store(std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now().time_since_epoch()).count());
}

void heartbeat_step() noexcept {
  if (g_started.load() && g_iteration.load() >= 0) g_iteration.fetch_add(1);
}

void heartbeat_resumed_from(int64_t iteration) noexcept { g_resumed_from.store(iteration); }

void heartbeat_final(const char* state, const std::string& message) noexcept {
  if (!g_started.load() || g_ended.exchange(true)) return;
  write_record(g_files.final_tmp, state, message.c_str(), true);
  g_wake.notify_all();
}

}  // namespace kusari::mn::detail
