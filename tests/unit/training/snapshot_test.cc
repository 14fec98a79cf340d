// Snapshots and resuming: a run interrupted by a snapshot and resumed in a fresh trainer ends
// with bit-for-bit the same parameters as an uninterrupted run.
#include <gtest/gtest.h>

#include <filesystem>

#include "kusari/kusari.h"
#include "kusari/training/extensions/snapshot.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace fs = std::filesystem;
using training::Trainer;

struct TrainingRun {
  std::shared_ptr<links::Classifier> model;
  std::shared_ptr<optimizers::Adam> optimizer;
  std::shared_ptr<SerialIterator> iterator;
  std::shared_ptr<training::StandardUpdater> updater;
};

std::shared_ptr<TupleDataset> make_data() {
  Generator g(11);
  Array x = Array::normal({40, 5}, 0, 1, float32, Device::cpu(), &g);
  std::vector<int32_t> labels;
  for (int i = 0; i < 40; ++i) labels.push_back(i % 3);
  return std::make_shared<TupleDataset>(std::vector<Array>{x, Array::from_vector(labels)});
}

TrainingRun make_setup(uint64_t init_seed) {
  TrainingRun s;
  manual_seed(init_seed);
  s.model = std::make_shared<links::Classifier>(std::make_shared<links::Linear>(5, 3));
  s.optimizer = std::make_shared<optimizers::Adam>();
  s.optimizer->setup(s.model);
  s.iterator = std::make_shared<SerialIterator>(make_data(), 4, true, true, 1);
  s.updater = std::make_shared<training::StandardUpdater>(s.iterator, s.optimizer);
  return s;
}

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    out_ = fs::temp_directory_path() / ("kusari_snapshot_test_" + std::to_string(::getpid()));
    fs::remove_all(out_);
  }
  void TearDown() override { fs::remove_all(out_); }
  fs::path out_;
};

TEST_F(SnapshotTest, ResumedRunMatchesUninterruptedRunBitForBit) {
  TrainingRun a = make_setup(0);
  Trainer ta(a.updater, training::interval(12, "iteration"), (out_ / "a").string());
  ta.run();

  TrainingRun b = make_setup(0);
  Trainer tb(b.updater, training::interval(5, "iteration"), (out_ / "b").string());
  tb.extend(training::extensions::snapshot(), "", training::interval(5, "iteration"));
  tb.run();
  ASSERT_TRUE(fs::exists(out_ / "b" / "snapshot_iter_5"));

  // A fresh process would build everything anew, with other random weights.
  TrainingRun c = make_setup(12345);
  Trainer tc(c.updater, training::interval(12, "iteration"), (out_ / "b").string());
  training::extensions::SnapshotOptions opts;
  opts.autoload = true;
  tc.extend(training::extensions::snapshot(opts), "", training::interval(100, "iteration"));
  tc.run();
  EXPECT_EQ(c.updater->iteration(), 12);
  auto pa = a.model->namedparams(), pc = c.model->namedparams();
  ASSERT_EQ(pa.size(), pc.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.data().to_vector<float>(), pc[i].second.data().to_vector<float>()) << pa[i].first;
  }
  EXPECT_EQ(a.optimizer->t(), c.optimizer->t());
  EXPECT_DOUBLE_EQ(a.iterator->epoch_detail(), c.iterator->epoch_detail());
}

TEST_F(SnapshotTest, RetainsTheNewestFilesAndLeavesNoTempFiles) {
  TrainingRun s = make_setup(0);
  Trainer t(s.updater, training::interval(7, "iteration"), out_.string());
  training::extensions::SnapshotOptions opts;
  opts.n_retains = 2;
  auto snap = training::extensions::snapshot(opts);
  t.extend(snap, "", training::interval(1, "iteration"));
  t.run();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(out_)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"snapshot_iter_6", "snapshot_iter_7"}));
  EXPECT_EQ(snap->find_snapshots(out_.string()), (std::vector<std::string>{"snapshot_iter_6", "snapshot_iter_7"}));
}

TEST_F(SnapshotTest, SnapshotObjectSavesTheModelAlone) {
  TrainingRun s = make_setup(0);
  Trainer t(s.updater, training::interval(3, "iteration"), out_.string());
  t.extend(training::extensions::snapshot_object(*s.model, "model_{.updater.iteration}.npz"), "",
           training::interval(3, "iteration"));
  t.run();
  ASSERT_TRUE(fs::exists(out_ / "model_3.npz"));
  auto fresh = std::make_shared<links::Classifier>(std::make_shared<links::Linear>(5, 3));
  load_npz((out_ / "model_3.npz").string(), *fresh);
  auto p = s.model->namedparams(), q = fresh->namedparams();
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(array_equal(p[i].second.data(), q[i].second.data()));
  EXPECT_THROW(training::extensions::snapshot({.filename = ""}), ValueError);
}

}  // namespace
}  // namespace kusari
