// The overlapped gradient reducer: gradients reduced in buckets while backward runs, PyTorch
// DDP's reducer done our way. See Note [Overlapped gradient reduction] below and Note [Gradient
// reducer] in reducer.h. Plain C++ (no MPI, CUDA or NCCL): the transports that move a bucket are
// host_bucket_transport.cc (MPI) and nccl_bucket_transport.cc (NCCL).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kusari/mn/communicator.h"
#include "kusari/mn/optimizer.h"
#include "mn/reduce/gradient_buffer.h"

namespace kusari::mn::detail {

// Note [Overlapped gradient reduction]
// Without overlap, multi_node_mean_grad starts after backward has ended, and the whole gradient
// allreduce adds to the step. With create_multi_node_optimizer(..., {.overlap = true}) the
// gradients go out in buckets while backward still runs (PyTorch DDP's reducer, ChainerMN's
// "better" that it declined):
//   Hooks. Every parameter has a gradient-ready hook (Note [Gradient-ready hooks] in
//     src/autograd/backward.cc), which runs once backward has summed the parameter's last
//     contribution of that backward.
//   Buckets. The parameters are grouped into buckets of about bucket_bytes (25 MiB; the first
//     bucket first_bucket_bytes, 1 MiB, so that communication starts soon), in the order their
//     gradients became ready in the first step, which is the reverse of their first use in
//     forward: the last layers' gradients are ready first. Parameters whose gradient was not
//     ready in that step go last, in reverse path order. A bucket holds one gradient dtype (a
//     change of dtype closes it). The last bucket can only go out when backward ends, so
//     nothing in it is ever hidden: its tail (the parameters backward finishes last) is cut off
//     into a last bucket of about first_bucket_bytes, and the rest goes out earlier (for
//     ResNet-18 with 25 MiB buckets, about 19 MiB that would otherwise wait for conv1). Each bucket is one flat buffer of its wire dtype
//     (allreduce_grad_dtype where the kind casts, else the gradients' own), segments aligned as
//     in Note [Gradients in the reduction buffer]; when no cast is needed (and
//     gradients_in_buffer is on) the segments are the gradients, as there: a hook copies a new
//     gradient into its segment and makes the segment the gradient, later backward calls
//     add into it in place, and the update reads the means where the reduction left them.
//     (Where the transport has a thread of its own, the hook only hands it the copy, and the
//     update makes the segment the gradient: Note [Progress thread] in
//     host_bucket_transport.cc.)
//   Order. A bucket is launched when its last gradient is ready, but only after every bucket
//     before it: buckets go out strictly in plan order on every rank, so the collectives match
//     even where a later step's backward reaches the parameters in another order (a rank then
//     only launches later; the sums are right). The plan is learnt in the first step (the one
//     create_multi_node_optimizer spends broadcasting rank 0's parameters, and again whenever
//     the parameter set changes) and checked across ranks before anything is launched: the
//     buckets' parameters, shapes and dtypes in order, and the settings, hashed in one small
//     allreduce; when they differ every rank gathers the plans and raises the same
//     CommunicatorError naming the first difference and the ranks (Note [Gradient sets] does
//     the same for the gradients). Nothing is in flight then, so nothing hangs.
//   Update. multi_node_mean_grad (the update) first checks with one allreduce of three integers
//     that every rank still holds the planned parameters (a rank whose parameters changed makes
//     every rank plan again), then fills each bucket not yet launched: a parameter whose gradient
//     was not ready in this backward sends its current gradient, or zeros when it has none
//     (unused in this step); launches those buckets in order; waits for all of them; divides by
//     the number of ranks where the collective summed (the CPU transports average float32 and
//     float64 buckets themselves, each as soon as its collective has finished); and gives every
//     parameter its mean.
//   Unused parameters. A bucket's layout is fixed, so a rank cannot skip a parameter as
//     ChainerMN's zero_fill=false does: a parameter without a gradient sends zeros, always.
//     With zero_fill (the default) it then gets the mean like the others (zeros counted, as
//     ChainerMN's zero_fill). Without zero_fill one more small allreduce counts, per parameter,
//     the ranks that had a gradient: none gives the parameter no gradient (skipped, as without
//     overlap); every rank gives the mean; some but not all is the disagreement that the
//     path without overlap reports, raised on every rank.
//   Accumulation. Hooks run in every backward. With several backward calls before an update,
//     run all but the last inside MultiNodeOptimizer::no_sync() (DDP's no_sync): their hooks
//     launch nothing, the gradients add up, and the last backward launches the buckets with the
//     sums. A gradient that becomes ready again after its bucket was launched (accumulation
//     without no_sync) raises an error from backward, on every rank alike: what was sent was
//     not the final gradient.
//   Equal results. With the same summation inside each collective, every parameter's mean is
//     computed as the kind computes it without overlap (the same sum, then the same scaling:
//     multiply_to by 1/size, or for "naive"'s 16-bit gradients a float32 product), so overlap
//     changes the step's timing and not its numbers: the tests compare the two bit for bit under
//     2 and 3 processes. With two ranks every summation order gives the same sums; with more,
//     the order of the additions must not depend on where a gradient sits in a message, which
//     the algorithm kusari selects for Open MPI guarantees (Note [Allreduce algorithm] in
//     mpi_util.cc; another MPI may choose by message size, and then large buckets may differ
//     from the path without overlap in the last bits).
//   Broadcast steps. A step whose update broadcasts (the first, or a changed parameter set)
//     reduces nothing, but its backward may already have sent buckets of the previous plan: the
//     gradients then hold those sums. The update discards them either way.
// Transports. A BucketTransport moves the buckets. On the CPU kinds ("naive", "flat", "dummy")
// it is MPI's non-blocking MPI_Iallreduce on a duplicate of the communicator (so that the
// buckets' collectives never interleave with other collectives a model issues during backward),
// started from the hook. MPI moves a non-blocking collective only while a thread is inside MPI.
// Where MPI allows a second thread (MPI_THREAD_MULTIPLE, kusari's own initialisation) and the
// process has a core to spare, a progress thread does that meanwhile (Note [Progress thread] in
// host_bucket_transport.cc); otherwise every hook also tests the requests in flight
// (MPI_Testall): the transfers and sums then happen on the thread that runs backward, between
// its layers. The update waits for the rest (wait_requests). On the NCCL
// kinds each bucket is handed from the compute stream to the communication stream with an event
// and reduced there (Note [Communication stream] in nccl_communicator.cc), and the update makes
// the compute stream wait only for the last bucket's done event (the buckets run in order on the
// one stream), so nothing waits on the host but the timeout's watch.
// Refused, with a clear error: double buffering (it reduces step t during step t+1, overlap
// during step t's own backward; choose one); the CPU kinds with a model on a GPU. A CUDA graph
// capture of forward and backward works: the hooks launch nothing while the device is capturing
// (the recorded work would replay without them), and the update launches every bucket after
// the replay; capturing the update itself is refused.

/// How an overlapped reduction cuts the gradients into buckets.
struct BucketSettings {
  /// Bytes of a bucket's wire buffer (a bucket closes once it holds at least this many).
  int64_t bucket_bytes = int64_t{25} << 20;
  /// Bytes of the first bucket.
  int64_t first_bucket_bytes = int64_t{1} << 20;
};

/// One bucket of a plan: parameters (indices into the planned list) in the order they are
/// expected ready.
struct BucketLayout {
  std::vector<size_t> params;
  /// Bytes of the parameters' gradients on the wire.
  int64_t bytes = 0;
  Dtype grad_dtype = Dtype::kFloat32;
  Dtype wire_dtype = Dtype::kFloat32;
};

/// Cuts the parameters, taken in `order` (indices into `sizes` / `grad_dtypes` / `wire_dtypes`),
/// into buckets: a bucket closes once its wire bytes reach settings.first_bucket_bytes (the
/// first) or settings.bucket_bytes (the others), and before a parameter of another gradient or
/// wire dtype. Every index of `order` lands in exactly one bucket, in order.
std::vector<BucketLayout> plan_buckets(const std::vector<size_t>& order,
                                       const std::vector<int64_t>& sizes,
                                       const std::vector<Dtype>& grad_dtypes,
                                       const std::vector<Dtype>& wire_dtypes,
                                       const BucketSettings& settings);

/// What moves a bucket: MPI on the host, or NCCL on a communication stream.
class BucketTransport {
 public:
  virtual ~BucketTransport() = default;
  /// The communicator's kind ("naive", "pure_nccl", ...).
  virtual std::string name() const = 0;
  /// The device the buckets of `params` (initialised parameters) live on; throws when this
  /// transport cannot reduce them there.
  virtual Device device_for(const NamedParams& params) const = 0;
  /// The dtype gradients of `grad_dtype` travel in.
  virtual Dtype wire_dtype(Dtype grad_dtype) const = 0;
  /// Segments start at multiples of this many bytes.
  virtual int64_t align_bytes() const = 0;
  /// A bucket's buffer holds a multiple of this many elements.
  virtual int64_t buffer_multiple() const { return 1; }
  /// Called on every rank together once a plan of `count` buckets on `device` is agreed, before
  /// the first launch (the NCCL transport creates its communicators and events here).
  virtual void prepare(int count, Device device) = 0;
  /// Copies `gradient` into `segment` (its parameter's part of a bucket's buffer, same shape and
  /// dtype), either now (returns true) or later but before that bucket's reduction starts
  /// (returns false; the caller must not read the segment before wait()).
  virtual bool fill(Array& segment, const Array& gradient) {
    segment.assign(gradient);
    return true;
  }
  /// Starts the in-place reduction of bucket `k`'s buffer `flat` (a sum, or the mean where
  /// averages() says so). Buckets are launched in order 0, 1, ... on every rank.
  virtual void launch(int k, Array& flat) = 0;
  /// Lets the reductions in flight move on (called from the hooks).
  virtual void progress() {}
  /// Waits until buckets 0 .. count-1 are reduced (the update).
  virtual void wait(int count) = 0;
  /// True when launch leaves the mean of `wire` values rather than the sum.
  virtual bool averages(Dtype wire) const = 0;
  /// Divides a bucket's sum `flat` by the number of ranks, in place, as the kind's own
  /// multi_node_mean_grad does.
  virtual void divide(Array& flat) const = 0;
  /// Waits for whatever is in flight and forgets it, never throwing (an error, or teardown).
  virtual void abandon() noexcept = 0;
  /// True when a thread of the transport's own moves the collectives on (Note [Progress
  /// thread] in host_bucket_transport.cc).
  virtual bool progress_thread() const { return false; }
  /// True when that thread yields between tests rather than sleeping.
  virtual bool progress_yields() const { return false; }
};

/// The transport of a host communicator ("naive", "flat", "dummy"); null for other kinds.
std::unique_ptr<BucketTransport> make_host_bucket_transport(Communicator& comm);

/// The CPUs this process may count on: those it is bound to, or, when it may run on every CPU of
/// the host (not bound), the host's CPUs divided among its `ranks_on_host` ranks; at least 1.
/// The CPU transport runs a progress thread only where this exceeds the compute threads (Note
/// [Progress thread] in host_bucket_transport.cc).
int cpu_share(int ranks_on_host);

/// Reduces a model's gradients in buckets as backward makes them ready. See Note [Overlapped
/// gradient reduction].
class BucketReducer {
 public:
  BucketReducer(Communicator& comm, std::unique_ptr<BucketTransport> transport,
                const BucketSettings& settings);
  BucketReducer(const BucketReducer&) = delete;
  BucketReducer& operator=(const BucketReducer&) = delete;
  /// Waits for what is in flight, removes the hooks and unbinds the gradients.
  ~BucketReducer();

  /// Waits for what is in flight, removes every hook and forgets the plan (a new model).
  void reset() noexcept {
    abandon_in_flight();
    detach();
  }
  /// Adds the hook to every parameter of `model` that has none of this reducer's yet.
  void attach(Link& model);
  /// A step that reduces nothing (the multi-node optimizer broadcast rank 0's parameters): plans
  /// the buckets from this step's order and checks the plan across ranks; the step's gradients
  /// are left as they are.
  void learn(Link& model);
  /// Replaces the gradients of `model` by their mean over the ranks: launches the buckets not yet
  /// launched and waits for all (Note [Overlapped gradient reduction], "Update").
  void mean_grad(Link& model, bool zero_fill);
  /// While held (nested holds count), hooks launch nothing (MultiNodeOptimizer::no_sync).
  void hold() { ++holds_; }
  void release_hold() { --holds_; }
  /// The last step's figures.
  const OverlapStats& stats() const { return stats_; }
  /// Buckets of the current plan (0 before one is made).
  int bucket_count() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    BucketLayout layout;
    /// The segments as the gradients (no cast, gradients_in_buffer): the buffer and binding.
    std::unique_ptr<GradientBuffer> in_place;
    /// Otherwise a wire buffer and each parameter's view of it.
    Array wire;
    std::vector<Array> views;
    /// The bucket's parameters as GradientBuffer takes them.
    NamedParams params;
    int pending = 0;
    bool launched = false;
    /// The buffer the collective reduces (a handle).
    Array flat() const { return in_place ? in_place->flat() : wire; }
  };

  /// The hook: parameter `impl`'s gradient is ready.
  void on_ready(kusari::detail::VariableImpl* impl);
  /// Plans the buckets from the order recorded in this step (collective: the check across
  /// ranks), allocates and binds their buffers, and resets the step.
  void plan(Link& model);
  /// The communicator settings that change what a bucket sends, in words.
  std::string gradient_settings_line() const;
  /// Checks the plan signature `signature` across ranks; raises on every rank if it differs.
  void check_plan_everywhere(const std::string& signature);
  /// Copies parameter (bucket b, slot i)'s gradient into its segment (zeros when it has none).
  void fill_segment(Bucket& b, size_t i);
  /// Launches the buckets from next_launch_ on while their gradients are all there.
  void launch_ready(bool in_backward);
  void launch(size_t b, bool in_backward);
  /// Clears the per-step state (nothing ready, nothing launched).
  void reset_step();
  /// Waits for the buckets in flight and forgets them (a failure, or a new plan).
  void abandon_in_flight() noexcept;
  /// Removes every hook of this reducer and unbinds the buffers.
  void detach() noexcept;
  /// The model's parameters in traversal order (impl pointers), to notice a change.
  static std::vector<const void*> walk(Link& model);

  Communicator& comm_;
  std::unique_ptr<BucketTransport> transport_;
  BucketSettings settings_;
  /// The hooks added: the parameter (weak: the reducer must not keep a model alive) and the id.
  struct Hooked {
    std::weak_ptr<kusari::detail::VariableImpl> impl;
    int64_t id = 0;
  };
  std::unordered_map<const kusari::detail::VariableImpl*, Hooked> hooked_;
  /// Parameters in the order their gradients were first ready in this step (for planning).
  std::vector<const kusari::detail::VariableImpl*> order_;
  std::unordered_map<const kusari::detail::VariableImpl*, char> seen_;

  /// The plan: the parameters (sorted by path), their bucket and slot, the buckets.
  bool planned_ = false;
  std::vector<const void*> walk_key_;
  NamedParams params_;
  std::unordered_map<const kusari::detail::VariableImpl*, std::pair<size_t, size_t>> where_;
  std::vector<Bucket> buckets_;
  std::vector<char> ready_;  // per bucket slot, flattened: ready_[first_slot_[b] + i]
  std::vector<size_t> first_slot_;
  size_t next_launch_ = 0;
  Device device_ = Device::cpu();
  uint64_t plan_hash_ = 0;

  int holds_ = 0;
  OverlapStats stats_;
  int launched_in_backward_ = 0;
  double seconds_in_backward_ = 0;
};

}  // namespace kusari::mn::detail
