// The CUDA utilities of kusari/core/cuda.h, forwarded to the CUDA library when it is loaded. See
// Note [The CUDA library is loaded] in core/cuda_runtime.h.
#include "kusari/core/cuda.h"

#include <algorithm>
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

void reset_peak_memory_stats(int device) {
  require_runtime("cuda::reset_peak_memory_stats").reset_peak_memory_stats(device);
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

// --- pinned host memory, Event, UploadStream (Note [Upload stream]) ----------------------------

Array pinned_empty(const Shape& shape, Dtype dtype, Device gpu) {
  KUSARI_CHECK(gpu.is_cuda(), DeviceError, "cuda::pinned_empty: ", gpu,
               " is not a CUDA device (name the GPU whose context pins the memory)");
  Runtime& r = require_runtime("cuda::pinned_empty");
  const int64_t n = shape.numel();
  const size_t nbytes = static_cast<size_t>(n) * kusari::itemsize(dtype);
  const int device = gpu.index();
  // One byte at least: an Array's storage is never null.
  void* ptr = r.allocate_pinned(device, std::max<size_t>(nbytes, 1));
  std::shared_ptr<void> owner(ptr, [&r, device](void* p) { r.free_pinned(device, p); });
  return Array::from_blob(std::move(owner), ptr, shape, dtype);
}

bool is_pinned(const Array& array) {
  if (!array.defined() || !array.device().is_cpu()) return false;
  Runtime* r = runtime();
  return r != nullptr && r->is_pinned(array.raw_data());
}

PinnedMemoryStats pinned_memory_stats() {
  Runtime* r = runtime();
  return r != nullptr ? r->pinned_memory_stats() : PinnedMemoryStats{};
}

Event::Event() = default;
Event::~Event() = default;
Event::Event(Event&& other) noexcept = default;
Event& Event::operator=(Event&& other) noexcept = default;

void Event::record_compute(Device device) {
  KUSARI_CHECK(device.is_cuda(), DeviceError, "cuda::Event::record_compute: ", device,
               " is not a CUDA device");
  if (!impl_) impl_ = require_runtime("cuda::Event::record_compute").make_event();
  impl_->record_compute(device.index());
}

bool Event::done() const {
  return !impl_ || impl_->done();
}

void Event::synchronize() const {
  if (impl_) impl_->synchronize();
}

void Event::block_compute() const {
  if (impl_) impl_->block_compute();
}

bool Event::recorded() const {
  return impl_ && impl_->recorded();
}

UploadStream::UploadStream(Device device) : device_(device) {
  KUSARI_CHECK(device.is_cuda(), DeviceError, "cuda::UploadStream: ", device,
               " is not a CUDA device (the stream copies host data to a GPU)");
  impl_ = require_runtime("cuda::UploadStream").make_upload_stream(device.index());
}

UploadStream::~UploadStream() = default;

void UploadStream::wait(const Event& event) {
  if (event.impl() != nullptr) impl_->wait(*event.impl());
}

void UploadStream::copy(const Array& src, const Array& dst) {
  const char* fn = "cuda::UploadStream::copy";
  KUSARI_CHECK(src.defined() && dst.defined(), ValueError, fn, ": an array is undefined");
  KUSARI_CHECK(src.device().is_cpu() && dst.device() == device_, DeviceError, fn,
               ": copies a CPU array to ", device_, ", got ", src.device(), " -> ", dst.device());
  KUSARI_CHECK(src.dtype() == dst.dtype() && src.shape() == dst.shape(), ShapeError, fn,
               ": source and destination differ: ", dtype_name(src.dtype()), " ", src.shape(),
               " -> ", dtype_name(dst.dtype()), " ", dst.shape());
  KUSARI_CHECK(src.is_contiguous() && dst.is_contiguous(), ValueError, fn,
               ": both arrays must be contiguous");
  if (src.nbytes() == 0) return;
  impl_->copy(dst.raw_data(), src.raw_data(), static_cast<size_t>(src.nbytes()));
}

void UploadStream::record(Event& event) {
  if (!event.impl_) event.impl_ = require_runtime("cuda::UploadStream::record").make_event();
  impl_->record(*event.impl_);
}

void UploadStream::synchronize() {
  impl_->synchronize();
}

}  // namespace kusari::cuda
