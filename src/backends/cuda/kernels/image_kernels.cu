// CUDA kernels of the input pipeline: a batch of uint8 images normalised through a per-channel
// table into a floating dtype, NCHW or NHWC (src/kernels/image.h).
#include "backends/cuda/kernels/cuda_kernels.h"
#include "backends/cuda/primitives/kernel_util.cuh"
#include "kernels/image.h"

namespace kusari::cuda {
namespace {

/// The most channels the kernel takes (its table lives in shared memory).
constexpr int64_t kMaxImageChannels = 16;

// --- kernels -------------------------------------------------------------------------------------

// images (B, HW, C) uint8; table (C, 256) float32; out (B, C, HW) when planar, else (B, HW, C).
// One thread per pixel: it reads the pixel's C bytes and writes its C values, which for planar
// output are HW apart (consecutive threads write consecutive addresses of each plane).
template <typename T>
__global__ void normalize_image_batch_kernel(int64_t pixels, int64_t hw, int c, const uint8_t* images,
                                             const float* table, bool planar, T* out) {
  __shared__ float lut[kMaxImageChannels * 256];
  for (int i = threadIdx.x; i < c * 256; i += blockDim.x) lut[i] = table[i];
  __syncthreads();
  for (int64_t p = grid_start(); p < pixels; p += grid_step()) {
    const uint8_t* px = images + p * c;
    if (planar) {
      const int64_t b = p / hw, q = p - b * hw;
      T* o = out + b * c * hw + q;
      for (int k = 0; k < c; ++k) o[k * hw] = from_compute<T>(lut[k * 256 + px[k]]);
    } else {
      T* o = out + p * c;
      for (int k = 0; k < c; ++k) o[k] = from_compute<T>(lut[k * 256 + px[k]]);
    }
  }
}

// --- launchers -----------------------------------------------------------------------------------

bool normalize_image_batch(const Array& images, const Array& table, bool planar, Array& out) {
  const int64_t c = images.dim(3);
  if (c > kMaxImageChannels) return false;
  const Dtype d = out.dtype();
  if (d != float32 && d != bfloat16 && d != float16) return false;
  const int64_t pixels = images.dim(0) * images.dim(1) * images.dim(2);
  const int64_t hw = images.dim(1) * images.dim(2);
  const cudaStream_t stream = prepare(images);
  const unsigned grid = grid_for(pixels, images.device().index());
  visit_device_dtype<common::kFloatingDtypes>(d, "normalize_image_batch", [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, double>) {
      normalize_image_batch_kernel<T><<<grid, kBlockSize, 0, stream>>>(
          pixels, hw, static_cast<int>(c), static_cast<const uint8_t*>(images.raw_data()),
          static_cast<const float*>(table.raw_data()), planar, static_cast<T*>(out.raw_data()));
    }
  });
  KUSARI_CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

void register_cuda_image_kernels() {
  kernels::normalize_image_batch.set(DeviceType::kCUDA, &normalize_image_batch);
}

}  // namespace kusari::cuda
