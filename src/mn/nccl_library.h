// The boundary between kusari_mn and the NCCL communicators' library (libkusari_mn_nccl), which
// kusari_mn loads at run time the first time an NCCL communicator is created, so that CPU-only
// multi-node programs need no CUDA or NCCL library (Note [The CUDA library is loaded] in
// core/cuda_runtime.h says the same of the CUDA backend).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "kusari/mn/communicator.h"
#include "mn/reduce/bucket_reducer.h"

namespace kusari::mn::detail {

/// What libkusari_mn_nccl gives kusari_mn.
struct NcclLibrary {
  /// Creates the NCCL communicator `name` (pure_nccl, hierarchical, ...) over `comm`.
  std::shared_ptr<Communicator> (*create)(const std::string& name, MPI_Comm comm,
                                          const CommunicatorOptions& options) = nullptr;
  /// "NCCL 2.x.y".
  std::string (*version)() = nullptr;
  /// For an NCCL communicator: its chunk count of the last gradient reduction (true), else false.
  bool (*gradient_chunks)(const Communicator& comm, int* chunks) = nullptr;
  /// For an NCCL communicator: allreduces x in `pieces` calls (true), else false.
  bool (*allreduce_in_pieces)(Communicator& comm, Array& x, int pieces) = nullptr;
  /// For an NCCL communicator: its chunk setting's name (true), else false.
  bool (*chunk_setting)(const Communicator& comm, std::string* setting) = nullptr;
  /// For an NCCL communicator: the transport of its overlapped buckets (Note [Overlapped
  /// gradient reduction]); null for another communicator.
  std::unique_ptr<BucketTransport> (*bucket_transport)(Communicator& comm) = nullptr;
};

/// The NCCL library, loaded on the first call; null when this build has none or it cannot be
/// loaded here (*why says why).
const NcclLibrary* nccl_library(std::string* why = nullptr);

}  // namespace kusari::mn::detail
