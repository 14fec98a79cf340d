#include "core/library_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kusari/core/error.h"

namespace kusari::detail {
namespace {

// The directory of the object this code is linked into (libkusari.so, or the program itself in
// a static build).
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_library_symbol), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  std::error_code ec;
  std::filesystem::path self = std::filesystem::canonical(info.dli_fname, ec);
  if (ec) self = info.dli_fname;
  return self.parent_path().string();
}

}  // namespace

void* load_library_symbol(const char* env_var, const char* file_name, const char* symbol,
                          std::string* error) {
  std::vector<std::string> candidates;
  const char* forced = env_var ? std::getenv(env_var) : nullptr;
  if (forced != nullptr && *forced != '\0') {
    candidates.emplace_back(forced);  // set by the user: nothing else is tried
  } else {
    const std::string dir = own_directory();
    if (!dir.empty() && std::filesystem::exists(std::filesystem::path(dir) / file_name)) {
      candidates.push_back((std::filesystem::path(dir) / file_name).string());
    }
    candidates.emplace_back(file_name);  // the dynamic linker's search
  }
  std::string reasons;
  for (const std::string& path : candidates) {
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      reasons += concat(reasons.empty() ? "" : "; ", why ? why : path + ": cannot be loaded");
      continue;
    }
    dlerror();
    void* address = dlsym(handle, symbol);
    if (address != nullptr) return address;
    const char* why = dlerror();
    reasons += concat(reasons.empty() ? "" : "; ", path, " has no ", symbol, " (",
                      why ? why : "not found",
                      "): it was built from another version of kusari than this program");
  }
  if (error) {
    *error = concat(file_name, " could not be loaded: ", reasons,
                    env_var ? concat(" (", env_var, " can name the file)") : std::string());
  }
  return nullptr;
}

}  // namespace kusari::detail
