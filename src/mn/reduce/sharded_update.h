// The sharded optimizer step (ZeRO stages 1, 2 and 3; Notes [Sharded optimizer] and [Sharded
// parameters] in sharded_update.cc): a model-level strategy of reduce/, owned by the multi-node
// optimizer, that talks to the communicator only through buffer collectives (allreduce,
// reduce-scatter, all-gather) and the object collectives.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kusari/mn/communicator.h"
#include "kusari/optimizers/optimizer.h"
#include "mn/snapshot_set.h"

namespace kusari::mn::detail {

/// The bounds of the processes' shards of a flat space of parameters: process r holds
/// [bounds[r], bounds[r + 1]). `sizes` are the elements of the parameters in order; a parameter
/// whose `splittable` entry is false lies whole in one shard (the bound moves to its nearer edge).
/// Shards are as equal as that allows; some may be empty.
std::vector<int64_t> shard_bounds(const std::vector<int64_t>& sizes, const std::vector<bool>& splittable,
                                  int processes);

/// Steps a model's parameters with an optimizer that holds the state of this process's shard only.
class ShardedUpdate final : public ::kusari::detail::DataSource {
 public:
  /// `stage` 1: the gradients are averaged whole (the communicator's multi_node_mean_grad), the
  /// optimizer's state is sharded; 2: the gradients are reduce-scattered into the shard and the
  /// model's gradients are dropped after the step; 3: as 2 with overlap, and the parameters'
  /// values live in the shards too, gathered whole only while used (Note [Sharded parameters]).
  /// `chunk_bytes`: the most bytes reduced or gathered at once (the host memory the step needs).
  /// `overlap` (stage 2 only): the chunks are reduce-scattered while backward runs, each launched
  /// from the gradient-ready hooks once its gradients are final, and each gradient dropped once
  /// packed (Note [Sharded optimizer], "Overlap"). Collective: every process makes it.
  ShardedUpdate(std::shared_ptr<Communicator> comm, int stage, int64_t chunk_bytes = int64_t{25} << 20,
                bool overlap = false);
  ~ShardedUpdate();
  ShardedUpdate(const ShardedUpdate&) = delete;
  ShardedUpdate& operator=(const ShardedUpdate&) = delete;
  /// True when the reduce-scatter overlaps backward.
  bool overlap() const { return overlap_; }
  /// While on, the hooks launch nothing: the gradients of several backward calls add up, and the
  /// last one (with hold off) launches them (gradient accumulation).
  void hold(bool on) { holding_ = on; }

  int stage() const { return stage_; }
  /// True once plan() has run (and until forget()).
  bool planned() const { return planned_; }
  /// Lays `model`'s initialised parameters out in shards and attaches `actual` to this process's
  /// pieces (a link of its own), moving the state `actual` held for whole parameters (a loaded
  /// snapshot) into the pieces. Collective only through nothing: every process computes the
  /// same layout from the same parameters (which the multi-node optimizer checked).
  void plan(Link& model, Optimizer& actual);
  /// Drops the layout (the optimizer's target changed).
  void forget();
  /// One step from the gradients backward left in `model`: averaged into the shard, the shard
  /// stepped by `actual`, and the updated parameters gathered on every process. Collective.
  /// `scale` multiplies the averaged gradients (a Join's mean over the processes that trained).
  void step(Link& model, Optimizer& actual, bool zero_fill, double scale = 1.0);
  /// Saves this process's pieces of `actual`'s state and the layout, or loads the pieces (Note
  /// [Sharded snapshot files]). Local: no communication.
  void serialize(Serializer& s, Optimizer& actual);
  /// The layout a snapshot records (after plan()).
  ShardLayout layout() const;

  /// Elements of the parameters in this process's shard, and in all shards.
  int64_t shard_elements() const;
  int64_t total_elements() const;
  /// Parameters cut between shards (each counted once).
  int64_t split_parameters() const;

  // --- stage 3 --------------------------------------------------------------------------------
  /// Gathers the released parameters of a unit when one of them is read (Variable::data()).
  void materialize(::kusari::detail::VariableImpl& impl) override;
  /// Releases the units whole since before the one gathered last (forward's next node).
  void at_next_node() override;
  /// Stage 3: gathers every parameter whole (collective) and keeps them whole until the next
  /// step or until backward is done with them. Other stages: nothing.
  void gather_all();
  /// Elements of the model's parameters held whole on this process now (stage 3; else all).
  int64_t whole_elements() const;
  /// Units gathered so far, and of them those prefetched (stage 3).
  int64_t gathers() const { return gathers_; }
  int64_t prefetched() const { return prefetched_; }
  int64_t units() const { return static_cast<int64_t>(units_.size()); }

 private:
  struct Entry {
    std::string path;
    Parameter param;      // the model's
    int64_t offset = 0;   // in its group's flat space
    int64_t size = 0;
    // Stage 3: where the whole values go, and what the data is while released.
    Shape shape;
    Device device;
    MemoryFormat format = MemoryFormat::kContiguous;
    Array placeholder;
  };
  struct Piece {
    std::string path;
    Parameter param;      // the model's
    Parameter shard;      // what the optimizer steps: the parameter itself, or a view of a part
    int64_t lo = 0, hi = 0;  // elements of the parameter (flat, C order)
    int64_t flat = 0;     // where it starts in the group's flat space
    bool whole = false;
  };
  struct Group {
    Dtype dtype = Dtype::kFloat32;
    std::vector<Entry> entries;
    std::vector<int64_t> bounds;  // size() + 1
    std::vector<Piece> pieces;    // this process's, in flat order
    std::vector<int64_t> counts() const;
  };

  void reduce_scatter_grads(Group& g, bool zero_fill, double scale);
  /// The pieces' gradients from the reduced shard of `g` (scaled by 1/N and `scale`); an entry
  /// whose gradient was absent gets none unless `zero_fill`.
  void pieces_from_shard(Group& g, Array shard, const std::vector<bool>& present, bool zero_fill, double scale);

  // --- stage 2 overlapped with backward -----------------------------------------------------
  struct Chunk {
    size_t group = 0;
    int64_t a = 0, b = 0;    // elements of the group's flat space
    size_t first = 0, last = 0;  // the entries [first, last) that reach into it
    int pending = 0;         // of those, the ones whose gradient is not final yet
    bool launched = false;
    Array send;
  };
  void make_chunks();
  void attach_hooks();
  void detach_hooks();
  void on_ready(size_t group, size_t entry);
  void launch(size_t k);
  size_t chunks_in_flight() const;
  /// Launches the chunks not launched yet and waits for all (a backward without its update).
  void drain();
  static constexpr size_t kChunksInFlight = 8;
  void reset_overlap();
  void finish_overlapped(bool zero_fill, double scale);
  void shard_grads_from_model(Group& g, double scale);
  void all_gather_params(Group& g);
  /// The piece of `path`, or null.
  const Piece* piece_of(const std::string& path) const;

  std::shared_ptr<Communicator> comm_;
  int stage_;
  int64_t chunk_bytes_;
  bool planned_ = false;
  std::vector<Group> groups_;
  std::shared_ptr<Link> shard_link_;

  bool overlap_ = false;
  bool holding_ = false;
  MPI_Comm dup_ = MPI_COMM_NULL;  // the chunks' collectives (never interleaved with a model's own)
  std::vector<Chunk> chunks_;
  std::vector<MPI_Request> requests_;  // by chunk
  size_t next_chunk_ = 0;              // chunks are launched strictly in order on every process
  std::vector<Array> shard_grads_;     // per group: this process's reduced shard (wire dtype)
  std::vector<std::vector<char>> ready_, present_;  // per group, per entry (this step)
  std::vector<std::vector<int64_t>> unpacked_;      // per group, per entry: its chunks not packed yet
  std::vector<std::vector<std::pair<size_t, size_t>>> entry_chunks_;  // per group, per entry: chunks [from, to)
  std::vector<std::vector<Array>> host_grads_;  // per group, per entry: the flat host gradient while packed
  std::vector<std::pair<Parameter, int64_t>> hooks_;

  // --- stage 3: sharded parameters (Note [Sharded parameters]) --------------------------------
  struct Unit {
    size_t group = 0;
    size_t first = 0, last = 0;  // its entries [first, last)
    int64_t a = 0, b = 0;        // its part of the group's flat space
    bool live = false;           // the entries hold their whole values
    int ready = 0;               // entries whose gradient backward finished since it was gathered
    uint64_t used = 0;           // when it was last gathered (the eviction order)
  };
  struct Gather {
    size_t unit = 0;
    Array buffer;  // the unit's flat values (host)
    MPI_Request request = MPI_REQUEST_NULL;
  };
  void make_units();
  /// Launches the gather of unit `u` (this process's part from its pieces).
  Gather start_gather(size_t u);
  /// Waits for a gather and gives its entries their whole values.
  void finish_gather(Gather& gather);
  void gather_unit(size_t u);
  /// Writes this process's parts of the unit's whole values back into its pieces (values set in
  /// place while whole, such as a loaded snapshot, are kept), then drops the whole values.
  void release_unit(size_t u);
  void release_all();
  void wait_prefetch(bool install);
  void note_ready(size_t group, size_t entry);
  /// Unit of an entry, per group.
  std::vector<std::vector<size_t>> entry_unit_;
  std::vector<Unit> units_;
  std::unordered_map<const ::kusari::detail::VariableImpl*, std::pair<size_t, size_t>> where_;
  MPI_Comm gather_dup_ = MPI_COMM_NULL;  // the gathers' collectives
  std::optional<Gather> prefetch_;
  std::vector<size_t> trace_, last_trace_;  // the units gathered in this step, and in the last
  uint64_t clock_ = 0;
  static constexpr size_t kLiveUnits = 2;  // whole units kept besides the one being gathered
  int64_t gathers_ = 0, prefetched_ = 0;
};

}  // namespace kusari::mn::detail
