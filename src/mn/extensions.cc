#include "kusari/mn/extensions.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "kusari/autograd/mode.h"
#include "kusari/core/random.h"
#include "kusari/core/reporter.h"
#include "kusari/core/routines.h"
#include "kusari/datasets/convert.h"
#include "kusari/mn/object.h"
#include "kusari/training/trainer.h"

namespace kusari::mn {

// --- MultiNodeEvaluator ----------------------------------------------------------------------------

MultiNodeEvaluator::MultiNodeEvaluator(std::shared_ptr<training::extensions::Evaluator> evaluator,
                                       std::shared_ptr<Communicator> comm)
    : evaluator_(std::move(evaluator)), comm_(std::move(comm)) {
  KUSARI_CHECK(evaluator_, ValueError, "create_multi_node_evaluator: the evaluator is null");
  KUSARI_CHECK(comm_, ValueError, "create_multi_node_evaluator: the communicator is null");
}

std::map<std::string, double> MultiNodeEvaluator::evaluate() {
  evaluator_->set_name(name().empty() ? default_name() : name());
  training::DictSummary local = evaluator_->evaluate_summary();
  // Every rank contributes every key any rank has (zero weight where it has none).
  ByteWriter w;
  std::vector<std::string> keys;
  for (const auto& [key, s] : local.summaries()) keys.push_back(key);
  w.put<uint64_t>(keys.size());
  for (const std::string& k : keys) w.put_string(k);
  std::set<std::string> all_keys;
  for (const Bytes& b : comm_->allgather_obj(w.take())) {
    ByteReader r(b);
    const uint64_t n = r.get<uint64_t>();
    for (uint64_t i = 0; i < n; ++i) all_keys.insert(r.get_string());
  }
  std::vector<double> raw;
  for (const std::string& k : all_keys) {
    auto it = local.summaries().find(k);
    if (it == local.summaries().end()) {
      raw.insert(raw.end(), {0.0, 0.0, 0.0});
    } else {
      raw.insert(raw.end(), {it->second.sum(), it->second.sum_of_squares(), it->second.weight()});
    }
  }
  raw = comm_->allreduce_obj(raw, ReduceOp::kSum);
  training::DictSummary global;
  size_t i = 0;
  for (const std::string& k : all_keys) {
    global.summaries()[k].set_raw(raw[i], raw[i + 1], raw[i + 2]);
    i += 3;
  }
  std::map<std::string, double> means = global.compute_mean();
  // Reported in the order this rank's model reported them, then keys only other ranks had.
  Observation values;
  for (const std::string& key : local.keys())
    if (means.count(key)) values[key] = Array::full({}, means.at(key), Dtype::kFloat64, Device::cpu());
  for (const auto& [key, mean] : means)
    if (!values.contains(key)) values[key] = Array::full({}, mean, Dtype::kFloat64, Device::cpu());
  report(values);
  return means;
}

void MultiNodeEvaluator::operator()(training::Trainer&) { evaluate(); }

std::shared_ptr<MultiNodeEvaluator> create_multi_node_evaluator(
    std::shared_ptr<training::extensions::Evaluator> evaluator, std::shared_ptr<Communicator> comm) {
  return std::make_shared<MultiNodeEvaluator>(std::move(evaluator), std::move(comm));
}

// --- GenericMultiNodeEvaluator -------------------------------------------------------------------

GenericMultiNodeEvaluator::GenericMultiNodeEvaluator(std::shared_ptr<Communicator> comm,
                                                     std::shared_ptr<Iterator> iterator, std::shared_ptr<Link> target,
                                                     Device device, int root)
    : comm_(std::move(comm)), iterator_(std::move(iterator)), target_(std::move(target)), device_(device), root_(root) {
  KUSARI_CHECK(comm_ && iterator_ && target_, ValueError,
               "GenericMultiNodeEvaluator: the communicator, iterator and target must not be null");
  KUSARI_CHECK(!iterator_->repeat(), ValueError,
               "GenericMultiNodeEvaluator: the iterator repeats; evaluation needs repeat=false");
}

GenericMultiNodeEvaluator::Results GenericMultiNodeEvaluator::calc_local(const std::vector<Variable>& batch) {
  return {{"y", target_->forward(batch.at(0)).data()}};
}

std::map<std::string, double> GenericMultiNodeEvaluator::evaluate() {
  ByteWriter w;
  {
    NoBackpropMode no_backprop;
    TrainMode test_mode(false);
    iterator_->reset();
    std::vector<Results> mine;
    for (std::vector<Example> batch = iterator_->next(); !batch.empty(); batch = iterator_->next()) {
      std::vector<Array> arrays = concat_examples(batch, device_);
      mine.push_back(calc_local(std::vector<Variable>(arrays.begin(), arrays.end())));
    }
    w.put<uint64_t>(mine.size());
    for (const Results& r : mine) {
      w.put<uint64_t>(r.size());
      for (const auto& [k, a] : r) {
        w.put_string(k);
        w.put_array(a);
      }
    }
  }
  std::vector<Bytes> gathered = comm_->gather_obj(w.take(), root_);
  ByteWriter out;
  if (comm_->rank() == root_) {
    std::vector<Results> all;
    for (const Bytes& b : gathered) {
      ByteReader r(b);
      const uint64_t batches = r.get<uint64_t>();
      for (uint64_t i = 0; i < batches; ++i) {
        Results res;
        const uint64_t n = r.get<uint64_t>();
        for (uint64_t j = 0; j < n; ++j) {
          std::string k = r.get_string();
          res[k] = r.get_array();
        }
        all.push_back(std::move(res));
      }
    }
    std::map<std::string, double> agg = aggregate(all);
    out.put<uint64_t>(agg.size());
    for (const auto& [k, v] : agg) {
      out.put_string(k);
      out.put<double>(v);
    }
  }
  Bytes b = comm_->bcast_obj(out.take(), root_);
  ByteReader r(b);
  std::map<std::string, double> result;
  const uint64_t n = r.get<uint64_t>();
  for (uint64_t i = 0; i < n; ++i) {
    std::string k = r.get_string();
    result[k] = r.get<double>();
  }
  const std::string prefix = name().empty() ? default_name() : name();
  Observation values;
  for (const auto& [k, v] : result) values[prefix + "/" + k] = Array::full({}, v, Dtype::kFloat64, Device::cpu());
  report(values);
  return result;
}

void GenericMultiNodeEvaluator::operator()(training::Trainer&) { evaluate(); }

// --- AllreducePersistent ---------------------------------------------------------------------------

AllreducePersistent::AllreducePersistent(std::shared_ptr<Link> model, std::shared_ptr<Communicator> comm)
    : model_(std::move(model)), comm_(std::move(comm)) {
  KUSARI_CHECK(model_ && comm_, ValueError, "AllreducePersistent: the model and communicator must not be null");
}

void AllreducePersistent::allreduce() {
  auto persistents = model_->namedpersistents();
  std::sort(persistents.begin(), persistents.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [path, array] : persistents) {
    if (!array->defined() || !is_floating(array->dtype())) continue;
    Array a = array->contiguous();
    comm_->allreduce_inplace(a, ReduceOp::kMean);
    *array = a;
  }
}

void AllreducePersistent::operator()(training::Trainer&) { allreduce(); }

// --- ObservationAggregator ------------------------------------------------------------------------

ObservationAggregator::ObservationAggregator(std::shared_ptr<Communicator> comm, std::string original_key,
                                             std::string aggregated_key, std::shared_ptr<training::Trigger> comm_trigger,
                                             Aggregator aggregator)
    : comm_(std::move(comm)),
      original_key_(std::move(original_key)),
      aggregated_key_(aggregated_key.empty() ? original_key_ : std::move(aggregated_key)),
      comm_trigger_(comm_trigger ? std::move(comm_trigger) : training::interval(1, "iteration")),
      aggregator_(std::move(aggregator)) {
  KUSARI_CHECK(comm_, ValueError, "ObservationAggregator: the communicator is null");
  if (!aggregator_) {
    aggregator_ = [](const std::vector<double>& v) {
      return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    };
  }
}

void ObservationAggregator::operator()(training::Trainer& trainer) {
  Observation& obs = trainer.observation();
  auto it = obs.find(original_key_);
  if (it != obs.end()) summary_.add(original_key_, it->second);
  if (!(*comm_trigger_)(trainer)) return;
  auto means = summary_.compute_mean();
  summary_.clear();
  auto m = means.find(original_key_);
  ByteWriter w;
  w.put<int32_t>(m != means.end() ? 1 : 0);
  w.put<double>(m != means.end() ? m->second : 0.0);
  std::vector<double> values;
  for (const Bytes& b : comm_->allgather_obj(w.take())) {
    ByteReader r(b);
    const bool has = r.get<int32_t>() != 0;
    const double v = r.get<double>();
    if (has) values.push_back(v);
  }
  if (values.empty()) return;
  obs[aggregated_key_] = Array::full({}, aggregator_(values), Dtype::kFloat64, Device::cpu());
}

// --- MultiNodeEarlyStoppingTrigger ------------------------------------------------------------------

MultiNodeEarlyStoppingTrigger::MultiNodeEarlyStoppingTrigger(std::shared_ptr<Communicator> comm,
                                                             std::shared_ptr<training::Trigger> check_trigger,
                                                             std::string monitor, int patience, std::string mode,
                                                             bool verbose, std::shared_ptr<training::Trigger> max_trigger)
    : EarlyStoppingTrigger(std::move(check_trigger), std::move(monitor), patience, std::move(mode), verbose,
                           std::move(max_trigger)),
      comm_(std::move(comm)) {
  KUSARI_CHECK(comm_, ValueError, "MultiNodeEarlyStoppingTrigger: the communicator is null");
}

double MultiNodeEarlyStoppingTrigger::reduce(double local_mean) {
  return comm_->allreduce_obj(local_mean, ReduceOp::kMean);
}

// --- iterators ----------------------------------------------------------------------------------

std::shared_ptr<Iterator> create_synchronized_iterator(std::shared_ptr<Iterator> iterator, Communicator& comm) {
  KUSARI_CHECK(iterator, ValueError, "create_synchronized_iterator: the iterator is null");
  ByteWriter w;
  if (comm.rank() == 0) w.put<uint64_t>(default_generator().next_uint64());
  Bytes b = comm.bcast_obj(w.take(), 0);
  iterator->reseed(ByteReader(b).get<uint64_t>());
  return iterator;
}

namespace {

class MultiNodeIterator : public Iterator {
 public:
  MultiNodeIterator(std::shared_ptr<Iterator> actual, std::shared_ptr<Communicator> comm, int master)
      : actual_(std::move(actual)), comm_(std::move(comm)), master_(master) {
    KUSARI_CHECK(master_ >= 0 && master_ < comm_->size(), ValueError, "create_multi_node_iterator: rank_master ",
                 master_, " is outside 0..", comm_->size() - 1);
    KUSARI_CHECK(!is_master() || actual_, ValueError, "create_multi_node_iterator: the master rank ", master_,
                 " must pass an iterator");
    ByteWriter w;
    if (is_master()) {
      w.put<int64_t>(actual_->batch_size());
      w.put<int32_t>(actual_->repeat() ? 1 : 0);
    }
    Bytes b = comm_->bcast_obj(w.take(), master_);
    ByteReader r(b);
    batch_size_ = r.get<int64_t>();
    repeat_ = r.get<int32_t>() != 0;
    sync_stats();
  }

  std::vector<Example> next() override {
    ByteWriter w;
    if (is_master()) {
      std::vector<Example> batch = actual_->next();
      w.put<uint64_t>(batch.size());
      for (const Example& e : batch) {
        w.put<uint64_t>(e.size());
        for (const Array& a : e) w.put_array(a);
      }
    }
    Bytes b = comm_->bcast_obj(w.take(), master_);
    ByteReader r(b);
    std::vector<Example> batch(r.get<uint64_t>());
    for (Example& e : batch) {
      e.resize(r.get<uint64_t>());
      for (Array& a : e) a = r.get_array();
    }
    sync_stats();
    return batch;
  }

  int64_t epoch() const override { return epoch_; }
  double epoch_detail() const override { return epoch_detail_; }
  double previous_epoch_detail() const override { return previous_epoch_detail_; }
  bool is_new_epoch() const override { return is_new_epoch_; }
  int64_t batch_size() const override { return batch_size_; }
  bool repeat() const override { return repeat_; }
  void reset() override {
    if (is_master()) actual_->reset();
    sync_stats();
  }
  void finalize() override {
    if (actual_) actual_->finalize();
  }
  void serialize(Serializer& s) override {
    if (is_master()) actual_->serialize(s);
    if (s.is_loading()) sync_stats();
  }

 private:
  bool is_master() const { return comm_->rank() == master_; }
  void sync_stats() {
    ByteWriter w;
    if (is_master()) {
      w.put<int64_t>(actual_->epoch());
      w.put<double>(actual_->epoch_detail());
      w.put<double>(actual_->previous_epoch_detail());
      w.put<int32_t>(actual_->is_new_epoch() ? 1 : 0);
    }
    Bytes b = comm_->bcast_obj(w.take(), master_);
    ByteReader r(b);
    epoch_ = r.get<int64_t>();
    epoch_detail_ = r.get<double>();
    previous_epoch_detail_ = r.get<double>();
    is_new_epoch_ = r.get<int32_t>() != 0;
  }

  std::shared_ptr<Iterator> actual_;
  std::shared_ptr<Communicator> comm_;
  int master_;
  int64_t batch_size_ = 0;
  bool repeat_ = true;
  int64_t epoch_ = 0;
  double epoch_detail_ = 0, previous_epoch_detail_ = -1;
  bool is_new_epoch_ = false;
};

}  // namespace

std::shared_ptr<Iterator> create_multi_node_iterator(std::shared_ptr<Iterator> iterator,
                                                     std::shared_ptr<Communicator> comm, int rank_master) {
  KUSARI_CHECK(comm, ValueError, "create_multi_node_iterator: the communicator is null");
  return std::make_shared<MultiNodeIterator>(std::move(iterator), std::move(comm), rank_master);
}

}  // namespace kusari::mn
