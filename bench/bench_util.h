// Shared helpers of the benchmark programs: timing, running the PyTorch peer and our own child
// processes with a time limit, printing. The programs read their flags with CLI11.
#pragma once

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kusari::bench {

/// Seconds of one call of f, the median over `repeats` after `warmup` calls.
inline double median_seconds(const std::function<void()>& f, int repeats, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  t.reserve(static_cast<size_t>(repeats));
  for (int i = 0; i < repeats; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Note [Runs with a time limit]
// A benchmark runs its peer (a PyTorch script) and sometimes copies of itself (under mpiexec, or
// one process per row) and reads their "RESULT key value" lines. A peer that hangs -- PyTorch DDP
// over gloo did, on a 2-core machine -- used to hang the benchmark with it, printing nothing
// (bench_mn_mnist: 500 s of silence). So every run goes through run_command:
//  - the command runs under /bin/sh in a process group of its own, so that stopping it also stops
//    what it started (mpiexec's ranks, torch.multiprocessing's workers);
//  - its output is collected while waiting; every 60 s of waiting a line on stderr says what is
//    waited for and for how long;
//  - after the time limit (--timeout, 600 s by default: the slowest peer run measured, a
//    torch.compile of ResNet-50, takes a few minutes) the group gets SIGTERM (mpiexec passes it on
//    to its ranks), and SIGKILL 5 s later;
//  - the benchmark then prints the rows it has, with "-" where the run gave nothing, says which
//    run did not finish and after how long (with the end of its output), and exits with status 1
//    after the "reproduce" line (finish()).
// Standard output is line-buffered (setup()), so rows appear as they are measured even when the
// output goes to a file or a pipe.
//  - the command may use every CPU the machine gives this process's group: under mpiexec a rank is
//    bound to one core (Open MPI's default for two ranks), and a child inherits the binding, so
//    rank 0's PyTorch peer ran all of its workers on rank 0's core (half the speed it has under a
//    launcher of its own). The peers' worker processes bind themselves as mpiexec bound the rank
//    that started them: as many CPUs each as it had (bench/peers/gloo_workers.py).

/// How a command run by run_command ended.
struct RunOutcome {
  /// Its standard output and standard error, interleaved as written.
  std::string output;
  /// The exit status when it exited by itself; -1 otherwise.
  int exit_status = -1;
  /// The signal that ended it when it did not exit by itself (0 otherwise).
  int signal = 0;
  /// True when it ran past the time limit and was stopped.
  bool timed_out = false;
  /// Seconds from its start to its end (or to its stop).
  double seconds = 0;
};

/// The time limit of each run of a peer or child process, in seconds (0: none). Set by the
/// --timeout flag that setup() adds.
inline double& run_timeout_seconds() {
  static double seconds = 600;
  return seconds;
}

/// Adds the flags every benchmark shares (--timeout) and makes standard output line-buffered, so
/// that each row appears as soon as it is measured. See Note [Runs with a time limit].
inline void setup(CLI::App& app) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  app.add_option("--timeout", run_timeout_seconds(),
                 "Seconds each run of the PyTorch peer (and each child process of the benchmark) may "
                 "take before it is stopped and reported as not finished (0: no limit)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

namespace detail {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Waits for `pid` until `deadline`; true (and `status` set) when it ended.
inline bool wait_until(pid_t pid, int* status, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    const pid_t r = ::waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// The last `n` lines of `text`.
inline std::string last_lines(const std::string& text, int n) {
  size_t at = text.size();
  if (at > 0 && text[at - 1] == '\n') --at;
  for (int i = 0; i < n && at != std::string::npos && at > 0; ++i) at = text.rfind('\n', at - 1);
  return at == std::string::npos || at == 0 ? text : text.substr(at + 1);
}

}  // namespace detail

/// Runs `command` with /bin/sh in a process group of its own and collects its output. When it is
/// still running after `timeout_seconds` (0: no limit) the whole group is stopped (SIGTERM, then
/// SIGKILL after 5 s) and the outcome says timed_out. While waiting, a line on stderr names
/// `what` every `heartbeat_seconds`. See Note [Runs with a time limit].
inline RunOutcome run_command(const std::string& command, double timeout_seconds,
                              const std::string& what, double heartbeat_seconds = 60) {
  using Clock = std::chrono::steady_clock;
  RunOutcome outcome;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    throw std::runtime_error("cannot run " + what + ": pipe: " + std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // a group of its own, led by the shell
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  pid_t pid = -1;
  const Clock::time_point start = Clock::now();
  // The child inherits the spawning thread's CPUs: widen them for the spawn (the kernel keeps
  // only those the process's cpuset allows), then restore.
  // The peers' workers take as many CPUs each as this process had (KUSARI_BENCH_CPUS_PER_WORKER).
  cpu_set_t bound, every;
  const bool widened = ::sched_getaffinity(0, sizeof(bound), &bound) == 0;
  if (widened) {
    ::setenv("KUSARI_BENCH_CPUS_PER_WORKER", std::to_string(CPU_COUNT(&bound)).c_str(), 1);
    CPU_ZERO(&every);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &every);
    ::sched_setaffinity(0, sizeof(every), &every);
  }
  const int spawned = ::posix_spawn(&pid, sh.c_str(), &actions, &attr, argv, environ);
  if (widened) ::sched_setaffinity(0, sizeof(bound), &bound);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    throw std::runtime_error("cannot run " + what + ": " + std::strerror(spawned));
  }
  const bool limited = timeout_seconds > 0;
  const Clock::time_point deadline =
      limited ? start + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(timeout_seconds))
              : Clock::time_point::max();
  double next_heartbeat = heartbeat_seconds;
  std::array<char, 4096> buf;
  bool open = true;
  while (open) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) break;
    const double to_heartbeat = next_heartbeat - detail::seconds_since(start);
    double wait = std::max(0.0, to_heartbeat);
    if (limited) wait = std::min(wait, std::chrono::duration<double>(deadline - now).count());
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min(wait * 1000.0 + 1, 1e9)));
    if (ready < 0 && errno != EINTR) break;
    if (ready > 0) {
      const ssize_t n = ::read(pipe_fds[0], buf.data(), buf.size());
      if (n > 0) {
        outcome.output.append(buf.data(), static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        open = false;  // every writer closed its end: the command has (nearly) ended
      }
    }
    if (detail::seconds_since(start) >= next_heartbeat) {
      std::fprintf(stderr, "[bench] waiting for %s: %.0f s so far%s\n", what.c_str(),
                   detail::seconds_since(start),
                   limited ? (" (limit " + std::to_string(static_cast<long long>(timeout_seconds)) +
                              " s, --timeout)")
                                 .c_str()
                           : "");
      std::fflush(stderr);
      next_heartbeat += heartbeat_seconds;
    }
  }
  ::close(pipe_fds[0]);
  int status = 0;
  if (!detail::wait_until(pid, &status, deadline)) {
    outcome.timed_out = true;
    ::kill(-pid, SIGTERM);
    if (!detail::wait_until(pid, &status, Clock::now() + std::chrono::seconds(5))) {
      ::kill(-pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    ::kill(-pid, SIGKILL);  // whatever of the group outlived the shell
    outcome.seconds = timeout_seconds;
    return outcome;
  }
  outcome.seconds = detail::seconds_since(start);
  if (WIFEXITED(status)) outcome.exit_status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  return outcome;
}

/// The "RESULT key value" lines of a run's output.
inline std::map<std::string, double> parse_results(const std::string& output) {
  std::map<std::string, double> out;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream is(line);
    std::string tag, key;
    double value;
    if (is >> tag >> key >> value && tag == "RESULT") out[key] = value;
  }
  return out;
}

/// Thrown by run_for_results when a run gave no results: it did not finish in time, failed, or
/// printed no RESULT line. The message names the run, how long it ran and the end of its output.
class RunFailed : public std::runtime_error {
 public:
  RunFailed(const std::string& message, bool timed_out)
      : std::runtime_error(message), timed_out_(timed_out) {}
  /// True when the run was stopped at the time limit.
  bool timed_out() const { return timed_out_; }

 private:
  bool timed_out_;
};

/// Runs a shell command with the time limit of --timeout and returns the "RESULT key value" lines
/// it prints; `what` names it in messages (default: the command). Throws RunFailed when it does
/// not finish in time, or prints no RESULT line.
inline std::map<std::string, double> run_for_results(const std::string& command,
                                                     const std::string& what = "") {
  const std::string name = what.empty() ? command : what;
  const RunOutcome r = run_command(command, run_timeout_seconds(), name);
  const std::map<std::string, double> results = parse_results(r.output);
  std::ostringstream why;
  if (r.timed_out) {
    why << name << " did not finish within " << r.seconds << " s and was stopped (--timeout "
        << run_timeout_seconds() << ")";
  } else if (results.empty()) {
    why << name << " printed no RESULT line";
  }
  if (why.tellp() == 0) return results;
  if (!r.timed_out) {
    why << " (it ran " << std::fixed << std::setprecision(1) << r.seconds << " s and ";
    if (r.signal) {
      why << "was killed by signal " << r.signal << ")";
    } else {
      why << "exited with status " << r.exit_status << ")";
    }
  }
  if (name != command) why << "\n  command: " << command;
  const std::string tail = detail::last_lines(r.output, 10);
  why << "\n  " << (tail.empty() ? "(no output)" : "its last output:\n" + tail);
  throw RunFailed(why.str(), r.timed_out);
}

/// The runs of this program that gave no results, in the order they ended (for finish()).
inline std::vector<std::string>& incomplete_runs() {
  static std::vector<std::string> runs;
  return runs;
}

/// run_for_results for a run that the benchmark can do without: when it fails or does not finish
/// in time, the reason is printed at once (the rows measured so far stay), remembered for
/// finish(), and nullopt is returned.
inline std::optional<std::map<std::string, double>> try_run(const std::string& command,
                                                            const std::string& what) {
  try {
    return run_for_results(command, what);
  } catch (const std::exception& e) {
    const std::string first_line = std::string(e.what()).substr(0, std::string(e.what()).find('\n'));
    std::printf("(%s)\n", first_line.c_str());
    std::fprintf(stderr, "%s\n", e.what());
    incomplete_runs().push_back(first_line);
    return std::nullopt;
  }
}

/// The peer scripts' folder: bench/ of the source tree this program was built from, or
/// $KUSARI_BENCH_DIR when set (a build copied to another machine).
inline std::string bench_dir() {
  const char* dir = std::getenv("KUSARI_BENCH_DIR");
  return dir && *dir ? dir : KUSARI_BENCH_DIR;
}

/// The command line that runs the peer script bench/peers/<script> with `args` under `python`,
/// with extra environment assignments in front ("OPENBLAS_NUM_THREADS=1").
inline std::string peer_command(const std::string& python, const std::string& script,
                                const std::string& args, const std::string& env = "") {
  return env + (env.empty() ? "" : " ") + python + " " + bench_dir() + "/peers/" + script + " " +
         args;
}

/// Runs a peer script (see peer_command) and returns its "RESULT key value" lines; throws
/// RunFailed when it fails or does not finish within --timeout.
inline std::map<std::string, double> run_peer(const std::string& python, const std::string& script,
                                              const std::string& args, const std::string& env = "") {
  return run_for_results(peer_command(python, script, args, env),
                         "the pytorch peer (" + script + " " + args + ")");
}

/// run_peer for try_run: nullopt, with the reason printed, when the peer gives no results.
inline std::optional<std::map<std::string, double>> try_peer(const std::string& python,
                                                             const std::string& script,
                                                             const std::string& args,
                                                             const std::string& env = "") {
  return try_run(peer_command(python, script, args, env),
                 "the pytorch peer (" + script + " " + args + ")");
}

/// The command line that started this program, for "reproduce with".
inline std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
  return s;
}

/// A figure for a table cell: "%.<precision>f" of the value, or "-" when there is none.
inline std::string cell(const std::optional<double>& value, int precision = 3) {
  if (!value) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, *value);
  return buf;
}

/// Ends a benchmark: prints the command that reproduces it and a line for every run that gave no
/// results; returns main's exit status (1 when a run gave none, else 0).
inline int finish(int argc, char** argv) {
  std::printf("reproduce: %s\n", command_line(argc, argv).c_str());
  for (const std::string& run : incomplete_runs()) std::printf("incomplete: %s\n", run.c_str());
  std::fflush(stdout);
  return incomplete_runs().empty() ? 0 : 1;
}

}  // namespace kusari::bench
