// Checkpoints of multi-node jobs (ChainerMN's create_multi_node_checkpointer and
// multi_node_snapshot): resume a job of many processes after a crash or a job-time limit.
//
//   auto checkpointer = kusari::mn::create_multi_node_checkpointer("run42", comm);
//   trainer.extend(checkpointer, "", kusari::training::interval(1000, "iteration"));
//   checkpointer->maybe_load(trainer, optimizer.get());   // after every extend(), before run()
//   trainer.run();
//
// See docs/checkpointing.md for a job flow.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kusari/mn/communicator.h"
#include "kusari/optimizers/optimizer.h"
#include "kusari/training/extension.h"
#include "kusari/training/extensions/snapshot.h"

namespace kusari::training {
class Trainer;
}  // namespace kusari::training

namespace kusari::mn {

/// Durations of the checkpoint writes of one rank (ChainerMN's _CheckpointStats).
struct CheckpointStats {
  /// Number of checkpoints written.
  int64_t count = 0;
  /// Seconds spent writing them, in all, the shortest and the longest write.
  double total_seconds = 0, min_seconds = 0, max_seconds = 0;
  /// Mean seconds per checkpoint (0 when none was written).
  double average_seconds() const { return count ? total_seconds / static_cast<double>(count) : 0; }
  /// ChainerMN's report: "Snapshot duration stats (sec): avg=..., min=..., max=..." or
  /// "No stats available".
  std::string report() const;
};

/// Generational checkpoints of every rank, for resuming a multi-node job (ChainerMN's
/// _MultiNodeCheckpointer). Made by create_multi_node_checkpointer.
///
/// Note [Multi-node checkpoint sets]
/// Every time the extension runs (its trigger is every iteration unless extend() gives another),
/// each rank saves the target with save_npz - atomically, a temporary file renamed into place -
/// as `<path>/<name>.<rank>.<iteration>`. The files of one iteration across all ranks form a set;
/// a set is complete when every rank has its file. A crash can leave the newest set incomplete
/// (some ranks wrote, others did not), never a half-written file.
///
/// After every save the ranks agree (one small allgather) on whether every save succeeded; if one
/// failed, every rank throws the same IOError, so no rank walks into the next collective alone.
/// Every `gc_interval` saves the same allgather carries each rank's list of iterations, and each
/// rank deletes its files except those of the newest `cp_interval` complete sets. Files of an
/// iteration newer than the one just saved are deleted too: they are left from an earlier run
/// that got further before it crashed without completing that set, and this run writes its own.
/// At most cp_interval + gc_interval checkpoint files per rank exist at any time. The temporary
/// files of this rank's saves that were killed (".<name>.<rank>.<iteration>.tmp.XXXXXX") are
/// removed when the checkpointer starts (initialize(), maybe_load()) and at every collection,
/// never another rank's nor one a running save holds (Note [Stale temporary files]). Not after
/// every save: the checkpointer runs every iteration by default, and listing a folder that all
/// ranks share at every step costs a parallel file system dearly; a save of this process that
/// fails removes its own temporary file, so between starts only files that a running save held
/// at the start (a dying process of the previous job) can be left, and the next collection
/// takes them.
///
/// maybe_load() lists each rank's files, agrees (allgather) on the iterations every rank has, and
/// loads the newest of them on every rank. A file that cannot be read (truncated, damaged, CRC
/// mismatch: read_npz throws) counts as missing: the ranks agree again, on the next older complete
/// set, and rank 0 prints a warning naming the file. If complete sets exist but none can be read
/// on every rank, every rank throws rather than start from scratch (the first collection of a
/// fresh start would delete them). A file that reads but does not fit the target (a missing key,
/// a shape mismatch) is an error on every rank instead: falling back would only meet the same
/// mismatch in every older set, or silently restart a changed model from scratch (and the next
/// collection would delete the old job's checkpoints).
///
/// When training ends normally, finalize() removes this rank's checkpoint files (ChainerMN: "after
/// training finished without errors all those temporary checkpoints will be cleaned up"); after an
/// error (on_error was called) they are kept for the restart. A job killed by a time limit never
/// reaches finalize().
class MultiNodeCheckpointer : public training::Extension {
 public:
  /// See create_multi_node_checkpointer.
  MultiNodeCheckpointer(std::string name, std::shared_ptr<Communicator> comm, int cp_interval,
                        int gc_interval, std::string path);

  /// Saves the trainer as checkpoint trainer.updater().iteration() (collective: every rank must
  /// run the extension at the same iterations).
  void operator()(training::Trainer& trainer) override;
  /// "multi_node_checkpointer".
  std::string default_name() const override { return "multi_node_checkpointer"; }
  /// Every iteration (Chainer's default for an extension); pass another trigger to extend().
  std::shared_ptr<training::Trigger> default_trigger() const override;
  /// -100, like snapshot: runs after the other extensions of the iteration.
  int priority() const override { return -100; }
  /// Takes the trainer's out folder when no path was given, and removes this rank's temporary
  /// files of killed saves (see the Note).
  void initialize(training::Trainer& trainer) override;
  /// Remembers that training failed, so that finalize() keeps the checkpoints.
  void on_error(training::Trainer& trainer, const std::exception& error) override;
  /// Removes this rank's checkpoint files unless training failed (see the Note).
  void finalize() override;

  /// Saves `target` as checkpoint `iteration`, then collects garbage when due. Collective: every
  /// rank calls it with the same iteration. Needs a folder (the `path` given at creation, or the
  /// out folder of a trainer it ran with): use it without a trainer as in ChainerMN's
  /// `checkpointer.save(obj, iteration)`.
  void save(Serializable& target, int64_t iteration);

  /// Loads the newest checkpoint that every rank has into `trainer` (the folder is the path given
  /// at creation, else trainer.out()) and returns its iteration; nullopt, with nothing loaded,
  /// when there is none. Call it after every extend() and before run(). With a MultiNodeOptimizer,
  /// pass it: a complete resume leaves every rank with the same parameters, so its first update
  /// takes a step instead of broadcasting. Collective.
  std::optional<int64_t> maybe_load(training::Trainer& trainer, Optimizer* optimizer = nullptr);
  /// As above, for any object saved with save(); needs the path given at creation.
  std::optional<int64_t> maybe_load(Serializable& target, Optimizer* optimizer = nullptr);

  /// This rank's checkpoint iterations found in the folder, oldest first (empty before a path is
  /// known). Local: no communication.
  std::vector<int64_t> local_iterations() const;
  /// The file name of this rank's checkpoint of `iteration`: "<name>.<rank>.<iteration>".
  std::string filename(int64_t iteration) const;
  /// The folder of the checkpoints (empty until given or taken from a trainer).
  const std::string& path() const { return path_; }
  /// The name given at creation.
  const std::string& name() const { return name_; }
  /// Statistics of this rank's writes.
  const CheckpointStats& stats() const { return stats_; }
  /// ChainerMN's get_stats(): stats().report().
  std::string get_stats() const { return stats_.report(); }

 private:
  /// (rank, iteration) of a file name of this checkpointer; nullopt for any other file.
  std::optional<std::pair<int, int64_t>> parse(const std::string& filename) const;
  std::optional<int64_t> load_common(Serializable& target, Optimizer* optimizer);
  void collect_garbage(const std::vector<std::vector<int64_t>>& iterations_of_ranks,
                       int64_t saved_iteration);
  /// Removes this rank's temporary files left by killed saves, last modified before
  /// `modified_before`.
  void remove_stale_temporaries(std::filesystem::file_time_type modified_before) const;

  std::string name_;
  std::shared_ptr<Communicator> comm_;
  int cp_interval_;
  int gc_interval_;
  std::string path_;
  int saves_since_gc_ = 0;
  bool failed_ = false;
  CheckpointStats stats_;
};

/// Creates a multi-node checkpointer (ChainerMN's create_multi_node_checkpointer): every rank
/// saves its trainer as `<path>/<name>.<rank>.<iteration>` each time the extension runs, and
/// maybe_load() resumes from the newest iteration that every rank has. `name` identifies the run
/// (no '/'); `cp_interval` is the number of complete checkpoint sets kept, `gc_interval` the
/// number of saves between garbage collections; `path` defaults to the trainer's out folder.
/// See Note [Multi-node checkpoint sets].
std::shared_ptr<MultiNodeCheckpointer> create_multi_node_checkpointer(
    const std::string& name, std::shared_ptr<Communicator> comm, int cp_interval = 5,
    int gc_interval = 5, const std::string& path = "");

/// Sets of ranks whose targets hold identical state, e.g. {{0, 1}, {2, 3}}.
using ReplicaSets = std::vector<std::vector<int>>;

/// The replica sets of a job of `size` ranks, completed as ChainerMN does: the ranks that no set
/// names form one more set (so {{0}} over 4 ranks is {0}, {1, 2, 3}, and {} is one set of all).
/// Each set is sorted. A rank outside 0..size-1, a rank in two sets or an empty set is a
/// ValueError naming it.
ReplicaSets complete_replica_sets(const ReplicaSets& replica_sets, int size);

/// A snapshot extension of which only one rank of each replica set writes (ChainerMN's
/// multi_node_snapshot). Made by multi_node_snapshot.
///
/// Note [Multi-node snapshot of replica sets]
/// The master of a set is its smallest rank. The wrapped snapshot's file name pattern gets
/// ".<rank>" appended (the snapshot object passed in is changed), so masters writing to one
/// shared folder never collide, and only masters run it (and its n_retains), its on_error and
/// its finalize. With autoload, initialize() lets each master load its newest snapshot as the
/// snapshot would, serialises the loaded target with
/// DictionarySerializer and sends the arrays to the other ranks of its set, which load them with
/// NpzDeserializer (strict: their targets must have the master's keys). Only masters need their
/// files, so a restart may regroup the other ranks: a rank that wrote nothing before can receive
/// its state from its new master. Finally every rank learns (allgather) whether every load
/// succeeded and all throw the same error if one failed, so no rank is left waiting.
///
/// When the target is the whole trainer, every rank also tells the iteration it resumed from.
/// Ranks of one job step together, so all must agree: if one set's master found an older
/// snapshot than the others (it crashed before writing the newest) or none at all, every rank
/// throws an IOError listing them, instead of training on from mixed iterations. When all agree,
/// a MultiNodeOptimizer as the updater's "main" optimizer is told that the parameters are in sync,
/// so that its first update takes a step (as after MultiNodeCheckpointer::maybe_load).
class MultiNodeSnapshot : public training::Extension {
 public:
  /// See multi_node_snapshot.
  MultiNodeSnapshot(std::shared_ptr<Communicator> comm,
                    std::shared_ptr<training::extensions::Snapshot> snapshot,
                    const ReplicaSets& replica_sets);

  /// Runs the snapshot on the masters.
  void operator()(training::Trainer& trainer) override;
  /// "multi_node_snapshot".
  std::string default_name() const override { return "multi_node_snapshot"; }
  /// The wrapped snapshot's trigger.
  std::shared_ptr<training::Trigger> default_trigger() const override;
  /// The wrapped snapshot's priority.
  int priority() const override { return snapshot_->priority(); }
  /// Autoload: the masters load, the other ranks receive their master's state (collective when
  /// autoload is on).
  void initialize(training::Trainer& trainer) override;
  /// Runs the snapshot's on_error on the masters.
  void on_error(training::Trainer& trainer, const std::exception& error) override;
  /// Runs the snapshot's finalize on the masters.
  void finalize() override;
  /// Serialises the wrapped snapshot's state.
  void serialize(Serializer& serializer) override;

  /// True on the rank that writes for its set.
  bool is_master() const { return master_ == comm_->rank(); }
  /// The smallest rank of this rank's set.
  int master() const { return master_; }
  /// This rank's replica set, sorted.
  const std::vector<int>& replica_set() const { return replica_set_; }
  /// The wrapped snapshot.
  training::extensions::Snapshot& snapshot() { return *snapshot_; }

 private:
  std::shared_ptr<Communicator> comm_;
  std::shared_ptr<training::extensions::Snapshot> snapshot_;
  std::vector<int> replica_set_;
  int master_ = 0;
};

/// Wraps `snapshot` (e.g. training::extensions::snapshot()) so that only one rank of each replica
/// set writes (ChainerMN's multi_node_snapshot). `replica_sets` lists sets of ranks whose state is
/// identical, completed by complete_replica_sets (so `{}` makes all ranks one set, as ChainerMN's
/// `[]` does). See Note [Multi-node snapshot of replica sets].
std::shared_ptr<MultiNodeSnapshot> multi_node_snapshot(
    std::shared_ptr<Communicator> comm, std::shared_ptr<training::extensions::Snapshot> snapshot,
    const ReplicaSets& replica_sets);

/// As above with every rank a set of its own: every rank writes (and autoloads) its own file.
std::shared_ptr<MultiNodeSnapshot> multi_node_snapshot(
    std::shared_ptr<Communicator> comm, std::shared_ptr<training::extensions::Snapshot> snapshot);

/// The snapshot file of this rank for the name `path`: `path` itself in a job of one process,
/// `<path>.<rank>` in a job of more - the names that multi_node_snapshot(comm, snapshot) writes,
/// each rank its own file.
std::string snapshot_file_of_rank(const std::string& path, const Communicator& comm);
/// snapshot_file_of_rank with the communicator as create_communicator returns it.
inline std::string snapshot_file_of_rank(const std::string& path, const std::shared_ptr<Communicator>& comm) {
  return snapshot_file_of_rank(path, detail::communicator_of(comm, "snapshot_file_of_rank"));
}

/// Resumes `trainer` from the snapshot `path` that a job of as many processes wrote with
/// multi_node_snapshot(comm, snapshot): each rank loads its own file (snapshot_file_of_rank), with
/// its own iterator position and order, so the resumed job goes on bit for bit as the uninterrupted
/// one would; one process loads `path` itself. Collective: the ranks then agree (one allgather)
/// that every load succeeded and that all resumed from the same iteration, and otherwise every rank
/// throws the same IOError naming each rank's file and what went wrong, so no rank is left waiting
/// in the first step. A MultiNodeOptimizer as the updater's "main" optimizer is told that the
/// parameters are in sync. Returns the iteration resumed from (Note [Resuming each rank from its
/// own snapshot]).
int64_t load_snapshot_of_each_rank(const std::string& path, training::Trainer& trainer,
                                   Communicator& comm);
/// load_snapshot_of_each_rank with the communicator as create_communicator returns it.
inline int64_t load_snapshot_of_each_rank(const std::string& path, training::Trainer& trainer,
                                          const std::shared_ptr<Communicator>& comm) {
  return load_snapshot_of_each_rank(path, trainer, detail::communicator_of(comm, "load_snapshot_of_each_rank"));
}

/// A set of snapshot files written at one iteration by every process of a job.
struct SnapshotSet {
  /// The updater's iteration the files hold.
  int64_t iteration = 0;
  /// The number of processes that wrote them.
  int size = 0;
  /// The files, by the rank that wrote them (full paths).
  std::vector<std::string> files;
};

/// The newest complete snapshot set in `folder`, whatever the number of processes that wrote it;
/// nullopt when there is none. Local: no communication. See Note [Resuming on another number of
/// processes].
std::optional<SnapshotSet> newest_complete_snapshot_set(const std::string& folder,
                                                        const std::string& prefix = "snapshot_iter_");

/// Resumes `trainer` from the newest complete snapshot set in `folder` that a job of any number of
/// processes wrote (with multi_node_snapshot(comm, snapshot), or one process with snapshot()),
/// and returns its iteration; nullopt, with nothing loaded on any rank, when the folder holds no
/// complete set (a first start). Collective.
///
/// Note [Resuming on another number of processes]
/// A set is complete when the files <prefix><iteration>.<r> of every rank r of the job that wrote
/// it exist; each file holds that number (multi_node_snapshot's "mn_world_size"), and the writes
/// are atomic, so a set whose writer died half-way lacks files instead of holding a broken one.
/// Rank 0 looks (the folder must be one that every process sees) and tells the others; rank r of M
/// then loads the file of rank r mod N. The model and the optimizer state are the same in every
/// file of a data-parallel job (the multi-node optimizer keeps them equal); rank 0 gets rank 0's,
/// which holds the log of the rank-0-only extensions; an iterator that resumes at another size is
/// a DistributedIterator (Note [Distributed iterator]), whose state is the same in every file. A
/// SerialIterator over a scatter_dataset shard cannot be continued by another number of processes:
/// its snapshot holds a position in a shard that no longer exists, and loading it at another size
/// is an error naming the iterator. The ranks agree (one allgather) that every load succeeded and
/// resumed the same iteration, or all throw the same IOError. Rank 0 also removes the temporary
/// files that killed writes of ranks this job no longer has left in the folder (Note [Stale
/// temporary files]), which no rank's own snapshot extension would.
std::optional<int64_t> load_newest_snapshot_set(const std::string& folder, training::Trainer& trainer,
                                                Communicator& comm, const std::string& prefix = "snapshot_iter_");
/// True when an example's `-r`/`--resume` value names a folder to resume from with
/// load_newest_snapshot_set: an existing folder, or the output folder `out` even before it
/// exists (a job script that always passes `-r <out>` starts fresh the first time).
bool names_snapshot_folder(const std::string& resume, const std::string& out);

/// load_newest_snapshot_set with the communicator as create_communicator returns it.
inline std::optional<int64_t> load_newest_snapshot_set(const std::string& folder, training::Trainer& trainer,
                                                       const std::shared_ptr<Communicator>& comm,
                                                       const std::string& prefix = "snapshot_iter_") {
  return load_newest_snapshot_set(folder, trainer, detail::communicator_of(comm, "load_newest_snapshot_set"),
                                  prefix);
}

/// Loads `target` from the files that the processes of one job wrote at one save (`files[r]` by
/// rank r, as SnapshotSet::files lists them) as from one unsharded snapshot: the state of a
/// sharded optimizer (MultiNodeOptimizerOptions::zero_stage) is put together from the files that
/// hold its pieces, everything else is read from `files[own]`. `path` selects a sub-tree, e.g.
/// "updater/optimizer:main/", and `strict` is as in NpzDeserializer. Local: no communication; a
/// sharded optimizer reads only the files that hold its own pieces, an unsharded one gets the whole
/// state. See Note [Sharded snapshot files].
void load_snapshot_files(const std::vector<std::string>& files, Serializable& target, int own = 0,
                         const std::string& path = "", bool strict = true);

/// Writes the files of one save (as for load_snapshot_files) as one unsharded npz file `out`, which
/// load_npz and a single process load (and NumPy reads): the pieces of sharded optimizers put
/// together, their layouts dropped, the rest from files[0] (rank 0's iterator and log), and the
/// recorded job size ("mn_world_size") 1. The file is replaced atomically. Local.
void merge_snapshot_files(const std::vector<std::string>& files, const std::string& out,
                          bool compression = true);

}  // namespace kusari::mn
