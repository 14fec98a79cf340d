// Shared helpers of the benchmark programs: timing, running the PyTorch peer, printing. The
// programs read their flags with CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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

/// Runs a shell command and returns the "RESULT key value" lines it prints.
inline std::map<std::string, double> run_for_results(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run: " + cmd);
  std::map<std::string, double> out;
  std::array<char, 4096> buf;
  std::string all;
  while (fgets(buf.data(), buf.size(), pipe.get())) {
    std::string line(buf.data());
    all += line;
    std::istringstream is(line);
    std::string tag, key;
    double value;
    if (is >> tag >> key >> value && tag == "RESULT") out[key] = value;
  }
  if (out.empty()) throw std::runtime_error("no RESULT lines from: " + cmd + "\noutput:\n" + all);
  return out;
}

/// Runs a peer script (bench/peers/<script>) with `args` under `python`, with extra environment
/// assignments in front ("OPENBLAS_NUM_THREADS=1"), and returns its "RESULT key value" lines.
inline std::map<std::string, double> run_peer(const std::string& python, const std::string& script,
                                              const std::string& args, const std::string& env = "") {
  return run_for_results(env + (env.empty() ? "" : " ") + python + " " + KUSARI_BENCH_DIR + "/peers/" + script + " " +
                         args);
}

/// The command line that started this program, for "reproduce with".
inline std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) s += (i ? " " : "") + std::string(argv[i]);
  return s;
}

}  // namespace kusari::bench
