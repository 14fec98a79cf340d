#include "kusari/training/terminal.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "kusari/core/error.h"

namespace kusari::training {

namespace {

// -1: detect, 0: plain, 1: terminal (the program's choice, rule 1 of Note [Terminal output]).
std::atomic<int> g_terminal_output{-1};

// The environment variables of Note [Terminal output], rule 3.
constexpr const char* kLauncherVariables[] = {
    "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",   "PMI_RANK",     "PMI_SIZE",
    "MPI_LOCALRANKID",      "MV2_COMM_WORLD_RANK", "PALS_RANKID", "SLURM_PROCID",
};

// KUSARI_TERMINAL (rule 2): read on every call, so a test or a program may change it.
std::optional<bool> terminal_from_environment() {
  const char* env = std::getenv("KUSARI_TERMINAL");
  if (env == nullptr) return std::nullopt;
  const std::string_view v(env);
  if (v.empty() || v == "auto") return std::nullopt;
  if (v == "1") return true;
  if (v == "0") return false;
  KUSARI_THROW(ValueError, "KUSARI_TERMINAL: expected 1 (terminal output), 0 (plain lines) or auto "
               "(detect), got '", v, "'");
}

}  // namespace

void set_terminal_output(std::optional<bool> terminal) {
  g_terminal_output.store(terminal ? (*terminal ? 1 : 0) : -1);
}

std::optional<bool> terminal_output() {
  const int v = g_terminal_output.load();
  if (v < 0) return std::nullopt;
  return v == 1;
}

bool under_launcher() {
  for (const char* name : kLauncherVariables) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

bool is_terminal_output(const std::ostream& out) {
  int fd = -1;
  if (&out == &std::cout) {
    fd = STDOUT_FILENO;
  } else if (&out == &std::cerr || &out == &std::clog) {
    fd = STDERR_FILENO;
  } else {
    return false;
  }
  if (std::optional<bool> chosen = terminal_output()) return *chosen;
  if (std::optional<bool> env = terminal_from_environment()) return *env;
  if (under_launcher()) return false;
  return ::isatty(fd) == 1;
}

}  // namespace kusari::training
