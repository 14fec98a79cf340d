// Communicators: every process of an MPI job holds one, and the multi-node pieces of kusari
// (optimizer, dataset scattering, evaluator, batch normalization, checkpoints, model
// parallelism) talk through it. ChainerMN's CommunicatorBase, in C++.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kusari/core/array.h"
#include "kusari/links/link.h"

namespace kusari::mn {

/// Bytes of a serialised object (see object.h for the codecs).
using Bytes = std::vector<uint8_t>;

/// How array and object reductions combine values.
enum class ReduceOp { kSum, kMax, kMin, kMean };

/// Options of create_communicator.
struct CommunicatorOptions {
  /// Wire dtype for gradients (NCCL communicators): float16 / bfloat16 halve the traffic while
  /// parameters stay float32. Unset: the gradients' own dtype.
  std::optional<Dtype> allreduce_grad_dtype;
  /// Check across ranks, before each gradient reduction, that every rank sends the same
  /// parameters with the same shapes and dtypes, and after it that no value is NaN or infinite.
  /// Also enabled by the environment variable KUSARI_MN_DEBUG=1.
  bool debug = false;
  /// The deadline, in seconds, of every wait of every communicator (MPI and NCCL): an operation
  /// that makes no progress for this long (a peer stopped, dead or elsewhere) raises
  /// CommunicatorError naming the operation, its sequence number and the ranks waited for, which
  /// uncaught ends the whole job. 0 = no deadline. The environment variable KUSARI_MN_TIMEOUT
  /// overrides it. NCCL's initialisation and first operation get at least 60 s. See
  /// docs/cluster.md.
  double timeout_seconds = 600;
  /// Keep every gradient in the communicator's flat reduction buffer ("flat", "dummy" and the
  /// NCCL kinds), so that multi_node_mean_grad needs no pack and no unpack: the first call binds
  /// each parameter's gradient buffer (Parameter::set_grad_buffer) to its segment, backward then
  /// writes gradients there, and each later call is one in-place allreduce. After a call every
  /// gradient is a view into that one buffer (which the next backward overwrites); copy a
  /// gradient to keep it. Used when the gradients share one floating dtype, are not cast
  /// (allreduce_grad_dtype unset or equal) and, for the NCCL kinds, travel in one chunk;
  /// otherwise, or when false, gradients are packed and unpacked as before. The environment
  /// variable KUSARI_MN_GRADIENTS_IN_BUFFER=0 (or 1) overrides it. See docs/nccl.md.
  bool gradients_in_buffer = true;
  /// Check, before every collective, that every rank calls the same one (its name, sequence
  /// number and, where the operation tells, element count and dtype): ranks that disagree all
  /// raise CommunicatorError naming the collective's number, each rank's call and this rank's
  /// last collectives, instead of waiting for the deadline or exchanging mismatched buffers. One
  /// small allgather per collective: a debug mode. The environment variable
  /// KUSARI_MN_CHECK_COLLECTIVES=1 (or 0) overrides it. See docs/cluster.md.
  bool check_collectives = false;
};

/// A group of processes that train together. Methods that communicate must be called by every
/// rank of the communicator in the same order (SPMD).
class Communicator {
 public:
  virtual ~Communicator() = default;

  // --- topology -----------------------------------------------------------------------------
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Rank among the processes of this host (the GPU a process uses).
  int intra_rank() const { return intra_rank_; }
  int intra_size() const { return intra_size_; }
  /// Index of this host among the hosts (hosts ordered by their smallest rank).
  int inter_rank() const { return inter_rank_; }
  int inter_size() const { return inter_size_; }
  /// The communicator's name ("naive", "flat", "pure_nccl", ...).
  virtual const char* name() const = 0;

  // --- models ----------------------------------------------------------------------------------
  /// Copies rank 0's parameters (in sorted path order) to every rank.
  virtual void bcast_data(Link& model);
  /// Replaces every parameter's gradient with its mean over the ranks. Parameters without a
  /// gradient are skipped, or get zeros when zero_fill is true. With
  /// CommunicatorOptions::gradients_in_buffer the gradients end as views of one flat buffer.
  virtual void multi_node_mean_grad(Link& model, bool zero_fill = false) = 0;

  // --- arrays (any device; received arrays are on `device`, default the CPU) --------------------
  void send(const Array& x, int dest, int tag = 0);
  Array recv(int source, int tag = 0, std::optional<Device> device = std::nullopt);
  /// Root's x on every rank (x is ignored on the others).
  Array bcast(const Array& x, int root = 0, std::optional<Device> device = std::nullopt);
  /// Every rank's x, at the root (empty elsewhere).
  std::vector<Array> gather(const Array& x, int root = 0);
  std::vector<Array> allgather(const Array& x);
  /// xs[j] goes to rank j; returns what each rank sent to this one.
  std::vector<Array> alltoall(const std::vector<Array>& xs);
  /// Root's xs[j] goes to rank j.
  Array scatter(const std::vector<Array>& xs, int root = 0, std::optional<Device> device = std::nullopt);
  /// Elementwise reduction over the ranks (same shape and dtype everywhere).
  Array allreduce(const Array& x, ReduceOp op = ReduceOp::kSum);
  /// In-place allreduce of a contiguous array (the building block of the gradient paths).
  virtual void allreduce_inplace(Array& x, ReduceOp op = ReduceOp::kSum);
  /// Reduce-scatter (PyTorch's reduce_scatter_tensor): x, of one shape and dtype on every rank,
  /// its first axis a multiple of size(), is reduced over the ranks with `op`, and rank r gets block
  /// r of the first axis (shape[0] / size() rows), on x's device. Ranks that pass different shapes
  /// or dtypes get a ValueError naming both.
  Array reduce_scatter(const Array& x, ReduceOp op = ReduceOp::kSum);
  /// All-gather into one array (PyTorch's all_gather_into_tensor): every rank's x, of one shape and
  /// dtype, concatenated along a new first block in rank order (shape[0] * size() rows; a 0-d x
  /// gives a vector of size() values), on x's device. allgather gives the arrays as a list.
  Array all_gather(const Array& x);

  // --- objects (byte buffers; large ones are sent in chunks) -------------------------------------
  void send_obj(const Bytes& obj, int dest, int tag = 0);
  Bytes recv_obj(int source, int tag = 0);
  Bytes bcast_obj(const Bytes& obj, int root = 0);
  std::vector<Bytes> gather_obj(const Bytes& obj, int root = 0);
  std::vector<Bytes> allgather_obj(const Bytes& obj);
  /// Reduction of numbers (ChainerMN's allreduce_obj for scalars).
  double allreduce_obj(double value, ReduceOp op = ReduceOp::kSum);
  int64_t allreduce_obj(int64_t value, ReduceOp op = ReduceOp::kSum);
  /// Elementwise reduction of equal-length vectors.
  std::vector<double> allreduce_obj(const std::vector<double>& values, ReduceOp op = ReduceOp::kSum);

  /// Waits for every rank.
  void barrier();
  /// A communicator of the ranks with the same color, ordered by key (MPI_Comm_split), of the
  /// same kind as this one.
  virtual std::shared_ptr<Communicator> split(int color, int key);
  /// Releases the communicator's resources (also done by the destructor) and tells the other
  /// ranks that this one is done with it: a rank that still waits in an operation this one will
  /// never join then raises CommunicatorError naming this rank, instead of waiting.
  virtual void finalize();

  /// The MPI communicator handle (an MPI_Comm, as an integer-sized opaque value).
  virtual intptr_t mpi_comm_handle() const = 0;
  const CommunicatorOptions& options() const { return options_; }

 protected:
  Communicator() = default;
  CommunicatorOptions options_;
  int rank_ = 0, size_ = 1;
  int intra_rank_ = 0, intra_size_ = 1;
  int inter_rank_ = 0, inter_size_ = 1;
};

/// The communicator names create_communicator accepts.
std::vector<std::string> communicator_names();

/// Creates a communicator over all processes of the job (initialising MPI if the program has
/// not, and finalising it at exit). Names: "naive" (one MPI allreduce per parameter; the CPU
/// default), "flat" (all gradients packed into one MPI allreduce), "dummy" (packing only, for
/// benchmarks), and with CUDA + NCCL "pure_nccl" (the GPU default), "non_cuda_aware",
/// "hierarchical", "two_dimensional", "single_node". An unknown name is an error listing them.
std::shared_ptr<Communicator> create_communicator(const std::string& name = "naive",
                                                  const CommunicatorOptions& options = {});

/// Like create_communicator, over an existing MPI communicator (an MPI_Comm cast to intptr_t;
/// see kusari/mn/mpi_interop.h for a typed overload).
std::shared_ptr<Communicator> create_communicator(const std::string& name, intptr_t mpi_comm,
                                                  const CommunicatorOptions& options);

// Note [Communicator arguments]
// Every function of kusari::mn takes the communicator as create_communicator returns it, a
// std::shared_ptr<Communicator>, as ChainerMN's functions take the communicator object:
// scatter_dataset(train, comm), check_same_settings(comm, ...), send(x, comm, 1). The functions
// that only use it during the call also take a Communicator& (for code that holds a reference,
// such as a link's own communicator()); objects that keep it (the optimizer, the evaluator,
// MultiNodeBatchNormalization, ...) take the shared_ptr only.
namespace detail {
/// *comm, or a ValueError naming `function` when comm is null.
Communicator& communicator_of(const std::shared_ptr<Communicator>& comm, const char* function);
}  // namespace detail

}  // namespace kusari::mn
