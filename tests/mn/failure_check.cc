// Runs the failing_rank program under mpiexec and checks that the job ends within seconds, with
// a non-zero status and one report of the failure (Note [One report of a failure]):
//
//   failure_check --np 2 --expect-once "rank 1 of 2 on host" --expect-once "injected failure at step 3"
//   failure_check --np 3 --all --expect-once "ranks 0, 1 and 2 of 3 on host"
//
// Every --expect-once text must appear exactly once in the job's output; Open MPI's abort banner
// (MPI_Abort) and its error-log lines must not appear at all.
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  std::string np = "2", program_args;
  std::vector<std::string> once;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--np" && i + 1 < argc) {
      np = argv[++i];
    } else if (a == "--all") {
      program_args = " --all";
    } else if (a == "--expect-once" && i + 1 < argc) {
      once.emplace_back(argv[++i]);
    } else {
      std::fprintf(stderr, "failure_check: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  const std::string cmd = std::string(KUSARI_MPIEXEC) + " -n " + np + " " + KUSARI_MPIEXEC_FLAGS + " " +
                          KUSARI_FAILING_RANK + program_args + " 2>&1";
  auto start = std::chrono::steady_clock::now();
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) {
    std::fprintf(stderr, "FAIL: cannot start %s\n", cmd.c_str());
    return 1;
  }
  std::string out;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), pipe)) out += buf.data();
  int status = pclose(pipe);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s\n--- exit status %d after %.1f s\n", out.c_str(), status, seconds);
  bool ok = true;
  if (!WIFEXITED(status) || WEXITSTATUS(status) == 0) {
    std::fprintf(stderr, "FAIL: the job must exit with a non-zero status\n");
    ok = false;
  }
  if (seconds > 30) {
    std::fprintf(stderr, "FAIL: the job took %.1f s to end (expected a few seconds)\n", seconds);
    ok = false;
  }
  for (const std::string& part : once) {
    const size_t n = count(out, part);
    if (n != 1) {
      std::fprintf(stderr, "FAIL: '%s' must appear once in the output, found %zu times\n", part.c_str(), n);
      ok = false;
    }
  }
  if (count(out, "[kusari.mn] the job ends: exit status 1") != 1) {
    std::fprintf(stderr, "FAIL: the output must end the report with one '[kusari.mn] the job ends' line\n");
    ok = false;
  }
  for (const char* banner : {"MPI_ABORT", "ORTE_ERROR_LOG", "finished without noticing"}) {
    if (out.find(banner) != std::string::npos) {
      std::fprintf(stderr, "FAIL: the output must not contain '%s'\n", banner);
      ok = false;
    }
  }
  std::printf(ok ? "PASS\n" : "FAIL\n");
  return ok ? 0 : 1;
}
