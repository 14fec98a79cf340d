// The CUDA utilities of kusari/core/cuda.h, forwarded to the CUDA library when it is loaded. See
// Note [The CUDA library is loaded] in core/cuda_runtime.h.
#include "kusari/core/cuda.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "core/cuda_runtime.h"
#include "core/library_loader.h"
#include "kusari/config.h"
#include "kusari/core/error.h"

#if KUSARI_HAVE_CUDA && KUSARI_CUDA_BUILTIN
extern "C" kusari::cuda::Runtime* KUSARI_CUDA_ENTRY();
#endif

namespace kusari::cuda {
namespace {

struct Loaded {
  Runtime* runtime = nullptr;
  std::string reason;
};

const Loaded& loaded() {
  static const Loaded* state = [] {
    auto* s = new Loaded();
#if !KUSARI_HAVE_CUDA
    s->reason = "this build of kusari has no CUDA support (configure with -DKUSARI_WITH_CUDA=ON)";
#elif KUSARI_CUDA_BUILTIN
    s->runtime = KUSARI_CUDA_ENTRY();
#else
    std::string error;
    void* entry = ::kusari::detail::load_library_symbol(
        "KUSARI_CUDA_LIBRARY", KUSARI_CUDA_LIBRARY_FILE, KUSARI_CUDA_ENTRY_NAME, &error);
    if (entry != nullptr) {
      s->runtime = reinterpret_cast<Runtime* (*)()>(entry)();
    } else {
      s->reason = "kusari's CUDA library is not usable on this machine: " + error;
    }
#endif
    return s;
  }();
  return *state;
}

// The default of a TF32 switch: its own variable, else KUSARI_ALLOW_TF32, else `fallback`.
bool tf32_default(const char* own, bool fallback) {
  for (const char* name : {own, "KUSARI_ALLOW_TF32"}) {
    const char* env = std::getenv(name);
    if (env == nullptr || *env == '\0') continue;
    const std::string_view v(env);
    KUSARI_CHECK(v == "0" || v == "1", ValueError, "kusari: ", name, "='", v,
                 "' is not a TF32 setting (expected 0 or 1)");
    return v == "1";
  }
  return fallback;
}

std::atomic<bool>& tf32_convolution_flag() {
  static std::atomic<bool> flag{tf32_default("KUSARI_ALLOW_TF32_CONV", true)};
  return flag;
}

std::atomic<bool>& tf32_matmul_flag() {
  static std::atomic<bool> flag{tf32_default("KUSARI_ALLOW_TF32_MATMUL", false)};
  return flag;
}

}  // namespace

Runtime* runtime() {
  return loaded().runtime;
}

const std::string& unavailable_reason() {
  return loaded().reason;
}

Runtime& require_runtime(const char* what) {
  Runtime* r = runtime();
  KUSARI_CHECK(r != nullptr, DeviceError, what, ": CUDA is unavailable: ", unavailable_reason());
  return *r;
}

MemoryStats memory_stats(int device) {
  return require_runtime("cuda::memory_stats").memory_stats(device);
}

void empty_cache() {
  if (Runtime* r = runtime()) r->empty_cache();
}

void profiler_start() { require_runtime("cuda::profiler_start").profiler_collect(true); }

void profiler_stop() { require_runtime("cuda::profiler_stop").profiler_collect(false); }

void set_allow_tf32(bool allow) {
  set_allow_tf32_convolution(allow);
  set_allow_tf32_matmul(allow);
}

void set_allow_tf32_convolution(bool allow) {
  tf32_convolution_flag().store(allow, std::memory_order_relaxed);
}

bool allow_tf32_convolution() {
  return tf32_convolution_flag().load(std::memory_order_relaxed);
}

void set_allow_tf32_matmul(bool allow) {
  tf32_matmul_flag().store(allow, std::memory_order_relaxed);
}

bool allow_tf32_matmul() {
  return tf32_matmul_flag().load(std::memory_order_relaxed);
}

bool is_capturing(Device device) {
  if (!device.is_cuda() || device.index() < 0) return false;
  Runtime* r = runtime();
  if (r == nullptr || device.index() >= r->device_count()) return false;
  return r->capturing(device.index());
}

// --- Graph ---------------------------------------------------------------------------------------

Graph::Graph() = default;
Graph::~Graph() = default;
Graph::Graph(Graph&& other) noexcept = default;
Graph& Graph::operator=(Graph&& other) noexcept = default;

void Graph::capture(Device device, const std::function<void()>& fn) {
  KUSARI_CHECK(device.is_cuda(), DeviceError, "cuda::Graph::capture: ", device,
               " is not a CUDA device (graphs record the work of a GPU)");
  if (!impl_) impl_ = require_runtime("cuda::Graph::capture").make_graph();
  impl_->capture(device, fn);
}

void Graph::replay() {
  KUSARI_CHECK(captured(), DeviceError, "cuda::Graph::replay: nothing has been captured");
  impl_->replay();
}

bool Graph::captured() const {
  return impl_ && impl_->captured();
}

Device Graph::device() const {
  KUSARI_CHECK(captured(), DeviceError, "cuda::Graph::device: nothing has been captured");
  return impl_->device();
}

int64_t Graph::num_nodes() const {
  return impl_ ? impl_->num_nodes() : 0;
}

void Graph::reset() {
  if (impl_) impl_->reset();
}

// --- ScalarReader --------------------------------------------------------------------------------

ScalarReader::ScalarReader() = default;
ScalarReader::~ScalarReader() = default;

void ScalarReader::start(const Array& value) {
  KUSARI_CHECK(value.device().is_cuda() && value.size() == 1 && value.dtype() == Dtype::kInt64,
               DeviceError, "cuda::ScalarReader::start: expected one int64 on a CUDA device, got ",
               value.shape(), " ", dtype_name(value.dtype()), " on ", value.device());
  if (!impl_) impl_ = require_runtime("cuda::ScalarReader::start").make_scalar_reader();
  impl_->start(value);
}

bool ScalarReader::pending() const {
  return impl_ && impl_->pending();
}

int64_t ScalarReader::get() {
  KUSARI_CHECK(pending(), ValueError, "cuda::ScalarReader::get: no read was started");
  return impl_->get();
}

}  // namespace kusari::cuda
