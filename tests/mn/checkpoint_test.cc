// Multi-process tests of the checkpoints of multi-node jobs: create_multi_node_checkpointer (file
// names, garbage collection, resuming from the newest complete set after losing or damaging one
// rank's newest file) and multi_node_snapshot (one writer per replica set, restoring every rank).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>

#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "kusari/training/extensions/snapshot.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace fs = std::filesystem;
using training::interval;
using training::Trainer;
using training::extensions::SnapshotOptions;

// An unexpected exception on one rank would leave the others waiting in a collective: end the
// whole job at once instead (the communicator's terminate handler calls MPI_Abort, see Note
// [Failure of one rank ends the job]). Expected errors are checked with EXPECT_THROW inside.
template <typename Body>
void on_every_rank(Body&& body) {
  try {
    body();
  } catch (...) {
    std::terminate();
  }
}

struct TrainingRun {
  std::shared_ptr<links::Classifier> model;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<SerialIterator> iterator;
  std::shared_ptr<training::StandardUpdater> updater;
};

std::shared_ptr<TupleDataset> make_data() {
  Generator g(11);
  Array x = Array::normal({48, 5}, 0, 1, float32, Device::cpu(), &g);
  std::vector<int32_t> labels;
  for (int i = 0; i < 48; ++i) labels.push_back(i % 3);
  return std::make_shared<TupleDataset>(std::vector<Array>{x, Array::from_vector(labels)});
}

// A Linear classifier trained with Adam; data-parallel (scattered data, MultiNodeOptimizer) or
// the same single-process training on every rank.
// `order_seed` seeds the iterator's shuffle.
TrainingRun make_run(const std::shared_ptr<Communicator>& comm, uint64_t init_seed,
                     bool data_parallel, uint64_t order_seed = 1, int zero_stage = 0) {
  TrainingRun r;
  manual_seed(init_seed);
  r.model = std::make_shared<links::Classifier>(std::make_shared<links::Linear>(5, 3));
  r.optimizer = std::make_shared<optimizers::Adam>();
  std::shared_ptr<Dataset> data = make_data();
  if (data_parallel) {
    MultiNodeOptimizerOptions o;
    o.zero_stage = zero_stage;
    r.optimizer = create_multi_node_optimizer(r.optimizer, comm, o);
    data = scatter_dataset(data, *comm, 0, true, 5);
  }
  r.optimizer->setup(r.model);
  r.iterator = std::make_shared<SerialIterator>(data, 4, true, true, order_seed);
  r.updater = std::make_shared<training::StandardUpdater>(r.iterator, r.optimizer);
  return r;
}

std::vector<std::vector<float>> params_of(Link& model) {
  std::vector<std::vector<float>> out;
  for (auto& [path, p] : model.namedparams()) out.push_back(p.data().to_vector<float>());
  return out;
}

// File names in `dir`, sorted (empty when it does not exist).
std::vector<std::string> list_dir(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "<name>.<rank>.<iteration>" for every rank and the given iterations, sorted.
std::vector<std::string> checkpoint_files(const std::string& name, int size,
                                          const std::vector<int64_t>& iterations) {
  std::vector<std::string> names;
  for (int r = 0; r < size; ++r) {
    for (int64_t i : iterations)
      names.push_back(name + "." + std::to_string(r) + "." + std::to_string(i));
  }
  std::sort(names.begin(), names.end());
  return names;
}

void touch(const fs::path& file, const std::string& contents = "x") {
  std::ofstream(file) << contents;
}

// Every test gets a fresh folder shared by the ranks: rank 0 creates it and broadcasts its name.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = create_communicator("naive");
    std::string made;
    if (comm_->rank() == 0) {
      std::string templ = (fs::temp_directory_path() / "kusari_mn_checkpoint_XXXXXX").string();
      if (::mkdtemp(templ.data())) made = templ;
    }
    const Bytes name = comm_->bcast_obj(Bytes(made.begin(), made.end()), 0);
    dir_ = std::string(name.begin(), name.end());
    ASSERT_FALSE(dir_.empty()) << "rank 0 could not create a temporary folder";
  }
  void TearDown() override {
    comm_->barrier();
    if (comm_->rank() == 0 && !dir_.empty()) fs::remove_all(dir_);
  }

  std::shared_ptr<Communicator> comm_;
  fs::path dir_;
};

TEST_F(CheckpointTest, EveryRankSavesAndCollectionKeepsTheNewestCompleteSets) {
  on_every_rank([&] {
    TrainingRun run = make_run(comm_, 0, true);
    Trainer trainer(run.updater, interval(20, "iteration"), dir_.string());
    // Saves every 2 iterations; keeps 2 complete sets, collecting every 3 saves.
    auto checkpointer = create_multi_node_checkpointer("job", comm_, 2, 3);
    EXPECT_EQ(checkpointer->filename(7), "job." + std::to_string(comm_->rank()) + ".7");
    trainer.extend(checkpointer, "", interval(2, "iteration"));
    std::map<int64_t, std::vector<std::string>> seen;
    auto observe = [&](Trainer& t) {
      comm_->barrier();  // every rank has saved and collected
      seen[t.updater().iteration()] = list_dir(dir_);
      comm_->barrier();
    };
    trainer.extend(training::make_extension(observe, "observe", interval(2, "iteration"), -200));
    trainer.run();
    const int size = comm_->size();
    // Collections after the saves of iterations 6, 12 and 18.
    EXPECT_EQ(seen[2], checkpoint_files("job", size, {2}));
    EXPECT_EQ(seen[4], checkpoint_files("job", size, {2, 4}));
    EXPECT_EQ(seen[6], checkpoint_files("job", size, {4, 6}));
    EXPECT_EQ(seen[10], checkpoint_files("job", size, {4, 6, 8, 10}));
    EXPECT_EQ(seen[12], checkpoint_files("job", size, {10, 12}));
    EXPECT_EQ(seen[18], checkpoint_files("job", size, {16, 18}));
    EXPECT_EQ(seen[20], checkpoint_files("job", size, {16, 18, 20}));
    EXPECT_EQ(checkpointer->stats().count, 10);
    EXPECT_EQ(checkpointer->get_stats().rfind("Snapshot duration stats (sec): avg=", 0), 0u)
        << checkpointer->get_stats();
    // Training ended normally: the checkpoints are removed (ChainerMN's finalize).
    comm_->barrier();
    EXPECT_EQ(list_dir(dir_), std::vector<std::string>{});
  });
}

enum class Damage { kDeleted, kTruncated };

class CheckpointResumeTest : public CheckpointTest, public ::testing::WithParamInterface<Damage> {};

TEST_P(CheckpointResumeTest, ResumesFromTheNewestCompleteSetAndMatchesAnUninterruptedRun) {
  on_every_rank([&] {
    const int rank = comm_->rank(), last = comm_->size() - 1;
    TrainingRun a = make_run(comm_, 0, true);
    Trainer ta(a.updater, interval(20, "iteration"), (dir_ / "a").string());
    ta.run();

    // The same job with checkpoints every 5 iterations, killed right after the one of 15.
    TrainingRun b = make_run(comm_, 0, true);
    Trainer tb(b.updater, interval(20, "iteration"), (dir_ / "b").string());
    tb.extend(create_multi_node_checkpointer("job", comm_, 3, 5), "", interval(5, "iteration"));
    auto kill = [](Trainer& t) {
      if (t.updater().iteration() == 15) throw std::runtime_error("job-time limit reached");
    };
    tb.extend(training::make_extension(kill, "kill", interval(1, "iteration"), -200));
    EXPECT_THROW(tb.run(), std::runtime_error);
    comm_->barrier();
    EXPECT_EQ(list_dir(dir_ / "b"), checkpoint_files("job", comm_->size(), {10, 15, 5}))
        << "a failed run keeps its checkpoints";
    comm_->barrier();  // every rank has looked before one of them damages a file

    // The last rank lost its newest file, or has only half of it.
    const fs::path newest = dir_ / "b" / ("job." + std::to_string(last) + ".15");
    if (rank == last) {
      if (GetParam() == Damage::kDeleted) {
        fs::remove(newest);
      } else {
        const auto bytes = fs::file_size(newest);
        std::string contents(bytes, '\0');
        std::ifstream(newest, std::ios::binary).read(contents.data(), static_cast<long>(bytes));
        std::ofstream(newest, std::ios::binary | std::ios::trunc)
            .write(contents.data(), static_cast<long>(bytes / 2));
      }
    }
    comm_->barrier();

    // A restarted job: everything built anew (other initial weights), then resumed.
    TrainingRun c = make_run(comm_, 1000 + static_cast<uint64_t>(rank), true);
    Trainer tc(c.updater, interval(20, "iteration"), (dir_ / "b").string());
    auto checkpointer = create_multi_node_checkpointer("job", comm_, 3, 5);
    tc.extend(checkpointer, "", interval(5, "iteration"));
    EXPECT_EQ(checkpointer->maybe_load(tc, c.optimizer.get()), std::optional<int64_t>(10));
    EXPECT_EQ(c.updater->iteration(), 10);
    tc.run();
    EXPECT_EQ(c.updater->iteration(), 20);
    EXPECT_EQ(params_of(*c.model), params_of(*a.model)) << "rank " << rank;
    EXPECT_EQ(c.optimizer->t(), a.optimizer->t());
  });
}

INSTANTIATE_TEST_SUITE_P(Damages, CheckpointResumeTest,
                         ::testing::Values(Damage::kDeleted, Damage::kTruncated),
                         [](const auto& info) {
                           return info.param == Damage::kDeleted ? "Deleted" : "Truncated";
                         });

TEST_F(CheckpointTest, NothingToLoadAndOtherFilesAreIgnored) {
  on_every_rank([&] {
    const std::vector<std::string> foreign = {
        "other.0.50", "job.0",     "job.0.x",   "job.0.50.npz",
        "job.x.50",   "job.00.50", "job.0.050", ".other.0.50.tmp.123456",
        "jobs.0.50",  "job.0.-5",  "job.99.50", "run.v2.0.3"};
    if (comm_->rank() == 0) {
      for (const std::string& f : foreign) touch(dir_ / f);
      fs::create_directories(dir_ / "job.1.60");  // a folder, not a checkpoint
      touch(dir_ / ".job.0.50.tmp.123456");       // not a checkpoint, but left by rank 0's save
    }
    comm_->barrier();
    TrainingRun run = make_run(comm_, 0, false);
    Trainer trainer(run.updater, interval(6, "iteration"), dir_.string());
    auto checkpointer = create_multi_node_checkpointer("job", comm_, 1, 1);
    trainer.extend(checkpointer, "", interval(2, "iteration"));
    EXPECT_EQ(checkpointer->maybe_load(trainer, run.optimizer.get()), std::nullopt);
    EXPECT_EQ(run.updater->iteration(), 0);
    EXPECT_EQ(checkpointer->local_iterations(), std::vector<int64_t>{});
    std::vector<int64_t> seen;
    auto observe = [&](Trainer&) { seen = checkpointer->local_iterations(); };
    trainer.extend(training::make_extension(observe, "observe", interval(2, "iteration"), -200));
    trainer.run();
    EXPECT_EQ(seen, std::vector<int64_t>{6}) << "collected at every save, keeping one set";
    comm_->barrier();
    std::vector<std::string> expected = foreign;
    expected.push_back("job.1.60");
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(list_dir(dir_), expected)
        << "only this checkpointer's files (and rank 0's stale temporary file) are touched";

    // A name with dots is matched as a whole.
    auto dotted = create_multi_node_checkpointer("run.v2", comm_, 1, 1, dir_.string());
    EXPECT_EQ(dotted->local_iterations(),
              comm_->rank() == 0 ? std::vector<int64_t>{3} : std::vector<int64_t>{});
  });
}

TEST_F(CheckpointTest, WorksWithoutATrainer) {
  on_every_rank([&] {
    const std::string folder = (dir_ / "nested" / "ckpt").string();
    auto checkpointer = create_multi_node_checkpointer("model", comm_, 2, 2, folder);
    manual_seed(3);
    links::Linear model(3, 2);
    for (int64_t it = 1; it <= 5; ++it) {
      model.W.set_data(model.W.data() + 1.0);
      checkpointer->save(model, it);
    }
    // Collections after saves 2 and 4 keep two sets each.
    EXPECT_EQ(checkpointer->local_iterations(), (std::vector<int64_t>{3, 4, 5}));
    EXPECT_EQ(checkpointer->stats().count, 5);

    links::Linear fresh(3, 2);
    auto again = create_multi_node_checkpointer("model", comm_, 2, 2, folder);
    EXPECT_EQ(again->maybe_load(fresh), std::optional<int64_t>(5));
    EXPECT_TRUE(array_equal(fresh.W.data(), model.W.data()));
    EXPECT_TRUE(array_equal(fresh.b.data(), model.b.data()));

    // A checkpoint that does not fit the target is an error on every rank, not a silent restart.
    links::Linear other(4, 2);
    EXPECT_THROW(again->maybe_load(other), IOError);

    // A run that starts over (it did not load) removes the newer files of the old run at its
    // first collection, and the temporary files a killed save left behind.
    const std::string rank = std::to_string(comm_->rank());
    touch(fs::path(folder) / (".model." + rank + ".6.tmp.Ab12Cd"));
    touch(fs::path(folder) / (".other." + rank + ".6.tmp.Ab12Cd"));
    again->save(model, 1);
    again->save(model, 2);
    EXPECT_EQ(again->local_iterations(), (std::vector<int64_t>{1, 2}));
    EXPECT_FALSE(fs::exists(fs::path(folder) / (".model." + rank + ".6.tmp.Ab12Cd")));
    EXPECT_TRUE(fs::exists(fs::path(folder) / (".other." + rank + ".6.tmp.Ab12Cd")));
  });
}

// A file last modified `age` ago (negative: in the future).
void touch_aged(const fs::path& file, std::chrono::seconds age) {
  touch(file);
  fs::last_write_time(file, fs::file_time_type::clock::now() - age);
}

// Each rank removes the temporary files that its own killed saves left (Note [Stale temporary
// files]) when the checkpointer starts and at each collection; never another rank's, never a
// look-alike, never one that a running save holds (locked) or that was written after it started.
TEST_F(CheckpointTest, StaleTemporaryFilesOfThisRankAreRemovedAtTheStartAndAtEachCollection) {
  on_every_rank([&] {
    const int rank = comm_->rank();
    const std::string r = std::to_string(rank);
    const auto hour = std::chrono::hours(1);
    const std::string stale = ".job." + r + ".10.tmp.Stale" + r;
    const std::string live = ".job." + r + ".11.tmp.LiveA" + r;
    const std::string fresh = ".job." + r + ".12.tmp.NewBb" + r;
    const std::vector<std::string> decoys = {
        ".job." + r + ".10.tmp.Ab12C",        // five random characters
        ".jobs." + r + ".10.tmp.Ab12Cd",      // another checkpointer's name
        ".job." + r + ".x.tmp.Ab12Cd",        // not an iteration
        ".job." + r + ".10.npz.tmp.Ab12Cd",   // not a checkpoint name
        ".job.99." + r + ".tmp.Ab12Cd",       // rank 99's (no such rank here)
    };
    touch_aged(dir_ / stale, hour);
    touch_aged(dir_ / live, hour);
    touch_aged(dir_ / fresh, -hour);
    for (const std::string& d : decoys) touch_aged(dir_ / d, hour);
    // A save of the same name still running (say, a second job started by mistake): locked.
    const int running = ::open((dir_ / live).c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(running, 0);
    ASSERT_EQ(::flock(running, LOCK_EX | LOCK_NB), 0);
    comm_->barrier();

    TrainingRun run = make_run(comm_, 0, false);
    Trainer trainer(run.updater, interval(2, "iteration"), dir_.string());
    auto checkpointer = create_multi_node_checkpointer("job", comm_, 1, 2);
    trainer.extend(checkpointer, "", interval(1, "iteration"));
    EXPECT_EQ(checkpointer->maybe_load(trainer, run.optimizer.get()), std::nullopt);
    comm_->barrier();
    std::vector<std::string> expected;
    for (int other = 0; other < comm_->size(); ++other) {
      const std::string o = std::to_string(other);
      expected.insert(expected.end(),
                      {".job." + o + ".11.tmp.LiveA" + o, ".job." + o + ".12.tmp.NewBb" + o,
                       ".job." + o + ".10.tmp.Ab12C", ".jobs." + o + ".10.tmp.Ab12Cd",
                       ".job." + o + ".x.tmp.Ab12Cd", ".job." + o + ".10.npz.tmp.Ab12Cd",
                       ".job.99." + o + ".tmp.Ab12Cd"});
    }
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(list_dir(dir_), expected) << "at the start, every rank removed its own stale file";
    comm_->barrier();

    // The running save ends (its lock is released, its file left): the trainer's start removes
    // it. A file left during training is removed by the next collection (every second save).
    ::close(running);
    comm_->barrier();
    const std::string killed = ".job." + r + ".1.tmp.Kille" + r;
    std::map<std::string, bool> seen;
    auto plant = [&](Trainer& t) {
      seen["live at the first save"] = fs::exists(dir_ / live);
      if (t.updater().iteration() == 2) touch_aged(dir_ / killed, std::chrono::seconds(30));
    };
    auto look = [&](Trainer& t) {
      if (t.updater().iteration() == 2) seen["killed after the collection"] = fs::exists(dir_ / killed);
    };
    trainer.extend(training::make_extension(plant, "plant", interval(1, "iteration"),
                                            training::kPriorityWriter));
    trainer.extend(training::make_extension(look, "look", interval(1, "iteration"), -200));
    trainer.run();
    EXPECT_FALSE(seen.at("live at the first save"));
    EXPECT_FALSE(seen.at("killed after the collection"));
    EXPECT_TRUE(fs::exists(dir_ / fresh));
    for (const std::string& d : decoys) EXPECT_TRUE(fs::exists(dir_ / d)) << d;
  });
}

class FailingTarget : public Serializable {
 public:
  explicit FailingTarget(bool fail) : fail_(fail) {}
  void serialize(Serializer& s) override {
    if (fail_) KUSARI_THROW(IOError, "no space left on device (simulated)");
    s("x", x_);
  }

 private:
  bool fail_;
  Array x_ = Array::ones({2}, float32);
};

TEST_F(CheckpointTest, AFailedSaveOnOneRankStopsEveryRank) {
  on_every_rank([&] {
    auto checkpointer = create_multi_node_checkpointer("job", comm_, 2, 2, dir_.string());
    FailingTarget ok(false), failing(comm_->rank() == comm_->size() - 1);
    checkpointer->save(ok, 1);
    try {
      checkpointer->save(failing, 2);
      ADD_FAILURE() << "expected IOError";
    } catch (const IOError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank " + std::to_string(comm_->size() - 1) + ": "), std::string::npos)
          << what;
      EXPECT_NE(what.find("simulated"), std::string::npos) << what;
    }
    EXPECT_EQ(checkpointer->local_iterations(), comm_->rank() == comm_->size() - 1
                                                    ? std::vector<int64_t>{1}
                                                    : (std::vector<int64_t>{1, 2}));
  });
}

TEST_F(CheckpointTest, RejectsBadArguments) {
  on_every_rank([&] {
    EXPECT_THROW(create_multi_node_checkpointer("", comm_), ValueError);
    EXPECT_THROW(create_multi_node_checkpointer("a/b", comm_), ValueError);
    EXPECT_THROW(create_multi_node_checkpointer("job", comm_, 0), ValueError);
    EXPECT_THROW(create_multi_node_checkpointer("job", comm_, 5, 0), ValueError);
    EXPECT_THROW(create_multi_node_checkpointer("job", nullptr), ValueError);
    auto checkpointer = create_multi_node_checkpointer("job", comm_);
    EXPECT_EQ(checkpointer->get_stats(), "No stats available");
    links::Linear model(2, 2);
    EXPECT_THROW(checkpointer->save(model, 1), ValueError) << "no folder";
    EXPECT_THROW(checkpointer->maybe_load(model), ValueError) << "no folder";
  });
}

// --- multi_node_snapshot -------------------------------------------------------------------------

TEST(ReplicaSetsTest, CompletedAsChainerMNDoes) {
  EXPECT_EQ(complete_replica_sets({{0}}, 4), (ReplicaSets{{0}, {1, 2, 3}}));
  EXPECT_EQ(complete_replica_sets({{0}, {1}}, 4), (ReplicaSets{{0}, {1}, {2, 3}}));
  EXPECT_EQ(complete_replica_sets({{0, 1}, {2, 3}}, 4), (ReplicaSets{{0, 1}, {2, 3}}));
  EXPECT_EQ(complete_replica_sets({}, 4), (ReplicaSets{{0, 1, 2, 3}}));
  EXPECT_EQ(complete_replica_sets({{6, 0, 4, 2}}, 8), (ReplicaSets{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_THROW(complete_replica_sets({{0, 4}}, 4), ValueError);
  EXPECT_THROW(complete_replica_sets({{-1}}, 4), ValueError);
  EXPECT_THROW(complete_replica_sets({{0, 1}, {1, 2}}, 4), ValueError);
  EXPECT_THROW(complete_replica_sets({{0, 0}}, 4), ValueError);
  EXPECT_THROW(complete_replica_sets({{0}, {}}, 4), ValueError);
  try {
    complete_replica_sets({{0, 1}, {1, 2}}, 4);
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 is listed twice"), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, MultiNodeSnapshotWritesOncePerReplicaSetAndRestoresEveryRank) {
  on_every_rank([&] {
    const int rank = comm_->rank(), size = comm_->size();
    const ReplicaSets sets = {{0, 1}};       // and, with 3 ranks, {2}
    const uint64_t seed = rank < 2 ? 0 : 1;  // identical state within a set, not across sets
    EXPECT_THROW(multi_node_snapshot(comm_, training::extensions::snapshot(), {{0, size}}),
                 ValueError);

    TrainingRun a = make_run(comm_, seed, false);
    Trainer ta(a.updater, interval(12, "iteration"), (dir_ / "a").string());
    ta.run();

    TrainingRun b = make_run(comm_, seed, false);
    Trainer tb(b.updater, interval(10, "iteration"), (dir_ / "b").string());
    auto writer = multi_node_snapshot(comm_, training::extensions::snapshot(), sets);
    EXPECT_EQ(writer->master(), rank < 2 ? 0 : 2);
    EXPECT_EQ(writer->is_master(), rank != 1);
    tb.extend(writer, "", interval(5, "iteration"));
    tb.run();
    comm_->barrier();
    std::vector<std::string> expected = {"snapshot_iter_10.0", "snapshot_iter_5.0"};
    if (size == 3)
      expected = {"snapshot_iter_10.0", "snapshot_iter_10.2", "snapshot_iter_5.0",
                  "snapshot_iter_5.2"};
    EXPECT_EQ(list_dir(dir_ / "b"), expected);
    comm_->barrier();

    // Restart with other weights everywhere: rank 1, which wrote nothing, gets rank 0's state.
    TrainingRun c = make_run(comm_, 1000 + static_cast<uint64_t>(rank), false);
    Trainer tc(c.updater, interval(12, "iteration"), (dir_ / "b").string());
    SnapshotOptions options;
    options.autoload = true;
    tc.extend(multi_node_snapshot(comm_, training::extensions::snapshot(options), sets), "",
              interval(5, "iteration"));
    tc.run();
    EXPECT_EQ(c.updater->iteration(), 12);
    EXPECT_EQ(params_of(*c.model), params_of(*a.model)) << "rank " << rank;
  });
}

// A sharded optimizer's state is spread over the processes: a snapshot that only some of them
// write is refused on every rank, at the first save, instead of waiting for the others.
TEST_F(CheckpointTest, MultiNodeSnapshotOfOneWriterRefusesASharedOptimizer) {
  on_every_rank([&] {
    TrainingRun run = make_run(comm_, 0, true, 1, /*zero_stage=*/1);
    Trainer trainer(run.updater, interval(4, "iteration"), (dir_ / "z").string());
    trainer.extend(multi_node_snapshot(comm_, training::extensions::snapshot(), {}), "", interval(2, "iteration"));
    EXPECT_TRUE(testing::ThrowsWith<ValueError>([&] { trainer.run(); },
                                       {"multi_node_snapshot", "'main'", "zero_stage 1", "every process"}));
  });
}

// Under multi_node_snapshot each rank's snapshot pattern ends in ".<rank>", so at the start
// (here with autoload) each rank removes its own killed writes' temporary files and never another
// rank's: rank 0's folder also holds one of a rank this job does not have, and one that another
// rank's running write holds.
TEST_F(CheckpointTest, MultiNodeSnapshotRemovesOnlyItsOwnRanksStaleTemporaryFiles) {
  on_every_rank([&] {
    const int rank = comm_->rank(), size = comm_->size();
    const std::string r = std::to_string(rank);
    const auto hour = std::chrono::hours(1);
    fs::create_directories(dir_);
    touch_aged(dir_ / (".snapshot_iter_5." + r + ".tmp.Stale" + r), hour);
    const std::string absent_rank = ".snapshot_iter_5." + std::to_string(size) + ".tmp.Other0";
    const std::string running_write = ".snapshot_iter_5.1.tmp.LiveAa";
    int running = -1;
    if (rank == 0) {
      touch_aged(dir_ / absent_rank, hour);
      touch_aged(dir_ / running_write, hour);
      running = ::open((dir_ / running_write).c_str(), O_RDWR | O_CLOEXEC);
      ASSERT_EQ(::flock(running, LOCK_EX | LOCK_NB), 0);
    }
    comm_->barrier();
    TrainingRun run = make_run(comm_, 0, false);
    Trainer trainer(run.updater, interval(1, "iteration"), dir_.string());
    SnapshotOptions options;
    options.autoload = true;
    trainer.extend(multi_node_snapshot(comm_, training::extensions::snapshot(options)), "",
                   interval(100, "iteration"));
    trainer.run();
    comm_->barrier();
    EXPECT_EQ(list_dir(dir_), (std::vector<std::string>{running_write, absent_rank}));
    comm_->barrier();
    if (running >= 0) ::close(running);
  });
}

TEST_F(CheckpointTest, MultiNodeSnapshotRestartMayRegroupRanks) {
  on_every_rank([&] {
    const int rank = comm_->rank();
    // First run: every rank is a set of its own (the default) and writes its own file.
    TrainingRun b = make_run(comm_, 50 + static_cast<uint64_t>(rank), false);
    Trainer tb(b.updater, interval(4, "iteration"), dir_.string());
    tb.extend(multi_node_snapshot(comm_, training::extensions::snapshot()), "",
              interval(4, "iteration"));
    tb.run();
    comm_->barrier();
    std::vector<std::string> expected;
    for (int r = 0; r < comm_->size(); ++r)
      expected.push_back("snapshot_iter_4." + std::to_string(r));
    EXPECT_EQ(list_dir(dir_), expected);
    comm_->barrier();

    // Restart as one replica set (ChainerMN's []): every rank takes rank 0's state.
    TrainingRun c = make_run(comm_, 900 + static_cast<uint64_t>(rank), false);
    Trainer tc(c.updater, interval(4, "iteration"), dir_.string());
    SnapshotOptions options;
    options.autoload = true;
    auto loader =
        multi_node_snapshot(comm_, training::extensions::snapshot(options), ReplicaSets{});
    EXPECT_EQ(loader->replica_set().size(), static_cast<size_t>(comm_->size()));
    tc.extend(loader, "", interval(4, "iteration"));
    loader->initialize(tc);
    EXPECT_EQ(c.updater->iteration(), 4);
    auto pb = b.model->namedparams(), pc = c.model->namedparams();
    EXPECT_EQ(pb.size(), pc.size());
    for (size_t i = 0; i < pb.size() && i < pc.size(); ++i) {
      Array writer = comm_->bcast(pb[i].second.data(), 0);
      EXPECT_TRUE(array_equal(pc[i].second.data(), writer)) << pc[i].first << " on rank " << rank;
    }
  });
}

TEST_F(CheckpointTest, MultiNodeSnapshotResumesADataParallelRunExactly) {
  on_every_rank([&] {
    const int rank = comm_->rank();
    TrainingRun a = make_run(comm_, 0, true);
    Trainer ta(a.updater, interval(12, "iteration"), (dir_ / "a").string());
    ta.run();

    // All ranks hold the same state: one replica set, one file.
    TrainingRun b = make_run(comm_, 0, true);
    Trainer tb(b.updater, interval(10, "iteration"), (dir_ / "b").string());
    tb.extend(multi_node_snapshot(comm_, training::extensions::snapshot(), ReplicaSets{}), "",
              interval(5, "iteration"));
    tb.run();
    comm_->barrier();
    EXPECT_EQ(list_dir(dir_ / "b"),
              (std::vector<std::string>{"snapshot_iter_10.0", "snapshot_iter_5.0"}));
    comm_->barrier();

    TrainingRun c = make_run(comm_, 1000 + static_cast<uint64_t>(rank), true);
    Trainer tc(c.updater, interval(12, "iteration"), (dir_ / "b").string());
    SnapshotOptions options;
    options.autoload = true;
    tc.extend(multi_node_snapshot(comm_, training::extensions::snapshot(options), ReplicaSets{}),
              "", interval(5, "iteration"));
    tc.run();
    // The multi-node optimizer took a step at iteration 11 instead of broadcasting again.
    EXPECT_EQ(params_of(*c.model), params_of(*a.model)) << "rank " << rank;
    EXPECT_EQ(c.optimizer->t(), a.optimizer->t());
  });
}

TEST_F(CheckpointTest, MultiNodeSnapshotRefusesToResumeFromMixedIterations) {
  on_every_rank([&] {
    const int last = comm_->size() - 1;
    TrainingRun b = make_run(comm_, 0, false);
    Trainer tb(b.updater, interval(8, "iteration"), dir_.string());
    tb.extend(multi_node_snapshot(comm_, training::extensions::snapshot()), "",
              interval(4, "iteration"));
    tb.run();
    comm_->barrier();
    // The last rank crashed before writing its snapshot of iteration 8.
    if (comm_->rank() == last) fs::remove(dir_ / ("snapshot_iter_8." + std::to_string(last)));
    comm_->barrier();
    TrainingRun c = make_run(comm_, 0, false);
    Trainer tc(c.updater, interval(8, "iteration"), dir_.string());
    SnapshotOptions options;
    options.autoload = true;
    auto loader = multi_node_snapshot(comm_, training::extensions::snapshot(options));
    tc.extend(loader, "", interval(4, "iteration"));
    try {
      loader->initialize(tc);
      ADD_FAILURE() << "expected IOError";
    } catch (const IOError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 0: iteration 8"), std::string::npos) << what;
      EXPECT_NE(what.find("rank " + std::to_string(last) + ": iteration 4"), std::string::npos)
          << what;
    }
  });
}

TEST_F(CheckpointTest, MultiNodeSnapshotFailureOnAMasterStopsEveryRank) {
  on_every_rank([&] {
    if (comm_->rank() == 0) touch(dir_ / "snapshot_iter_7.0", "not an npz file");
    comm_->barrier();
    TrainingRun c = make_run(comm_, 0, false);
    Trainer tc(c.updater, interval(8, "iteration"), dir_.string());
    SnapshotOptions options;
    options.autoload = true;
    auto loader =
        multi_node_snapshot(comm_, training::extensions::snapshot(options), ReplicaSets{});
    tc.extend(loader, "", interval(4, "iteration"));
    try {
      loader->initialize(tc);
      ADD_FAILURE() << "expected IOError";
    } catch (const IOError& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0: "), std::string::npos) << e.what();
    }
  });
}

// Note [Resuming each rank from its own snapshot]: every rank's iterator has its own order here,
// so loading rank 0's file everywhere would not give the uninterrupted run back.
TEST_F(CheckpointTest, LoadSnapshotOfEachRankResumesExactlyAndFailsOnEveryRank) {
  on_every_rank([&] {
    const int rank = comm_->rank();
    const int last = comm_->size() - 1;
    const uint64_t order_seed = 100 + static_cast<uint64_t>(rank);
    TrainingRun a = make_run(comm_, 0, true, order_seed);
    Trainer ta(a.updater, interval(12, "iteration"), (dir_ / "a").string());
    ta.run();

    TrainingRun b = make_run(comm_, 0, true, order_seed);
    Trainer tb(b.updater, interval(6, "iteration"), (dir_ / "b").string());
    tb.extend(multi_node_snapshot(comm_, training::extensions::snapshot()), "",
              interval(6, "iteration"));
    tb.run();
    comm_->barrier();
    const std::string path = (dir_ / "b" / "snapshot_iter_6").string();
    EXPECT_EQ(snapshot_file_of_rank(path, *comm_), path + "." + std::to_string(rank));

    TrainingRun c = make_run(comm_, 1000 + static_cast<uint64_t>(rank), true, 7);
    Trainer tc(c.updater, interval(12, "iteration"), (dir_ / "c").string());
    EXPECT_EQ(load_snapshot_of_each_rank(path, tc, *comm_), 6);
    tc.run();
    EXPECT_EQ(params_of(*c.model), params_of(*a.model)) << "rank " << rank;
    EXPECT_EQ(c.iterator->order(), a.iterator->order()) << "rank " << rank;

    // The last rank's file is missing: every rank throws, naming it.
    comm_->barrier();
    if (rank == last) fs::remove(path + "." + std::to_string(last));
    comm_->barrier();
    TrainingRun d = make_run(comm_, 0, true, order_seed);
    Trainer td(d.updater, interval(12, "iteration"), (dir_ / "d").string());
    EXPECT_TRUE(testing::ThrowsWith<IOError>(
        [&] { load_snapshot_of_each_rank(path, td, *comm_); },
        {"load_snapshot_of_each_rank: resuming from '" + path + "' failed",
         "rank " + std::to_string(last) + ": '" + path + "." + std::to_string(last) +
             "' does not exist"}));
  });
}

}  // namespace
}  // namespace kusari::mn
