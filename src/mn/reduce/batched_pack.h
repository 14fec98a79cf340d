// Batched packing of many arrays (a model's gradients or parameters) into one flat GPU buffer,
// and back, for the NCCL communicators, whole or one pipeline chunk at a time. See
// Note [Batched packing].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kusari/core/array.h"
#include "mn/reduce/chunk_plan.h"

namespace kusari::mn::detail {

/// Launches one kernel that copies the `num_blocks` blocks of the device table `blocks` (of the
/// entries of the device table `entries`) into `buffer` (dtype `wire`), casting, on `stream`.
void launch_pack(const PackEntry* entries, const PackBlock* blocks, int64_t num_blocks,
                 void* buffer, Dtype wire, cudaStream_t stream);
/// Launches one kernel that writes those blocks of `buffer` * scale back into their entries, cast
/// to each entry's dtype.
void launch_unpack(const PackEntry* entries, const PackBlock* blocks, int64_t num_blocks,
                   const void* buffer, Dtype wire, double scale, cudaStream_t stream);

/// Packs a list of arrays into one buffer and unpacks it, with one kernel each way (or one per
/// pipeline chunk), driven by device-side tables that are built once per layout and reused. See
/// Note [Batched packing].
class BatchedPacker {
 public:
  BatchedPacker() = default;
  ~BatchedPacker();
  BatchedPacker(const BatchedPacker&) = delete;
  BatchedPacker& operator=(const BatchedPacker&) = delete;

  /// Makes the tables describe `arrays` (contiguous, floating, all on GPU `device`) packed as
  /// `wire` at consecutive offsets, cut into chunks of `chunk_elements` elements of the buffer
  /// (0: one chunk) that pack_chunk and unpack_chunk handle one at a time. With `offsets`, array
  /// i goes to element offsets[i] of the buffer instead (segments that must not overlap; one
  /// chunk only): the gradients-in-buffer path copies the gradients that are not in their
  /// segments yet with it. Cheap when nothing changed since the last call; uploads the pointer
  /// table when only the arrays' memory moved; rebuilds everything when the layout (sizes,
  /// dtypes, offsets, wire dtype, chunk size) changed. Uploads are queued on the device's compute
  /// stream.
  void prepare(const std::vector<Array>& arrays, Dtype wire, int device,
               int64_t chunk_elements = 0, const std::vector<int64_t>* offsets = nullptr);
  /// Elements of the packed layout (before any padding; with offsets, the end of the last
  /// segment).
  int64_t total() const { return total_; }
  Dtype wire() const { return wire_; }
  /// Chunks of the layout: max(1, ceil(total() / chunk_elements)).
  int chunks() const { return static_cast<int>(chunk_first_block_.size()) - 1; }
  /// Queues the pack of the prepared arrays into `buffer` on `stream`.
  void pack(void* buffer, cudaStream_t stream) const;
  /// Queues the pack of chunk `k` only (nothing for k >= chunks()).
  void pack_chunk(void* buffer, int k, cudaStream_t stream) const;
  /// Queues the unpack of `buffer` (times `scale`) into the prepared arrays on `stream`.
  void unpack(const void* buffer, double scale, cudaStream_t stream) const;
  /// Queues the unpack of chunk `k` only (nothing for k >= chunks()).
  void unpack_chunk(const void* buffer, int k, double scale, cudaStream_t stream) const;
  /// Rebuilds of the layout and uploads of the pointer table so far (diagnostics).
  int64_t layout_builds() const { return layout_builds_; }
  int64_t pointer_uploads() const { return pointer_uploads_; }

 private:
  /// Blocks [first, last) of the table.
  void pack_blocks(void* buffer, int64_t first, int64_t last, cudaStream_t stream) const;
  void unpack_blocks(const void* buffer, int64_t first, int64_t last, double scale,
                     cudaStream_t stream) const;

  int device_ = -1;
  Dtype wire_ = Dtype::kFloat32;
  int64_t chunk_elements_ = 0;
  int64_t total_ = 0;
  std::vector<PackEntry> entries_;
  std::vector<PackBlock> blocks_;
  std::vector<int64_t> chunk_first_block_ = {0, 0};
  Array device_entries_;
  Array device_blocks_;
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

}  // namespace kusari::mn::detail
