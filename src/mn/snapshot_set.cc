#include "mn/snapshot_set.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "kusari/core/error.h"
#include "kusari/serializers/npz.h"

namespace kusari::mn::detail {

// Note [Sharded snapshot files]
// A sharded optimizer (Note [Sharded optimizer]) saves what its process holds and nothing more:
// the state arrays of its pieces, under the keys an unsharded optimizer uses for the whole
// parameters ("<param path>/<state>"), a part shaped (1, ..., 1, n) where the parameter is cut
// between processes, the whole array where the parameter lies whole in its shard; and, under the
// optimizer's path, the layout (kShardLayoutKey: the number of processes, the writer's rank, per
// group the shard bounds and where each parameter lies, as JSON text in a uint8 array). The
// layout is the same in every process's file but for the rank. Nothing is gathered: a save needs
// no communication and no memory beyond the shard, and the files of one save hold each state
// element once.
//
// Reading. The files of one save form a set (files[r] written by rank r). SnapshotSetReader
// presents a set as one unsharded snapshot: a key that a layout covers ("<param>/<state>") is put
// together from the pieces of the files whose shards meet the parameter (the per-parameter step
// count "t" is the same in each of them and read from the first), and every other key (the model,
// the iterator, the optimizer's own counters) from the reader's own file, as the unsharded
// resume of Note [Resuming on another number of processes] does. A sharded optimizer reading
// through it (ShardedUpdate's loader) asks for the elements of its own pieces only, read_part,
// which opens just the files whose shards overlap them; an unsharded optimizer gets whole arrays.
// So a set written by N processes loads on M processes, sharded or not, M = 1 included, and
// merge_snapshot_files writes a set as one unsharded file for programs without a communicator.
//
// A lone file of a set cannot stand for the set: an optimizer that reads one with a plain
// deserializer (load_npz) gets an IOError that says so (Optimizer::serialize refuses a file
// with a layout key), except the sharded optimizer of the same rank of a job cut alike, whose
// pieces are exactly those the file holds (a multi_node_snapshot's autoload on the same number
// of processes).

namespace {

using json = nlohmann::json;

}  // namespace

Array ShardLayout::encode() const {
  json j;
  j["format"] = 1;
  j["processes"] = processes;
  j["rank"] = rank;
  j["stage"] = stage;
  j["groups"] = json::array();
  for (const Group& g : groups) {
    json jg;
    jg["dtype"] = g.dtype;
    jg["bounds"] = g.bounds;
    jg["params"] = json::array();
    for (const Param& p : g.params) {
      jg["params"].push_back(json{{"path", p.path},
                                  {"offset", p.offset},
                                  {"size", p.size},
                                  {"shape", std::vector<int64_t>(p.shape.begin(), p.shape.end())}});
    }
    j["groups"].push_back(std::move(jg));
  }
  const std::string text = j.dump();
  std::vector<uint8_t> bytes(text.begin(), text.end());
  return Array::from_vector(bytes, Shape{static_cast<int64_t>(bytes.size())}, Device::cpu());
}

ShardLayout ShardLayout::decode(const Array& a, const std::string& where) {
  ShardLayout layout;
  try {
    KUSARI_CHECK(a.dtype() == Dtype::kUInt8 && a.ndim() == 1, IOError, "expected a 1-d uint8 array, got ", a.dtype(),
                 " ", a.shape());
    const std::vector<uint8_t> bytes = a.to_vector<uint8_t>();
    const json j = json::parse(std::string(bytes.begin(), bytes.end()));
    KUSARI_CHECK(j.at("format").get<int>() == 1, IOError, "unknown format ", j.at("format").dump());
    layout.processes = j.at("processes").get<int>();
    layout.rank = j.at("rank").get<int>();
    layout.stage = j.at("stage").get<int>();
    KUSARI_CHECK(layout.processes >= 1 && layout.rank >= 0 && layout.rank < layout.processes, IOError,
                 "rank ", layout.rank, " of ", layout.processes, " processes");
    for (const json& jg : j.at("groups")) {
      Group g;
      g.dtype = jg.at("dtype").get<std::string>();
      g.bounds = jg.at("bounds").get<std::vector<int64_t>>();
      KUSARI_CHECK(static_cast<int>(g.bounds.size()) == layout.processes + 1 && g.bounds.front() == 0 &&
                       std::is_sorted(g.bounds.begin(), g.bounds.end()),
                   IOError, "bad shard bounds");
      for (const json& jp : jg.at("params")) {
        Param p;
        p.path = jp.at("path").get<std::string>();
        p.offset = jp.at("offset").get<int64_t>();
        p.size = jp.at("size").get<int64_t>();
        p.shape = Shape(jp.at("shape").get<std::vector<int64_t>>());
        KUSARI_CHECK(p.offset >= 0 && p.size == p.shape.numel() && p.offset + p.size <= g.bounds.back(), IOError,
                     "bad parameter entry '", p.path, "'");
        g.params.push_back(std::move(p));
      }
      layout.groups.push_back(std::move(g));
    }
  } catch (const json::exception& e) {
    KUSARI_THROW(IOError, where, ": the shard layout cannot be read: ", e.what());
  } catch (const IOError& e) {
    KUSARI_THROW(IOError, where, ": the shard layout cannot be read: ", e.what());
  }
  return layout;
}

bool ShardLayout::same_cut(const ShardLayout& other) const {
  if (processes != other.processes || groups.size() != other.groups.size()) return false;
  for (size_t i = 0; i < groups.size(); ++i) {
    const Group& a = groups[i];
    const Group& b = other.groups[i];
    if (a.dtype != b.dtype || a.bounds != b.bounds || a.params.size() != b.params.size()) return false;
    for (size_t k = 0; k < a.params.size(); ++k) {
      if (a.params[k].path != b.params[k].path || a.params[k].offset != b.params[k].offset ||
          a.params[k].shape != b.params[k].shape) {
        return false;
      }
    }
  }
  return true;
}

std::optional<std::pair<const ShardLayout::Group*, const ShardLayout::Param*>> ShardLayout::find(
    const std::string& path) const {
  for (const Group& g : groups) {
    for (const Param& p : g.params) {
      if (p.path == path) return std::make_pair(&g, &p);
    }
  }
  return std::nullopt;
}

// --- SnapshotSetReader -------------------------------------------------------------------------

struct SnapshotSetReader::Shared {
  std::vector<std::string> files;
  int own = 0;
  std::string caller;
  bool strict = true;
  mutable std::vector<std::shared_ptr<const NpzFile>> opened;
  std::map<std::string, ShardLayout> layouts;  // by the optimizer's path ("updater/optimizer:main/")

  const NpzFile& file(size_t r) const {
    if (!opened[r]) opened[r] = std::make_shared<const NpzFile>(files[r], caller);
    return *opened[r];
  }

  /// A key a layout covers: the layout, the parameter and its group, and the state's name.
  struct Covered {
    const ShardLayout* layout;
    const ShardLayout::Group* group;
    const ShardLayout::Param* param;
    std::string state;
  };
  std::optional<Covered> covered(const std::string& full) const {
    for (const auto& [prefix, layout] : layouts) {
      if (!full.starts_with(prefix)) continue;
      const std::string rest = full.substr(prefix.size());
      const size_t slash = rest.rfind('/');
      if (slash == std::string::npos) continue;
      if (auto found = layout.find(rest.substr(0, slash))) {
        return Covered{&layout, found->first, found->second, rest.substr(slash + 1)};
      }
    }
    return std::nullopt;
  }

  /// The processes whose shards meet elements [lo, hi) of the parameter, with the part of the
  /// parameter each holds.
  struct Holder {
    size_t rank;
    int64_t lo, hi;
  };
  static std::vector<Holder> holders(const Covered& c, int64_t lo, int64_t hi) {
    std::vector<Holder> out;
    const auto& bounds = c.group->bounds;
    for (size_t q = 0; q + 1 < bounds.size(); ++q) {
      const int64_t plo = std::max(bounds[q], c.param->offset) - c.param->offset;
      const int64_t phi = std::min(bounds[q + 1], c.param->offset + c.param->size) - c.param->offset;
      if (phi <= plo || phi <= lo || plo >= hi) continue;
      out.push_back(Holder{q, plo, phi});
    }
    return out;
  }

  Array read_part(const Covered& c, const std::string& full, int64_t lo, int64_t hi) const {
    KUSARI_CHECK(lo >= 0 && lo <= hi && hi <= c.param->size, IOError, caller, ": elements [", lo, ", ", hi,
                 ") of '", full, "', a parameter of ", c.param->size);
    Array out;
    for (const Holder& h : holders(c, lo, hi)) {
      const NpzFile& f = file(h.rank);
      KUSARI_CHECK(f.contains(full), IOError, caller, ": '", f.path(), "' has no '", full,
                   "', which its process's shard holds (elements ", h.lo, " to ", h.hi, " of ", c.param->path,
                   "); the files are not of one save of one job");
      Array piece = f.get(full);
      KUSARI_CHECK(piece.size() == h.hi - h.lo, IOError, caller, ": '", full, "' in '", f.path(), "' has ",
                   piece.size(), " elements, expected ", h.hi - h.lo, " (elements ", h.lo, " to ", h.hi, " of ",
                   c.param->path, " ", c.param->shape, ")");
      if (!out.defined()) out = Array::zeros(Shape{hi - lo}, piece.dtype(), Device::cpu());
      const int64_t a = std::max(lo, h.lo), b = std::min(hi, h.hi);
      out.at({Slice(a - lo, b - lo)}).assign(piece.reshape({piece.size()}).at({Slice(a - h.lo, b - h.lo)}));
    }
    if (!out.defined()) out = Array::zeros(Shape{0}, Dtype::kFloat32, Device::cpu());  // (hi == lo)
    return out;
  }

  /// Reads the whole state array (the parameter's shape), or the step count "t" from the first holder.
  Array read_whole(const Covered& c, const std::string& full) const {
    if (c.state == "t") {
      for (const Holder& h : holders(c, 0, c.param->size)) return file(h.rank).get(full);
      KUSARI_THROW(IOError, caller, ": no file holds '", full, "'");
    }
    return read_part(c, full, 0, c.param->size).reshape(c.param->shape);
  }

  bool contains_covered(const Covered& c, const std::string& full) const {
    for (const Holder& h : holders(c, 0, c.param->size)) return file(h.rank).contains(full);
    return false;
  }
};

SnapshotSetReader::SnapshotSetReader(std::vector<std::string> files, int own, std::string caller, bool strict)
    : shared_(std::make_shared<Shared>()) {
  KUSARI_CHECK(!files.empty(), ValueError, caller, ": no files");
  KUSARI_CHECK(own >= 0 && own < static_cast<int>(files.size()), ValueError, caller, ": file ", own, " of ",
               files.size());
  shared_->files = std::move(files);
  shared_->own = own;
  shared_->caller = std::move(caller);
  shared_->strict = strict;
  shared_->opened.resize(shared_->files.size());
  const NpzFile& mine = shared_->file(static_cast<size_t>(own));
  for (const std::string& key : mine.keys()) {
    if (key != kShardLayoutKey && !key.ends_with(std::string("/") + kShardLayoutKey)) continue;
    const std::string prefix = key.substr(0, key.size() - std::string(kShardLayoutKey).size());
    ShardLayout layout = ShardLayout::decode(mine.get(key), shared_->caller + ": '" + mine.path() + "' " + key);
    KUSARI_CHECK(layout.processes == static_cast<int>(shared_->files.size()), IOError, shared_->caller, ": '",
                 mine.path(), "' is the part of rank ", layout.rank, " of a snapshot that ", layout.processes,
                 " processes wrote (a sharded optimizer at '", prefix, "'), but ", shared_->files.size(),
                 " files were given; a sharded snapshot loads from the files of all its processes together");
    KUSARI_CHECK(layout.rank == own, IOError, shared_->caller, ": '", mine.path(), "' was written by rank ",
                 layout.rank, ", but it was given as the file of rank ", own);
    shared_->layouts.emplace(prefix, std::move(layout));
  }
}

SnapshotSetReader::SnapshotSetReader(std::shared_ptr<Shared> shared, std::string path)
    : shared_(std::move(shared)), path_(std::move(path)) {}

SnapshotSetReader::~SnapshotSetReader() = default;

std::unique_ptr<Serializer> SnapshotSetReader::child(const std::string& name) {
  return std::unique_ptr<Serializer>(new SnapshotSetReader(shared_, path_ + name + "/"));
}

void SnapshotSetReader::operator()(const std::string& key, Array& value) {
  const std::string full = path_ + key;
  if (auto c = shared_->covered(full)) {
    if (!shared_->contains_covered(*c, full)) {
      KUSARI_CHECK(!shared_->strict, IOError, shared_->caller, ": '", full, "' is not in the snapshot of ",
                   shared_->files.size(), " files starting with '", shared_->files[0], "'");
      return;
    }
    NamedArrays one{{full, shared_->read_whole(*c, full)}};
    NpzDeserializer from_pieces(one);
    from_pieces(full, value);
    return;
  }
  NpzDeserializer own(std::shared_ptr<const NpzFile>(shared_->opened[static_cast<size_t>(shared_->own)]), path_,
                      shared_->strict);
  own(key, value);
}

bool SnapshotSetReader::contains(const std::string& key) const {
  const std::string full = path_ + key;
  if (key == kShardLayoutKey) return false;  // (the set reads as one unsharded snapshot)
  if (auto c = shared_->covered(full)) return shared_->contains_covered(*c, full);
  return shared_->file(static_cast<size_t>(shared_->own)).contains(full);
}

std::optional<Array> SnapshotSetReader::read_part(const std::string& key, int64_t lo, int64_t hi) const {
  const std::string full = path_ + key;
  auto c = shared_->covered(full);
  if (!c || c->state == "t") return std::nullopt;
  return shared_->read_part(*c, full, lo, hi);
}

bool SnapshotSetReader::sharded() const { return !shared_->layouts.empty(); }

std::vector<std::string> SnapshotSetReader::unsharded_keys() const {
  std::vector<std::string> keys;
  const NpzFile& mine = shared_->file(static_cast<size_t>(shared_->own));
  for (const std::string& key : mine.keys()) {
    if (key == kShardLayoutKey || key.ends_with(std::string("/") + kShardLayoutKey)) continue;
    if (shared_->covered(key)) continue;
    keys.push_back(key);
  }
  // The sharded states: the names each parameter's first holder stores.
  for (const auto& [prefix, layout] : shared_->layouts) {
    for (const ShardLayout::Group& g : layout.groups) {
      for (const ShardLayout::Param& p : g.params) {
        Shared::Covered c{&layout, &g, &p, ""};
        const auto holders = Shared::holders(c, 0, p.size);
        if (holders.empty()) continue;
        const std::string base = prefix + p.path + "/";
        for (const std::string& key : shared_->file(holders[0].rank).keys()) {
          if (key.starts_with(base) && key.find('/', base.size()) == std::string::npos) keys.push_back(key);
        }
      }
    }
  }
  return keys;
}

bool is_sharded_snapshot_file(const std::string& path) {
  try {
    NpzFile f(path);
    for (const std::string& key : f.keys()) {
      if (key == kShardLayoutKey || key.ends_with(std::string("/") + kShardLayoutKey)) return true;
    }
  } catch (const std::exception&) {
  }
  return false;
}

}  // namespace kusari::mn::detail
