#include "kusari/config.h"

#if KUSARI_HAVE_CUDA

#include "mn/reduce/batched_pack.h"

#include <algorithm>
#include <cstring>

#include "backends/cuda/runtime/cuda_backend.h"

namespace kusari::mn::detail {

// Note [Batched packing]
// A ResNet-50 has about 160 gradients; copying them into the wire buffer one cudaMemcpy (or one
// cast kernel) at a time costs 160 launches per step. Instead one kernel copies all of them:
//   - an entry table on the GPU lists each array as (pointer, elements, offset in the buffer,
//     dtype), and a block table splits every entry into pieces of at most kPackBlockElements, one
//     per thread block, so a 2.4M-element weight and a 64-element bias both spread over the GPU
//     and the grid is one launch however uneven the sizes;
//   - the block reads its piece and entry once and copies its range, casting to the wire dtype
//     (pack) or multiplying by the scale and casting back (unpack), in float32 arithmetic
//     (float64 when either side is float64), rounding to nearest even like the CPU; a plain copy
//     (same dtype, no scale) moves 16 bytes per thread and step when both sides are aligned;
//   - for the gradient pipeline (Note [Gradient pipeline] in nccl_reducer.cc) the block
//     table is also cut at every chunk boundary of the buffer, so that the blocks of chunk k are
//     a contiguous range of the table and packing or unpacking one chunk is still one launch
//     (over that range: the kernel indexes blocks from the pointer it is given);
//   - the tables are kept between steps. The block table and offsets depend only on the layout
//     (sizes and dtypes in order, the wire dtype and the chunk size) and are rebuilt when it
//     changes; the pointers change whenever backward allocates new gradient arrays, and only the
//     entry table (32 bytes an array) is uploaded again then, and only if a pointer actually
//     moved (the caching pool often hands back the same blocks). Uploads and kernels run on the
//     compute stream in order, so rewriting a table never races a kernel still reading it.
//     Uploads go through pinned buffers of the packer's own, so that they never make the host
//     wait for the compute stream (a copy from pageable memory may);
//   - an entry may also name its offset in the buffer explicitly (segments with gaps between
//     them): the blocks only index entries, so the same kernel then copies a few arrays into
//     their segments of a buffer that holds the others already (Note [Gradients in the reduction
//     buffer] in gradient_buffer.cc).
void BatchedPacker::prepare(const std::vector<Array>& arrays, Dtype wire, int device,
                            int64_t chunk_elements, const std::vector<int64_t>* offsets) {
  KUSARI_ASSERT(!offsets || (offsets->size() == arrays.size() && chunk_elements == 0),
                "BatchedPacker: explicit offsets need one per array and a single chunk");
  bool layout_same = device == device_ && wire == wire_ && chunk_elements == chunk_elements_ &&
                     arrays.size() == entries_.size();
  int64_t next = 0;
  for (size_t i = 0; layout_same && i < arrays.size(); ++i) {
    const int64_t at = offsets ? (*offsets)[i] : next;
    layout_same = arrays[i].size() == entries_[i].size &&
                  static_cast<int32_t>(arrays[i].dtype()) == entries_[i].dtype &&
                  entries_[i].offset == at;
    next = at + arrays[i].size();
  }
  bool pointers_same = layout_same;
  for (size_t i = 0; pointers_same && i < arrays.size(); ++i) {
    pointers_same = arrays[i].raw_data() == entries_[i].data;
  }
  if (pointers_same && device_entries_.defined()) return;

  for (const Array& a : arrays) {
    KUSARI_ASSERT(a.is_contiguous(), "BatchedPacker: arrays must be contiguous");
    KUSARI_CHECK(a.device() == Device::cuda(device), DeviceError,
                 "gradient packing: an array is on ", a.device(),
                 " but the communicator uses cuda:", device,
                 " (every parameter must be on the communicator's GPU)");
    KUSARI_CHECK(is_floating(a.dtype()), DtypeError,
                 "gradient packing: only floating arrays can be packed, got ",
                 dtype_name(a.dtype()));
  }
  const Device gpu = Device::cuda(device);
  if (!layout_same) {
    device_ = device;
    wire_ = wire;
    chunk_elements_ = chunk_elements;
    entries_.assign(arrays.size(), PackEntry{});
    std::vector<int64_t> sizes(arrays.size());
    int64_t offset = 0, end = 0;
    for (size_t i = 0; i < arrays.size(); ++i) {
      const int64_t n = arrays[i].size();
      if (offsets) offset = (*offsets)[i];
      sizes[i] = n;
      entries_[i].size = n;
      entries_[i].offset = offset;
      entries_[i].dtype = static_cast<int32_t>(arrays[i].dtype());
      offset += n;
      end = std::max(end, offset);
    }
    total_ = end;
    blocks_ = build_pack_blocks(sizes, chunk_elements, &chunk_first_block_);
    static_assert(sizeof(PackBlock) % sizeof(int64_t) == 0);
    const int64_t block_words =
        static_cast<int64_t>(blocks_.size() * sizeof(PackBlock) / sizeof(int64_t));
    device_blocks_ =
        Array::from_buffer(blocks_.data(), {std::max<int64_t>(block_words, 1)}, int64, gpu);
    ++layout_builds_;
  }
  for (size_t i = 0; i < arrays.size(); ++i) entries_[i].data = arrays[i].raw_data();
  static_assert(sizeof(PackEntry) % sizeof(int64_t) == 0);
  const int64_t entry_words =
      static_cast<int64_t>(entries_.size() * sizeof(PackEntry) / sizeof(int64_t));
  if (!device_entries_.defined() || device_entries_.size() != std::max<int64_t>(entry_words, 1)) {
    device_entries_ = Array::empty({std::max<int64_t>(entry_words, 1)}, int64, gpu);
  }
  if (entry_words > 0) upload_entries();
  ++pointer_uploads_;
}

void BatchedPacker::upload_entries() {
  const size_t bytes = entries_.size() * sizeof(PackEntry);
  Staging& st = staging_[next_staging_];
  next_staging_ ^= 1;
  cuda::set_device(device_);
  if (st.copied) {
    KUSARI_CUDA_CHECK(cudaEventSynchronize(st.copied));  // its last copy has left the buffer
  } else {
    KUSARI_CUDA_CHECK(cudaEventCreateWithFlags(&st.copied, cudaEventDisableTiming));
  }
  if (bytes > st.bytes) {
    if (st.host) KUSARI_CUDA_CHECK(cudaFreeHost(st.host));
    st.host = nullptr;
    st.bytes = 0;
    KUSARI_CUDA_CHECK(cudaHostAlloc(&st.host, bytes, cudaHostAllocDefault));
    st.bytes = bytes;
  }
  std::memcpy(st.host, entries_.data(), bytes);
  cudaStream_t stream = cuda::compute_stream(device_);
  KUSARI_CUDA_CHECK(
      cudaMemcpyAsync(device_entries_.raw_data(), st.host, bytes, cudaMemcpyHostToDevice, stream));
  KUSARI_CUDA_CHECK(cudaEventRecord(st.copied, stream));
}

BatchedPacker::~BatchedPacker() {
  // Never throws (destructors; the CUDA runtime may be shutting down at exit).
  for (Staging& st : staging_) {
    if (st.copied) {
      cudaEventSynchronize(st.copied);
      cudaEventDestroy(st.copied);
    }
    if (st.host) cudaFreeHost(st.host);
  }
  cudaGetLastError();
}

void BatchedPacker::pack_blocks(void* buffer, int64_t first, int64_t last,
                                cudaStream_t stream) const {
  if (last <= first) return;
  launch_pack(static_cast<const PackEntry*>(device_entries_.raw_data()),
              static_cast<const PackBlock*>(device_blocks_.raw_data()) + first, last - first,
              buffer, wire_, stream);
}

void BatchedPacker::unpack_blocks(const void* buffer, int64_t first, int64_t last, double scale,
                                  cudaStream_t stream) const {
  if (last <= first) return;
  launch_unpack(static_cast<const PackEntry*>(device_entries_.raw_data()),
                static_cast<const PackBlock*>(device_blocks_.raw_data()) + first, last - first,
                buffer, wire_, scale, stream);
}

void BatchedPacker::pack(void* buffer, cudaStream_t stream) const {
  pack_blocks(buffer, 0, static_cast<int64_t>(blocks_.size()), stream);
}

void BatchedPacker::pack_chunk(void* buffer, int k, cudaStream_t stream) const {
  if (k < 0 || k >= chunks()) return;
  const size_t i = static_cast<size_t>(k);
  pack_blocks(buffer, chunk_first_block_[i], chunk_first_block_[i + 1], stream);
}

void BatchedPacker::unpack(const void* buffer, double scale, cudaStream_t stream) const {
  unpack_blocks(buffer, 0, static_cast<int64_t>(blocks_.size()), scale, stream);
}

void BatchedPacker::unpack_chunk(const void* buffer, int k, double scale,
                                 cudaStream_t stream) const {
  if (k < 0 || k >= chunks()) return;
  const size_t i = static_cast<size_t>(k);
  unpack_blocks(buffer, chunk_first_block_[i], chunk_first_block_[i + 1], scale, stream);
}

}  // namespace kusari::mn::detail

#endif  // KUSARI_HAVE_CUDA
