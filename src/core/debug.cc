#include "kusari/core/debug.h"

#include <atomic>
#include <cstdlib>
#include <string>

namespace kusari {

namespace {
std::atomic<bool>& debug_flag() {
  static std::atomic<bool> flag = [] {
    const char* env = std::getenv("KUSARI_DEBUG");
    return env != nullptr && std::string(env) == "1";
  }();
  return flag;
}
}  // namespace

bool is_debug() { return debug_flag().load(std::memory_order_relaxed); }
void set_debug(bool on) { debug_flag().store(on, std::memory_order_relaxed); }

}  // namespace kusari
