// Multi-process tests of sharded data parallelism: reduce_scatter and all_gather, the shard
// layout, and the sharded multi-node optimizer (ZeRO stages 1, 2 and 3) against the unsharded one,
// its state per process, its snapshots on another number of processes, and its refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "kusari/functions.h"
#include "kusari/links/linear.h"
#include "kusari/mn.h"
#include "kusari/optimizers/adam.h"
#include "kusari/optimizers/hooks.h"
#include "kusari/optimizers/lamb.h"
#include "kusari/optimizers/lars.h"
#include "kusari/optimizers/sgd.h"
#include "kusari/serializers/npz.h"
#include "mn/reduce/sharded_update.h"
#include "mn_test_util.h"
#include "test_util.h"

namespace kusari::mn {
namespace {

namespace F = functions;
using testing::ArraysClose;
using testing::ThrowsWith;

// --- layout ------------------------------------------------------------------------------------

TEST(ShardLayout, EvenCutsAndWholeParameters) {
  // 4 parameters of 10 elements over 4 processes: cuts at 10, 20, 30 (parameter edges).
  EXPECT_EQ(detail::shard_bounds({10, 10, 10, 10}, {true, true, true, true}, 4),
            (std::vector<int64_t>{0, 10, 20, 30, 40}));
  // 3 processes over 40 splittable elements: 13, 26 (cuts inside parameters).
  EXPECT_EQ(detail::shard_bounds({10, 10, 10, 10}, {true, true, true, true}, 3),
            (std::vector<int64_t>{0, 13, 26, 40}));
  // Unsplittable: 13 moves to 10 (nearer), 26 to 30 (nearer).
  EXPECT_EQ(detail::shard_bounds({10, 10, 10, 10}, {false, false, false, false}, 3),
            (std::vector<int64_t>{0, 10, 30, 40}));
  // One large parameter that cannot be cut: every cut falls at one of its edges, shards may be empty.
  EXPECT_EQ(detail::shard_bounds({2, 100, 2}, {true, false, true}, 3), (std::vector<int64_t>{0, 2, 102, 104}));
  // More processes than elements: empty shards, still ordered and covering.
  EXPECT_EQ(detail::shard_bounds({2}, {true}, 4), (std::vector<int64_t>{0, 0, 1, 1, 2}));
  EXPECT_EQ(detail::shard_bounds({}, {}, 2), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_TRUE(ThrowsWith<ValueError>([] { detail::shard_bounds({1}, {true}, 0); }, {"shard_bounds", "0"}));
}

// --- collectives -------------------------------------------------------------------------------

TEST(ReduceScatter, SumsAndScattersBlocksOfTheFirstAxis) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), n = comm->size();
  for (const char* pieces : {"", "5"}) {  // whole, and cut into pieces of 5 / n elements per rank
    if (*pieces) setenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS", pieces, 1);
    // x[i, j] = (r + 1) * (10 i + j): the sum over ranks is n (n + 1) / 2 * (10 i + j).
    Array x = (Array::arange(static_cast<int64_t>(2 * n * 7), Dtype::kFloat64).reshape({2 * n, 7}) * (r + 1.0));
    Array base = Array::arange(static_cast<int64_t>(2 * n * 7), Dtype::kFloat64).reshape({2 * n, 7});
    Array y = comm->reduce_scatter(x);
    ASSERT_EQ(y.shape(), (Shape{2, 7}));
    EXPECT_TRUE(array_equal(y, base.at({Slice(2 * r, 2 * r + 2)}) * (n * (n + 1) / 2.0))) << pieces;
    Array m = comm->reduce_scatter(x.astype(Dtype::kFloat32), ReduceOp::kMean);
    EXPECT_TRUE(ArraysClose(m, (base.at({Slice(2 * r, 2 * r + 2)}) * ((n + 1) / 2.0)).astype(Dtype::kFloat32)));
    Array g = comm->all_gather(Array::full({3}, r, Dtype::kInt64));
    ASSERT_EQ(g.shape(), (Shape{3 * n}));
    for (int k = 0; k < 3 * n; ++k) EXPECT_EQ(g.at({k}).item<int64_t>(), k / 3);
    Array h = comm->all_gather(Array::full({}, r + 0.5, Dtype::kBFloat16));
    ASSERT_EQ(h.shape(), (Shape{n}));
    EXPECT_EQ(h.astype(Dtype::kFloat32).at({n - 1}).item<float>(), n - 0.5f);
    unsetenv("KUSARI_MN_MAX_MESSAGE_ELEMENTS");
  }
}

TEST(ReduceScatter, RefusesBadShapesWithAClearError) {
  auto comm = create_communicator("naive");
  const int n = comm->size();
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { comm->reduce_scatter(Array::ones({2 * n + 1}, float32)); },
                                     {"reduce_scatter", "multiple", "processes"}));
  // Ranks that disagree all get the error naming both shapes.
  const int64_t rows = comm->rank() == 0 ? n : 2 * n;
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { comm->all_gather(Array::ones({rows}, float32)); },
                                     {"all_gather", "same shape", "rank"}));
}

// --- the sharded optimizer -----------------------------------------------------------------------

/// Three layers of odd sizes (85 + 70 + 18 + 6 + ... parameters: cuts fall inside them).
class Mlp : public Chain {
 public:
  Mlp() {
    l1 = add_link("l1", std::make_shared<links::Linear>(7, 11));
    l2 = add_link("l2", std::make_shared<links::Linear>(11, 6));
    l3 = add_link("l3", std::make_shared<links::Linear>(6, 3));
  }
  Variable forward(const Variable& x) override { return (*l3)(F::tanh((*l2)(F::tanh((*l1)(x))))); }
  std::shared_ptr<links::Linear> l1, l2, l3;
};

/// This rank's batch of step `step`: different on every rank and step.
std::pair<Array, Array> batch(int rank, int step) {
  Array i = Array::arange(int64_t{5 * 7}, Dtype::kFloat32).reshape({5, 7});
  Array x = sin(i * (0.3 + 0.1 * rank) + step);
  Array t = cos(Array::arange(int64_t{5 * 3}, Dtype::kFloat32).reshape({5, 3}) * (0.7 + 0.05 * step) + rank);
  return {x, t};
}

std::shared_ptr<Optimizer> make_optimizer(const std::string& name) {
  if (name == "adam") {
    auto o = std::make_shared<optimizers::Adam>(0.01);
    o->add_hook(std::make_shared<optimizers::GradientClipping>(0.05));  // (active: global norms exceed it)
    return o;
  }
  if (name == "adamw") {
    auto o = std::make_shared<optimizers::AdamW>(0.01, 0.9, 0.999, 1e-8, 1.0, 0.1);
    o->set_hyperparam_where("weight_decay_rate", 0.0, optimizers::is_bias_or_norm);
    return o;
  }
  if (name == "momentum") {
    auto o = std::make_shared<optimizers::MomentumSGD>(0.05);
    o->add_hook(std::make_shared<optimizers::WeightDecay>(1e-3));
    return o;
  }
  if (name == "scaled") {  // a loss scale to undo, and a step proportional to the gradient
    auto o = std::make_shared<optimizers::MomentumSGD>(0.05);
    o->set_loss_scale(16);
    return o;
  }
  if (name == "lars") return std::make_shared<optimizers::LARS>(optimizers::LARSOptions{.lr = 0.1});
  return std::make_shared<optimizers::LAMB>(optimizers::LAMBOptions{.lr = 0.01});
}

/// Trains `model` for `steps` updates (the first only broadcasts) with `opt`.
void train(Optimizer& opt, Mlp& model, int rank, int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s) {
    auto [x, t] = batch(rank, s);
    opt.update([&] { return F::mean_squared_error(model(Variable(x)), Variable(t)); });
  }
}

bool same_everywhere(Communicator& comm, const Array& a) {
  const std::vector<Array> all = comm.allgather(a);
  for (const Array& x : all) {
    if (!array_equal(x, all[0])) return false;
  }
  return true;
}

using ShardCase = std::tuple<int, std::string, std::string>;  // stage, optimizer, communicator

class ShardedOptimizerTest : public ::testing::TestWithParam<ShardCase> {};

/// Trains a sharded and an unsharded optimizer alike and compares the parameters.
void expect_equal_to_unsharded(int stage, const std::string& opt_name, const std::string& comm_name,
                               int64_t bucket_bytes, bool overlap = false) {
  auto comm = create_communicator(comm_name);
  auto reference = std::make_shared<Mlp>();
  auto sharded = std::make_shared<Mlp>();
  sharded->copyparams(*reference);
  auto ref_opt = create_multi_node_optimizer(make_optimizer(opt_name), comm, MultiNodeOptimizerOptions{});
  MultiNodeOptimizerOptions o;
  o.zero_stage = stage;
  o.bucket_bytes = bucket_bytes;
  o.overlap = overlap;
  auto opt = create_multi_node_optimizer(make_optimizer(opt_name), comm, o);
  ref_opt->setup(reference);
  opt->setup(sharded);
  train(*ref_opt, *reference, comm->rank(), 0, 6);
  train(*opt, *sharded, comm->rank(), 0, 6);
  // Exact where the sums are taken in the same order: stage 1 always, stage 2 on 2 processes.
  const bool exact = stage == 1 || comm->size() == 2;
  auto ref_params = reference->namedparams();
  auto params = sharded->namedparams();
  ASSERT_EQ(ref_params.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Array& a = params[i].second.data();
    const Array& b = ref_params[i].second.data();
    if (exact) {
      EXPECT_TRUE(array_equal(a, b)) << params[i].first << " stage " << stage << " " << opt_name;
    } else {
      EXPECT_TRUE(ArraysClose(a, b, 1e-5, 1e-6)) << params[i].first << " stage " << stage << " " << opt_name;
    }
    EXPECT_TRUE(same_everywhere(*comm, a)) << params[i].first;
  }
  EXPECT_EQ(opt->t(), ref_opt->t());
  auto& mn_opt = dynamic_cast<MultiNodeOptimizer&>(*opt);
  const ShardStats stats = mn_opt.shard_stats();
  EXPECT_EQ(stats.stage, stage);
  EXPECT_EQ(stats.total_elements, sharded->count_params());
  if (stage >= 2) {
    for (auto& [path, p] : params) EXPECT_FALSE(p.grad().defined()) << path << ": stage 2 drops the gradients";
  }
}

TEST_P(ShardedOptimizerTest, EqualsTheUnshardedOptimizer) {
  const auto& [stage, opt_name, comm_name] = GetParam();
  expect_equal_to_unsharded(stage, opt_name, comm_name, int64_t{25} << 20);
}

TEST(ShardedOptimizer, SmallChunksCrossParametersAndShards) {
  // 9 float32 per chunk: chunks end inside parameters and inside shards.
  expect_equal_to_unsharded(2, "adam", "naive", 36);
  expect_equal_to_unsharded(1, "momentum", "flat", 36);
  expect_equal_to_unsharded(3, "adam", "naive",
                            36);  // (units of 9 or more: gathered and prefetched apart)
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [] {
        create_multi_node_optimizer(make_optimizer("adam"), create_communicator("naive"),
                                    MultiNodeOptimizerOptions{.bucket_bytes = 0, .zero_stage = 1});
      },
      {"bucket_bytes", "positive", "0"}));
}

TEST(ShardedOptimizer, Stage2OverlappedWithBackwardEqualsTheUnshardedOptimizer) {
  // Whole chunks (one per group), and 9 float32 per chunk (many chunks, launched from the hooks
  // while backward runs), with every kind of optimizer the step after backward takes.
  for (const char* opt : {"adam", "scaled", "lamb"}) {
    expect_equal_to_unsharded(2, opt, "naive", int64_t{25} << 20, true);
    expect_equal_to_unsharded(2, opt, "flat", 36, true);
  }
}

TEST(ShardedOptimizer, Stage2OverlappedDropsEachGradientOnceSent) {
  auto comm = create_communicator("naive");
  auto reference = std::make_shared<Mlp>();
  auto model = std::make_shared<Mlp>();
  model->copyparams(*reference);
  auto ref_opt = create_multi_node_optimizer(make_optimizer("adam"), comm, MultiNodeOptimizerOptions{});
  MultiNodeOptimizerOptions o;
  o.zero_stage = 2;
  o.overlap = true;
  o.bucket_bytes = 40;
  auto opt = create_multi_node_optimizer(make_optimizer("adam"), comm, o);
  ref_opt->setup(reference);
  opt->setup(model);
  train(*ref_opt, *reference, comm->rank(), 0, 1);  // (the first update only broadcasts)
  train(*opt, *model, comm->rank(), 0, 1);
  for (int s = 1; s < 4; ++s) {
    auto [x, t] = batch(comm->rank(), s);
    model->cleargrads();
    Variable loss = F::mean_squared_error((*model)(Variable(x)), Variable(t));
    loss.backward();
    // The first chunks went out during backward, and the gradients they hold whole with them:
    // l3's bias (finished first, 3 elements) lies in the first chunk of 10; the chunks beyond two
    // in flight may wait for the update, with their gradients.
    EXPECT_FALSE(model->l3->b.grad().defined()) << "step " << s;
    int64_t kept = 0;
    for (auto& [path, p] : model->namedparams()) kept += p.grad().defined() ? p.grad().size() : 0;
    EXPECT_LT(kept, model->count_params()) << "step " << s;
    opt->update();
    for (auto& [path, p] : model->namedparams()) EXPECT_FALSE(p.grad().defined()) << path << " step " << s;
    ref_opt->update([&] { return F::mean_squared_error((*reference)(Variable(x)), Variable(t)); });
  }
  auto a = model->namedparams(), b = reference->namedparams();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(ArraysClose(a[i].second.data(), b[i].second.data(), 1e-5, 1e-6)) << a[i].first;
  }
  // Accumulating over several backward calls goes through update_accumulated (which holds the
  // chunks until the last); a gradient finished again after it was sent is refused.
  auto [x, t] = batch(comm->rank(), 9);
  opt->update_accumulated(3, [&](int64_t) { return F::mean_squared_error((*model)(Variable(x)), Variable(t)); });
  ref_opt->update_accumulated(3, [&](int64_t) { return F::mean_squared_error((*reference)(Variable(x)), Variable(t)); });
  a = model->namedparams();
  b = reference->namedparams();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(ArraysClose(a[i].second.data(), b[i].second.data(), 1e-5, 1e-6)) << a[i].first << " accumulated";
  }
  model->cleargrads();
  F::mean_squared_error((*model)(Variable(x)), Variable(t)).backward();
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { F::mean_squared_error((*model)(Variable(x)), Variable(t)).backward(); },
      {"zero_stage 2, overlap", "finished again after it was sent", "update_accumulated"}));
}

INSTANTIATE_TEST_SUITE_P(
    Stages, ShardedOptimizerTest,
    ::testing::Values(ShardCase{1, "adam", "naive"}, ShardCase{2, "adam", "naive"},
                      ShardCase{1, "adamw", "flat"}, ShardCase{2, "adamw", "flat"},
                      ShardCase{2, "momentum", "naive"}, ShardCase{1, "scaled", "naive"},
                      ShardCase{2, "scaled", "flat"}, ShardCase{1, "lars", "naive"},
                      ShardCase{2, "lamb", "flat"}, ShardCase{3, "adam", "naive"},
                      ShardCase{3, "momentum", "flat"}, ShardCase{3, "scaled", "naive"},
                      ShardCase{3, "lamb", "flat"}),
    [](const auto& info) {
      return "stage" + std::to_string(std::get<0>(info.param)) + "_" + std::get<1>(info.param) + "_" +
             std::get<2>(info.param);
    });

TEST(ShardedOptimizer, MixedPrecisionKeepsFloat32MasterCopiesOfTheShardOnly) {
  // bfloat16 parameters stepped through float32 master copies (use_fp32_update), with a fixed
  // loss scale: equal to the unsharded optimizer, and each process holds the masters of its shard.
  auto comm = create_communicator("naive");
  for (int stage : {1, 2}) {
    auto reference = std::make_shared<Mlp>();
    reference->to_dtype(Dtype::kBFloat16);
    auto sharded = std::make_shared<Mlp>();
    sharded->to_dtype(Dtype::kBFloat16);
    sharded->copyparams(*reference);
    auto make = [] {
      auto adam = std::make_shared<optimizers::Adam>(0.01);
      adam->use_fp32_update();
      adam->set_loss_scale(64);
      return adam;
    };
    auto ref_opt = create_multi_node_optimizer(make(), comm, MultiNodeOptimizerOptions{});
    auto opt = create_multi_node_optimizer(make(), comm, MultiNodeOptimizerOptions{.zero_stage = stage});
    ref_opt->setup(reference);
    opt->setup(sharded);
    for (int s = 0; s < 5; ++s) {
      auto [x, t] = batch(comm->rank(), s);
      ref_opt->update([&] {
        return F::mean_squared_error((*reference)(Variable(x.astype(Dtype::kBFloat16))), Variable(t.astype(Dtype::kBFloat16)));
      });
      opt->update([&] {
        return F::mean_squared_error((*sharded)(Variable(x.astype(Dtype::kBFloat16))), Variable(t.astype(Dtype::kBFloat16)));
      });
    }
    auto pa = sharded->namedparams();
    auto pb = reference->namedparams();
    for (size_t i = 0; i < pa.size(); ++i) {
      ASSERT_EQ(pa[i].second.dtype(), Dtype::kBFloat16);
      if (stage == 1 || comm->size() == 2) {
        EXPECT_TRUE(array_equal(pa[i].second.data(), pb[i].second.data())) << pa[i].first << " stage " << stage;
      } else {
        EXPECT_TRUE(ArraysClose(pa[i].second.data().astype(float32), pb[i].second.data().astype(float32), 1e-2, 1e-3))
            << pa[i].first << " stage " << stage;
      }
    }
    int64_t masters = 0;
    for (ParamState& s : opt->param_states()) {
      if (const Array* m = s.find("master")) {
        EXPECT_EQ(m->dtype(), float32);
        masters += m->size();
      }
    }
    EXPECT_EQ(masters, dynamic_cast<MultiNodeOptimizer&>(*opt).shard_stats().shard_elements) << "stage " << stage;
    EXPECT_EQ(comm->allreduce_obj(masters, ReduceOp::kSum), sharded->count_params());
  }
}

TEST(ShardedOptimizer, HoldsTheStateOfItsShardOnly) {
  auto comm = create_communicator("naive");
  auto model = std::make_shared<Mlp>();
  MultiNodeOptimizerOptions o;
  o.zero_stage = 1;
  auto opt = create_multi_node_optimizer(std::make_shared<optimizers::Adam>(), comm, o);
  opt->setup(model);
  train(*opt, *model, comm->rank(), 0, 2);
  int64_t mine = 0;
  for (ParamState& s : opt->param_states()) {
    for (auto& [name, a] : s.arrays) mine += a.size();
  }
  const int64_t total = model->count_params();
  const auto stats = dynamic_cast<MultiNodeOptimizer&>(*opt).shard_stats();
  // Adam keeps m and v: twice the shard, which is an n-th of the parameters (rounded).
  EXPECT_EQ(mine, 2 * stats.shard_elements);
  EXPECT_LE(stats.shard_elements, total / comm->size() + 1);
  EXPECT_EQ(comm->allreduce_obj(mine, ReduceOp::kSum), 2 * total);
  if (comm->size() > 1) EXPECT_GT(stats.split_parameters, 0);
}

/// The optimizer's state as saved: key -> a copy of the array.
std::map<std::string, Array> saved_state(Optimizer& opt) {
  DictionarySerializer s;
  opt.serialize(s);
  std::map<std::string, Array> out;
  for (const auto& [key, value] : s.target()) out[key] = value.copy();
  return out;
}

/// A folder every rank sees: rank 0 makes it and tells the others; removed at the end.
class SharedFolder {
 public:
  explicit SharedFolder(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {
    std::string made;
    if (comm_->rank() == 0) {
      std::string templ = (std::filesystem::temp_directory_path() / "kusari_sharding_XXXXXX").string();
      if (::mkdtemp(templ.data())) made = templ;
    }
    const Bytes name = comm_->bcast_obj(Bytes(made.begin(), made.end()), 0);
    path_ = std::string(name.begin(), name.end());
  }
  ~SharedFolder() {
    comm_->barrier();
    if (comm_->rank() == 0 && !path_.empty()) std::filesystem::remove_all(path_);
  }
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  bool made() const { return !path_.empty(); }

 private:
  std::shared_ptr<Communicator> comm_;
  std::string path_;
};

/// Trains a sharded (zero_stage 2) and an unsharded Adam for 4 steps on the first `n` processes;
/// the sharded one's processes save their files "sharded.<r>", rank 0 the unsharded state "whole".
void save_sharded_run(Communicator& world, const SharedFolder& folder, int n) {
  auto sub = world.split(world.rank() < n ? 0 : 1, world.rank());
  if (world.rank() >= n) return;
  auto reference = std::make_shared<Mlp>();
  auto sharded = std::make_shared<Mlp>();
  sharded->copyparams(*reference);
  auto ref_opt = create_multi_node_optimizer(make_optimizer("adam"), sub, MultiNodeOptimizerOptions{});
  auto opt = create_multi_node_optimizer(make_optimizer("adam"), sub, MultiNodeOptimizerOptions{.zero_stage = 2});
  ref_opt->setup(reference);
  opt->setup(sharded);
  train(*ref_opt, *reference, sub->rank(), 0, 4);
  train(*opt, *sharded, sub->rank(), 0, 4);
  save_npz(folder.file("sharded." + std::to_string(sub->rank())), *opt);  // (local: no communication)
  if (sub->rank() == 0) {
    save_npz(folder.file("whole"), *ref_opt);
    save_npz(folder.file("model"), *reference);
  }
}

TEST(ShardedOptimizer, SnapshotFilesHoldTheShardOnlyAndLoadOnEveryNumberOfProcesses) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), world = comm->size();
  for (int n = 1; n <= world; ++n) {
    SharedFolder folder(comm);
    ASSERT_TRUE(folder.made());
    save_sharded_run(*comm, folder, n);
    comm->barrier();
    std::vector<std::string> files;
    for (int q = 0; q < n; ++q) files.push_back(folder.file("sharded." + std::to_string(q)));
    if (r < n) {
      // A file holds its shard's state only: Adam's m and v of about 1/n of the parameters.
      NpzFile mine(files[static_cast<size_t>(r)]);
      int64_t elements = 0;
      for (const std::string& key : mine.keys()) {
        if (key.ends_with("/m") || key.ends_with("/v")) elements += mine.get(key).size();
      }
      EXPECT_LE(elements, 2 * (Mlp().count_params() / n + 1)) << n << " processes";
    }
    for (int m = 1; m <= world; ++m) {
      SCOPED_TRACE(::testing::Message() << "saved by " << n << " processes, loaded by " << m);
      auto sub = comm->split(r < m ? 0 : 1, r);
      if (r >= m) continue;
      auto model_of = [&] {
        auto model = std::make_shared<Mlp>();
        load_npz(folder.file("model"), *model);
        return model;
      };
      auto a = model_of(), b = model_of(), c = model_of();
      auto opt_a = create_multi_node_optimizer(make_optimizer("adam"), sub, MultiNodeOptimizerOptions{.zero_stage = 2});
      auto opt_b = create_multi_node_optimizer(make_optimizer("adam"), sub, MultiNodeOptimizerOptions{});
      auto opt_c = create_multi_node_optimizer(make_optimizer("adam"), sub, MultiNodeOptimizerOptions{});
      opt_a->setup(a);
      opt_b->setup(b);
      opt_c->setup(c);
      load_snapshot_files(files, *opt_a, sub->rank() % n);  // sharded: only this process's pieces
      load_snapshot_files(files, *opt_b, sub->rank() % n);  // unsharded: the whole state
      load_npz(folder.file("whole"), *opt_c);               // the unsharded run's own state
      // The sharded optimizer laid its shards out at the load and holds only their state.
      const ShardStats stats = dynamic_cast<MultiNodeOptimizer&>(*opt_a).shard_stats();
      ASSERT_GT(stats.total_elements, 0);
      int64_t held = 0;
      for (ParamState& st : opt_a->param_states()) {
        for (auto& [name, arr] : st.arrays) held += arr.size();
      }
      EXPECT_EQ(held, 2 * stats.shard_elements);
      // The whole state put together equals the unsharded run's (stage 2 sums in another order on
      // 3 or more processes: within rounding).
      const auto state_b = saved_state(*opt_b);
      const auto state_c = saved_state(*opt_c);
      ASSERT_EQ(state_b.size(), state_c.size());
      for (const auto& [key, value] : state_c) {
        ASSERT_TRUE(state_b.count(key)) << key;
        EXPECT_TRUE(ArraysClose(state_b.at(key), value, 1e-5, 1e-7)) << key;
      }
      for (auto* o : {opt_a.get(), opt_b.get(), opt_c.get()}) {
        dynamic_cast<MultiNodeOptimizer&>(*o).mark_parameters_synchronized();
      }
      train(*opt_a, *a, sub->rank(), 10, 2);
      train(*opt_b, *b, sub->rank(), 10, 2);
      train(*opt_c, *c, sub->rank(), 10, 2);
      EXPECT_EQ(opt_a->t(), 5);  // (3 steps saved, then two)
      auto pa = a->namedparams(), pb = b->namedparams(), pc = c->namedparams();
      for (size_t i = 0; i < pa.size(); ++i) {
        EXPECT_TRUE(ArraysClose(pa[i].second.data(), pc[i].second.data(), 1e-5, 1e-6)) << pa[i].first;
        EXPECT_TRUE(ArraysClose(pb[i].second.data(), pc[i].second.data(), 1e-5, 1e-6)) << pb[i].first;
      }
    }
    comm->barrier();
  }
}

TEST(ShardedOptimizer, ALoneFileOfASetIsRefusedAndASetMergesIntoOneFile) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), n = comm->size();
  SharedFolder folder(comm);
  ASSERT_TRUE(folder.made());
  save_sharded_run(*comm, folder, n);
  comm->barrier();
  std::vector<std::string> files;
  for (int q = 0; q < n; ++q) files.push_back(folder.file("sharded." + std::to_string(q)));
  const std::string mine = files[static_cast<size_t>(r)];
  // An unsharded optimizer cannot take one process's part.
  auto plain = std::make_shared<optimizers::Adam>();
  auto model = std::make_shared<Mlp>();
  load_npz(folder.file("model"), *model);
  plain->setup(model);
  EXPECT_TRUE(ThrowsWith<IOError>([&] { load_npz(mine, *plain); },
                                  {"Adam", "one process's part", "load_snapshot_files", "merge_snapshot_files"}));
  // The sharded optimizer of the same rank and cut reads its own file directly (an autoload on as
  // many processes); on another cut (one process fewer) it is told to load the set.
  auto same = create_multi_node_optimizer(make_optimizer("adam"), comm, MultiNodeOptimizerOptions{.zero_stage = 1});
  same->setup(model);
  load_npz(mine, *same);
  EXPECT_EQ(same->t(), 3);
  if (n > 1) {
    auto sub = comm->split(r < n - 1 ? 0 : 1, r);
    if (r < n - 1) {
      auto other = std::make_shared<Mlp>();
      other->copyparams(*model);
      auto fewer = create_multi_node_optimizer(make_optimizer("adam"), sub, MultiNodeOptimizerOptions{.zero_stage = 2});
      fewer->setup(other);
      EXPECT_TRUE(ThrowsWith<IOError>([&] { load_npz(mine, *fewer); },
                                      {"part of rank", std::to_string(n) + " processes", "load_newest_snapshot_set"}));
    }
  }
  // Fewer files than processes that wrote them: named.
  if (n > 1) {
    EXPECT_TRUE(ThrowsWith<IOError>([&] { load_snapshot_files({files[0]}, *plain); },
                                    {"load_snapshot_files", std::to_string(n) + " processes", "1 files"}));
  }
  // Merged into one unsharded file, the state equals the unsharded run's and loads with load_npz.
  if (r == 0) {
    const std::string merged = folder.file("merged.npz");
    merge_snapshot_files(files, merged);
    NpzFile f(merged);
    for (const std::string& key : f.keys()) EXPECT_EQ(key.find("mn_shard_layout"), std::string::npos) << key;
    auto from_merged = std::make_shared<optimizers::Adam>();
    auto whole = std::make_shared<optimizers::Adam>();
    auto m1 = std::make_shared<Mlp>(), m2 = std::make_shared<Mlp>();
    from_merged->setup(m1);
    whole->setup(m2);
    load_npz(merged, *from_merged);
    load_npz(folder.file("whole"), *whole);
    const auto a = saved_state(*from_merged), b = saved_state(*whole);
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [key, value] : b) {
      ASSERT_TRUE(a.count(key)) << key;
      EXPECT_TRUE(ArraysClose(a.at(key), value, 1e-5, 1e-7)) << key;
    }
  }
}

TEST(ShardedOptimizer, EveryProcessSkipsTheSameOverflowingStep) {
  auto comm = create_communicator("naive");
  auto model = std::make_shared<Mlp>();
  auto adam = std::make_shared<optimizers::Adam>(0.01);
  adam->loss_scaling();  // dynamic
  auto opt = create_multi_node_optimizer(adam, comm, MultiNodeOptimizerOptions{.zero_stage = 2});
  opt->setup(model);
  train(*opt, *model, comm->rank(), 0, 2);
  const double scale = opt->loss_scale();
  const Array before = model->l3->W.data().copy();
  // Only the last rank's gradient of l1/W (the first shard's) overflows.
  auto [x, t] = batch(comm->rank(), 3);
  Variable loss = F::mean_squared_error((*model)(Variable(x)), Variable(t));
  model->cleargrads();
  loss.backward();
  if (comm->rank() == comm->size() - 1) {
    Array g = model->l1->W.grad();
    g.assign(Array::full(g.shape(), std::numeric_limits<double>::infinity(), float32));
  }
  opt->update();
  EXPECT_TRUE(array_equal(model->l3->W.data(), before)) << "the step must be skipped on every process";
  EXPECT_EQ(opt->loss_scale(), scale / 2);
  EXPECT_TRUE(same_everywhere(*comm, Array::full({}, opt->loss_scale(), Dtype::kFloat64)));
}

// --- stage 3: sharded parameters
// ------------------------------------------------------------------

/// The elements of `model`'s parameters whose data is their values (not a released placeholder).
int64_t whole_elements_of(Link& model) {
  int64_t n = 0;
  for (auto& [path, p] : model.namedparams()) n += p.impl().source == nullptr ? p.size() : 0;
  return n;
}

TEST(ShardedParameters, Stage3EqualsStage2BitForBitAndHoldsTheShardBetweenSteps) {
  auto comm = create_communicator("naive");
  auto model2 = std::make_shared<Mlp>();
  auto model3 = std::make_shared<Mlp>();
  model3->copyparams(*model2);
  auto opt2 = create_multi_node_optimizer(
      make_optimizer("adam"), comm,
      MultiNodeOptimizerOptions{.overlap = true, .bucket_bytes = 40, .zero_stage = 2});
  auto opt3 = create_multi_node_optimizer(
      make_optimizer("adam"), comm, MultiNodeOptimizerOptions{.bucket_bytes = 40, .zero_stage = 3});
  opt2->setup(model2);
  opt3->setup(model3);
  auto& mn3 = dynamic_cast<MultiNodeOptimizer&>(*opt3);
  const int64_t total = model3->count_params();
  for (int s = 0; s < 6; ++s) {
    auto [x, t] = batch(comm->rank(), s);
    opt2->update([&] { return F::mean_squared_error((*model2)(Variable(x)), Variable(t)); });
    int64_t whole_after_forward = -1;
    opt3->update([&] {
      Variable loss = F::mean_squared_error((*model3)(Variable(x)), Variable(t));
      whole_after_forward = whole_elements_of(*model3);
      return loss;
    });
    // Between steps no parameter is whole; after forward only the last groups gathered are.
    EXPECT_EQ(whole_elements_of(*model3), 0) << "step " << s;
    EXPECT_EQ(mn3.shard_stats().whole_elements, 0) << "step " << s;
    if (s > 0) EXPECT_LT(whole_after_forward, total) << "step " << s;
  }
  const ShardStats stats = mn3.shard_stats();
  EXPECT_EQ(stats.stage, 3);
  EXPECT_GT(stats.units, 2);  // (40 bytes: several groups of parameters)
  EXPECT_GT(stats.gathers, 5 * stats.units);
  EXPECT_GT(stats.prefetched, 0) << "the order of the last step predicts the next gathers";
  // Reading a released parameter gathers it (collectively): the same values as stage 2's, bit for
  // bit.
  auto p2 = model2->namedparams(), p3 = model3->namedparams();
  for (size_t i = 0; i < p3.size(); ++i) {
    EXPECT_TRUE(array_equal(p3[i].second.data(), p2[i].second.data())) << p3[i].first;
    EXPECT_TRUE(same_everywhere(*comm, p3[i].second.data())) << p3[i].first;
  }
  // The shape, dtype and size of a released parameter need no gather.
  opt3->update([&] {
    auto [x, t] = batch(comm->rank(), 7);
    return F::mean_squared_error((*model3)(Variable(x)), Variable(t));
  });
  const int64_t gathers = mn3.shard_stats().gathers;
  EXPECT_EQ(model3->count_params(), total);
  EXPECT_EQ(model3->l1->W.shape(), (Shape{11, 7}));
  EXPECT_EQ(mn3.shard_stats().gathers, gathers);
}

TEST(ShardedParameters, ValuesSetInPlaceAreKeptAndSummonedParametersAreReadableByOneProcess) {
  auto comm = create_communicator("flat");
  auto reference = std::make_shared<Mlp>();
  auto model = std::make_shared<Mlp>();
  model->copyparams(*reference);
  auto ref_opt =
      create_multi_node_optimizer(make_optimizer("momentum"), comm, MultiNodeOptimizerOptions{});
  auto opt =
      create_multi_node_optimizer(make_optimizer("momentum"), comm,
                                  MultiNodeOptimizerOptions{.bucket_bytes = 48, .zero_stage = 3});
  ref_opt->setup(reference);
  opt->setup(model);
  train(*ref_opt, *reference, comm->rank(), 0, 3);
  train(*opt, *model, comm->rank(), 0, 3);
  // Set in place on every process while whole (as a loaded snapshot is): kept after release.
  for (auto* m : {reference.get(), model.get()}) {
    Array w = m->l2->W.data();
    w.fill(0.25);
  }
  train(*ref_opt, *reference, comm->rank(), 3, 2);
  train(*opt, *model, comm->rank(), 3, 2);
  auto a = model->namedparams(), b = reference->namedparams();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(ArraysClose(a[i].second.data(), b[i].second.data(), 1e-5, 1e-6)) << a[i].first;
  }
  // Summoned whole on every process, the parameters may be read by one process alone.
  auto& mn = dynamic_cast<MultiNodeOptimizer&>(*opt);
  mn.summon_full_parameters();
  EXPECT_EQ(mn.shard_stats().whole_elements, model->count_params());
  if (comm->rank() == 0) {
    for (auto& [path, p] : model->namedparams())
      EXPECT_TRUE(std::isfinite(sum(p.data()).item<double>())) << path;
  }
  comm->barrier();
  // A released parameter cannot be replaced, and outlives its optimizer with a clear error.
  train(*opt, *model, comm->rank(), 5, 1);
  EXPECT_TRUE(ThrowsWith<ValueError>([&] { model->l1->b.set_data(Array::zeros({11})); },
                                     {"set_data", "zero_stage 3", "assign"}));
  opt.reset();
  EXPECT_TRUE(
      ThrowsWith<ValueError>([&] { (void)model->l1->W.data(); },
                             {"zero_stage 3", "no longer exists", "summon_full_parameters"}));
}

TEST(ShardedParameters, Stage3SnapshotsLoadOnAnotherNumberOfProcesses) {
  auto comm = create_communicator("naive");
  const int r = comm->rank(), world = comm->size();
  SharedFolder folder(comm);
  ASSERT_TRUE(folder.made());
  {
    auto model = std::make_shared<Mlp>();
    auto opt =
        create_multi_node_optimizer(make_optimizer("adam"), comm,
                                    MultiNodeOptimizerOptions{.bucket_bytes = 64, .zero_stage = 3});
    opt->setup(model);
    train(*opt, *model, r, 0, 4);
    save_npz(folder.file("sharded." + std::to_string(r)), *opt);  // (the optimizer's pieces: local)
    save_npz(folder.file("model." + std::to_string(r)),
             *model);  // (reads every parameter: collective)
    dynamic_cast<MultiNodeOptimizer&>(*opt).summon_full_parameters();
    if (r == 0) save_npz(folder.file("model"), *model);  // (one process alone, once summoned)
  }
  comm->barrier();
  std::vector<std::string> files;
  for (int q = 0; q < world; ++q) files.push_back(folder.file("sharded." + std::to_string(q)));
  EXPECT_TRUE(array_equal(NpzFile(folder.file("model." + std::to_string(r))).get("l1/W"),
                          NpzFile(folder.file("model")).get("l1/W")));
  for (int m = 1; m <= world; ++m) {
    SCOPED_TRACE(::testing::Message() << "saved by " << world << " processes, loaded by " << m);
    auto sub = comm->split(r < m ? 0 : 1, r);
    if (r >= m) continue;
    auto a = std::make_shared<Mlp>(), c = std::make_shared<Mlp>();
    load_npz(folder.file("model"), *a);
    load_npz(folder.file("model"), *c);
    auto opt_a =
        create_multi_node_optimizer(make_optimizer("adam"), sub,
                                    MultiNodeOptimizerOptions{.bucket_bytes = 64, .zero_stage = 3});
    auto opt_c =
        create_multi_node_optimizer(make_optimizer("adam"), sub, MultiNodeOptimizerOptions{});
    opt_a->setup(a);
    opt_c->setup(c);
    load_snapshot_files(files, *opt_a, sub->rank() % world);
    load_snapshot_files(files, *opt_c, sub->rank() % world);
    for (auto* o : {opt_a.get(), opt_c.get()})
      dynamic_cast<MultiNodeOptimizer&>(*o).mark_parameters_synchronized();
    train(*opt_a, *a, sub->rank(), 10, 2);
    train(*opt_c, *c, sub->rank(), 10, 2);
    EXPECT_EQ(opt_a->t(), opt_c->t());
    auto pa = a->namedparams(), pc = c->namedparams();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(ArraysClose(pa[i].second.data(), pc[i].second.data(), 1e-5, 1e-6)) << pa[i].first;
    }
  }
  comm->barrier();
}

TEST(ShardedOptimizer, RefusesWhatItCannotDo) {
  auto comm = create_communicator("naive");
  auto adam = [] { return std::make_shared<optimizers::Adam>(); };
  {
    auto stage3 =
        create_multi_node_optimizer(adam(), comm, MultiNodeOptimizerOptions{.zero_stage = 3});
    stage3->setup(std::make_shared<Mlp>());
    EXPECT_TRUE(ThrowsWith<NotImplementedError>([&] { Join join(stage3); },
                                                {"Join", "zero_stage 3", "gathers"}));
  }
  EXPECT_TRUE(ThrowsWith<ValueError>(
      [&] { create_multi_node_optimizer(adam(), comm, MultiNodeOptimizerOptions{.zero_stage = 4}); },
      {"zero_stage", "4"}));
  MultiNodeOptimizerOptions o;
  o.zero_stage = 1;
  o.overlap = true;
  EXPECT_TRUE(ThrowsWith<NotImplementedError>([&] { create_multi_node_optimizer(adam(), comm, o); },
                                              {"zero_stage 1", "overlap"}));
}

}  // namespace
}  // namespace kusari::mn
