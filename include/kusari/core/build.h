// What this build of the library was made with, asked at run time. kusari/config.h holds the
// same switches as macros for code that must know them at compile time; code that asks here
// compiles to the same object whatever the build, so one program's source serves a build with
// CUDA and one without (and a compiler cache serves both).
#pragma once

#include <string>

namespace kusari {

/// The switches of the library's build (kusari/config.h when the library was compiled).
struct BuildInfo {
  /// The library's version, e.g. "0.1.0".
  std::string version;
  /// Built with the CUDA backend (kusari_cuda; loaded when a program first asks for a GPU).
  bool cuda = false;
  /// Built with the NCCL communicators (kusari_mn_nccl).
  bool nccl = false;
  /// CPU convolutions through oneDNN (else im2col + BLAS).
  bool dnnl = false;
  /// OpenMP threads in the CPU kernels.
  bool openmp = false;
  /// The multi-node library (kusari_mn) was built (MPI was found).
  bool mpi = false;
  /// PlotReport draws with cairo (else it says once that it draws nothing).
  bool cairo = false;
  /// The BLAS the CPU matrix products use, e.g. "OpenBLAS 0.3.21".
  std::string blas;
};

/// The build's switches (the same object every call).
const BuildInfo& build_info();

}  // namespace kusari
