// Loading kusari's optional shared libraries (the CUDA backend, the NCCL communicators) at run
// time, so that programs which never use a GPU need none of the GPU libraries. See
// Note [The CUDA library is loaded] in core/cuda_runtime.h.
#pragma once

#include <string>

namespace kusari::detail {

/// Loads the shared library `file_name` and returns the address of its `symbol`, or null with
/// `*error` saying why. The library is looked for in the path held by the environment variable
/// `env_var` (when set), then in the directory of the library this function lives in
/// (libkusari), then by the dynamic linker's own search. A library once loaded stays loaded.
void* load_library_symbol(const char* env_var, const char* file_name, const char* symbol,
                          std::string* error);

}  // namespace kusari::detail
