// KUSARI_HOST_DEVICE: marks the scalar code that the CPU (.cc) and CUDA (.cu) kernels share.
//
// Note [Shared backend code]
// The arithmetic of an element (the body of every unary and binary op), Philox, the compute
// types and the dtype visitor are written once, in src/backends/common/, and compiled by both the
// host compiler and nvcc. Under nvcc the functions become __host__ __device__; for the host
// compiler the macro is empty, so the CPU kernels see plain inline functions that vectorise as
// before. Math goes through kusari::common::math, which calls the C library's float and double
// functions by name (expf, exp, ...): glibc on the host, CUDA's libm on the device, the same
// functions each backend called before they shared the code.
#pragma once

#if defined(__CUDACC__)
#define KUSARI_HOST_DEVICE __host__ __device__
#define KUSARI_FORCE_INLINE __forceinline__
#else
#define KUSARI_HOST_DEVICE
#define KUSARI_FORCE_INLINE inline __attribute__((always_inline))
#endif
