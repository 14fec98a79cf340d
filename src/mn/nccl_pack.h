// Batched packing of many arrays (a model's gradients or parameters) into one flat GPU buffer,
// and back, for the NCCL communicators. See Note [Batched packing].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kusari/core/array.h"

namespace kusari::mn::detail {

/// One array of a packed set, as the kernels see it (32 bytes).
struct PackEntry {
  /// The array's data (contiguous, on the packer's GPU).
  void* data = nullptr;
  /// Elements.
  int64_t size = 0;
  /// Where the array starts in the flat buffer, in elements of the wire dtype.
  int64_t offset = 0;
  /// The array's Dtype.
  int32_t dtype = 0;
  int32_t unused = 0;
};

/// A piece of one entry that one thread block copies (32 bytes).
struct PackChunk {
  int64_t entry = 0;
  /// Element range [begin, end) within the entry.
  int64_t begin = 0;
  int64_t end = 0;
  int64_t unused = 0;
};

/// Launches one kernel that copies every entry into `buffer` (dtype `wire`), casting, on
/// `stream`. `entries` and `chunks` are device tables.
void launch_pack(const PackEntry* entries, const PackChunk* chunks, int64_t num_chunks,
                 void* buffer, Dtype wire, cudaStream_t stream);
/// Launches one kernel that writes `buffer` * scale back into every entry, cast to its dtype.
void launch_unpack(const PackEntry* entries, const PackChunk* chunks, int64_t num_chunks,
                   const void* buffer, Dtype wire, double scale, cudaStream_t stream);

/// Packs a list of arrays into one buffer and unpacks it, with one kernel each way, driven by
/// device-side tables that are built once per layout and reused. See Note [Batched packing].
class BatchedPacker {
 public:
  BatchedPacker() = default;
  ~BatchedPacker();
  BatchedPacker(const BatchedPacker&) = delete;
  BatchedPacker& operator=(const BatchedPacker&) = delete;

  /// Makes the tables describe `arrays` (contiguous, floating, all on GPU `device`) packed as
  /// `wire` at consecutive offsets. Cheap when nothing changed since the last call; uploads the
  /// pointer table when only the arrays' memory moved; rebuilds everything when the layout
  /// (sizes, dtypes, wire dtype) changed. Uploads are queued on the device's compute stream.
  void prepare(const std::vector<Array>& arrays, Dtype wire, int device);
  /// Elements of the packed layout (before any padding).
  int64_t total() const { return total_; }
  Dtype wire() const { return wire_; }
  /// Queues the pack of the prepared arrays into `buffer` on `stream`.
  void pack(void* buffer, cudaStream_t stream) const;
  /// Queues the unpack of `buffer` (times `scale`) into the prepared arrays on `stream`.
  void unpack(const void* buffer, double scale, cudaStream_t stream) const;
  /// Rebuilds of the layout and uploads of the pointer table so far (diagnostics).
  int64_t layout_builds() const { return layout_builds_; }
  int64_t pointer_uploads() const { return pointer_uploads_; }

 private:
  int device_ = -1;
  Dtype wire_ = Dtype::kFloat32;
  int64_t total_ = 0;
  std::vector<PackEntry> entries_;
  std::vector<PackChunk> chunks_;
  Array device_entries_;
  Array device_chunks_;
  /// Uploads of the entry table go through two pinned buffers, each free again once the
  /// compute stream has passed its event (a copy from pageable memory may wait for the stream).
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t copied = nullptr;
  };
  Staging staging_[2];
  int next_staging_ = 0;
  /// Queues the copy of entries_ into device_entries_ on the compute stream.
  void upload_entries();
  int64_t layout_builds_ = 0;
  int64_t pointer_uploads_ = 0;
};

/// Elements of one array that one thread block of the pack kernels copies at most.
inline constexpr int64_t kPackChunkElements = 16384;

}  // namespace kusari::mn::detail
