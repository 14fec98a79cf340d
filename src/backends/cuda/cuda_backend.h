// The CUDA backend's internal interface, shared by the backend's files and by the NCCL
// communicators (src/mn/). Only compiled when KUSARI_HAVE_CUDA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "kusari/core/device.h"

namespace kusari::cuda {

/// The CUDA backend (created and its kernel table filled on first use).
Backend& cuda_backend();
/// Usable GPUs (0 when there is no driver or no device; never throws).
int cuda_device_count();

/// The stream every kernel of GPU `device` runs on (work on it is ordered; see
/// Note [One compute stream per device]).
cudaStream_t compute_stream(int device);
/// The cuBLAS / cuDNN handles of GPU `device`, bound to its compute stream.
cublasHandle_t cublas_handle(int device);
cudnnHandle_t cudnn_handle(int device);
/// Makes `device` current on this thread (cudaSetDevice), cheaply.
void set_device(int device);

/// Throws DeviceError naming the call and the CUDA error.
void check_cuda(cudaError_t status, const char* call, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
void check_cudnn(cudnnStatus_t status, const char* call, const char* file, int line);

}  // namespace kusari::cuda

#define KUSARI_CUDA_CHECK(call) ::kusari::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define KUSARI_CUBLAS_CHECK(call) ::kusari::cuda::check_cublas((call), #call, __FILE__, __LINE__)
#define KUSARI_CUDNN_CHECK(call) ::kusari::cuda::check_cudnn((call), #call, __FILE__, __LINE__)
