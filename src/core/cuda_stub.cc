// The CUDA utilities of a build without CUDA (see kusari/core/cuda.h).
#include "kusari/config.h"
#include "kusari/core/cuda.h"
#include "kusari/core/error.h"

#if !KUSARI_HAVE_CUDA
namespace kusari::cuda {

MemoryStats memory_stats(int) { return {}; }
void empty_cache() {}
void set_allow_tf32(bool) {}
bool allow_tf32() { return false; }

struct Graph::Impl {};
Graph::Graph() = default;
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;
void Graph::capture(Device device, const std::function<void()>&) {
  KUSARI_THROW(DeviceError, "cuda::Graph::capture: cannot capture on ", device,
               ": this build of kusari has no CUDA support (configure with -DKUSARI_WITH_CUDA=ON)");
}
void Graph::replay() {
  KUSARI_THROW(DeviceError, "cuda::Graph::replay: nothing was captured (this build of kusari has no "
                            "CUDA support)");
}
bool Graph::captured() const { return false; }
Device Graph::device() const { return Device::cpu(); }
int64_t Graph::num_nodes() const { return 0; }
void Graph::reset() {}
bool is_capturing(Device) { return false; }

struct ScalarReader::Impl {};
ScalarReader::ScalarReader() = default;
ScalarReader::~ScalarReader() = default;
void ScalarReader::start(const Array& value) {
  KUSARI_THROW(DeviceError, "cuda::ScalarReader::start: cannot read from ", value.device(),
               ": this build of kusari has no CUDA support (configure with -DKUSARI_WITH_CUDA=ON)");
}
bool ScalarReader::pending() const {
  return false;
}
int64_t ScalarReader::get() {
  KUSARI_THROW(DeviceError,
               "cuda::ScalarReader::get: nothing was started (this build of kusari "
               "has no CUDA support)");
}

}  // namespace kusari::cuda
#endif
