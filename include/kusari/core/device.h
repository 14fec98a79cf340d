// Devices and backends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

namespace kusari {

/// The kind of memory and processor an array lives on.
enum class DeviceType : int8_t { kCPU, kCUDA };

class Backend;

/// A device: a type and an index ("cpu", "cuda:0", "cuda:1", ...). A small value type.
class Device {
 public:
  constexpr Device() = default;
  constexpr Device(DeviceType type, int index) : type_(type), index_(index) {}

  /// The host CPU.
  static constexpr Device cpu() { return Device(DeviceType::kCPU, 0); }
  /// The CUDA GPU numbered `index` (checked when first used).
  static constexpr Device cuda(int index = 0) { return Device(DeviceType::kCUDA, index); }
  /// Parses "cpu", "cuda", "cuda:N" or "@cupy:N" (Chainer's spelling); throws ValueError otherwise.
  static Device parse(const std::string& spec);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::kCPU; }
  bool is_cuda() const { return type_ == DeviceType::kCUDA; }

  /// The backend that owns this device's memory and kernels (throws DeviceError if unavailable).
  Backend& backend() const;
  /// Waits until all work queued on the device has finished.
  void synchronize() const;

  std::string str() const;

  friend constexpr bool operator==(Device a, Device b) { return a.type_ == b.type_ && a.index_ == b.index_; }
  friend constexpr bool operator!=(Device a, Device b) { return !(a == b); }

 private:
  DeviceType type_ = DeviceType::kCPU;
  int index_ = 0;
};

inline std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

/// A backend: the memory and transfers of one device type. Its kernels are private to the library
/// (Note [Kernel families] in src/kernels/kernel.h); its constructor registers them.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual DeviceType type() const = 0;
  /// "cpu" or "cuda".
  virtual const char* name() const = 0;
  /// How many devices of this type exist (0 when none can be used).
  virtual int device_count() const = 0;

  virtual void* allocate(int index, size_t nbytes) = 0;
  virtual void deallocate(int index, void* ptr, size_t nbytes) = 0;
  /// Copies between host memory and this backend's device `index` (in queue order).
  virtual void copy_from_host(int index, void* dst, const void* src, size_t nbytes) = 0;
  virtual void copy_to_host(int index, void* dst, const void* src, size_t nbytes) = 0;
  /// Copies between two devices of this backend.
  virtual void copy_between_devices(int dst_index, void* dst, int src_index, const void* src, size_t nbytes) = 0;
  virtual void synchronize(int index) = 0;

 protected:
  Backend() = default;
};

/// The backend of a device type; throws DeviceError when it was not built or has no device.
Backend& get_backend(DeviceType type);

/// True when this build has the CUDA backend and at least one GPU can be used.
bool cuda_available();
/// Number of usable GPUs (0 without CUDA or without a driver).
int cuda_device_count();

/// The device new arrays go to when none is named (CPU unless a DeviceScope says otherwise).
Device default_device();

/// Makes `device` the default device of this thread until the scope ends.
class DeviceScope {
 public:
  explicit DeviceScope(Device device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  Device previous_;
};

}  // namespace kusari
