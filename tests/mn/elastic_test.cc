// Elastic training's pieces: DistributedIterator (every example of an epoch exactly once across
// the processes, and across a resume on another number of processes) and the newest complete
// snapshot set of a folder written by any number of processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "mn_test_util.h"

namespace kusari::mn {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<TupleDataset> numbered(int64_t n) {
  return std::make_shared<TupleDataset>(std::vector<Array>{Array::arange(0.0, static_cast<double>(n), 1.0).astype(int64)});
}

/// The processes' iterators of one job of `size`, each built as its rank would.
std::vector<DistributedIterator> job(const std::shared_ptr<TupleDataset>& data, int64_t batch, int size,
                                     ElasticBatch resize = ElasticBatch::kKeepGlobal) {
  std::vector<DistributedIterator> its;
  for (int r = 0; r < size; ++r) {
    DistributedIteratorOptions o;
    o.seed = 7;
    o.resize = resize;
    its.emplace_back(data, batch, r, size, o);
  }
  return its;
}

/// One step of every process: the indices each took, in rank order.
std::vector<int64_t> step(std::vector<DistributedIterator>& its) {
  std::vector<int64_t> all;
  for (auto& it : its) {
    const std::vector<int64_t> mine = it.next_indices();
    EXPECT_EQ(static_cast<int64_t>(mine.size()), it.batch_size());
    all.insert(all.end(), mine.begin(), mine.end());
  }
  for (auto& it : its) EXPECT_DOUBLE_EQ(it.epoch_detail(), its[0].epoch_detail());
  return all;
}

/// The saved state of `it`, as a snapshot holds it.
NamedArrays saved(DistributedIterator& it) {
  DictionarySerializer s;
  s.save(it);
  return s.target();
}

TEST(DistributedIteratorTest, EveryExampleOfAnEpochOnceOverTheProcesses) {
  for (int size : {1, 2, 3, 4}) {
    auto data = numbered(60);
    auto its = job(data, 5, size);
    std::multiset<int64_t> epoch0;
    // 60 examples in global batches of 5 * size: whole steps up to the epoch's end.
    while (its[0].epoch() == 0) {
      for (int64_t i : step(its)) {
        if (its[0].epoch() == 0 || its[0].is_new_epoch()) epoch0.insert(i);
      }
    }
    // The steps of epoch 0 hold every example once (60 is a multiple of 5 * size for 1..4).
    EXPECT_EQ(epoch0.size(), 60u) << size << " processes";
    EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), 60u) << size << " processes";
  }
}

TEST(DistributedIteratorTest, UnevenPartsDifferByOneAndCoverTheGlobalBatch) {
  auto data = numbered(50);
  DistributedIteratorOptions o;
  o.seed = 3;
  // 3 processes x 7 = 21 per step; after a resize to 2 under kKeepGlobal the parts are 10 and 11.
  auto its = job(data, 7, 3);
  step(its);
  const NamedArrays state = saved(its[0]);
  std::vector<DistributedIterator> two;
  for (int r = 0; r < 2; ++r) {
    two.emplace_back(data, 7, r, 2, o);
    NpzDeserializer d(state);
    two.back().serialize(d);
  }
  EXPECT_EQ(two[0].global_batch_size(), 21);
  EXPECT_EQ(two[0].batch_size(), 10);
  EXPECT_EQ(two[1].batch_size(), 11);
  EXPECT_EQ(two[0].loaded_size(), 3);
  EXPECT_DOUBLE_EQ(two[0].learning_rate_factor(), 1.0);
  EXPECT_EQ(step(two).size(), 21u);
}

// The heart of elastic training: a job of 3 saves in the middle of an epoch, a job of 2 goes on
// from that state, and the epoch still holds every example exactly once.
TEST(DistributedIteratorTest, ResumedOnAnotherNumberOfProcessesNoExampleTwiceOrSkipped) {
  for (ElasticBatch resize : {ElasticBatch::kKeepGlobal, ElasticBatch::kKeepPerProcess}) {
    for (auto [from, to] : std::vector<std::pair<int, int>>{{3, 2}, {2, 3}, {4, 1}, {1, 4}, {3, 3}}) {
      auto data = numbered(120);
      auto before = job(data, 5, from, resize);
      std::vector<int64_t> seen;
      for (int s = 0; s < 3; ++s) {
        const auto batch = step(before);
        seen.insert(seen.end(), batch.begin(), batch.end());
      }
      // Every process saves the same state (the snapshot of any rank resumes any other).
      const NamedArrays state = saved(before[0]);
      for (auto& it : before) {
        const NamedArrays other = saved(it);
        ASSERT_EQ(other.size(), state.size());
        for (size_t k = 0; k < state.size(); ++k) {
          EXPECT_EQ(other[k].first, state[k].first);
          EXPECT_EQ(other[k].second.to_vector<double>(), state[k].second.to_vector<double>()) << other[k].first;
        }
      }
      auto after = job(data, 5, to, resize);
      for (auto& it : after) {
        NpzDeserializer d(state);
        it.serialize(d);
        EXPECT_EQ(it.loaded_size(), from);
        EXPECT_EQ(it.current_position(), before[0].current_position());
      }
      const int64_t global = resize == ElasticBatch::kKeepGlobal ? 5 * from : 5 * to;
      EXPECT_EQ(after[0].global_batch_size(), global);
      EXPECT_DOUBLE_EQ(after[0].learning_rate_factor(), static_cast<double>(global) / (5.0 * from));
      while (after[0].epoch() == 0) {
        const double before_step = after[0].epoch_detail();
        const auto batch = step(after);
        // The examples of epoch 0 (a batch that wraps takes the rest of epoch 0 first).
        const size_t in_epoch0 = std::min<size_t>(batch.size(), static_cast<size_t>(120 - before_step * 120 + 0.5));
        seen.insert(seen.end(), batch.begin(), batch.begin() + static_cast<std::ptrdiff_t>(in_epoch0));
      }
      std::vector<int64_t> sorted = seen;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> expected(120);
      for (int64_t i = 0; i < 120; ++i) expected[static_cast<size_t>(i)] = i;
      EXPECT_EQ(sorted, expected) << from << " -> " << to << " processes, resize "
                                  << (resize == ElasticBatch::kKeepGlobal ? "global" : "per process");
    }
  }
}

TEST(DistributedIteratorTest, ResumedJobDrawsTheUninterruptedJobsOrders) {
  // One process with a global batch of 6 vs. 3 processes of 2, saved and resumed by 2 of 3: the
  // examples of each step are the same set (the order is global and seeded).
  auto data = numbered(36);
  auto one = job(data, 6, 1);
  auto three = job(data, 2, 3);
  for (int s = 0; s < 4; ++s) {
    auto a = step(one), b = step(three);
    EXPECT_EQ(a, b) << "step " << s;
  }
  const NamedArrays state = saved(three[1]);
  auto two = job(data, 3, 2);
  for (auto& it : two) {
    NpzDeserializer d(state);
    it.serialize(d);
  }
  for (int s = 4; s < 20; ++s) EXPECT_EQ(step(one), step(two)) << "step " << s;
}

TEST(DistributedIteratorTest, RefusesWhatCannotWork) {
  auto data = numbered(10);
  DistributedIteratorOptions o;
  o.seed = 1;
  EXPECT_THROW(DistributedIterator(data, 2, 3, 3, o), ValueError);  // rank outside 0..size-1
  EXPECT_THROW(DistributedIterator(data, 0, 0, 1, o), ValueError);  // batch 0
  try {
    DistributedIterator(data, 4, 0, 3, o);  // 12 > 10 examples
    FAIL() << "a global batch larger than the dataset was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("global batch of 3 processes x 4 = 12 examples is larger than the dataset (10"),
              std::string::npos)
        << e.what();
  }
  DistributedIteratorOptions no_seed;
  EXPECT_THROW(DistributedIterator(data, 2, 0, 2, no_seed), ValueError);  // processes could not agree
  // A SerialIterator's snapshot is not a DistributedIterator's.
  SerialIterator serial(data, 2, true, true, 1);
  DictionarySerializer s;
  s.save(serial);
  DistributedIterator it(data, 2, 0, 2, o);
  NpzDeserializer d(s.target());
  try {
    it.serialize(d);
    FAIL() << "a SerialIterator's state was loaded";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("no 'global_batch_size'"), std::string::npos) << e.what();
  }
}

TEST(DistributedIteratorTest, SeedAgreedThroughTheCommunicator) {
  auto comm = create_communicator("naive");
  auto data = numbered(30);
  DistributedIterator it(data, 2, comm);
  const Array mine = Array::from_vector(it.next_indices());
  const std::vector<Array> all = comm->allgather(mine);
  std::set<int64_t> distinct;
  for (const Array& a : all) {
    for (int64_t v : a.to_vector<int64_t>()) distinct.insert(v);
  }
  // One order on every process: their parts never overlap.
  EXPECT_EQ(distinct.size(), static_cast<size_t>(2 * comm->size()));
}

// Files named as multi_node_snapshot names them, holding the job size it records.
void write_snapshot(const fs::path& dir, int64_t iteration, int rank, int size) {
  const std::string name = "snapshot_iter_" + std::to_string(iteration) + (rank < 0 ? "" : "." + std::to_string(rank));
  NamedArrays arrays;
  arrays.emplace_back("updater/iteration", Array::from_vector(std::vector<int64_t>{iteration}));
  if (rank >= 0) {
    arrays.emplace_back("extensions/multi_node_snapshot/mn_world_size", Array::from_vector(std::vector<int64_t>{size}));
  }
  write_npz((dir / name).string(), arrays);
}

TEST(SnapshotSetTest, NewestCompleteSetOfAnySize) {
  const fs::path dir = fs::temp_directory_path() /
                       ("kusari_elastic_" + std::to_string(::getpid()) + "_" + std::to_string(test::world_rank()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_FALSE(newest_complete_snapshot_set(dir.string()));
  EXPECT_FALSE(newest_complete_snapshot_set((dir / "absent").string()));
  for (int r = 0; r < 3; ++r) write_snapshot(dir, 100, r, 3);  // complete, 3 processes
  write_snapshot(dir, 150, 0, 3);                               // rank 1 and 2 died before writing
  write_snapshot(dir, 150, 1, 3);
  auto set = newest_complete_snapshot_set(dir.string());
  ASSERT_TRUE(set);
  EXPECT_EQ(set->iteration, 100);
  EXPECT_EQ(set->size, 3);
  ASSERT_EQ(set->files.size(), 3u);
  EXPECT_EQ(fs::path(set->files[2]).filename(), "snapshot_iter_100.2");
  // The restarted job of 2 writes 150 again: its set is complete with 2 files (a stale third is ignored).
  write_snapshot(dir, 150, 0, 2);
  write_snapshot(dir, 150, 1, 2);
  write_snapshot(dir, 150, 2, 3);
  set = newest_complete_snapshot_set(dir.string());
  ASSERT_TRUE(set);
  EXPECT_EQ(set->iteration, 150);
  EXPECT_EQ(set->size, 2);
  EXPECT_EQ(set->files.size(), 2u);
  // One process's file (no rank suffix) is a set of 1; other names and temporary files are not sets.
  write_snapshot(dir, 200, -1, 1);
  std::ofstream(dir / ".snapshot_iter_300.0.tmp.abcdef") << "half";
  std::ofstream(dir / "snapshot_iter_x.0") << "other";
  set = newest_complete_snapshot_set(dir.string());
  ASSERT_TRUE(set);
  EXPECT_EQ(set->iteration, 200);
  EXPECT_EQ(set->size, 1);
  // A rank-0 file that cannot be read (damaged) does not make a set.
  std::ofstream(dir / "snapshot_iter_250.0") << "not an npz";
  write_snapshot(dir, 250, 1, 2);
  EXPECT_EQ(newest_complete_snapshot_set(dir.string())->iteration, 200);
  fs::remove_all(dir);
}

TEST(SnapshotSetTest, WhichResumeValuesNameAFolder) {
  const fs::path dir = fs::temp_directory_path() /
                       ("kusari_resume_" + std::to_string(::getpid()) + "_" + std::to_string(test::world_rank()));
  fs::create_directories(dir);
  EXPECT_TRUE(names_snapshot_folder(dir.string(), "result"));              // an existing folder
  EXPECT_TRUE(names_snapshot_folder("result", "result"));                  // the output folder, not made yet
  EXPECT_TRUE(names_snapshot_folder("./result/", "result"));
  EXPECT_FALSE(names_snapshot_folder("result/snapshot_iter_600", "result"));  // a snapshot's name
  EXPECT_FALSE(names_snapshot_folder("", "result"));                        // no -r
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kusari::mn
