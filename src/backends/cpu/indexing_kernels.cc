// CPU kernels: take (gather along an axis) and add_at (its transpose, a scatter-add).
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "kernels/indexing.h"
#include "backends/cpu/loops.h"

namespace kusari::cpu {
namespace {

std::vector<int64_t> read_indices(const Array& indices, int64_t axis_len, const char* fn) {
  std::vector<int64_t> idx = indices.to_vector<int64_t>();
  for (int64_t& i : idx) {
    KUSARI_CHECK(i >= -axis_len && i < axis_len, IndexError, fn, ": index ", i, " is out of bounds for an axis of length ",
                 axis_len);
    if (i < 0) i += axis_len;
  }
  return idx;
}

}  // namespace

void take(const Array& x_in, const Array& indices, int axis, Array& out) {
  Array x = x_in.contiguous();
  const Shape& xs = x.shape();
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= xs[d];
  for (int d = axis + 1; d < xs.size(); ++d) inner *= xs[d];
  const int64_t len = xs[axis];
  std::vector<int64_t> idx = read_indices(indices, len, "take");
  const int64_t ni = static_cast<int64_t>(idx.size());
  const size_t row_bytes = static_cast<size_t>(inner) * x.itemsize();
  const char* xp = static_cast<const char*>(x.raw_data());
  char* op = static_cast<char*>(out.raw_data());
  parallel_for(outer * ni, inner, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t o = r / ni, j = r % ni;
      std::memcpy(op + r * row_bytes, xp + (o * len + idx[j]) * row_bytes, row_bytes);
    }
  });
}

void add_at(Array& out, const Array& indices, int axis, const Array& values_in) {
  KUSARI_ASSERT(out.is_contiguous());
  Array values = values_in.contiguous();
  const Shape& os = out.shape();
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= os[d];
  for (int d = axis + 1; d < os.size(); ++d) inner *= os[d];
  const int64_t len = os[axis];
  std::vector<int64_t> idx = read_indices(indices, len, "add_at");
  const int64_t ni = static_cast<int64_t>(idx.size());
  common::visit_dtype(out.dtype(), "add_at", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      KUSARI_THROW(DtypeError, "add_at: not supported for dtype bool");
    } else {
      T* op = out.data<T>();
      const T* vp = values.data<T>();
      // Parallel over the outer axis only: rows of different outer positions never collide.
      parallel_for(outer, ni * inner, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          for (int64_t j = 0; j < ni; ++j) {
            T* dst = op + (o * len + idx[j]) * inner;
            const T* src = vp + (o * ni + j) * inner;
            for (int64_t k = 0; k < inner; ++k) {
              dst[k] = static_cast<T>(static_cast<compute_t<T>>(dst[k]) + static_cast<compute_t<T>>(src[k]));
            }
          }
        }
      });
    }
  });
}

void register_cpu_indexing_kernels() {
  kernels::take.set(DeviceType::kCPU, &take);
  kernels::add_at.set(DeviceType::kCPU, &add_at);
}

}  // namespace kusari::cpu
