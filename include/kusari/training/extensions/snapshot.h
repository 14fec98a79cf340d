// Snapshots: save the whole trainer (or one object) to npz files during training, and resume
// from the newest one (Chainer's extensions.snapshot / snapshot_object).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kusari/serializers/serializer.h"
#include "kusari/training/extension.h"

namespace kusari::training::extensions {

/// Options shared by snapshot() and snapshot_object().
struct SnapshotOptions {
  /// File name inside the trainer's out folder; "{.updater.iteration}" and "{.updater.epoch}"
  /// are replaced by the current values.
  std::string filename = "snapshot_iter_{.updater.iteration}";
  /// Keep only the newest n snapshot files written by this extension (-1: keep all). Temporary
  /// files that killed writes left behind are never kept (Note [Snapshot files on disk]).
  int n_retains = -1;
  /// At the start of training, load the newest snapshot matching `filename` found in the out
  /// folder, if any (resume after a crash or a job-time limit).
  bool autoload = false;
  /// Also write a snapshot when training stops with an exception.
  bool snapshot_on_error = false;
  /// Compress the npz members.
  bool compression = true;
};

/// Saves `target` (the trainer itself when null) with save_npz. Every write is atomic (a temp
/// file renamed into place), so a crash never leaves a half-written snapshot behind.
///
/// Note [Snapshot files on disk]
/// A job killed while it writes a snapshot (preemption, a time limit, the OOM killer) leaves the
/// temporary file of that write, ".snapshot_iter_N.tmp.XXXXXX", which nothing else removes: a
/// preempted job snapshotting a large model filled its quota with them. So the extension removes
/// the temporary files of its own file name pattern when it starts (initialize(), before an
/// autoload) and after each successful write, with remove_stale_temporary_files: only names of
/// its pattern ("snapshot_iter_<n>"; under multi_node_snapshot "snapshot_iter_<n>.<rank>", so a
/// rank never touches another rank's), only files last modified before the extension started or
/// before the write began, and only files no running writer holds (Note [Stale temporary
/// files]). With n_retains = k the folder then holds at most the k newest snapshots of the
/// pattern, plus the one temporary file of a write in progress; a killed write's leftovers count
/// as nothing to keep.
class Snapshot : public Extension {
 public:
  Snapshot(Serializable* target, SnapshotOptions options);
  void operator()(Trainer& trainer) override;
  std::string default_name() const override;
  int priority() const override { return -100; }
  void initialize(Trainer& trainer) override;
  void on_error(Trainer& trainer, const std::exception& error) override;

  /// The file name the pattern gives for the trainer's current state.
  std::string filename_for(Trainer& trainer) const;
  /// Snapshot files in `dir` matching the pattern, oldest first (by the numbers in the name).
  std::vector<std::string> find_snapshots(const std::string& dir) const;
  /// Removes from `dir` the temporary files of killed writes of this pattern last modified before
  /// `modified_before` (Note [Snapshot files on disk]); returns their names.
  std::vector<std::string> remove_stale_temporaries(
      const std::string& dir, std::filesystem::file_time_type modified_before) const;

  /// The options this snapshot was made with.
  const SnapshotOptions& options() const { return options_; }
  /// The object saved, or null when the snapshot saves the whole trainer.
  Serializable* target() const { return target_; }
  /// Replaces the file name pattern (mn::multi_node_snapshot appends the rank to it).
  void set_filename(std::string filename);

 private:
  void write(Trainer& trainer);
  Serializable* target_;
  SnapshotOptions options_;
};

/// Snapshot of the whole trainer: `trainer.extend(snapshot(), ...)`.
std::shared_ptr<Snapshot> snapshot(SnapshotOptions options = {});

/// Snapshot of one object (e.g. the model) under a file name of its own.
std::shared_ptr<Snapshot> snapshot_object(Serializable& target, const std::string& filename,
                                          SnapshotOptions options = {});

}  // namespace kusari::training::extensions
