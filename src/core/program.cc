#include "kusari/core/program.h"

#include <cstdio>
#include <cstdlib>

namespace kusari {

bool only_check_arguments(const std::string& program) {
  const char* env = std::getenv("KUSARI_CHECK_ARGS");
  if (env == nullptr || *env == '\0' || std::string(env) == "0") return false;
  std::printf("%s: arguments accepted\n", program.c_str());
  std::fflush(stdout);
  return true;
}

}  // namespace kusari
