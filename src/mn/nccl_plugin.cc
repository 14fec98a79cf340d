// The entry point of the NCCL communicators' library (see mn/nccl_library.h).
#include <nccl.h>

#include "mn/reduce/chunk_plan.h"
#include "mn/comm/nccl_kinds.h"
#include "mn/reduce/nccl_reducer.h"
#include "mn/nccl_library.h"

namespace kusari::mn::detail {
namespace {

std::string version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return ::kusari::detail::concat("NCCL ", v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

bool gradient_chunks(const Communicator& comm, int* chunks) {
  const auto* nccl = dynamic_cast<const NcclCommunicator*>(&comm);
  if (nccl) *chunks = nccl->reducer().last_gradient_chunks();
  return nccl != nullptr;
}

bool allreduce_in_pieces(Communicator& comm, Array& x, int pieces) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&comm);
  if (nccl) nccl->allreduce_in_pieces(x, pieces);
  return nccl != nullptr;
}

bool chunk_setting(const Communicator& comm, std::string* setting) {
  const auto* nccl = dynamic_cast<const NcclCommunicator*>(&comm);
  if (nccl) *setting = chunk_bytes_name(nccl->reducer().chunk_bytes());
  return nccl != nullptr;
}

}  // namespace

std::unique_ptr<BucketTransport> make_nccl_bucket_transport(Communicator& comm);

}  // namespace kusari::mn::detail

extern "C" __attribute__((visibility("default"))) const kusari::mn::detail::NcclLibrary* KUSARI_NCCL_ENTRY() {
  using namespace kusari::mn::detail;
  static const NcclLibrary library{&create_nccl_communicator, &version, &gradient_chunks,
                                   &allreduce_in_pieces, &chunk_setting,
                                   &make_nccl_bucket_transport};
  return &library;
}
