// Link, Chain, ChainList, Sequential and Classifier: namedparams / namedlinks / namedpersistents
// order and paths, cleargrads / zerograds, copyparams (with persistents, lazy sources), addgrads,
// disable_update, Sequential of links and functions, Classifier reporting into an observation,
// nested npz keys, and registration errors.
#include <gtest/gtest.h>

#include "link_test_util.h"

namespace kusari {
namespace {

namespace F = functions;
namespace L = links;
using testing::ArraysClose;
using StrVec = std::vector<std::string>;

// A chain with a nested chain, as users write them.
struct Block : Chain {
  std::shared_ptr<L::Convolution2D> conv;
  std::shared_ptr<L::BatchNormalization> bn;
  Block() {
    conv = add_link("conv", std::make_shared<L::Convolution2D>(std::nullopt, 4, 3, 1, 1, true));
    bn = add_link("bn", std::make_shared<L::BatchNormalization>(4));
  }
  Variable forward(const Variable& x) override { return F::relu((*bn)((*conv)(x))); }
};

struct Net : Chain {
  std::shared_ptr<Block> block;
  std::shared_ptr<L::Linear> fc;
  explicit Net(std::optional<int64_t> fc_in = std::nullopt) {
    block = add_link("block", std::make_shared<Block>());
    fc = add_link("fc", std::make_shared<L::Linear>(fc_in, 3));
  }
  Variable forward(const Variable& x) override { return (*fc)((*block)(x)); }
};

class LinkTest : public testing::DeviceTest {
 protected:
  Array input(const Shape& s) { return Array::uniform(s, -1, 1, float32, device(), &gen_); }
  Generator gen_{13};
};

TEST_P(LinkTest, NamedParamsLinksAndPersistentsInRegistrationOrder) {
  Net net(4 * 5 * 5);
  net.to_device(device());
  EXPECT_EQ(testing::param_paths(net),
            (StrVec{"/block/conv/W", "/block/bn/gamma", "/block/bn/beta", "/fc/W", "/fc/b"}));
  // The lazily sized conv W is listed but not counted until initialised.
  EXPECT_EQ(testing::param_paths(net, false),
            (StrVec{"/block/bn/gamma", "/block/bn/beta", "/fc/W", "/fc/b"}));
  EXPECT_EQ(net.count_params(), 4 + 4 + 3 * 100 + 3);
  EXPECT_EQ(testing::persistent_paths(net),
            (StrVec{"/block/bn/N", "/block/bn/avg_mean", "/block/bn/avg_var"}));
  StrVec links;
  for (const auto& [path, link] : net.namedlinks()) links.push_back(path);
  EXPECT_EQ(links, (StrVec{"/", "/block", "/block/conv", "/block/bn", "/fc"}));
  EXPECT_EQ(net.namedlinks(true).size(), 4u);
  EXPECT_EQ(net.block->conv->name(), "conv");
  EXPECT_EQ(net.children().size(), 2u);
  net(input({2, 2, 5, 5}));
  EXPECT_EQ(net.count_params(), 4 * 2 * 9 + 4 + 4 + 3 * 100 + 3);
}

TEST_P(LinkTest, CleargradsAndZerograds) {
  Net net;
  net.to_device(device());
  testing::backward_random_weighted(net(input({2, 2, 5, 5})), gen_);
  testing::expect_grads_on_every_param(net);
  net.cleargrads();
  for (const auto& [path, p] : net.namedparams()) EXPECT_FALSE(p.grad().defined()) << path;
  net.zerograds();
  for (const auto& [path, p] : net.namedparams()) {
    ASSERT_TRUE(p.grad().defined()) << path;
    EXPECT_EQ(kusari::sum(kusari::abs(p.grad())).item<double>(), 0.0) << path;
  }
  // zerograds leaves uninitialised parameters alone.
  L::Linear lazy(3);
  lazy.zerograds();
  EXPECT_FALSE(lazy.W.is_initialized());
  EXPECT_TRUE(lazy.b.grad().defined());
}

TEST_P(LinkTest, CopyparamsCopiesValuesAndPersistents) {
  Net a, b;
  a.to_device(device());
  b.to_device(device());
  Array x = input({2, 2, 5, 5});
  a(x);  // sizes everything and moves a's running statistics
  testing::randomize_params(a, gen_);
  b.copyparams(a);
  auto pa = a.namedparams(), pb = b.namedparams();
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pb[i].second.is_initialized()) << pb[i].first;
    EXPECT_TRUE(ArraysClose(pb[i].second.data(), pa[i].second.data(), 0, 0)) << pa[i].first;
    EXPECT_FALSE(pb[i].second.data().shares_memory_with(pa[i].second.data())) << pa[i].first;
  }
  EXPECT_TRUE(ArraysClose(b.block->bn->avg_mean(), a.block->bn->avg_mean(), 0, 0));
  {
    TrainMode test_mode(false);
    EXPECT_TRUE(ArraysClose(b(x).data(), a(x).data(), 0, 0));
  }
  // copy_persistent = false leaves the statistics.
  Net c;
  c.to_device(device());
  c.copyparams(a, false);
  EXPECT_TRUE(ArraysClose(c.block->bn->avg_mean(), Array::zeros({4}, float32, device()), 0, 0));
  // A lazy source (conv W and nothing else unsized) copies what is there.
  Net lazy_source, target;
  target.to_device(device());
  lazy_source.to_device(device());
  target.copyparams(lazy_source);
  EXPECT_FALSE(target.block->conv->W.is_initialized());
  // A lazy batch norm whose statistics are unsized copies into another without error.
  L::BatchNormalization lazy_bn(std::nullopt, 0.9, 2e-5, float32, true, true, nullptr, nullptr,
                                Axes{0});
  L::BatchNormalization other_bn(std::nullopt, 0.9, 2e-5, float32, true, true, nullptr, nullptr,
                                 Axes{0});
  other_bn.copyparams(lazy_bn);
  EXPECT_FALSE(other_bn.avg_mean().defined());
  // Different structures are refused.
  L::Linear lin(3, 2);
  KUSARI_EXPECT_THROW_WITH(lin.copyparams(a), ValueError, "copyparams");
}

TEST_P(LinkTest, Addgrads) {
  L::Linear a(3, 2), b(3, 2);
  a.to_device(device());
  b.to_device(device());
  Array x = input({4, 3});
  testing::backward_random_weighted(a(x), gen_);
  testing::backward_random_weighted(b(x), gen_);
  Array ga = a.W.grad().copy(), gb = b.W.grad().copy();
  a.addgrads(b);
  EXPECT_TRUE(ArraysClose(a.W.grad(), ga + gb, 1e-6, 1e-7));
  // Into a link without gradients, the other's are copied.
  L::Linear c(3, 2);
  c.to_device(device());
  c.addgrads(b);
  EXPECT_TRUE(ArraysClose(c.W.grad(), gb, 0, 0));
  EXPECT_FALSE(c.W.grad().shares_memory_with(b.W.grad()));
}

TEST_P(LinkTest, DisableUpdateFreezesParameters) {
  auto net = std::make_shared<Net>();
  net->to_device(device());
  Array x = input({2, 2, 5, 5});
  net->block->disable_update();
  for (const auto& [path, p] : net->namedparams()) {
    EXPECT_EQ(p.impl().update_enabled, path.rfind("/fc/", 0) == 0) << path;
  }
  optimizers::SGD sgd(0.1);
  sgd.setup(net);
  testing::backward_random_weighted((*net)(x), gen_);
  Array conv_w = net->block->conv->W.data().copy(), fc_w = net->fc->W.data().copy();
  sgd.update();
  EXPECT_TRUE(ArraysClose(net->block->conv->W.data(), conv_w, 0, 0));
  EXPECT_FALSE(ArraysClose(net->fc->W.data(), fc_w, 0, 0));
  net->enable_update();
  for (const auto& [path, p] : net->namedparams()) EXPECT_TRUE(p.impl().update_enabled) << path;
}

TEST_P(LinkTest, ChainListNumbersItsChildren) {
  ChainList list;
  auto first = list.append(std::make_shared<L::Linear>(3, 4));
  list.append(std::make_shared<L::Linear>(4, 2, true));
  EXPECT_EQ(list.size(), 2u);
  EXPECT_EQ(&list[0], first.get());
  EXPECT_EQ(testing::param_paths(list), (StrVec{"/0/W", "/0/b", "/1/W"}));
  EXPECT_THROW(list.forward(Variable(input({1, 3}))), NotImplementedError);
  const testing::TempFile file("list.npz");
  const std::string& path = file.path;
  save_npz(path, list);
  EXPECT_EQ(testing::npz_keys(path), (StrVec{"0/W", "0/b", "1/W"}));
}

TEST_P(LinkTest, SequentialAppliesLinksAndFunctionsInOrder) {
  Sequential seq;
  auto l1 = std::make_shared<L::Linear>(3, 4);
  auto l2 = std::make_shared<L::Linear>(4, 2);
  seq.add(l1).add(F::relu).add(l2).add([](const Variable& v) { return v * 2.0; });
  seq.to_device(device());
  // Only links are children, numbered among themselves (Chainer's Sequential).
  EXPECT_EQ(seq.size(), 2u);
  EXPECT_EQ(testing::param_paths(seq), (StrVec{"/0/W", "/0/b", "/1/W", "/1/b"}));
  Array x = input({5, 3});
  Variable expected = (*l2)(F::relu((*l1)(x))) * 2.0;
  EXPECT_TRUE(ArraysClose(seq(x).data(), expected.data(), 0, 0));
  testing::backward_random_weighted(seq(x), gen_);
  testing::expect_grads_on_every_param(seq);
  std::function<Variable(const Variable&)> empty;
  EXPECT_THROW(seq.add(empty), ValueError);
  // A Sequential inside a chain, with a lazy link.
  Sequential lazy_seq;
  lazy_seq.add(std::make_shared<L::Linear>(4)).add(F::tanh);
  lazy_seq.to_device(device());
  EXPECT_EQ(lazy_seq(x).shape(), (Shape{5, 4}));
}

TEST_P(LinkTest, ClassifierReportsLossAndAccuracy) {
  auto predictor = std::make_shared<L::Linear>(4, 3);
  L::Classifier clf(predictor);
  clf.to_device(device());
  EXPECT_EQ(testing::param_paths(clf), (StrVec{"/predictor/W", "/predictor/b"}));
  EXPECT_EQ(&clf.predictor(), predictor.get());
  Array x = input({6, 4});
  Array t = Array::from_vector(std::vector<int32_t>{0, 1, 2, 0, 1, 2}, std::nullopt, device());

  Reporter reporter;
  reporter.add_observer("main", static_cast<const Link*>(&clf));
  Observation observation;
  Variable loss;
  {
    ReporterScope scope(reporter, observation);
    loss = clf(x, t);
  }
  Variable y = (*predictor)(x);
  EXPECT_TRUE(ArraysClose(loss.data(), F::softmax_cross_entropy(y, t).data(), 1e-6, 1e-7));
  ASSERT_EQ(observation.count("main/loss"), 1u);
  ASSERT_EQ(observation.count("main/accuracy"), 1u);
  EXPECT_TRUE(ArraysClose(observation["main/loss"], loss.data(), 0, 0));
  EXPECT_TRUE(ArraysClose(observation["main/accuracy"], F::accuracy(y, t).data(), 0, 0));
  EXPECT_TRUE(ArraysClose(clf.y.data(), y.data(), 0, 0));
  loss.backward();
  testing::expect_grads_on_every_param(clf);

  // forward_batch({x, t}) is the same; without accuracy only the loss is reported.
  clf.compute_accuracy = false;
  Observation second;
  {
    ReporterScope scope(reporter, second);
    Variable l2 = clf.forward_batch({Variable(x), Variable(t)});
    EXPECT_TRUE(ArraysClose(l2.data(), loss.data(), 0, 0));
  }
  EXPECT_EQ(second.count("main/loss"), 1u);
  EXPECT_EQ(second.count("main/accuracy"), 0u);
  KUSARI_EXPECT_THROW_WITH(clf.forward_batch({Variable(x)}), ValueError, "Classifier", "(x, t)");
  // A custom loss function.
  L::Classifier l1_clf(predictor,
                       [](const Variable& yy, const Array&) { return F::sum(F::abs(yy)); });
  l1_clf.to_device(device());
  EXPECT_TRUE(ArraysClose(l1_clf(x, t).data(), F::sum(F::abs(y)).data(), 1e-6, 1e-6));
  EXPECT_THROW(L::Classifier(nullptr), ValueError);
}

TEST_P(LinkTest, NestedChainNpzRoundTripIntoLazyInstance) {
  Net net;
  net.to_device(device());
  Array x = input({2, 2, 5, 5});
  net(x);
  testing::randomize_params(net, gen_);
  const testing::TempFile file("net.npz");
  const std::string& path = file.path;
  save_npz(path, net);
  EXPECT_EQ(testing::npz_keys(path),
            (StrVec{"block/bn/N", "block/bn/avg_mean", "block/bn/avg_var", "block/bn/beta",
                    "block/bn/gamma", "block/conv/W", "fc/W", "fc/b"}));
  Net fresh;
  fresh.to_device(device());
  load_npz(path, fresh);
  TrainMode test_mode(false);
  EXPECT_TRUE(ArraysClose(fresh(x).data(), net(x).data(), 0, 0));
}

TEST_P(LinkTest, RegistrationErrors) {
  struct Bad : Chain {
    void twice() {
      add_link("a", std::make_shared<L::Linear>(2));
      add_link("a", std::make_shared<L::Linear>(2));
    }
    void slash() { add_link("a/b", std::make_shared<L::Linear>(2)); }
    void null() { add_link("n", std::shared_ptr<L::Linear>()); }
  };
  Bad bad;
  KUSARI_EXPECT_THROW_WITH(bad.twice(), ValueError, "'a' already exists");
  EXPECT_THROW(bad.slash(), ValueError);
  EXPECT_THROW(bad.null(), ValueError);
  KUSARI_EXPECT_THROW_WITH(bad.add_param("", Parameter(Array::zeros({1}))), ValueError,
                           "add_param");
  KUSARI_EXPECT_THROW_WITH(bad.forward(Variable(input({1}))), NotImplementedError, "forward");
  KUSARI_EXPECT_THROW_WITH(bad.persistent("missing"), ValueError, "missing");
}

KUSARI_INSTANTIATE_DEVICE_TEST(LinkTest);

}  // namespace
}  // namespace kusari
