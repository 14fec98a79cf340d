#include "mn/reduce/chunk_plan.h"

#include <cctype>
#include <charconv>
#include <limits>
#include <numeric>

#include "kusari/core/error.h"

namespace kusari::mn::detail {

namespace {

int64_t ceil_div(int64_t n, int64_t d) {
  return (n + d - 1) / d;
}

int64_t round_up(int64_t n, int64_t multiple) {
  return ceil_div(n, multiple) * multiple;
}

}  // namespace

int64_t parse_chunk_bytes(const std::string& text, const char* what) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c)))
      s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  if (s.empty() || s == "auto") return kChunkBytesAuto;
  if (s == "off" || s == "none" || s == "1chunk") return kChunkBytesOff;
  int64_t value = 0;
  const char* first = s.data();
  const char* last = s.data() + s.size();
  const auto [end, error] = std::from_chars(first, last, value);
  const std::string suffix(end, last);
  int shift = -1;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    shift = 30;
  }
  KUSARI_CHECK(error == std::errc() && end != first && value >= 0 && shift >= 0, ValueError, what,
               ": expected 'auto', 'off' or a number of bytes such as 8388608, 8M or 8MiB, "
               "got '",
               text, "'");
  KUSARI_CHECK(value <= (std::numeric_limits<int64_t>::max() >> shift), ValueError, what,
               ": the chunk size '", text, "' is too large");
  if (value == 0) return kChunkBytesOff;
  return value << shift;
}

std::string chunk_bytes_name(int64_t setting) {
  if (setting == kChunkBytesAuto) return "auto";
  if (setting < 0) return "off";
  if (setting % (int64_t{1} << 30) == 0) return std::to_string(setting >> 30) + "GiB";
  if (setting % (int64_t{1} << 20) == 0) return std::to_string(setting >> 20) + "MiB";
  if (setting % (int64_t{1} << 10) == 0) return std::to_string(setting >> 10) + "KiB";
  return std::to_string(setting) + "B";
}

ChunkPlan plan_chunks(int64_t elements, int64_t itemsize, int64_t multiple, int64_t chunk_bytes) {
  KUSARI_ASSERT(elements >= 0 && itemsize > 0 && multiple > 0 && elements % multiple == 0,
                "plan_chunks: ", elements, " elements of ", itemsize, " bytes, multiple ",
                multiple);
  ChunkPlan plan;
  plan.elements = elements;
  plan.chunk = elements;
  plan.count = 1;
  if (chunk_bytes < 0 || elements == 0) return plan;
  const int64_t unit = std::lcm(multiple, std::max<int64_t>(1, kChunkAlignBytes / itemsize));
  int64_t chunk = 0;
  if (chunk_bytes == kChunkBytesAuto) {
    const int64_t bytes = elements * itemsize;
    const int64_t n =
        std::clamp<int64_t>((bytes + kAutoChunkBytes / 2) / kAutoChunkBytes, 1, kMaxChunks);
    if (n == 1) return plan;
    chunk = ceil_div(elements, n);  // equal chunks rather than full ones and a small remainder
  } else {
    chunk = std::max<int64_t>(1, chunk_bytes / itemsize);
  }
  chunk = std::max(round_up(chunk, unit), round_up(ceil_div(elements, kMaxChunks), unit));
  if (chunk >= elements) return plan;
  plan.chunk = chunk;
  plan.count = static_cast<int>(ceil_div(elements, chunk));
  return plan;
}

std::vector<PackBlock> build_pack_blocks(const std::vector<int64_t>& sizes, int64_t chunk_elements,
                                         std::vector<int64_t>* chunk_first_block) {
  std::vector<PackBlock> blocks;
  std::vector<int64_t> starts;  // where each block starts in the buffer
  int64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    for (int64_t b = 0; b < n;) {
      int64_t e = std::min(n, b + kPackBlockElements);
      if (chunk_elements > 0) {
        const int64_t next_cut = ((offset + b) / chunk_elements + 1) * chunk_elements - offset;
        e = std::min(e, next_cut);
      }
      PackBlock block;
      block.entry = static_cast<int64_t>(i);
      block.begin = b;
      block.end = e;
      blocks.push_back(block);
      starts.push_back(offset + b);
      b = e;
    }
    offset += n;
  }
  const int64_t chunks =
      chunk_elements > 0 ? std::max<int64_t>(1, ceil_div(offset, chunk_elements)) : 1;
  chunk_first_block->assign(static_cast<size_t>(chunks) + 1, static_cast<int64_t>(blocks.size()));
  size_t j = 0;
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t at = k * chunk_elements;
    while (j < blocks.size() && starts[j] < at) ++j;
    (*chunk_first_block)[static_cast<size_t>(k)] = static_cast<int64_t>(j);
  }
  return blocks;
}

}  // namespace kusari::mn::detail
