#include "mn/nccl_library.h"

#include "core/library_loader.h"
#include "kusari/config.h"

#if KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL && KUSARI_CUDA_BUILTIN
extern "C" const kusari::mn::detail::NcclLibrary* KUSARI_NCCL_ENTRY();
#endif

namespace kusari::mn::detail {

const NcclLibrary* nccl_library(std::string* why) {
  struct Loaded {
    const NcclLibrary* library = nullptr;
    std::string reason;
  };
  static const Loaded* loaded = [] {
    auto* s = new Loaded();
#if !(KUSARI_HAVE_CUDA && KUSARI_HAVE_NCCL)
    s->reason = "this kusari was built without CUDA and NCCL";
#elif KUSARI_CUDA_BUILTIN
    s->library = KUSARI_NCCL_ENTRY();
#else
    std::string error;
    void* entry = ::kusari::detail::load_library_symbol("KUSARI_NCCL_LIBRARY", KUSARI_NCCL_LIBRARY_FILE,
                                                        KUSARI_NCCL_ENTRY_NAME, &error);
    if (entry != nullptr) {
      s->library = reinterpret_cast<const NcclLibrary* (*)()>(entry)();
    } else {
      s->reason = "kusari's NCCL library is not usable on this machine: " + error;
    }
#endif
    return s;
  }();
  if (why) *why = loaded->reason;
  return loaded->library;
}

}  // namespace kusari::mn::detail
