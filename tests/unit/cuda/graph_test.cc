// CUDA graphs (kusari::cuda::Graph): replays recompute from the current inputs, a captured
// training step matches the eager one, what a capture may not do is refused with a clear error
// and leaves the device usable, and the graph's memory is never handed to eager arrays.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kusari/core/cuda.h"
#include "kusari/core/reporter.h"
#include "kusari/functions.h"
#include "kusari/iterators/iterator.h"
#include "kusari/links/classifier.h"
#include "kusari/links/linear.h"
#include "kusari/links/link.h"
#include "kusari/optimizers/adam.h"
#include "kusari/serializers/serializer.h"
#include "kusari/training/updater.h"

namespace kusari {
namespace {

using testing::CudaTest;

class CudaGraph : public CudaTest {};

std::vector<float> host(const Array& a) { return a.to_vector<float>(); }

TEST_F(CudaGraph, ReplayRecomputesFromTheCurrentInputs) {
  Array x = Array::from_vector(std::vector<float>{1, 2, 3, 4}, Shape{4}, gpu());
  Array y;
  cuda::Graph graph;
  EXPECT_FALSE(graph.captured());
  graph.capture(gpu(), [&] {
    EXPECT_TRUE(cuda::is_capturing(gpu()));
    y = exp(x * 2.0f) + x;
  });
  EXPECT_FALSE(cuda::is_capturing(gpu()));
  ASSERT_TRUE(graph.captured());
  EXPECT_GE(graph.num_nodes(), 2);
  graph.replay();
  const std::vector<float> first = host(y);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(first[static_cast<size_t>(i)], std::exp(2.0f * (i + 1)) + (i + 1));
  x.assign(Array::from_vector(std::vector<float>{-1, 0, 0.5f, 1}, Shape{4}).to_device(gpu()));
  graph.replay();
  const std::vector<float> second = host(y);
  const std::vector<float> xs{-1, 0, 0.5f, 1};
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(second[i], std::exp(2.0f * xs[i]) + xs[i]);
}

class TwoLayer : public Chain {
 public:
  TwoLayer() {
    l1 = add_link("l1", std::make_shared<links::Linear>(6, 8));
    l2 = add_link("l2", std::make_shared<links::Linear>(8, 3));
  }
  Variable forward(const Variable& x) override { return (*l2)(functions::relu((*l1)(x))); }
  std::shared_ptr<links::Linear> l1, l2;
};

// Forward and backward captured once, replayed on new batches: the loss and every gradient equal
// those of an eager step of an identical model on the same batch.
TEST_F(CudaGraph, CapturedStepMatchesTheEagerStep) {
  manual_seed(3);
  TwoLayer captured_model;
  manual_seed(3);
  TwoLayer eager_model;
  captured_model.to_device(gpu());
  eager_model.to_device(gpu());
  auto batch = [](int k) {
    Array x = Array::uniform({5, 6}, -1, 1, float32, Device::cpu());
    std::vector<int32_t> labels(5);
    for (int i = 0; i < 5; ++i) labels[static_cast<size_t>(i)] = (i + k) % 3;
    return std::make_pair(x, Array::from_vector(labels));
  };
  Array x = Array::zeros({5, 6}, float32, gpu());
  Array t = Array::zeros({5}, int32, gpu());
  auto loss_of = [](TwoLayer& m, const Array& xa, const Array& ta) {
    return functions::softmax_cross_entropy(m(Variable(xa)), ta);
  };
  // One eager step before the capture (cuBLAS handle, workspaces).
  loss_of(captured_model, x, t).backward();
  Variable loss;
  cuda::Graph graph;
  graph.capture(gpu(), [&] {
    captured_model.cleargrads();
    loss = loss_of(captured_model, x, t);
    loss.backward();
  });
  for (int k = 0; k < 3; ++k) {
    auto [bx, bt] = batch(k);
    x.assign(bx.to_device(gpu()));
    t.assign(bt.to_device(gpu()));
    graph.replay();
    eager_model.cleargrads();
    Variable eager_loss = loss_of(eager_model, bx.to_device(gpu()), bt.to_device(gpu()));
    eager_loss.backward();
    EXPECT_NEAR(loss.data().item<double>(), eager_loss.data().item<double>(), 1e-6) << "batch " << k;
    auto a = captured_model.namedparams();
    auto b = eager_model.namedparams();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const std::vector<float> ga = host(a[i].second.grad()), gb = host(b[i].second.grad());
      ASSERT_EQ(ga.size(), gb.size());
      for (size_t j = 0; j < ga.size(); ++j) EXPECT_NEAR(ga[j], gb[j], 1e-5) << a[i].first << " batch " << k;
    }
  }
}

void expect_refused(const std::function<void()>& fn, const std::string& what) {
  cuda::Graph graph;
  try {
    graph.capture(Device::cuda(0), fn);
    FAIL() << "expected a DeviceError for " << what;
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
    EXPECT_NE(msg.find("captured"), std::string::npos) << msg;
  }
  EXPECT_FALSE(graph.captured());
  EXPECT_FALSE(cuda::is_capturing(Device::cuda(0)));
}

TEST_F(CudaGraph, WhatACaptureCannotRecordIsRefusedClearly) {
  Array x = Array::ones({16}, float32, gpu());
  expect_refused([&] { (void)sum(x).item<float>(); }, "reading GPU data on the host");
  expect_refused([&] { (void)Array::from_vector(std::vector<float>{1, 2}, Shape{2}, Device::cuda(0)); },
                 "copying host data to the GPU");
  expect_refused([&] { (void)Array::uniform({8}, 0, 1, float32, Device::cuda(0)); },
                 "drawing random numbers");
  expect_refused([&] { Device::cuda(0).synchronize(); }, "synchronize()");
  // The device is usable afterwards, eagerly and for a new capture.
  EXPECT_FLOAT_EQ(sum(x).item<float>(), 16.0f);
  Array y;
  cuda::Graph graph;
  graph.capture(gpu(), [&] { y = x * 3.0f; });
  graph.replay();
  EXPECT_FLOAT_EQ(sum(y).item<float>(), 48.0f);
}

TEST_F(CudaGraph, AnExceptionInTheFunctionAbandonsTheCapture) {
  cuda::Graph graph;
  EXPECT_THROW(graph.capture(gpu(), [] { throw ValueError("from the captured function"); }), ValueError);
  EXPECT_FALSE(graph.captured());
  EXPECT_FALSE(cuda::is_capturing(gpu()));
  EXPECT_THROW(graph.replay(), DeviceError);
}

TEST_F(CudaGraph, GraphMemoryIsNotHandedToEagerArrays) {
  Array x = Array::ones({1000}, float32, gpu());
  void* inside = nullptr;
  cuda::Graph graph;
  graph.capture(gpu(), [&] {
    Array tmp = x * 2.0f;  // released inside the capture: the graph's now
    inside = tmp.raw_data();
  });
  // Same size as the graph's block: must not reuse it while the graph lives.
  Array eager = Array::empty({1000}, float32, gpu());
  EXPECT_NE(eager.raw_data(), inside);
  graph.reset();
  EXPECT_FALSE(graph.captured());
  // Once the graph is gone its memory is the device's again.
  std::vector<Array> many;
  bool reused = false;
  for (int i = 0; i < 4 && !reused; ++i) {
    many.push_back(Array::empty({1000}, float32, gpu()));
    reused = many.back().raw_data() == inside;
  }
  EXPECT_TRUE(reused);
}

/// Batches of 10 and 7 examples in turn (two recordings), from a fixed list.
class AlternatingIterator : public Iterator {
 public:
  explicit AlternatingIterator(std::vector<Example> data) : data_(std::move(data)) {}
  std::vector<Example> next() override {
    const size_t n = calls_++ % 2 == 0 ? 10 : 7;
    std::vector<Example> batch;
    for (size_t i = 0; i < n; ++i) batch.push_back(data_[(position_ + i) % data_.size()]);
    position_ = (position_ + n) % data_.size();
    return batch;
  }
  int64_t epoch() const override { return 0; }
  double epoch_detail() const override { return 0; }
  double previous_epoch_detail() const override { return 0; }
  bool is_new_epoch() const override { return false; }
  int64_t batch_size() const override { return 10; }
  bool repeat() const override { return true; }
  void reset() override { calls_ = position_ = 0; }
  void serialize(Serializer&) override {}

 private:
  std::vector<Example> data_;
  size_t calls_ = 0, position_ = 0;
};

// The updater's graph steps train exactly like its eager steps: same reported losses and
// accuracies every iteration, same parameters at the end, with two batch shapes recorded.
TEST_F(CudaGraph, UpdaterGraphStepsTrainLikeEagerSteps) {
  manual_seed(7);
  std::vector<Example> data;
  for (int i = 0; i < 30; ++i) {
    data.push_back({Array::uniform({6}, -1, 1, float32, Device::cpu()),
                    Array::full({}, i % 3, int32, Device::cpu())});
  }
  auto make = [&](bool graph, std::shared_ptr<links::Classifier>& model) {
    manual_seed(11);
    model = std::make_shared<links::Classifier>(std::make_shared<TwoLayer>());
    model->to_device(gpu());
    auto adam = std::make_shared<optimizers::Adam>();
    adam->setup(model);
    auto updater = std::make_shared<training::StandardUpdater>(std::make_shared<AlternatingIterator>(data), adam, gpu());
    updater->set_use_cuda_graph(graph);
    return updater;
  };
  std::shared_ptr<links::Classifier> graph_model, eager_model;
  auto graph_updater = make(true, graph_model);
  auto eager_updater = make(false, eager_model);
  Reporter reporter;
  reporter.add_observer("main", graph_model.get());
  reporter.add_observer("main", eager_model.get());
  for (int it = 0; it < 8; ++it) {
    Observation graph_obs, eager_obs;
    {
      ReporterScope scope(reporter, graph_obs);
      graph_updater->update();
    }
    {
      ReporterScope scope(reporter, eager_obs);
      eager_updater->update();
    }
    for (const char* key : {"main/loss", "main/accuracy"}) {
      ASSERT_TRUE(graph_obs.count(key)) << key << " iteration " << it;
      EXPECT_NEAR(graph_obs.at(key).item<double>(), eager_obs.at(key).item<double>(), 1e-5)
          << key << " iteration " << it;
    }
  }
  // Iterations 0 and 1 ran eagerly (one per batch shape), the six others from recordings.
  EXPECT_EQ(graph_updater->graph_replays(), 6);
  auto a = graph_model->namedparams();
  auto b = eager_model->namedparams();
  for (size_t i = 0; i < a.size(); ++i) {
    const std::vector<float> pa = host(a[i].second.data()), pb = host(b[i].second.data());
    for (size_t j = 0; j < pa.size(); ++j) EXPECT_NEAR(pa[j], pb[j], 1e-5) << a[i].first;
  }
}

TEST_F(CudaGraph, CpuDeviceIsRefused) {
  cuda::Graph graph;
  EXPECT_THROW(graph.capture(Device::cpu(), [] {}), DeviceError);
}

}  // namespace
}  // namespace kusari
