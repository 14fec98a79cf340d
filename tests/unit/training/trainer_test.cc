// The training loop and triggers: IntervalTrigger / ManualScheduleTrigger firing points,
// extension priorities and order, names, and initialize / on_error / finalize calls.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include <stdexcept>

#include "kusari/datasets/tuple_dataset.h"
#include "kusari/iterators/serial_iterator.h"
#include "kusari/training/extensions.h"
#include "kusari/training/trainer.h"
#include "test_util.h"
#include "training_test_util.h"

namespace kusari::training {
namespace {

using testing::make_setup;
using testing::MapSerializer;

// The iterations at which an extension with `trigger` ran during `stop`.
std::vector<int64_t> firing_iterations(std::shared_ptr<Trigger> trigger,
                                       std::shared_ptr<Trigger> stop, int64_t n = 6,
                                       int64_t batch_size = 2) {
  auto s = make_setup(testing::fresh_out_dir("firing"), std::move(stop), n, batch_size);
  std::vector<int64_t> fired;
  s.trainer->extend(
      make_extension([&](Trainer& t) { fired.push_back(t.updater().iteration()); }, "probe"), "",
      std::move(trigger));
  s.trainer->run();
  return fired;
}

TEST(TriggerTest, IntervalIteration) {
  EXPECT_EQ(firing_iterations(interval(3, "iteration"), interval(10, "iteration")),
            (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(firing_iterations(interval(1, "iteration"), interval(3, "iteration")),
            (std::vector<int64_t>{1, 2, 3}));
}

TEST(TriggerTest, IntervalEpoch) {
  // 6 examples in batches of 2: 3 iterations per epoch.
  EXPECT_EQ(firing_iterations(interval(1, "epoch"), interval(3, "epoch")),
            (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(firing_iterations(interval(2, "epoch"), interval(5, "epoch")),
            (std::vector<int64_t>{6, 12}));
  // Half epochs: epoch_detail crosses 0.5 at iteration 2 (0.67), 1.0 at 3, 1.5 at 5 (1.67), 2.0
  // at 6.
  EXPECT_EQ(firing_iterations(interval(0.5, "epoch"), interval(2, "epoch")),
            (std::vector<int64_t>{2, 3, 5, 6}));
  // Batches crossing the epoch boundary (4 examples, batches of 3): epoch_detail
  // 0.75, 1.5, 2.25, 3.
  EXPECT_EQ(firing_iterations(interval(1, "epoch"), interval(4, "iteration"), 4, 3),
            (std::vector<int64_t>{2, 3, 4}));
}

// Note [Batch larger than the dataset]: with the real SerialIterator and any batch up to the
// dataset's size, the stop trigger interval(p, "epoch") ends training when the epoch count
// reaches p -- never past it -- after ceil(p n / b) iterations, and the epoch the trainer reports
// is p. Larger batches are refused when the iterator is built.
TEST(TriggerTest, StopTriggerStopsAtTheEpochAskedFor) {
  const int64_t n = 7;
  std::vector<double> x(n), t(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<double>(i), t[i] = 2.0 * x[i];
  auto dataset = std::make_shared<TupleDataset>(std::vector<Array>{
      Array::from_vector(x, Shape{n, 1}, Device::cpu()), Array::from_vector(t, Shape{n, 1}, Device::cpu())});
  for (int64_t b : {1, 3, 6, 7}) {
    for (int64_t p : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "batch " << b << ", stop at epoch " << p);
      auto model = std::make_shared<testing::ProbeModel>();
      auto optimizer = std::make_shared<testing::TinySGD>(0.001);
      optimizer->setup(model);
      auto it = std::make_shared<SerialIterator>(dataset, b, true, true, 3);
      auto updater = std::make_shared<StandardUpdater>(it, optimizer, Device::cpu());
      Trainer trainer(updater, interval(static_cast<double>(p), "epoch"),
                      testing::fresh_out_dir("stop_epoch"));
      std::vector<int64_t> logged;
      trainer.extend(make_extension([&](Trainer& tr) { logged.push_back(tr.updater().epoch()); },
                                    "epochs"),
                     "", interval(1, "epoch"));
      trainer.run();
      EXPECT_EQ(updater->epoch(), p);
      EXPECT_EQ(updater->iteration(), (p * n + b - 1) / b);
      std::vector<int64_t> expected;
      for (int64_t e = 1; e <= p; ++e) expected.push_back(e);
      EXPECT_EQ(logged, expected);
    }
  }
  EXPECT_THROW(SerialIterator(dataset, 8, true, true, 3), ValueError);
}

TEST(TriggerTest, StopTriggerDoesNotFireBeforeTraining) {
  // The stop trigger is asked at iteration 0; see Note [Trigger start].
  auto s = make_setup(testing::fresh_out_dir("stop"), interval(1, "epoch"));
  s.trainer->run();
  EXPECT_EQ(s.updater->iteration(), 3);
  auto s2 = make_setup(testing::fresh_out_dir("stop2"), interval(7, "iteration"));
  s2.trainer->run();
  EXPECT_EQ(s2.updater->iteration(), 7);
}

TEST(TriggerTest, ManualSchedule) {
  EXPECT_EQ(firing_iterations(manual_schedule({2, 5}, "iteration"), interval(8, "iteration")),
            (std::vector<int64_t>{2, 5}));
  // epoch_detail after each iteration: 1/3, 2/3, 1, 4/3, 5/3, 2, 7/3, 8/3, 3.
  EXPECT_EQ(firing_iterations(manual_schedule({1, 2.5}, "epoch"), interval(3, "epoch")),
            (std::vector<int64_t>{3, 8}));
  EXPECT_THROW(manual_schedule({1}, "minute"), ValueError);
  EXPECT_THROW(interval(0, "epoch"), ValueError);
}

TEST(TriggerTest, ResumedTrainerKeepsTriggerPositions) {
  // Train to iteration 4, save, resume into a fresh trainer and go on to 9: an extension every
  // 3 iterations fires at 3, then 6 and 9, not at 5 (which a trigger that forgot its previous
  // iteration would report as a crossing).
  auto store = std::make_shared<MapSerializer::Store>();
  std::vector<int64_t> fired;
  auto probe = [&fired](Trainer& t) { fired.push_back(t.updater().iteration()); };
  {
    auto s = make_setup(testing::fresh_out_dir("trigger_resume"), interval(4, "iteration"));
    s.trainer->extend(make_extension(probe, "probe"), "", interval(3, "iteration"));
    s.trainer->run();
    MapSerializer saver(store, false);
    s.trainer->serialize(saver);
  }
  EXPECT_EQ(store->at("extension_triggers/probe/previous_iteration").item<int64_t>(), 4);
  EXPECT_EQ(store->at("stop_trigger/previous_iteration").item<int64_t>(), 4);
  auto s = make_setup(testing::fresh_out_dir("trigger_resume"), interval(9, "iteration"));
  s.trainer->extend(make_extension(probe, "probe"), "", interval(3, "iteration"));
  MapSerializer loader(store, true);
  s.trainer->serialize(loader);
  s.trainer->run();
  EXPECT_EQ(fired, (std::vector<int64_t>{3, 6, 9}));
  EXPECT_EQ(s.updater->iteration(), 9);
}

// Records its calls into a shared log.
class RecordingExtension : public Extension {
 public:
  RecordingExtension(std::string tag, int priority, std::vector<std::string>* log)
      : tag_(std::move(tag)), priority_(priority), log_(log) {}
  void operator()(Trainer&) override { log_->push_back(tag_); }
  std::string default_name() const override { return "Recording"; }
  std::shared_ptr<Trigger> default_trigger() const override { return interval(1, "iteration"); }
  int priority() const override { return priority_; }
  void initialize(Trainer&) override { log_->push_back("initialize " + tag_); }
  void finalize() override { log_->push_back("finalize " + tag_); }
  void on_error(Trainer&, const std::exception& e) override {
    log_->push_back("on_error " + tag_ + ": " + e.what());
  }

 private:
  std::string tag_;
  int priority_;
  std::vector<std::string>* log_;
};

TEST(TrainerTest, ExtensionsRunByPriorityThenRegistrationOrder) {
  std::vector<std::string> log;
  auto s = make_setup(testing::fresh_out_dir("order"), interval(1, "iteration"));
  s.trainer->extend(std::make_shared<RecordingExtension>("reader1", kPriorityReader, &log));
  s.trainer->extend(std::make_shared<RecordingExtension>("writer", kPriorityWriter, &log));
  s.trainer->extend(std::make_shared<RecordingExtension>("editor", kPriorityEditor, &log));
  s.trainer->extend(std::make_shared<RecordingExtension>("reader2", kPriorityReader, &log));
  // extend()'s priority overrides the extension's own.
  s.trainer->extend(std::make_shared<RecordingExtension>("promoted", kPriorityReader, &log), "",
                    nullptr, kPriorityWriter + 1);
  s.trainer->run();
  const std::vector<std::string> expected = {"initialize promoted",
                                             "initialize writer",
                                             "initialize editor",
                                             "initialize reader1",
                                             "initialize reader2",
                                             "promoted",
                                             "writer",
                                             "editor",
                                             "reader1",
                                             "reader2",
                                             "finalize promoted",
                                             "finalize writer",
                                             "finalize editor",
                                             "finalize reader1",
                                             "finalize reader2"};
  EXPECT_EQ(log, expected);
}

TEST(TrainerTest, NamesAreNumberedAndGivenToTheExtension) {
  auto s = make_setup(testing::fresh_out_dir("names"), interval(1, "iteration"));
  std::vector<std::string> log;
  auto a = std::make_shared<RecordingExtension>("a", kPriorityReader, &log);
  auto b = std::make_shared<RecordingExtension>("b", kPriorityReader, &log);
  auto c = std::make_shared<RecordingExtension>("c", kPriorityReader, &log);
  s.trainer->extend(a);
  s.trainer->extend(b);
  s.trainer->extend(c, "custom");
  EXPECT_EQ(a->name(), "Recording");
  EXPECT_EQ(b->name(), "Recording_1");
  EXPECT_EQ(c->name(), "custom");
  EXPECT_EQ(&s.trainer->get_extension("Recording_1"), b.get());
  EXPECT_THROW(s.trainer->get_extension("missing"), ValueError);
  // Extensions can be given by value (Chainer's trainer.extend(LogReport())).
  s.trainer->extend(extensions::LogReport());
  EXPECT_NE(dynamic_cast<extensions::LogReport*>(&s.trainer->get_extension("LogReport")), nullptr);
}

TEST(TrainerTest, OnErrorAndFinalizeRunWhenAnUpdateThrows) {
  int calls = 0;
  LossFunction failing = [&](const std::vector<Variable>&) -> Variable {
    if (++calls == 3) throw std::runtime_error("update failed on purpose");
    return Variable(Array::zeros({}, float64, Device::cpu()), true);
  };
  auto s =
      make_setup(testing::fresh_out_dir("error"), interval(10, "iteration"), 6, 2, 0.01, failing);
  std::vector<std::string> log;
  s.trainer->extend(std::make_shared<RecordingExtension>("r", kPriorityReader, &log));
  s.trainer->extend(std::make_shared<RecordingExtension>("w", kPriorityWriter, &log));
  EXPECT_THROW(
      {
        try {
          s.trainer->run();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "update failed on purpose");
          throw;
        }
      },
      std::runtime_error);
  const std::vector<std::string> expected = {"initialize w",
                                             "initialize r",
                                             "w",
                                             "r",
                                             "w",
                                             "r",
                                             "on_error w: update failed on purpose",
                                             "on_error r: update failed on purpose",
                                             "finalize w",
                                             "finalize r"};
  EXPECT_EQ(log, expected);
  EXPECT_EQ(s.updater->iteration(), 2);
}

// An output folder that exists but cannot be written is an IOError naming the folder before the
// first iteration (Note [Probing the output folder]), not after the first epoch when a log or a
// snapshot is written. /proc/self is such a folder even for root, who may write into a folder
// with mode 0555.
TEST(TrainerTest, UnwritableOutputFolderFailsBeforeTraining) {
  std::vector<std::string> outs = {"/proc/self"};
  if (::geteuid() != 0) {
    const std::string ro = testing::fresh_out_dir("read_only");
    std::filesystem::create_directories(ro);
    std::filesystem::permissions(ro, std::filesystem::perms::owner_read |
                                         std::filesystem::perms::owner_exec);
    outs.push_back(ro);
  }
  for (const std::string& out : outs) {
    auto s = make_setup(out, interval(2, "iteration"));
    try {
      s.trainer->run();
      ADD_FAILURE() << "expected kusari::IOError for " << out;
    } catch (const IOError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("Trainer::run"), std::string::npos) << what;
      EXPECT_NE(what.find("'" + out + "' is not writable"), std::string::npos) << what;
    }
    EXPECT_EQ(s.updater->iteration(), 0) << "no update should run before the check";
  }
}

// The probe file is removed again: a trainer with no extensions leaves its folder empty.
TEST(TrainerTest, WritableOutputFolderIsLeftClean) {
  const std::string out = testing::fresh_out_dir("clean");
  auto s = make_setup(out, interval(2, "iteration"));
  s.trainer->run();
  EXPECT_EQ(s.updater->iteration(), 2);
  EXPECT_TRUE(std::filesystem::is_empty(out));
}

// CUDA graphs record GPU work: asking for them on a CPU updater is an error that says so.
TEST(StandardUpdaterTest, CudaGraphNeedsAGpuDevice) {
  auto s = testing::make_setup(testing::fresh_out_dir("graph_cpu"), training::interval(1, "iteration"));
  try {
    s.updater->set_use_cuda_graph(true);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(s.updater->use_cuda_graph());
  s.updater->set_use_cuda_graph(false);
}

}  // namespace
}  // namespace kusari::training
