#include "kusari/core/error.h"

namespace kusari::detail {

void assertion_failed(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << "internal error in kusari (please report it): " << cond << " failed at " << file << ":" << line;
  if (!msg.empty()) os << ": " << msg;
  throw Error(os.str());
}

}  // namespace kusari::detail
