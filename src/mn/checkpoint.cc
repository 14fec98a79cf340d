#include "kusari/mn/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string_view>

#include "kusari/mn/object.h"
#include "mn/comm/heartbeat.h"
#include "mn/snapshot_set.h"
#include "kusari/mn/optimizer.h"
#include "kusari/serializers/npz.h"
#include "kusari/training/trainer.h"

namespace kusari::mn {

namespace fs = std::filesystem;

namespace {

// What one rank tells the others after a step that may fail on some ranks only.
struct RankReport {
  bool failed = false;
  std::string error;
  std::vector<int64_t> iterations;
};

// Every rank's report, in rank order (collective).
std::vector<RankReport> exchange(Communicator& comm, const RankReport& mine) {
  ByteWriter w;
  w.put<uint8_t>(mine.failed ? 1 : 0);
  w.put_string(mine.error);
  w.put_vector(mine.iterations);
  std::vector<RankReport> all;
  for (const Bytes& b : comm.allgather_obj(w.take())) {
    ByteReader r(b);
    RankReport rep;
    rep.failed = r.get<uint8_t>() != 0;
    rep.error = r.get_string();
    rep.iterations = r.get_vector<int64_t>();
    all.push_back(std::move(rep));
  }
  return all;
}

// "rank 1: <error>; rank 2: <error>" for the ranks that failed (empty when none did).
std::string failures(const std::vector<RankReport>& reports) {
  std::ostringstream msg;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r].failed) continue;
    if (msg.tellp() > 0) msg << "; ";
    msg << "rank " << r << ": " << reports[r].error;
  }
  return msg.str();
}

// Throws the same IOError on every rank when any rank failed.
void throw_if_any_failed(const std::vector<RankReport>& reports, const std::string& what) {
  const std::string failed = failures(reports);
  if (!failed.empty()) KUSARI_THROW(IOError, what, " failed (", failed, ")");
}

// The iterations of every rank's report.
std::vector<std::vector<int64_t>> iterations_of(const std::vector<RankReport>& reports) {
  std::vector<std::vector<int64_t>> out;
  for (const RankReport& r : reports) out.push_back(r.iterations);
  return out;
}

// The iterations present in every list, ascending.
std::vector<int64_t> common_iterations(const std::vector<std::vector<int64_t>>& lists) {
  if (lists.empty()) return {};
  std::set<int64_t> common(lists[0].begin(), lists[0].end());
  for (size_t r = 1; r < lists.size(); ++r) {
    std::set<int64_t> mine(lists[r].begin(), lists[r].end());
    std::set<int64_t> both;
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(),
                          std::inserter(both, both.begin()));
    common = std::move(both);
  }
  return {common.begin(), common.end()};
}

// A decimal number written without sign or leading zeros (as std::to_string writes it).
std::optional<int64_t> parse_number(std::string_view s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

void make_directory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Another rank may have created it at the same moment: only a missing folder is an error.
  KUSARI_CHECK(fs::is_directory(dir), IOError,
               "multi-node checkpointer: cannot create the folder '", dir, "'",
               ec ? ": " + ec.message() : std::string());
}

}  // namespace

// --- statistics ----------------------------------------------------------------------------------

std::string CheckpointStats::report() const {
  if (count == 0) return "No stats available";
  char buf[160];
  std::snprintf(buf, sizeof(buf), "Snapshot duration stats (sec): avg=%f, min=%f, max=%f",
                average_seconds(), min_seconds, max_seconds);
  return buf;
}

// --- MultiNodeCheckpointer -----------------------------------------------------------------------

MultiNodeCheckpointer::MultiNodeCheckpointer(std::string name, std::shared_ptr<Communicator> comm,
                                             int cp_interval, int gc_interval, std::string path)
    : name_(std::move(name)),
      comm_(std::move(comm)),
      cp_interval_(cp_interval),
      gc_interval_(gc_interval),
      path_(std::move(path)) {
  KUSARI_CHECK(comm_, ValueError, "create_multi_node_checkpointer: the communicator is null");
  KUSARI_CHECK(!name_.empty(), ValueError, "create_multi_node_checkpointer: the name is empty");
  KUSARI_CHECK(name_.find('/') == std::string::npos, ValueError,
               "create_multi_node_checkpointer: the name '", name_,
               "' contains '/' (it is a file name prefix; give the folder as `path`)");
  KUSARI_CHECK(cp_interval_ > 0, ValueError,
               "create_multi_node_checkpointer: cp_interval (the number of checkpoint sets kept) "
               "must be positive, got ",
               cp_interval_);
  KUSARI_CHECK(gc_interval_ > 0, ValueError,
               "create_multi_node_checkpointer: gc_interval (saves between garbage collections) "
               "must be positive, got ",
               gc_interval_);
}

std::shared_ptr<training::Trigger> MultiNodeCheckpointer::default_trigger() const {
  return training::interval(1, "iteration");
}

std::string MultiNodeCheckpointer::filename(int64_t iteration) const {
  return name_ + "." + std::to_string(comm_->rank()) + "." + std::to_string(iteration);
}

std::optional<std::pair<int, int64_t>> MultiNodeCheckpointer::parse(
    const std::string& filename) const {
  // "<name>.<rank>.<iteration>"; the name itself may contain dots, so match it as a prefix.
  if (filename.size() <= name_.size() + 1 || filename.compare(0, name_.size(), name_) != 0 ||
      filename[name_.size()] != '.') {
    return std::nullopt;
  }
  const std::string_view rest = std::string_view(filename).substr(name_.size() + 1);
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const auto rank = parse_number(rest.substr(0, dot));
  const auto iteration = parse_number(rest.substr(dot + 1));
  if (!rank || !iteration || *rank > std::numeric_limits<int>::max()) return std::nullopt;
  return std::make_pair(static_cast<int>(*rank), *iteration);
}

std::vector<int64_t> MultiNodeCheckpointer::local_iterations() const {
  std::vector<int64_t> found;
  if (path_.empty()) return found;
  std::error_code ec;
  for (fs::directory_iterator it(path_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    const auto parsed = parse(it->path().filename().string());
    if (parsed && parsed->first == comm_->rank()) found.push_back(parsed->second);
  }
  std::sort(found.begin(), found.end());
  return found;
}

void MultiNodeCheckpointer::operator()(training::Trainer& trainer) {
  if (path_.empty()) path_ = trainer.out();
  save(trainer, trainer.updater().iteration());
}

void MultiNodeCheckpointer::save(Serializable& target, int64_t iteration) {
  KUSARI_CHECK(!path_.empty(), ValueError,
               "MultiNodeCheckpointer::save: no folder; give `path` to "
               "create_multi_node_checkpointer or use the checkpointer as a trainer extension");
  KUSARI_CHECK(iteration >= 0, ValueError, "MultiNodeCheckpointer::save: iteration ", iteration,
               " is negative");
  RankReport mine;
  try {
    const auto start = std::chrono::steady_clock::now();
    make_directory(path_);
    save_npz((fs::path(path_) / filename(iteration)).string(), target);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats_.min_seconds = stats_.count ? std::min(stats_.min_seconds, seconds) : seconds;
    stats_.max_seconds = stats_.count ? std::max(stats_.max_seconds, seconds) : seconds;
    stats_.total_seconds += seconds;
    ++stats_.count;
  } catch (const std::exception& e) {
    mine.failed = true;
    mine.error = e.what();
  }
  // The counter moves identically on every rank, so all of them collect at the same save.
  const bool collect = ++saves_since_gc_ >= gc_interval_;
  if (collect) {
    saves_since_gc_ = 0;
    mine.iterations = local_iterations();
  }
  const std::vector<RankReport> reports = exchange(*comm_, mine);
  throw_if_any_failed(reports, "multi-node checkpointer '" + name_ + "': saving iteration " +
                                   std::to_string(iteration));
  if (collect) collect_garbage(iterations_of(reports), iteration);
}

void MultiNodeCheckpointer::collect_garbage(
    const std::vector<std::vector<int64_t>>& iterations_of_ranks, int64_t saved_iteration) {
  // Keep the newest cp_interval complete sets up to the one just saved; see
  // Note [Multi-node checkpoint sets] for why newer files go too.
  std::vector<int64_t> common = common_iterations(iterations_of_ranks);
  common.erase(std::upper_bound(common.begin(), common.end(), saved_iteration), common.end());
  const size_t keep_from = common.size() > static_cast<size_t>(cp_interval_)
                               ? common.size() - static_cast<size_t>(cp_interval_)
                               : 0;
  const std::set<int64_t> keep(common.begin() + static_cast<long>(keep_from), common.end());
  for (int64_t i : iterations_of_ranks[static_cast<size_t>(comm_->rank())]) {
    if (keep.count(i)) continue;
    std::error_code ec;  // a file that cannot be removed is retried at the next collection
    fs::remove(fs::path(path_) / filename(i), ec);
  }
  remove_stale_temporaries(fs::file_time_type::clock::now());
}

void MultiNodeCheckpointer::remove_stale_temporaries(fs::file_time_type modified_before) const {
  // save_npz writes ".<file>.tmp.XXXXXX" beside <file> (Note [Atomic file replacement]); this
  // rank's are the names of its own checkpoints (Note [Stale temporary files]).
  if (path_.empty()) return;
  remove_stale_temporary_files(
      path_,
      [this](const std::string& target) {
        const auto parsed = parse(target);
        return parsed && parsed->first == comm_->rank();
      },
      modified_before);
}

void MultiNodeCheckpointer::initialize(training::Trainer& trainer) {
  if (path_.empty()) path_ = trainer.out();
  remove_stale_temporaries(fs::file_time_type::clock::now());
}

std::optional<int64_t> MultiNodeCheckpointer::maybe_load(training::Trainer& trainer,
                                                         Optimizer* optimizer) {
  if (path_.empty()) path_ = trainer.out();
  return load_common(trainer, optimizer);
}

std::optional<int64_t> MultiNodeCheckpointer::maybe_load(Serializable& target,
                                                         Optimizer* optimizer) {
  KUSARI_CHECK(!path_.empty(), ValueError,
               "MultiNodeCheckpointer::maybe_load: no folder; give `path` to "
               "create_multi_node_checkpointer or pass the trainer");
  return load_common(target, optimizer);
}

std::optional<int64_t> MultiNodeCheckpointer::load_common(Serializable& target,
                                                          Optimizer* optimizer) {
  remove_stale_temporaries(fs::file_time_type::clock::now());
  RankReport listing;
  listing.iterations = local_iterations();
  const std::vector<int64_t> common = common_iterations(iterations_of(exchange(*comm_, listing)));
  std::vector<std::string> unreadable;
  for (auto it = common.rbegin(); it != common.rend(); ++it) {
    const std::string file = (fs::path(path_) / filename(*it)).string();
    // Read the whole file first, so that a damaged one is found before the target is touched.
    RankReport read;
    NamedArrays arrays;
    try {
      arrays = read_npz(file);
    } catch (const std::exception& e) {
      read.failed = true;
      read.error = e.what();
    }
    const std::vector<RankReport> reads = exchange(*comm_, read);
    const std::string failed = failures(reads);
    if (!failed.empty()) {
      if (comm_->rank() == 0) {
        std::fprintf(stderr,
                     "[kusari.mn] multi-node checkpointer '%s': checkpoint iteration %lld cannot "
                     "be read on every rank (%s); trying an older one\n",
                     name_.c_str(), static_cast<long long>(*it), failed.c_str());
        std::fflush(stderr);
      }
      unreadable.push_back(std::to_string(*it) + " (" + failed + ")");
      continue;
    }
    RankReport load;
    try {
      const bool sharded = std::any_of(arrays.begin(), arrays.end(), [](const auto& e) {
        return e.first == detail::kShardLayoutKey || e.first.ends_with(std::string("/") + detail::kShardLayoutKey);
      });
      if (sharded) {
        // A sharded optimizer's pieces: the files of every rank together (Note [Sharded snapshot files]).
        std::vector<std::string> files;
        for (int q = 0; q < comm_->size(); ++q) {
          files.push_back((fs::path(path_) / (name_ + "." + std::to_string(q) + "." + std::to_string(*it))).string());
        }
        detail::SnapshotSetReader reader(files, comm_->rank(), "multi-node checkpointer '" + name_ + "'");
        target.serialize(reader);
      } else {
        NpzDeserializer(arrays).load(target);
      }
    } catch (const std::exception& e) {
      load.failed = true;
      load.error = e.what();
    }
    throw_if_any_failed(exchange(*comm_, load), "multi-node checkpointer '" + name_ +
                                                    "': loading checkpoint iteration " +
                                                    std::to_string(*it) + " from " + path_);
    if (auto* multi = dynamic_cast<MultiNodeOptimizer*>(optimizer)) {
      multi->mark_parameters_synchronized();
    }
    return *it;
  }
  if (!unreadable.empty()) {
    std::ostringstream msg;
    for (const std::string& u : unreadable) msg << "\n  iteration " << u;
    KUSARI_THROW(IOError, "multi-node checkpointer '", name_, "': there are complete checkpoint ",
                 "sets in ", path_, " but none can be read on every rank:", msg.str(),
                 "\nRemove the damaged files (or all of them, to start from scratch)");
  }
  return std::nullopt;
}

void MultiNodeCheckpointer::on_error(training::Trainer&, const std::exception&) {
  failed_ = true;
}

void MultiNodeCheckpointer::finalize() {
  if (failed_ || path_.empty()) return;
  for (int64_t i : local_iterations()) {
    std::error_code ec;
    fs::remove(fs::path(path_) / filename(i), ec);
  }
  remove_stale_temporaries(fs::file_time_type::clock::now());
}

std::shared_ptr<MultiNodeCheckpointer> create_multi_node_checkpointer(
    const std::string& name, std::shared_ptr<Communicator> comm, int cp_interval, int gc_interval,
    const std::string& path) {
  return std::make_shared<MultiNodeCheckpointer>(name, std::move(comm), cp_interval, gc_interval,
                                                 path);
}

// --- replica sets --------------------------------------------------------------------------------

ReplicaSets complete_replica_sets(const ReplicaSets& replica_sets, int size) {
  KUSARI_CHECK(size > 0, ValueError, "multi_node_snapshot: the communicator size ", size,
               " is not positive");
  std::vector<int> set_of(static_cast<size_t>(size), -1);
  ReplicaSets sets;
  for (size_t i = 0; i < replica_sets.size(); ++i) {
    KUSARI_CHECK(!replica_sets[i].empty(), ValueError, "multi_node_snapshot: replica set ", i,
                 " is empty (every set needs at least one rank)");
    for (int r : replica_sets[i]) {
      KUSARI_CHECK(r >= 0 && r < size, ValueError, "multi_node_snapshot: rank ", r,
                   " in replica set ", i, " is outside 0..", size - 1);
      const int before = set_of[static_cast<size_t>(r)];
      KUSARI_CHECK(before < 0, ValueError, "multi_node_snapshot: rank ", r,
                   " is listed twice (in replica sets ", before, " and ", i,
                   "); the sets must not overlap");
      set_of[static_cast<size_t>(r)] = static_cast<int>(i);
    }
    std::vector<int> s = replica_sets[i];
    std::sort(s.begin(), s.end());
    sets.push_back(std::move(s));
  }
  std::vector<int> rest;
  for (int r = 0; r < size; ++r) {
    if (set_of[static_cast<size_t>(r)] < 0) rest.push_back(r);
  }
  if (!rest.empty()) sets.push_back(std::move(rest));
  return sets;
}

// --- MultiNodeSnapshot ---------------------------------------------------------------------------

namespace {

constexpr int kSnapshotStateTag = 7101;

enum class AutoloadResult : uint8_t { kNothing = 0, kLoaded = 1, kFailed = 2 };

}  // namespace

MultiNodeSnapshot::MultiNodeSnapshot(std::shared_ptr<Communicator> comm,
                                     std::shared_ptr<training::extensions::Snapshot> snapshot,
                                     const ReplicaSets& replica_sets)
    : comm_(std::move(comm)), snapshot_(std::move(snapshot)) {
  KUSARI_CHECK(comm_, ValueError, "multi_node_snapshot: the communicator is null");
  KUSARI_CHECK(snapshot_, ValueError, "multi_node_snapshot: the snapshot extension is null");
  for (std::vector<int>& s : complete_replica_sets(replica_sets, comm_->size())) {
    if (std::find(s.begin(), s.end(), comm_->rank()) != s.end()) {
      replica_set_ = std::move(s);
      break;
    }
  }
  KUSARI_ASSERT(!replica_set_.empty(), "complete_replica_sets left out rank ", comm_->rank());
  master_ = replica_set_.front();
  snapshot_->set_filename(snapshot_->options().filename + "." + std::to_string(comm_->rank()));
}

std::shared_ptr<training::Trigger> MultiNodeSnapshot::default_trigger() const {
  return snapshot_->default_trigger();
}

void MultiNodeSnapshot::operator()(training::Trainer& trainer) {
  // A sharded optimizer's state is saved by every process together (Note [Sharded optimizer]):
  // with writers for sets of several processes the others would wait for the writers in vain.
  // Every rank of such a set refuses alike, before anything is written.
  if (replica_set_.size() > 1) {
    for (auto& [name, optimizer] : trainer.updater().all_optimizers()) {
      const auto* mn = dynamic_cast<const MultiNodeOptimizer*>(optimizer);
      const int stage = mn ? mn->shard_stats().stage : 0;
      KUSARI_CHECK(stage == 0, ValueError, "multi_node_snapshot: the optimizer '", name, "' is sharded (zero_stage ",
                   stage, "): every process holds a part of its state, so every process must write its own "
                   "snapshot; give each process its own replica set, or use create_multi_node_checkpointer");
    }
  }
  if (is_master()) (*snapshot_)(trainer);
}

void MultiNodeSnapshot::on_error(training::Trainer& trainer, const std::exception& error) {
  if (is_master()) snapshot_->on_error(trainer, error);
}

void MultiNodeSnapshot::finalize() {
  if (is_master()) snapshot_->finalize();
}

void MultiNodeSnapshot::serialize(Serializer& serializer) {
  snapshot_->serialize(serializer);
  // The size of the job that wrote the file (Note [Resuming on another number of processes]).
  if (!serializer.is_loading()) {
    int64_t size = comm_->size();
    serializer("mn_world_size", size);
  }
}

void MultiNodeSnapshot::initialize(training::Trainer& trainer) {
  if (!snapshot_->options().autoload) {
    if (is_master()) snapshot_->initialize(trainer);
    return;
  }
  Serializable& target = snapshot_->target() ? *snapshot_->target() : trainer;
  RankReport mine;
  bool loaded = false;
  if (is_master()) {
    ByteWriter message;
    try {
      snapshot_->initialize(trainer);
      if (snapshot_->find_snapshots(trainer.out()).empty()) {
        message.put<uint8_t>(static_cast<uint8_t>(AutoloadResult::kNothing));
      } else {
        loaded = true;
        DictionarySerializer state;
        state.save(target);
        message.put<uint8_t>(static_cast<uint8_t>(AutoloadResult::kLoaded));
        message.put<uint64_t>(state.target().size());
        for (const auto& [key, value] : state.target()) {
          message.put_string(key);
          message.put_array(value);
        }
      }
    } catch (const std::exception& e) {
      mine.failed = true;
      mine.error = e.what();
      message = ByteWriter();
      message.put<uint8_t>(static_cast<uint8_t>(AutoloadResult::kFailed));
    }
    const Bytes bytes = message.take();
    for (int r : replica_set_) {
      if (r != comm_->rank()) comm_->send_obj(bytes, r, kSnapshotStateTag);
    }
  } else {
    try {
      const Bytes bytes = comm_->recv_obj(master_, kSnapshotStateTag);
      ByteReader reader(bytes);
      if (static_cast<AutoloadResult>(reader.get<uint8_t>()) == AutoloadResult::kLoaded) {
        NamedArrays state;
        const uint64_t n = reader.get<uint64_t>();
        for (uint64_t i = 0; i < n; ++i) {
          std::string key = reader.get_string();
          state.emplace_back(std::move(key), reader.get_array());
        }
        NpzDeserializer(state).load(target);
        loaded = true;
      }
    } catch (const std::exception& e) {
      mine.failed = true;
      mine.error = e.what();
    }
  }
  if (loaded && !snapshot_->target()) mine.iterations = {trainer.updater().iteration()};
  const std::vector<RankReport> reports = exchange(*comm_, mine);
  throw_if_any_failed(reports, "multi_node_snapshot: autoload in " + trainer.out());
  if (snapshot_->target()) return;
  // Whole trainers: see Note [Multi-node snapshot of replica sets] for this check.
  std::ostringstream resumed;
  bool any = false, same = true;
  for (size_t r = 0; r < reports.size(); ++r) {
    const std::vector<int64_t>& it = reports[r].iterations;
    any = any || !it.empty();
    same = same && it == reports[0].iterations;
    resumed << (r ? "; " : "") << "rank " << r << ": ";
    if (it.empty()) {
      resumed << "nothing";
    } else {
      resumed << "iteration " << it[0];
    }
  }
  if (!any) return;
  KUSARI_CHECK(same, IOError, "multi_node_snapshot: the replica sets resumed from different ",
               "iterations (", resumed.str(), ") in ", trainer.out(),
               "; a master lacks the newest snapshot of the others - restore it, or remove the ",
               "newer snapshots of the other masters");
  if (auto* multi = dynamic_cast<MultiNodeOptimizer*>(&trainer.updater().optimizer())) {
    multi->mark_parameters_synchronized();
  }
}

std::shared_ptr<MultiNodeSnapshot> multi_node_snapshot(
    std::shared_ptr<Communicator> comm, std::shared_ptr<training::extensions::Snapshot> snapshot,
    const ReplicaSets& replica_sets) {
  return std::make_shared<MultiNodeSnapshot>(std::move(comm), std::move(snapshot), replica_sets);
}

std::shared_ptr<MultiNodeSnapshot> multi_node_snapshot(
    std::shared_ptr<Communicator> comm, std::shared_ptr<training::extensions::Snapshot> snapshot) {
  KUSARI_CHECK(comm, ValueError, "multi_node_snapshot: the communicator is null");
  ReplicaSets sets;
  for (int r = 0; r < comm->size(); ++r) sets.push_back({r});
  return multi_node_snapshot(std::move(comm), std::move(snapshot), sets);
}

std::string snapshot_file_of_rank(const std::string& path, const Communicator& comm) {
  if (comm.size() == 1) return path;
  return path + "." + std::to_string(comm.rank());
}

// Note [Resuming each rank from its own snapshot]
// A trainer snapshot holds, besides the model and the optimizer state that every rank shares, the
// training iterator's state: its epoch, its position and the order of the epoch, which are this
// rank's own (its shard, its shuffle). When every rank loaded rank 0's file, the other ranks took
// rank 0's order for their shards and the resumed job drew other batches than the uninterrupted
// one, ending at another loss. So under
// mpiexec every rank writes its own file (multi_node_snapshot with a set per rank appends
// ".<rank>") and loads its own. The loads can fail on some ranks only (a file missing on one node);
// the ranks tell each other before anyone walks into the first step's allreduce alone, and they
// check that all files are of the same iteration (the files of an older run left in the folder).
int64_t load_snapshot_of_each_rank(const std::string& path, training::Trainer& trainer,
                                   Communicator& comm) {
  const std::string file = snapshot_file_of_rank(path, comm);
  RankReport mine;
  try {
    KUSARI_CHECK(
        fs::exists(file), IOError, "'", file, "' does not exist",
        comm.size() > 1
            ? " (in a job of several processes each resumes from its own file, <snapshot>.<rank>; "
              "give the name without the rank, from a job of as many processes)"
            : "");
    if (detail::is_sharded_snapshot_file(file)) {
      // A sharded optimizer's pieces: the files of every rank together (Note [Sharded snapshot files]).
      std::vector<std::string> files;
      for (int q = 0; q < comm.size(); ++q) files.push_back(comm.size() == 1 ? path : path + "." + std::to_string(q));
      detail::SnapshotSetReader reader(files, comm.rank(), "load_snapshot_of_each_rank");
      trainer.serialize(reader);
    } else {
      load_npz(file, trainer);
    }
    mine.iterations = {trainer.updater().iteration()};
  } catch (const std::exception& e) {
    mine.failed = true;
    mine.error = e.what();
  }
  const std::vector<RankReport> reports = exchange(comm, mine);
  throw_if_any_failed(reports, "load_snapshot_of_each_rank: resuming from '" + path + "'");
  bool same = true;
  std::ostringstream resumed;
  for (size_t r = 0; r < reports.size(); ++r) {
    same = same && reports[r].iterations == reports[0].iterations;
    resumed << (r ? "; " : "") << "rank " << r << ": iteration " << reports[r].iterations.at(0);
  }
  KUSARI_CHECK(same, IOError, "load_snapshot_of_each_rank: the files of '", path,
               "' are of different iterations (", resumed.str(),
               "); every rank must resume from the snapshot of the same iteration");
  if (auto* multi = dynamic_cast<MultiNodeOptimizer*>(&trainer.updater().optimizer())) {
    multi->mark_parameters_synchronized();
  }
  detail::heartbeat_resumed_from(reports[0].iterations.at(0));  // Note [Heartbeat files]
  detail::heartbeat_iteration(reports[0].iterations.at(0));
  return reports[0].iterations.at(0);
}

namespace {

/// "<prefix><iteration>" or "<prefix><iteration>.<rank>": (iteration, rank or -1).
std::optional<std::pair<int64_t, int>> parse_snapshot_name(const std::string& name, const std::string& prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  const char* p = name.data() + prefix.size();
  const char* end = name.data() + name.size();
  int64_t iteration = 0;
  auto [after, ec] = std::from_chars(p, end, iteration);
  if (ec != std::errc() || after == p) return std::nullopt;
  if (after == end) return std::make_pair(iteration, -1);
  if (*after != '.') return std::nullopt;
  int rank = 0;
  const char* q = after + 1;
  auto [after_rank, ec2] = std::from_chars(q, end, rank);
  if (ec2 != std::errc() || after_rank != end || after_rank == q || rank < 0) return std::nullopt;
  return std::make_pair(iteration, rank);
}

/// The job size a multi-node snapshot file records, or nullopt when it records none or cannot be read.
std::optional<int> recorded_world_size(const std::string& path) {
  try {
    NpzFile npz(path, "load_newest_snapshot_set");
    for (const std::string& key : npz.keys()) {
      if (key == "mn_world_size" || key.ends_with("/mn_world_size")) {
        const int64_t n = npz.get(key).astype(int64).to_vector<int64_t>().at(0);
        if (n >= 1 && n <= (1 << 24)) return static_cast<int>(n);
      }
    }
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

bool names_snapshot_folder(const std::string& resume, const std::string& out) {
  if (resume.empty()) return false;
  const auto folder = [](const std::string& p) { return (fs::path(p) / "").lexically_normal(); };
  std::error_code ec;
  return fs::is_directory(resume, ec) || folder(resume) == folder(out);
}

std::optional<SnapshotSet> newest_complete_snapshot_set(const std::string& folder, const std::string& prefix) {
  std::map<int64_t, std::map<int, std::string>, std::greater<>> by_iteration;  // rank -1: one process's file
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return std::nullopt;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const std::string name = entry.path().filename().string();
    if (auto parsed = parse_snapshot_name(name, prefix)) {
      by_iteration[parsed->first][parsed->second] = entry.path().string();
    }
  }
  for (const auto& [iteration, files] : by_iteration) {
    if (auto single = files.find(-1); single != files.end()) {
      return SnapshotSet{iteration, 1, {single->second}};
    }
    auto first = files.find(0);
    if (first == files.end()) continue;
    const std::optional<int> size = recorded_world_size(first->second);
    if (!size) continue;
    SnapshotSet set{iteration, *size, {}};
    for (int r = 0; r < *size; ++r) {
      auto f = files.find(r);
      if (f == files.end()) break;
      set.files.push_back(f->second);
    }
    if (static_cast<int>(set.files.size()) == *size) return set;
  }
  return std::nullopt;
}

std::optional<int64_t> load_newest_snapshot_set(const std::string& folder, training::Trainer& trainer,
                                                Communicator& comm, const std::string& prefix) {
  const char* fn = "load_newest_snapshot_set";
  // Rank 0 looks, everyone hears what it found (Note [Resuming on another number of processes]).
  std::optional<SnapshotSet> found;
  if (comm.rank() == 0) found = newest_complete_snapshot_set(folder, prefix);
  ByteWriter w;
  w.put<uint8_t>(found ? 1 : 0);
  if (found) {
    w.put<int64_t>(found->iteration);
    w.put<int64_t>(found->size);
    for (const std::string& f : found->files) w.put_string(f);
  }
  const Bytes agreed = comm.bcast_obj(w.take(), 0);
  ByteReader r(agreed);
  if (r.get<uint8_t>() == 0) {
    if (comm.rank() == 0) {
      std::printf("%s: no complete snapshot set in '%s'; starting from the beginning (every process must see "
                  "the folder: on several hosts, a shared file system)\n", fn, folder.c_str());
      std::fflush(stdout);
    }
    return std::nullopt;
  }
  SnapshotSet set;
  set.iteration = r.get<int64_t>();
  set.size = static_cast<int>(r.get<int64_t>());
  for (int k = 0; k < set.size; ++k) set.files.push_back(r.get_string());
  const std::string& file = set.files.at(static_cast<size_t>(comm.rank() % set.size));
  RankReport mine;
  try {
    const int own = comm.rank() % set.size;
    if (detail::is_sharded_snapshot_file(file)) {
      detail::SnapshotSetReader reader(set.files, own, fn);  // (Note [Sharded snapshot files])
      trainer.serialize(reader);
    } else {
      load_npz(file, trainer);
    }
    mine.iterations = {trainer.updater().iteration()};
  } catch (const std::exception& e) {
    mine.failed = true;
    mine.error = kusari::detail::concat("'", file, "': ", e.what());
  }
  const std::vector<RankReport> reports = exchange(comm, mine);
  throw_if_any_failed(reports, kusari::detail::concat(fn, ": resuming ", comm.size(), " processes from the set of iteration ",
                                      set.iteration, " that ", set.size, " processes wrote in '", folder, "'"));
  for (size_t k = 0; k < reports.size(); ++k) {
    KUSARI_CHECK(reports[k].iterations == reports[0].iterations, IOError, fn, ": rank ", k, " resumed iteration ",
                 reports[k].iterations.at(0), " but rank 0 resumed ", reports[0].iterations.at(0), " from '", folder,
                 "'; every rank must resume the same iteration");
  }
  if (auto* multi = dynamic_cast<MultiNodeOptimizer*>(&trainer.updater().optimizer())) {
    multi->mark_parameters_synchronized();
  }
  if (comm.rank() == 0) {
    // Killed writes of ranks this job no longer has: nobody else removes their temporary files.
    const int size = comm.size();
    remove_stale_temporary_files(folder, [&](const std::string& target) {
      auto parsed = parse_snapshot_name(target, prefix);
      return parsed && parsed->second >= size;
    });
    std::printf("%s: %d processes resumed from iteration %lld, which %d processes wrote in '%s'\n", fn, size,
                static_cast<long long>(set.iteration), set.size, folder.c_str());
    std::fflush(stdout);
  }
  detail::heartbeat_resumed_from(set.iteration);  // Note [Heartbeat files]
  detail::heartbeat_iteration(set.iteration);
  return set.iteration;
}

void load_snapshot_files(const std::vector<std::string>& files, Serializable& target, int own,
                         const std::string& path, bool strict) {
  const char* fn = "load_snapshot_files";
  KUSARI_CHECK(!files.empty(), ValueError, fn, ": no files given");
  KUSARI_CHECK(own >= 0 && own < static_cast<int>(files.size()), ValueError, fn, ": own must name one of the ",
               files.size(), " files (0..", files.size() - 1, "), got ", own);
  detail::SnapshotSetReader reader(files, own, fn, strict);
  std::unique_ptr<Serializer> sub;
  Serializer* at = &reader;
  std::string rest = path;
  while (!rest.empty()) {
    const size_t slash = rest.find('/');
    const std::string name = rest.substr(0, slash);
    rest = slash == std::string::npos ? "" : rest.substr(slash + 1);
    if (name.empty()) continue;
    sub = at->child(name);
    at = sub.get();
  }
  target.serialize(*at);
}

void merge_snapshot_files(const std::vector<std::string>& files, const std::string& out, bool compression) {
  const char* fn = "merge_snapshot_files";
  KUSARI_CHECK(!files.empty(), ValueError, fn, ": no files given");
  detail::SnapshotSetReader reader(files, 0, fn);
  NamedArrays arrays;
  for (const std::string& key : reader.unsharded_keys()) {
    Array value;
    if (key == "mn_world_size" || key.ends_with("/mn_world_size")) {
      value = Array::from_vector(std::vector<int64_t>{1}, Shape{}, Device::cpu());  // (now one process's file)
    } else {
      reader(key, value);
    }
    arrays.emplace_back(key, value);
  }
  write_npz(out, arrays, compression);
}

}  // namespace kusari::mn
