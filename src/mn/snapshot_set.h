// The files of one save of a sharded optimizer read as one snapshot (Note [Sharded snapshot
// files] in snapshot_set.cc): the layout each file records, and a deserializer over the files of
// every process of the job that wrote them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kusari/core/array.h"
#include "optimizers/shard_layout_key.h"
#include "kusari/serializers/serializer.h"

namespace kusari::mn::detail {

/// The key, under the optimizer's path, of the layout a sharded optimizer writes beside its pieces.
using optimizers::detail::kShardLayoutKey;

/// How a sharded optimizer's state was cut over the processes that wrote a snapshot: per group of
/// parameters of one dtype, the flat space's bounds per process and where each parameter lies.
struct ShardLayout {
  struct Param {
    std::string path;  // without the leading '/', e.g. "l1/W"
    int64_t offset = 0;
    int64_t size = 0;
    Shape shape;
  };
  struct Group {
    std::string dtype;
    std::vector<int64_t> bounds;  // processes + 1
    std::vector<Param> params;
  };
  int processes = 0;
  int rank = 0;  // the process that wrote the file
  int stage = 0;
  std::vector<Group> groups;

  /// The layout as a uint8 array of JSON text (readable with NumPy: bytes(a).decode()).
  Array encode() const;
  /// Reads encode()'s array; IOError naming `where` when it is not one.
  static ShardLayout decode(const Array& a, const std::string& where);
  /// True when the pieces are cut alike (everything but the writer's rank).
  bool same_cut(const ShardLayout& other) const;
  /// The parameter at `path` (without leading '/'), with its group; nullopt when not laid out.
  std::optional<std::pair<const Group*, const Param*>> find(const std::string& path) const;
};

/// Loads from the files that the processes of one job wrote at one save (files[r] by rank r) as
/// from one unsharded snapshot: the state of a sharded optimizer is put together from the files
/// that hold its pieces; every other key is read from files[own].
class SnapshotSetReader : public Serializer {
 public:
  /// `caller` names the function in error messages. The files are opened when first needed;
  /// files[own] at once, for its layouts (IOError when they disagree with the number of files).
  SnapshotSetReader(std::vector<std::string> files, int own, std::string caller, bool strict = true);
  ~SnapshotSetReader() override;

  bool is_loading() const override { return true; }
  std::unique_ptr<Serializer> child(const std::string& name) override;
  void operator()(const std::string& key, Array& value) override;
  using Serializer::operator();
  bool contains(const std::string& key) const override;
  std::string path() const override { return path_; }

  /// Elements [lo, hi) (flat, C order) of the sharded state array path() + key, a new CPU array
  /// read from the files that hold them; nullopt when no layout covers the key.
  std::optional<Array> read_part(const std::string& key, int64_t lo, int64_t hi) const;
  /// True when files[own] records a sharded optimizer's layout.
  bool sharded() const;
  /// Every key of the snapshot as one unsharded file holds it, in order: files[own]'s keys less
  /// the layouts and the pieces, then the sharded states (local; used to merge a set).
  std::vector<std::string> unsharded_keys() const;

 private:
  struct Shared;
  SnapshotSetReader(std::shared_ptr<Shared> shared, std::string path);

  std::shared_ptr<Shared> shared_;
  std::string path_;
};

/// True when the npz file `path` records a sharded optimizer's layout (a key ending in
/// kShardLayoutKey); false when it does not or cannot be opened.
bool is_sharded_snapshot_file(const std::string& path);

}  // namespace kusari::mn::detail
