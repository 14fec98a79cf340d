// How the NCCL gradient paths cut their flat wire buffer into pipeline chunks (Note [Gradient
// pipeline] in nccl_reducer.cc), and the block table that lets the batched pack kernels
// (Note [Batched packing] in nccl_pack.cc) pack or unpack one chunk per launch. Plain C++ (no
// CUDA), so that it is built and tested on every machine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace kusari::mn::detail {

/// The chunk-size setting that picks the chunk size from the buffer size.
inline constexpr int64_t kChunkBytesAuto = 0;
/// The chunk-size setting that sends the whole buffer as one chunk (no pipelining).
inline constexpr int64_t kChunkBytesOff = -1;

/// Parses a chunk-size setting (the value of KUSARI_MN_CHUNK_BYTES): "auto" (or empty) gives
/// kChunkBytesAuto; "off", "none", "1chunk" or "0" give kChunkBytesOff; otherwise a positive
/// number of bytes, optionally followed by K, M or G (binary: 2^10, 2^20, 2^30; "KB", "KiB",
/// "MB", ... mean the same). Throws ValueError naming `what` on anything else.
int64_t parse_chunk_bytes(const std::string& text, const char* what = "KUSARI_MN_CHUNK_BYTES");
/// The setting in words: "auto", "off", "8MiB", "1536B".
std::string chunk_bytes_name(int64_t setting);

/// The pipeline chunks of a wire buffer of `elements` elements: chunk k holds the elements
/// [begin(k), begin(k) + size(k)); all chunks but the last hold `chunk` elements.
struct ChunkPlan {
  /// Elements of the (padded) buffer.
  int64_t elements = 0;
  /// Elements of every chunk but the last.
  int64_t chunk = 0;
  /// Number of chunks (at least 1).
  int count = 1;

  int64_t begin(int k) const { return static_cast<int64_t>(k) * chunk; }
  int64_t size(int k) const { return std::min(chunk, elements - begin(k)); }
};

/// At most this many chunks: a smaller chunk size than that allows is raised.
inline constexpr int kMaxChunks = 64;
/// The chunk size the automatic setting aims at (the buffer is cut into about bytes / this many
/// equal chunks; one chunk below 1.5 times this). Measured on 2 x H200 over NVLink (NCCL 2.28,
/// ResNet-50-sized float32 gradient, docs/benchmarks.md): one chunk took 0.56 ms, 4 chunks
/// 0.69 ms, 25 chunks 1.57 ms; even unpacked back-to-back allreduces of 4 pieces cost 20% more
/// than one. So chunking only starts with gradients of gigabytes.
inline constexpr int64_t kAutoChunkBytes = int64_t{1} << 30;
/// Chunk boundaries fall on multiples of this many bytes (and of the buffer's multiple).
inline constexpr int64_t kChunkAlignBytes = 256;

/// Plans the chunks of a buffer of `elements` elements of `itemsize` bytes, `elements` being a
/// multiple of `multiple` (two_dimensional's padding), for the setting `chunk_bytes` (a number of
/// bytes, kChunkBytesAuto or kChunkBytesOff). Every chunk but the last holds a multiple of
/// `multiple` elements and of kChunkAlignBytes, so every chunk starts aligned and can be split
/// evenly like the whole buffer; there are at most kMaxChunks.
ChunkPlan plan_chunks(int64_t elements, int64_t itemsize, int64_t multiple, int64_t chunk_bytes);

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
struct PackBlock {
  int64_t entry = 0;
  /// Element range [begin, end) within the entry.
  int64_t begin = 0;
  int64_t end = 0;
  int64_t unused = 0;
};

/// Elements of one array that one thread block of the pack kernels copies at most.
inline constexpr int64_t kPackBlockElements = 16384;

/// The block table of arrays of `sizes` elements packed at consecutive offsets of a flat buffer:
/// each array is cut into blocks of at most kPackBlockElements, and also wherever the buffer
/// crosses a multiple of `chunk_elements` (0: nowhere), so that no block straddles two chunks.
/// Blocks are in buffer order. `chunk_first_block` receives, for each of the
/// max(1, ceil(sum(sizes) / chunk_elements)) chunks, the index of its first block, followed by
/// the number of blocks: chunk k is blocks [first[k], first[k + 1]).
std::vector<PackBlock> build_pack_blocks(const std::vector<int64_t>& sizes, int64_t chunk_elements,
                                         std::vector<int64_t>* chunk_first_block);

}  // namespace kusari::mn::detail
