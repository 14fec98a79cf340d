// Multi-process tests of the multi-node evaluator, persistent allreduce, observation
// aggregation, early stopping and iterators.
#include <gtest/gtest.h>

#include "kusari/kusari.h"
#include "kusari/mn.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using training::Trainer;

std::shared_ptr<TupleDataset> labelled_data(int64_t n, uint64_t seed) {
  Generator g(seed);
  Array x = Array::normal({n, 3}, 0, 1, float32, Device::cpu(), &g);
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(i % 2));
  return std::make_shared<TupleDataset>(std::vector<Array>{x, Array::from_vector(t)});
}

TEST(MultiNodeEvaluatorTest, EqualsASingleProcessEvaluationOfTheWholeSet) {
  auto comm = create_communicator("naive");
  auto model = std::make_shared<links::Classifier>(std::make_shared<links::Linear>(3, 2));
  comm->bcast_data(*model);
  auto data = labelled_data(11, 5);
  // The reference: one process evaluating everything, batches of 4 (last one short).
  auto whole = std::make_shared<training::extensions::Evaluator>(std::make_shared<SerialIterator>(data, 4, false, false),
                                                                 model);
  whole->set_name("validation");
  std::map<std::string, double> expected = whole->evaluate();
  // Each rank evaluates its shard (unequal split: no sample counted twice).
  auto shard = scatter_dataset(data, *comm, 0, true, 3, /*force_equal_length=*/false);
  // The evaluator by value (as Trainer::extend takes it), and shared.
  auto mn_eval = create_multi_node_evaluator(
      training::extensions::Evaluator(std::make_shared<SerialIterator>(shard, 4, false, false), model), comm);
  mn_eval->set_name("validation");
  std::map<std::string, double> got = mn_eval->evaluate();
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [k, v] : expected) EXPECT_NEAR(got.at(k), v, 1e-6) << k;
  auto shared = std::make_shared<training::extensions::Evaluator>(
      std::make_shared<SerialIterator>(shard, 4, false, false), model);
  auto mn_shared = create_multi_node_evaluator(shared, comm);
  mn_shared->set_name("validation");
  EXPECT_EQ(mn_shared->evaluate(), got);
  EXPECT_TRUE(got.count("validation/main/loss"));
  EXPECT_TRUE(got.count("validation/main/accuracy"));
}

class CountingEvaluator : public GenericMultiNodeEvaluator {
 public:
  using GenericMultiNodeEvaluator::GenericMultiNodeEvaluator;

 protected:
  std::map<std::string, double> aggregate(const std::vector<Results>& results) override {
    double rows = 0, sum = 0;
    for (const Results& r : results) {
      rows += static_cast<double>(r.at("y").shape()[0]);
      sum += kusari::sum(r.at("y")).item<double>();
    }
    return {{"rows", rows}, {"sum", sum}};
  }
};

TEST(MultiNodeEvaluatorTest, GenericEvaluatorAggregatesOnTheRoot) {
  auto comm = create_communicator("naive");
  auto data = labelled_data(10, 6);
  auto shard = scatter_dataset(data, *comm, 0, false, std::nullopt, false);
  auto predictor = std::make_shared<links::Linear>(3, 1);
  comm->bcast_data(*predictor);
  CountingEvaluator ev(comm, std::make_shared<SerialIterator>(shard, 3, false, false), predictor);
  std::map<std::string, double> r = ev.evaluate();
  EXPECT_DOUBLE_EQ(r.at("rows"), 10.0);
  // The sum over all rows equals the single-process sum.
  Array all_x = std::static_pointer_cast<TupleDataset>(data)->columns()[0];
  double expected = kusari::sum((*predictor)(Variable(all_x)).data()).item<double>();
  EXPECT_NEAR(r.at("sum"), expected, 1e-4);
}

class WithPersistent : public Link {
 public:
  explicit WithPersistent(double v) {
    add_persistent("avg", Array::full({2}, v, float32));
    add_persistent("count", Array::full({}, 7, int64));
  }
};

TEST(AllreducePersistentTest, AveragesFloatPersistents) {
  auto comm = create_communicator("naive");
  auto link = std::make_shared<WithPersistent>(comm->rank());
  AllreducePersistent(link, comm).allreduce();
  EXPECT_TRUE(array_equal(link->persistent("avg"), Array::full({2}, (comm->size() - 1) / 2.0, float32)));
  EXPECT_EQ(link->persistent("count").item<int64_t>(), 7);
}

// A trainer whose "updater" only reports a rank-dependent value per iteration.
struct ReportingRun {
  std::shared_ptr<links::Linear> model;
  std::shared_ptr<Trainer> trainer;
};

ReportingRun make_reporting_run(std::shared_ptr<training::Trigger> stop, std::function<double(int64_t)> value) {
  ReportingRun run;
  run.model = std::make_shared<links::Linear>(3, 1);
  auto opt = std::make_shared<optimizers::SGD>(0.0);
  opt->setup(run.model);
  auto it = std::make_shared<SerialIterator>(labelled_data(4, 1), 2, true, false);
  auto updater = std::make_shared<training::StandardUpdater>(
      it, opt, Device::cpu(), nullptr, [run, value, it](const std::vector<Variable>& batch) {
        report_scalar("value", value(static_cast<int64_t>(it->epoch_detail() * 2)));
        return F::sum((*run.model)(batch[0]) * 0.0);
      });
  run.trainer = std::make_shared<Trainer>(updater, stop, "");
  return run;
}

TEST(ObservationAggregatorTest, ReportsTheMeanOverRanks) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), s = comm->size();
  ReportingRun run = make_reporting_run(training::interval(3, "iteration"), [r](int64_t) { return 10.0 * r; });
  run.trainer->extend(std::make_shared<ObservationAggregator>(comm, "value", "value_mean"));
  std::vector<double> seen;
  run.trainer->extend(training::make_extension(
      [&seen](Trainer& t) { seen.push_back(t.observation().at("value_mean").item<double>()); }, "probe",
      training::interval(1, "iteration"), training::kPriorityReader));
  run.trainer->run();
  ASSERT_EQ(seen.size(), 3u);
  for (double v : seen) EXPECT_DOUBLE_EQ(v, 10.0 * (s - 1) / 2.0);
}

TEST(EarlyStoppingTest, AllRanksStopTogether) {
  auto comm = create_communicator("naive");
  const int r = comm->rank();
  // The mean over ranks decreases for 3 epochs, then rises; rank 0 alone would stop later.
  auto value = [r](int64_t step) {
    const double epoch = static_cast<double>(step / 2);
    return r == 0 ? -epoch : (epoch < 3 ? -epoch : 10 * epoch);
  };
  auto stop = std::make_shared<MultiNodeEarlyStoppingTrigger>(comm, training::interval(1, "epoch"), "value", 2);
  ReportingRun run = make_reporting_run(stop, value);
  run.trainer->run();
  const int64_t it = run.trainer->updater().iteration();
  std::vector<Array> all = comm->allgather(Array::full({}, it, int64));
  for (const Array& a : all) EXPECT_EQ(a.item<int64_t>(), it);
  EXPECT_LT(it, 100 * 2) << "early stopping must fire before max_trigger";
}

TEST(IteratorTest, SynchronizedIteratorGivesEveryRankTheSameOrder) {
  auto comm = create_communicator("naive");
  auto data = labelled_data(9, 2);
  auto it = create_synchronized_iterator(std::make_shared<SerialIterator>(data, 4, true, true, 1000 + comm->rank()), *comm);
  for (int step = 0; step < 5; ++step) {
    std::vector<Array> batch = concat_examples(it->next());
    std::vector<Array> all = comm->allgather(batch[0]);
    for (const Array& a : all) EXPECT_TRUE(array_equal(a, all[0]));
  }
}

TEST(IteratorTest, MultiNodeIteratorBroadcastsTheMastersBatches) {
  auto comm = create_communicator("naive");
  auto data = labelled_data(7, 3);
  const int master = comm->size() - 1;
  std::shared_ptr<Iterator> actual;
  if (comm->rank() == master) actual = std::make_shared<SerialIterator>(data, 3, true, true, 9);
  auto it = create_multi_node_iterator(actual, comm, master);
  EXPECT_EQ(it->batch_size(), 3);
  for (int step = 0; step < 4; ++step) {
    std::vector<Array> batch = concat_examples(it->next());
    std::vector<Array> all = comm->allgather(batch[0]);
    for (const Array& a : all) EXPECT_TRUE(array_equal(a, all[0]));
    std::vector<Array> epochs = comm->allgather(Array::full({}, it->epoch_detail(), float64));
    for (const Array& e : epochs) EXPECT_DOUBLE_EQ(e.item<double>(), it->epoch_detail());
  }
}

}  // namespace
}  // namespace kusari::mn
