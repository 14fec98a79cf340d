// Runs the failing_rank program under mpiexec and checks that the job ends within seconds,
// with a non-zero status and a message naming the failed rank and the error.
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>

int main() {
  const std::string cmd = std::string(KUSARI_MPIEXEC) + " -n 2 " + KUSARI_MPIEXEC_FLAGS + " " + KUSARI_FAILING_RANK + " 2>&1";
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
  if (out.find("rank 1 of 2") == std::string::npos || out.find("injected failure at step 3") == std::string::npos) {
    std::fprintf(stderr, "FAIL: the output must name rank 1 and the error message\n");
    ok = false;
  }
  if (out.find("finished without noticing") != std::string::npos) {
    std::fprintf(stderr, "FAIL: a rank finished although its peer had failed\n");
    ok = false;
  }
  std::printf(ok ? "PASS\n" : "FAIL\n");
  return ok ? 0 : 1;
}
