// Runs a program under mpiexec and checks how the job ends: its exit status, how long it took, and
// what it printed. Optionally stops one rank from outside (SIGSTOP, as a frozen node would) once
// the output matches a pattern. The deadline tests of CMakeLists.txt use it.
//
//   kusari_mn_job_check [--np N] [--max-seconds S] [--status zero|nonzero] [--env NAME=VALUE]...
//       [--expect REGEX]... [--reject REGEX]... [--stop-rank R --stop-when REGEX]
//       [--needs-fashion-mnist] -- PROGRAM [ARGS...]
//
// The job runs in a process group of its own; whatever is left of it at the end (a stopped rank
// that mpiexec did not end) is killed, and counts as a failure. The rank to stop is found among
// mpiexec's descendants by the rank in its environment (OMPI_COMM_WORLD_RANK, PMI_RANK).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

/// The parent of process `pid` (0 when it cannot be read).
pid_t parent_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t close = line.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 1));
  std::string state;
  long ppid = 0;
  rest >> state >> ppid;
  return static_cast<pid_t>(ppid);
}

/// Every process (of this machine) below `root`.
std::vector<pid_t> descendants(pid_t root) {
  std::vector<pid_t> all;
  if (DIR* proc = opendir("/proc")) {
    while (dirent* e = readdir(proc)) {
      const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
      if (pid > 0) all.push_back(pid);
    }
    closedir(proc);
  }
  std::vector<pid_t> out = {root};
  for (size_t i = 0; i < out.size(); ++i) {
    for (pid_t pid : all) {
      if (parent_of(pid) == out[i]) out.push_back(pid);
    }
  }
  out.erase(out.begin());
  return out;
}

/// The processes below `root` whose environment says they are MPI rank `rank`.
std::vector<pid_t> ranks_below(pid_t root, int rank) {
  std::vector<pid_t> out;
  const std::string want[] = {"OMPI_COMM_WORLD_RANK=" + std::to_string(rank),
                              "PMI_RANK=" + std::to_string(rank), "PMIX_RANK=" + std::to_string(rank)};
  for (pid_t pid : descendants(root)) {
    std::ifstream env("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    std::istringstream vars(all);
    bool match = false;
    for (std::string var; std::getline(vars, var, '\0');) {
      for (const std::string& w : want) match = match || var == w;
    }
    if (match) out.push_back(pid);
  }
  return out;
}

bool group_alive(pid_t pgid) { return kill(-pgid, 0) == 0; }

}  // namespace

int main(int argc, char** argv) {
  int np = 2, stop_rank = -1;
  double max_seconds = 60;
  std::string status = "nonzero", stop_when;
  std::vector<std::string> envs, expects, rejects, program;
  bool needs_data = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      for (++i; i < argc; ++i) program.push_back(argv[i]);
      break;
    }
    if (a == "--needs-fashion-mnist") {
      needs_data = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "job_check: missing value after %s\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--np") np = std::atoi(v.c_str());
    else if (a == "--max-seconds") max_seconds = std::atof(v.c_str());
    else if (a == "--status") status = v;
    else if (a == "--env") envs.push_back(v);
    else if (a == "--expect") expects.push_back(v);
    else if (a == "--reject") rejects.push_back(v);
    else if (a == "--stop-rank") stop_rank = std::atoi(v.c_str());
    else if (a == "--stop-when") stop_when = v;
    else {
      std::fprintf(stderr, "job_check: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (program.empty()) {
    std::fprintf(stderr, "job_check: no program given (after --)\n");
    return 2;
  }
  if (needs_data) {
    std::vector<std::string> dirs = {"/usr/share/datasets/fashion-mnist"};
    if (const char* root = std::getenv("KUSARI_DATASET_ROOT")) dirs.insert(dirs.begin(), std::string(root) + "/fashion-mnist");
    bool found = false;
    for (const auto& d : dirs) found = found || exists(d + "/train-images-idx3-ubyte") || exists(d + "/train-images-idx3-ubyte.gz");
    if (!found) {
      std::printf("SKIP: Fashion-MNIST is not installed\n");
      return 0;
    }
  }

  std::vector<std::string> cmd = {KUSARI_MPIEXEC, "-n", std::to_string(np)};
  for (const std::string& f : split_words(KUSARI_MPIEXEC_FLAGS)) cmd.push_back(f);
  cmd.insert(cmd.end(), program.begin(), program.end());
  std::string shown;
  for (const std::string& c : cmd) shown += (shown.empty() ? "" : " ") + c;
  for (const std::string& e : envs) shown = e + " " + shown;
  std::printf("running: %s\n", shown.c_str());
  std::fflush(stdout);

  int fds[2];
  if (pipe(fds) != 0) {
    std::perror("pipe");
    return 1;
  }
  const Clock::time_point start = Clock::now();
  const pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);
    for (const std::string& e : envs) putenv(strdup(e.c_str()));
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (std::string& c : cmd) args.push_back(c.data());
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::perror("execvp");
    _exit(127);
  }
  setpgid(child, child);
  close(fds[1]);

  std::string out;
  const std::regex stop_pattern(stop_when.empty() ? "$^" : stop_when);
  double stopped_at = -1;
  std::vector<pid_t> stopped;
  bool over_time = false;
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready > 0) {
      char buf[4096];
      const ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    if (stop_rank >= 0 && stopped_at < 0 && std::regex_search(out, stop_pattern)) {
      const std::vector<pid_t> pids = ranks_below(child, stop_rank);
      if (!pids.empty()) {
        for (pid_t pid : pids) kill(pid, SIGSTOP);
        stopped = pids;
        stopped_at = since(start);
        out += "[job_check] stopped rank " + std::to_string(stop_rank) + " (SIGSTOP) after " +
               std::to_string(stopped_at) + " s\n";
      }
    }
    if (since(start) > max_seconds) {
      over_time = true;
      break;
    }
  }
  int wstatus = 0;
  if (over_time) {
    kill(-child, SIGCONT);
    kill(-child, SIGKILL);
  }
  waitpid(child, &wstatus, 0);
  const double seconds = since(start);
  // Whatever is left of the job (a stopped rank mpiexec did not end) is a failure too.
  usleep(200 * 1000);
  bool leftovers = group_alive(child);
  for (pid_t pid : stopped) {
    // Still there, and not a zombie of some other parent: mpiexec left the stopped rank behind.
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t close = line.rfind(')');
    if (close != std::string::npos && line.compare(close + 2, 1, "Z") != 0) {
      leftovers = true;
      kill(pid, SIGCONT);
      kill(pid, SIGKILL);
    }
  }
  if (group_alive(child)) {
    kill(-child, SIGCONT);
    kill(-child, SIGKILL);
  }
  close(fds[0]);

  std::printf("%s\n--- exit status %d after %.1f s", out.c_str(),
              WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1, seconds);
  if (stopped_at >= 0) std::printf(" (%.1f s after the stop)", seconds - stopped_at);
  std::printf("\n");
  bool ok = true;
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "FAIL: %s\n", why.c_str());
    ok = false;
  };
  if (over_time) fail("the job was still running after " + std::to_string(max_seconds) + " s (killed)");
  if (leftovers) fail("processes of the job were left behind after mpiexec ended (killed)");
  const bool zero = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;
  if (!over_time && status == "zero" && !zero) fail("the job must exit with status 0");
  if (!over_time && status == "nonzero" && zero) fail("the job must exit with a non-zero status");
  if (stop_rank >= 0 && stopped_at < 0) fail("the output never matched --stop-when '" + stop_when + "'");
  for (const std::string& e : expects) {
    if (!std::regex_search(out, std::regex(e))) fail("the output must match '" + e + "'");
  }
  for (const std::string& r : rejects) {
    if (std::regex_search(out, std::regex(r))) fail("the output must not match '" + r + "'");
  }
  std::printf(ok ? "PASS\n" : "FAIL\n");
  return ok ? 0 : 1;
}
