// kusari-run: the elastic launcher. It runs an MPI job through mpiexec, watches the heartbeats its
// ranks write, and when ranks are lost (crashed or hung) starts the job again on the slots that
// are left, where the program resumes from its last snapshot:
//
//   kusari-run --np 4:8 --hostfile hosts --max-restarts 3 -- ./train_imagenet --resume ...
//
// Note [Elastic launcher]
// A long job on many hosts loses a process now and then: a host fails, a GPU falls off the bus, a
// rank stops making progress. MPI cannot go on without the lost rank, so the job ends; a snapshot
// lets it start again, and kusari-run is what starts it again, without a person watching.
//
//   kusari-run [options] -- PROGRAM [ARGS...]
//     -n, --np MIN[:MAX]       at least MIN processes, at most MAX (MAX defaults to MIN); required
//     --hostfile FILE          Open MPI hostfile, lines "HOST slots=N" (N defaults to 1; '#'
//                              starts a comment); without it, this host with MAX slots
//     --max-restarts K         how many times to start again after a loss (default 3)
//     --hang-timeout SECONDS   a running rank whose last heartbeat is older than this is hung
//                              (default 120; 0 turns the check off)
//     --heartbeat-dir DIR      where the ranks write heartbeats (default ".kusari-run"); attempt k
//                              uses DIR/attempt.<k>/, made afresh
//     --log FILE               the attempts as JSON lines (default kusari-run.log beside DIR)
//     --mpiexec PATH           default $KUSARI_MPIEXEC, else "mpiexec"
//     --mpiexec-arg ARG        one more argument for mpiexec (repeatable)
//     --restart-on-error       also start again when ranks failed with an error of the program
//
// Attempt k = 0, 1, ... runs `mpiexec -n NP --hostfile DIR/attempt.<k>/hostfile [-x ...] [mpiexec
// args] PROGRAM ARGS`, with NP = min(MAX, slots left) and the hostfile filled host by host in the
// order given, with KUSARI_HEARTBEAT_DIR (the attempt's folder, absolute) and KUSARI_RUN_ATTEMPT=k
// in the environment (and passed on with -x when mpiexec is Open MPI's, whose remote ranks do not
// inherit it). mpiexec runs in its own process group, so that the launcher can end the whole job.
// Fewer than MIN slots left ends the run (exit 1).
//
// Each rank replaces the file rank.<r>.json of that folder about once a second (written under a
// name starting with '.', then renamed) with one JSON object:
//   {"rank":0,"size":3,"host":"node1","pid":1234,"time":1765000000.25,"iteration":120,
//    "resumed_from":-1,"state":"running","message":""}
// `time` is when it was written (Unix seconds); `iteration` the updates done (-1 before the
// first); `resumed_from` the iteration a resumed job loaded (-1 for none); `state` is "running",
// "done", "failed" (the rank's own error, told by `message`), "peer_failed" (it stopped because
// another rank failed) or "terminated" (it got SIGTERM).
//
// When an attempt ends with status 0 the run is finished. Otherwise each rank is judged by what
// it wrote last: a rank that said how it ended is not lost; one still "running", or one that
// never wrote, is lost: "crashed", or "hung" if the launcher found its heartbeat too old (such a
// rank is lost whatever it wrote after); the ranks the launcher itself ended because another hung
// are not lost, whatever they wrote last (mpiexec may kill them before SIGTERM gets a last word
// out). Each lost rank takes one slot from its host (the one its heartbeat names, else the one
// the hostfile put it on), and the job starts again while restarts
// are left. No heartbeat at all means the program does not write them: it starts again on the
// same slots.
// Ranks that failed with no rank lost are an error of the program, which another attempt would
// only repeat: the launcher stops (unless --restart-on-error) and exits with the job's status.
//
// A hung rank (its last heartbeat older than --hang-timeout while the job runs; the age is this
// host's clock against the heartbeat's own `time`, so the hosts' clocks must agree; a rank that
// never wrote one is not judged) ends the attempt: SIGTERM to mpiexec's group, SIGKILL to the
// hung rank when it runs on this host (a stopped process never sees SIGTERM), and 5 s later
// SIGKILL to the group and to the ranks of this host that are still there (Open MPI gives each
// rank a process group of its own, so mpiexec's group does not hold them; a rank's pid is checked
// against its environment first). SIGINT or SIGTERM to the launcher ends the job the same way,
// and the launcher with 128 + the signal, without restart. Should the launcher itself be killed,
// mpiexec gets SIGTERM (Linux's parent-death signal).
//
// Every event goes to the log as one JSON line (one write to a file opened O_APPEND) and to stderr
// as one line starting "[kusari-run] ":
//   start {attempt, np, hosts{host: processes}}; hang {attempt, rank, host, heartbeat_age_s};
//   end {attempt, exit_status, signal, lost[{rank, host, pid, cause}], failed[{rank, message}],
//   last_iteration}; resumed {attempt, resumed_from}; caught_up {attempt, iteration,
//   time_lost_s}; finished {attempt, restarts}; stopped {reason}; each with its `time`.
// caught_up is logged when a restarted attempt first reaches the furthest iteration of the
// attempts before it; time_lost_s is how long after that iteration was first reached.
#include <fcntl.h>
#include <signal.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

/// How often the launcher looks at the job and its heartbeats, in seconds.
constexpr double kPollSeconds = 0.2;
/// How long a job has to end after SIGTERM before its process group gets SIGKILL, in seconds.
constexpr double kKillGraceSeconds = 5.0;

/// The signal (SIGINT or SIGTERM) that asked the launcher to stop; 0 while none did.
volatile std::sig_atomic_t g_stop_signal = 0;

/// Records a stop request; the main loop acts on it.
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

/// A mistake in the command line or in a file it names: kusari-run exits 2 with the message.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The end of a command line that CLI11 answered itself (an error, or --help): exit with `code`.
struct ParseExit {
  int code;  ///< what CLI::App::exit returned
};

/// The current Unix time in seconds.
double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// Sleeps `seconds`, or less when a signal arrives.
void nap(double seconds) {
  timespec ts{static_cast<time_t>(seconds),
              static_cast<long>((seconds - static_cast<time_t>(seconds)) * 1e9)};
  nanosleep(&ts, nullptr);
}

/// `value` with one decimal, for the human lines.
std::string one_decimal(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", value);
  return buffer;
}

/// A host of the job and the process slots it still offers.
struct Host {
  std::string name;  ///< as the hostfile names it
  int slots = 0;     ///< processes it may run
};

/// "node1:2, node2:1", for the human lines.
std::string describe(const std::vector<Host>& hosts) {
  std::string out;
  for (const Host& h : hosts)
    out += (out.empty() ? "" : ", ") + h.name + ":" + std::to_string(h.slots);
  return out;
}

/// "1 restart", "3 restarts".
std::string restarts_text(int restarts) {
  return std::to_string(restarts) + (restarts == 1 ? " restart" : " restarts");
}

/// The sum of the slots of `hosts`.
int total_slots(const std::vector<Host>& hosts) {
  int total = 0;
  for (const Host& h : hosts) total += h.slots;
  return total;
}

/// Parses --np MIN[:MAX] into (MIN, MAX).
std::pair<int, int> parse_np(const std::string& text) {
  const auto number = [&](std::string_view s) {
    int value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
      throw UsageError("--np '" + text +
                       "': expected MIN or MIN:MAX, whole numbers with 1 <= MIN <= MAX");
    }
    return value;
  };
  const size_t colon = text.find(':');
  const int lo = number(std::string_view(text).substr(0, colon));
  const int hi = colon == std::string::npos ? lo : number(std::string_view(text).substr(colon + 1));
  if (lo < 1 || hi < lo) {
    throw UsageError("--np '" + text + "': expected 1 <= MIN <= MAX, got MIN " +
                     std::to_string(lo) + " and MAX " + std::to_string(hi));
  }
  return {lo, hi};
}

/// Reads an Open MPI hostfile: "HOST [slots=N] [max_slots=M]" a line, '#' comments. A host named
/// twice gets the sum of its slots.
std::vector<Host> read_hostfile(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw UsageError("--hostfile '" + path + "': is a folder, expected a hostfile");
  std::ifstream in(path);
  if (!in)
    throw UsageError("--hostfile '" + path + "': cannot read it (" + std::strerror(errno) + ")");
  std::vector<Host> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::istringstream words(line.substr(0, line.find('#')));
    std::string name, word;
    if (!(words >> name)) continue;
    int slots = 1;
    while (words >> word) {
      if (word.rfind("max_slots=", 0) == 0) continue;
      const bool is_slots = word.rfind("slots=", 0) == 0;
      int value = 0;
      const char* last = word.c_str() + word.size();
      const auto [end, err] = std::from_chars(word.c_str() + (is_slots ? 6 : 0), last, value);
      if (!is_slots || err != std::errc() || end != last || value < 1) {
        throw UsageError("--hostfile '" + path + "' line " + std::to_string(number) +
                         ": expected 'HOST slots=N' with N >= 1, got '" + line + "'");
      }
      slots = value;
    }
    const auto same =
        std::find_if(hosts.begin(), hosts.end(), [&](const Host& h) { return h.name == name; });
    if (same != hosts.end()) {
      same->slots += slots;
    } else {
      hosts.push_back({name, slots});
    }
  }
  if (hosts.empty())
    throw UsageError("--hostfile '" + path + "': names no host, expected lines 'HOST slots=N'");
  return hosts;
}

/// The first `np` slots of `hosts`, host by host: the hosts an attempt runs on.
std::vector<Host> fill_hosts(const std::vector<Host>& hosts, int np) {
  std::vector<Host> used;
  for (const Host& h : hosts) {
    if (np == 0) break;
    const int take = std::min(h.slots, np);
    if (take > 0) used.push_back({h.name, take});
    np -= take;
  }
  return used;
}

/// This host's name, as gethostname gives it.
const std::string& this_host() {
  static const std::string name = [] {
    char buffer[256] = {};
    gethostname(buffer, sizeof buffer - 1);
    return std::string(buffer);
  }();
  return name;
}

/// `name` up to its first dot: "node1" for "node1.cluster".
std::string short_name(const std::string& name) {
  return name.substr(0, name.find('.'));
}

/// Whether `name` is this host.
bool is_this_host(const std::string& name) {
  return name == "localhost" || name == "127.0.0.1" || short_name(name) == short_name(this_host());
}

/// Whether the process `pid` is a rank of the attempt whose heartbeat folder is `folder`: its
/// environment holds KUSARI_HEARTBEAT_DIR=folder. So a pid from a heartbeat that has since been
/// given to another process is never signalled. Where /proc cannot tell, the pid is trusted.
bool is_rank_of(long pid, const fs::path& folder) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  if (!in) return ::kill(static_cast<pid_t>(pid), 0) == 0 && !fs::exists("/proc/self/environ");
  const std::string wanted = "KUSARI_HEARTBEAT_DIR=" + folder.string();
  std::string entry;
  while (std::getline(in, entry, '\0')) {
    if (entry == wanted) return true;
  }
  return false;
}

/// The events of a run: JSON lines appended to the log, and a human line on stderr each.
class EventLog {
 public:
  /// Opens (creates) the log at `path` for appending.
  explicit EventLog(const fs::path& path) : path_(path) {
    std::error_code ec;
    if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw UsageError("--log '" + path.string() + "': cannot open it (" + std::strerror(errno) +
                       ")");
  }
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  ~EventLog() { ::close(fd_); }

  /// Appends `event` (with its "time" added when it has none) and prints `human`.
  void write(Json event, const std::string& human) {
    if (!event.contains("time")) event["time"] = unix_now();
    const std::string line = event.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
    // One write() per line: with O_APPEND a line is never interleaved with another writer's.
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size()) && !warned_) {
      std::fprintf(stderr, "[kusari-run] cannot write the log '%s' (%s); going on without it\n",
                   path_.c_str(), std::strerror(errno));
      warned_ = true;
    }
    say(human);
  }

  /// Prints `human` on stderr after the prefix.
  static void say(const std::string& human) {
    std::fprintf(stderr, "[kusari-run] %s\n", human.c_str());
  }

 private:
  fs::path path_;
  int fd_ = -1;
  bool warned_ = false;
};

/// Starts `args` (the program looked up in PATH) as a child: the leader of its own process group
/// when `own_group`, its stdout and stderr going to `output_fd` when that is >= 0. Throws
/// std::system_error when fork or exec fails.
pid_t spawn(const std::vector<std::string>& args, bool own_group, int output_fd) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The child reports a failed exec through this pipe; a successful exec closes it.
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe");
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    ::close(report[0]);
    ::close(report[1]);
    throw std::system_error(e, std::generic_category(), "fork");
  }
  if (pid == 0) {
    if (own_group) setpgid(0, 0);
#ifdef __linux__
    // Should the launcher die without a word (SIGKILL), mpiexec gets SIGTERM and ends the job.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
    if (output_fd >= 0) {
      dup2(output_fd, STDOUT_FILENO);
      dup2(output_fd, STDERR_FILENO);
    }
    execvp(argv[0], argv.data());
    const int e = errno;
    (void)!::write(report[1], &e, sizeof e);
    _exit(127);
  }
  // Also here: whichever of the two runs first, the group exists before anyone signals it.
  if (own_group) setpgid(pid, pid);
  ::close(report[1]);
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(report[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    throw std::system_error(exec_errno, std::generic_category(), "cannot run '" + args[0] + "'");
  }
  return pid;
}

/// Whether `mpiexec` is Open MPI's, from what `mpiexec --version` prints.
bool is_open_mpi(const std::string& mpiexec, const std::string& flag) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  pid_t pid;
  try {
    pid = spawn({mpiexec, "--version"}, false, out[1]);
  } catch (const std::system_error& e) {
    ::close(out[0]);
    ::close(out[1]);
    throw UsageError(flag + " '" + mpiexec + "': cannot run it (" + e.code().message() + ")");
  }
  ::close(out[1]);
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(out[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    text.append(buffer, static_cast<size_t>(got));
  }
  ::close(out[0]);
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  return text.find("Open MPI") != std::string::npos || text.find("OpenRTE") != std::string::npos;
}

/// The running mpiexec, leader of its process group. Whatever way the launcher leaves an attempt,
/// an exception included, the group is killed and the child reaped: no job outlives it, no zombie.
class ChildGroup {
 public:
  /// Takes charge of the child `pid`.
  explicit ChildGroup(pid_t pid) : pid_(pid) {}
  ChildGroup(const ChildGroup&) = delete;
  ChildGroup& operator=(const ChildGroup&) = delete;
  ~ChildGroup() {
    if (pid_ <= 0) return;
    ::killpg(pid_, SIGKILL);
    while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }

  /// The child's wait status once it has ended (and is reaped); nullopt while it runs.
  std::optional<int> poll() {
    int status = 0;
    if (pid_ <= 0 || waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
    pid_ = -1;
    return status;
  }

  /// Sends `sig` to the whole group.
  void signal(int sig) const {
    if (pid_ > 0) ::killpg(pid_, sig);
  }

 private:
  pid_t pid_;
};

/// What a rank last wrote into its heartbeat file (Note [Elastic launcher]).
struct Heartbeat {
  std::string host;           ///< where it runs; empty when it did not say
  long pid = -1;              ///< its process id; -1 when it did not say
  double time = 0;            ///< when it was written: the record's `time`, else the file's mtime
  int64_t iteration = -1;     ///< updates done
  int64_t resumed_from = -1;  ///< the iteration it resumed from, -1 for none
  std::string state;          ///< "running", "done", "failed", "peer_failed", "terminated"
  std::string message;        ///< what failed, for "failed"
};

/// Whether a rank in `state` said how it ended (and so is not lost).
bool has_ended(const std::string& state) {
  return state == "done" || state == "failed" || state == "peer_failed" || state == "terminated";
}

/// Parses one heartbeat record; nullopt when `text` is not one. `mtime` stands in for a missing
/// `time`.
std::optional<Heartbeat> parse_heartbeat(const std::string& text, double mtime) {
  const Json record = Json::parse(text, nullptr, false);
  if (!record.is_object()) return std::nullopt;
  const auto number = [&](const char* key, double fallback) {
    const auto it = record.find(key);
    return it != record.end() && it->is_number() ? it->get<double>() : fallback;
  };
  const auto string = [&](const char* key) {
    const auto it = record.find(key);
    return it != record.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  Heartbeat h;
  h.host = string("host");
  h.pid = static_cast<long>(number("pid", -1));
  h.time = number("time", mtime);
  h.iteration = static_cast<int64_t>(number("iteration", -1));
  h.resumed_from = static_cast<int64_t>(number("resumed_from", -1));
  h.state = string("state");
  h.message = string("message");
  return h;
}

/// What the launcher knows of one rank during an attempt.
struct RankWatch {
  std::optional<Heartbeat> last;  ///< its last record; nullopt while it wrote none
  struct stat seen {};            ///< the file the record came from (re-read only when it changes)
  bool hung = false;              ///< whether the launcher found it hung
  bool ended_by_launcher = false;  ///< whether the launcher ended it while it was not hung
};

/// Re-reads the heartbeat file of `rank` from `folder` when it has changed.
void read_heartbeat(const fs::path& folder, int rank, RankWatch& watch) {
  const fs::path path = folder / ("rank." + std::to_string(rank) + ".json");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;
  if (watch.last && st.st_ino == watch.seen.st_ino && st.st_size == watch.seen.st_size &&
      st.st_mtim.tv_sec == watch.seen.st_mtim.tv_sec &&
      st.st_mtim.tv_nsec == watch.seen.st_mtim.tv_nsec) {
    return;
  }
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const double mtime =
      static_cast<double>(st.st_mtim.tv_sec) + static_cast<double>(st.st_mtim.tv_nsec) * 1e-9;
  // A record that does not parse (not possible with a renamed file, but a rank may write it in
  // place) keeps the previous one until the next change.
  if (auto h = parse_heartbeat(text.str(), mtime)) {
    watch.last = std::move(*h);
    watch.seen = st;
  }
}

/// The furthest iteration a job reached and when the launcher first saw it.
struct Progress {
  int64_t iteration = -1;  ///< -1 before any
  double first_seen = 0;   ///< Unix time
};

/// How an attempt ended.
struct AttemptEnd {
  int status = 0;                ///< mpiexec's exit status, 128 + the signal when one ended it
  std::optional<int> signal;     ///< the signal that ended mpiexec, if one did
  int stop_signal = 0;           ///< the signal that asked the launcher to stop, 0 if none
  std::vector<RankWatch> ranks;  ///< per rank 0..np-1, what it wrote last
  Progress progress;             ///< the furthest iteration of this attempt
};

/// The settings of a run, from the command line.
struct Options {
  int min_np = 0;                         ///< --np MIN
  int max_np = 0;                         ///< --np MAX
  std::vector<Host> hosts;                ///< --hostfile, or this host with MAX slots
  int max_restarts = 3;                   ///< --max-restarts
  double hang_timeout = 120;              ///< --hang-timeout, 0 for never
  fs::path heartbeat_dir;                 ///< --heartbeat-dir, absolute
  fs::path log;                           ///< --log
  std::string mpiexec;                    ///< --mpiexec
  std::string mpiexec_flag;               ///< where mpiexec came from, for messages
  std::vector<std::string> mpiexec_args;  ///< --mpiexec-arg
  bool restart_on_error = false;          ///< --restart-on-error
  std::vector<std::string> program;       ///< PROGRAM ARGS
};

/// Makes the --heartbeat-dir `folder` (and the folders above it).
void make_heartbeat_dir(const fs::path& folder) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec || !fs::is_directory(folder)) {
    throw UsageError("--heartbeat-dir '" + folder.string() + "': cannot make the folder (" +
                     (ec ? ec.message() : "a file is in the way") + ")");
  }
}

/// Runs the attempts of one job (Note [Elastic launcher]).
class Launcher {
 public:
  /// Asks mpiexec what it is (first: a wrong --mpiexec leaves no files behind), opens the log and
  /// makes the heartbeat folder.
  explicit Launcher(Options options)
      : options_(std::move(options)),
        open_mpi_(is_open_mpi(options_.mpiexec, options_.mpiexec_flag)),
        log_(options_.log) {
    make_heartbeat_dir(options_.heartbeat_dir);
  }

  /// Runs attempts until the job finishes or cannot go on; returns the launcher's exit status.
  int run() {
    std::vector<Host> hosts = options_.hosts;
    Progress earlier;  // the furthest any earlier attempt got
    int restarts = 0;
    for (int attempt = 0;; ++attempt) {
      if (g_stop_signal != 0)
        return stop("got signal " + std::to_string(g_stop_signal) + ": stopping",
                    128 + g_stop_signal);
      const int np = std::min(options_.max_np, total_slots(hosts));
      if (np < options_.min_np) {
        return stop("only " + std::to_string(total_slots(hosts)) +
                        " process slots are left (hosts " + describe(hosts) +
                        "), and --np asks for at least " + std::to_string(options_.min_np) +
                        ": stopping",
                    1);
      }
      const std::vector<Host> used = fill_hosts(hosts, np);
      AttemptEnd end = run_attempt(attempt, np, hosts, used, earlier);
      if (end.progress.iteration > earlier.iteration) earlier = end.progress;
      if (end.stop_signal != 0) {
        log_end(attempt, end, Json::array(), Json::array());
        return stop(std::string("got ") + (end.stop_signal == SIGINT ? "SIGINT" : "SIGTERM") +
                        ": ended the job, not restarting",
                    128 + end.stop_signal);
      }
      // (A job the launcher ended for a hang did not finish, whatever mpiexec says.)
      const bool hung = std::any_of(end.ranks.begin(), end.ranks.end(),
                                    [](const RankWatch& w) { return w.hung; });
      if (end.status == 0 && !hung) {
        log_end(attempt, end, Json::array(), Json::array());
        log_.write(
            {{"event", "finished"}, {"attempt", attempt}, {"restarts", restarts}},
            "finished (attempt " + std::to_string(attempt) + ", " + restarts_text(restarts) + ")");
        return 0;
      }

      const Verdict verdict = judge(end, hosts, used);
      log_end(attempt, end, verdict.lost, verdict.failed);
      for (const auto& [message, ranks] : verdict.failures) {
        std::string list;
        for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
        EventLog::say((ranks.size() == 1 ? "rank " : "ranks ") + list + " failed: " + message);
      }
      const int status = end.status != 0 ? end.status : 1;
      if (!verdict.any_heartbeat) {
        EventLog::say(
            "no rank wrote a heartbeat (the program does not write them, or ended before its "
            "first): the cause is unknown, the next attempt keeps the same " +
            std::to_string(np) + " processes");
      } else if (verdict.lost.empty() && !options_.restart_on_error) {
        return stop(std::string(verdict.failed.empty()
                                    ? "the job ended with status " + std::to_string(end.status) +
                                          " and no rank failed or was lost"
                                    : "the job failed with an error of the program") +
                        ", not a lost rank: not restarting (--restart-on-error would)",
                    status);
      }
      if (restarts >= options_.max_restarts) {
        return stop("gave up after " + restarts_text(restarts) + " (--max-restarts " +
                        std::to_string(options_.max_restarts) + ")",
                    status);
      }
      ++restarts;
    }
  }

 private:
  /// What the end of an attempt says of its ranks.
  struct Verdict {
    bool any_heartbeat = false;   ///< whether any rank wrote a heartbeat
    Json lost = Json::array();    ///< the lost ranks, as the "end" event lists them
    Json failed = Json::array();  ///< the ranks that failed, as the "end" event lists them
    /// Each distinct failure message with its ranks, in the order of the first rank.
    std::vector<std::pair<std::string, std::vector<int>>> failures;
  };

  /// Judges each rank of an attempt that did not finish by what it wrote last, and takes one slot
  /// of `hosts` for each lost rank (Note [Elastic launcher]).
  static Verdict judge(const AttemptEnd& end, std::vector<Host>& hosts,
                       const std::vector<Host>& used) {
    Verdict v;
    v.any_heartbeat = std::any_of(end.ranks.begin(), end.ranks.end(),
                                  [](const RankWatch& w) { return w.last.has_value(); });
    if (!v.any_heartbeat) return v;  // the program does not write heartbeats: nothing to judge by
    for (int r = 0; r < static_cast<int>(end.ranks.size()); ++r) {
      const RankWatch& w = end.ranks[r];
      // A rank found hung is lost even when SIGTERM got a last word out of it; one the launcher
      // ended because another hung is not, whether or not its last word got out before mpiexec
      // killed it.
      if (!w.hung && w.ended_by_launcher && !(w.last && w.last->state == "failed")) continue;
      if (!w.hung && w.last && has_ended(w.last->state)) {
        if (w.last->state != "failed") continue;
        v.failed.push_back({{"rank", r}, {"message", w.last->message}});
        const auto same = std::find_if(v.failures.begin(), v.failures.end(),
                                       [&](const auto& f) { return f.first == w.last->message; });
        if (same != v.failures.end()) {
          same->second.push_back(r);
        } else {
          v.failures.push_back({w.last->message, {r}});
        }
        continue;
      }
      Host& host = host_of(hosts, used, r, w.last ? w.last->host : std::string());
      host.slots = std::max(0, host.slots - 1);
      v.lost.push_back({{"rank", r},
                        {"host", host.name},
                        {"pid", w.last && w.last->pid > 0 ? Json(w.last->pid) : Json(nullptr)},
                        {"cause", w.hung ? "hung" : "crashed"}});
    }
    return v;
  }

  /// Runs attempt `attempt` on `np` processes of `used` and watches it until mpiexec ends.
  AttemptEnd run_attempt(int attempt, int np, std::vector<Host>& hosts,
                         const std::vector<Host>& used, const Progress& earlier) {
    const fs::path folder = options_.heartbeat_dir / ("attempt." + std::to_string(attempt));
    fs::remove_all(folder);
    fs::create_directories(folder);
    const fs::path hostfile = folder / "hostfile";
    {
      std::ofstream out(hostfile);
      for (const Host& h : used) out << h.name << " slots=" << h.slots << "\n";
      if (!out.flush())
        throw std::runtime_error("cannot write the hostfile '" + hostfile.string() + "'");
    }
    ::setenv("KUSARI_HEARTBEAT_DIR", folder.c_str(), 1);
    ::setenv("KUSARI_RUN_ATTEMPT", std::to_string(attempt).c_str(), 1);
    std::vector<std::string> args = {options_.mpiexec, "-n", std::to_string(np), "--hostfile",
                                     hostfile.string()};
    if (open_mpi_)
      args.insert(args.end(), {"-x", "KUSARI_HEARTBEAT_DIR", "-x", "KUSARI_RUN_ATTEMPT"});
    args.insert(args.end(), options_.mpiexec_args.begin(), options_.mpiexec_args.end());
    args.insert(args.end(), options_.program.begin(), options_.program.end());

    Json hosts_json = Json::object();
    for (const Host& h : used) hosts_json[h.name] = h.slots;
    log_.write({{"event", "start"}, {"attempt", attempt}, {"np", np}, {"hosts", hosts_json}},
               "attempt " + std::to_string(attempt) + ": starting " + std::to_string(np) +
                   " processes on " + describe(used));
    ChildGroup child(spawn(args, true, -1));

    AttemptEnd end;
    end.ranks.resize(static_cast<size_t>(np));
    bool resumed_logged = false, caught_up_logged = false, killed = false;
    std::optional<double> ending_since;  // when the launcher began ending the attempt
    for (;;) {
      const std::optional<int> status = child.poll();
      // Read after the poll: once mpiexec has ended, this sees the ranks' last words.
      for (int r = 0; r < np; ++r) read_heartbeat(folder, r, end.ranks[r]);
      const double now = unix_now();
      for (const RankWatch& w : end.ranks) {
        if (!w.last) continue;
        if (w.last->iteration > end.progress.iteration) end.progress = {w.last->iteration, now};
        if (attempt > 0 && !resumed_logged && w.last->resumed_from >= 0) {
          resumed_logged = true;
          log_.write(
              {{"event", "resumed"}, {"attempt", attempt}, {"resumed_from", w.last->resumed_from}},
              "attempt " + std::to_string(attempt) + ": resumed from iteration " +
                  std::to_string(w.last->resumed_from));
        }
      }
      if (attempt > 0 && !caught_up_logged && earlier.iteration >= 0 &&
          end.progress.iteration >= earlier.iteration) {
        caught_up_logged = true;
        const double lost_s = now - earlier.first_seen;
        log_.write({{"event", "caught_up"},
                    {"attempt", attempt},
                    {"iteration", earlier.iteration},
                    {"time_lost_s", lost_s}},
                   "attempt " + std::to_string(attempt) + ": back at iteration " +
                       std::to_string(earlier.iteration) + ", " + one_decimal(lost_s) +
                       " s after the job first got there");
      }
      if (status) {
        end.status = WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
        if (WIFSIGNALED(*status)) end.signal = WTERMSIG(*status);
        return end;
      }
      if (g_stop_signal != 0 && end.stop_signal == 0) {
        end.stop_signal = g_stop_signal;
        EventLog::say(std::string("got ") + (end.stop_signal == SIGINT ? "SIGINT" : "SIGTERM") +
                      ": ending the job");
        child.signal(SIGTERM);
        if (!ending_since) ending_since = now;
      }
      if (!ending_since && options_.hang_timeout > 0 &&
          find_hung(attempt, end.ranks, hosts, used, now)) {
        for (RankWatch& w : end.ranks) w.ended_by_launcher = !w.hung;
        child.signal(SIGTERM);
        kill_local_ranks(folder, end.ranks, used, true);
        ending_since = now;
      }
      if (ending_since && !killed && now - *ending_since >= kKillGraceSeconds) {
        child.signal(SIGKILL);
        kill_local_ranks(folder, end.ranks, used, false);
        killed = true;
      }
      nap(kPollSeconds);
    }
  }

  /// SIGKILLs the ranks of this host that are still there (only the hung ones when `only_hung`).
  // Open MPI puts each rank in a process group of its own: the group of mpiexec does not hold
  // them, and a rank that mpiexec could not end (a stopped one, say) would outlive it.
  static void kill_local_ranks(const fs::path& folder, const std::vector<RankWatch>& ranks,
                               const std::vector<Host>& used, bool only_hung) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      const RankWatch& w = ranks[r];
      if (!w.last || w.last->pid <= 0 || (only_hung && !w.hung)) continue;
      const std::string host =
          w.last->host.empty() ? mapped_host(used, static_cast<int>(r)) : w.last->host;
      if (is_this_host(host) && is_rank_of(w.last->pid, folder))
        ::kill(static_cast<pid_t>(w.last->pid), SIGKILL);
    }
  }

  /// Marks and logs the ranks of `ranks` whose heartbeat is older than --hang-timeout; returns
  /// whether there was one.
  bool find_hung(int attempt, std::vector<RankWatch>& ranks, std::vector<Host>& hosts,
                 const std::vector<Host>& used, double now) {
    bool any = false;
    for (size_t r = 0; r < ranks.size(); ++r) {
      RankWatch& w = ranks[r];
      if (!w.last || has_ended(w.last->state) || now - w.last->time <= options_.hang_timeout)
        continue;
      w.hung = any = true;
      const std::string host = host_of(hosts, used, static_cast<int>(r), w.last->host).name;
      const double age = now - w.last->time;
      log_.write({{"event", "hang"},
                  {"attempt", attempt},
                  {"rank", r},
                  {"host", host},
                  {"heartbeat_age_s", age}},
                 "attempt " + std::to_string(attempt) + ": rank " + std::to_string(r) + " on " +
                     host + " is hung: its last heartbeat is " + one_decimal(age) +
                     " s old (--hang-timeout " + one_decimal(options_.hang_timeout) +
                     "): ending the attempt");
    }
    return any;
  }

  /// The host the attempt's hostfile puts `rank` on (Open MPI fills the hosts slot by slot).
  static std::string mapped_host(const std::vector<Host>& used, int rank) {
    for (const Host& h : used) {
      if (rank < h.slots) return h.name;
      rank -= h.slots;
    }
    return used.empty() ? std::string() : used.back().name;
  }

  /// The entry of `hosts` that lost `rank` runs on: the host its heartbeat names (as the hostfile
  /// names it, or by short name, or this host under "localhost"), else where the hostfile put it.
  static Host& host_of(std::vector<Host>& hosts, const std::vector<Host>& used, int rank,
                       const std::string& said) {
    const auto find = [&](auto&& match) { return std::find_if(hosts.begin(), hosts.end(), match); };
    if (!said.empty()) {
      auto it = find([&](const Host& h) { return h.name == said; });
      if (it == hosts.end())
        it = find([&](const Host& h) { return short_name(h.name) == short_name(said); });
      if (it == hosts.end() && is_this_host(said))
        it = find([&](const Host& h) { return is_this_host(h.name); });
      if (it != hosts.end()) return *it;
    }
    const std::string name = mapped_host(used, rank);
    return *find([&](const Host& h) { return h.name == name; });
  }

  /// Logs the end of `attempt` with its `lost` and `failed` ranks.
  void log_end(int attempt, const AttemptEnd& end, const Json& lost, const Json& failed) {
    std::string human = "attempt " + std::to_string(attempt) + " ended with exit status " +
                        std::to_string(end.status);
    if (end.signal) human += " (signal " + std::to_string(*end.signal) + ")";
    for (const Json& l : lost) {
      human += "; lost rank " + std::to_string(l["rank"].get<int>()) + " on " +
               l["host"].get<std::string>() + " (" + l["cause"].get<std::string>() + ")";
    }
    log_.write({{"event", "end"},
                {"attempt", attempt},
                {"exit_status", end.status},
                {"signal", end.signal ? Json(*end.signal) : Json(nullptr)},
                {"lost", lost},
                {"failed", failed},
                {"last_iteration", end.progress.iteration}},
               human);
  }

  /// Logs that the run stops because of `reason`; returns `status`.
  int stop(const std::string& reason, int status) {
    log_.write({{"event", "stopped"}, {"reason", reason}}, reason);
    return status;
  }

  Options options_;  ///< the command line
  bool open_mpi_;    ///< whether mpiexec is Open MPI's (it needs -x to pass the environment on)
  EventLog log_;     ///< where the events go
};

/// Reads and checks the command line into `options`; throws UsageError (or CLI11's errors).
Options parse_command_line(int argc, char** argv) {
  CLI::App app{"Runs an MPI job and starts it again on the slots left when ranks are lost",
               "kusari-run"};
  app.footer("Usage: kusari-run [options] -- PROGRAM [ARGS...]");
  std::string np, hostfile, heartbeat_dir = ".kusari-run", log;
  Options options;
  const char* env_mpiexec = std::getenv("KUSARI_MPIEXEC");
  const bool from_env = env_mpiexec != nullptr && *env_mpiexec != '\0';
  options.mpiexec = from_env ? env_mpiexec : "mpiexec";
  app.add_option("-n,--np", np, "Processes: at least MIN, at most MAX (MAX defaults to MIN)")
      ->type_name("MIN[:MAX]")
      ->required();
  app.add_option("--hostfile", hostfile,
                 "Open MPI hostfile ('HOST slots=N' lines); default: this host, MAX slots");
  app.add_option("--max-restarts", options.max_restarts, "Restarts after a loss")
      ->capture_default_str();
  app.add_option("--hang-timeout", options.hang_timeout,
                 "A rank whose heartbeat is older than this (s) is hung; 0: never")
      ->capture_default_str();
  app.add_option("--heartbeat-dir", heartbeat_dir, "Where the ranks write heartbeats")
      ->capture_default_str();
  app.add_option(
      "--log", log,
      "JSON lines of the attempts (default: kusari-run.log beside the heartbeat folder)");
  app.add_option("--mpiexec", options.mpiexec,
                 "mpiexec to run (default: $KUSARI_MPIEXEC, else mpiexec)");
  app.add_option("--mpiexec-arg", options.mpiexec_args,
                 "One more argument for mpiexec (repeatable)")
      ->allow_extra_args(false);
  app.add_flag("--restart-on-error", options.restart_on_error,
               "Also restart when ranks failed with a program error");
  // Everything from the first word that is not an option on (or after "--") is the program.
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    throw ParseExit{app.exit(e)};
  }

  std::tie(options.min_np, options.max_np) = parse_np(np);
  if (options.max_restarts < 0) {
    throw UsageError("--max-restarts '" + std::to_string(options.max_restarts) +
                     "': expected a whole number >= 0");
  }
  if (!(options.hang_timeout >= 0) || !std::isfinite(options.hang_timeout)) {
    throw UsageError("--hang-timeout '" + app.get_option("--hang-timeout")->as<std::string>() +
                     "': expected seconds >= 0 (0 turns the check off)");
  }
  std::vector<std::string> program = app.remaining();
  const bool dashes = !program.empty() && program.front() == "--";
  if (dashes) program.erase(program.begin());
  if (program.empty())
    throw UsageError("no program given: expected 'kusari-run [options] -- PROGRAM [ARGS...]'");
  if (!dashes && program.front().size() > 1 && program.front()[0] == '-') {
    throw UsageError("unknown option '" + program.front() + "' (put the program after '--')");
  }
  options.program = std::move(program);
  options.mpiexec_flag = app.count("--mpiexec") == 0 && from_env ? "KUSARI_MPIEXEC" : "--mpiexec";
  options.hosts =
      hostfile.empty() ? std::vector<Host>{{"localhost", options.max_np}} : read_hostfile(hostfile);
  if (heartbeat_dir.empty()) throw UsageError("--heartbeat-dir '': expected a folder");
  std::error_code ec;
  options.heartbeat_dir = fs::absolute(heartbeat_dir, ec).lexically_normal();
  if (options.heartbeat_dir.filename().empty())
    options.heartbeat_dir = options.heartbeat_dir.parent_path();
  options.log =
      log.empty() ? options.heartbeat_dir.parent_path() / "kusari-run.log" : fs::path(log);
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  try {
    Options options = parse_command_line(argc, argv);
    // As kusari's programs do (kusari::only_check_arguments), without linking kusari.
    const char* check = std::getenv("KUSARI_CHECK_ARGS");
    if (check != nullptr && *check != '\0' && std::string(check) != "0") {
      std::printf("kusari-run: arguments accepted\n");
      return 0;
    }
    Launcher launcher(std::move(options));
    return launcher.run();
  } catch (const ParseExit& e) {
    return e.code == 0 ? 0 : 2;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "kusari-run: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[kusari-run] error: %s\n", e.what());
    return 1;
  }
}
