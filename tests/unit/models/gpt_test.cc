// The GPT model: GPT-2 small's parameter count and names, the shapes of the logits and the loss,
// a tiny GPT that learns a sequence, generation with the KV cache equal to generation without
// it, sequences longer than the position table, gradient accumulation equal to one larger batch,
// and the iteration schedule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kusari/autograd/mode.h"
#include "kusari/kusari.h"
#include "test_util.h"

namespace kusari {
namespace {

namespace F = functions;
using models::GPT;
using models::GPTConfig;
using testing::ArraysClose;

GPTConfig small_config() {
  GPTConfig c;
  c.vocab_size = 11;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

TEST(GPT, Gpt2SmallHas124MParametersNamedAsGpt2) {
  Generator gen(0);
  auto model = models::gpt2_small(&gen);
  // GPT-2 small, its output layer tied to wte, the vocabulary padded to 50,304 rows.
  EXPECT_EQ(model->count_params(), 124439808 + (50304 - 50257) * 768);
  EXPECT_EQ(model->padded_vocab_size(), 50304);
  std::vector<std::string> names;
  for (const auto& [path, p] : model->namedparams()) names.push_back(path);
  for (const char* expected : {"/wte/W", "/wpe/W", "/h/0/ln_1/gamma", "/h/0/attn/c_attn/W", "/h/0/attn/c_proj/b",
                               "/h/11/mlp/c_fc/W", "/h/11/mlp/c_proj/W", "/ln_f/beta"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  EXPECT_EQ(model->wte->W.shape(), (Shape{50304, 768}));
  // The padding rows are 0 (Note [Padded vocabulary]); unpadded, the model is GPT-2's to the row.
  EXPECT_EQ(
      kusari::amax(kusari::abs(model->wte->W.data().at({Slice(50257, 50304)}))).item<double>(),
      0.0);
  GPTConfig exact = models::gpt2_small_config();
  exact.vocab_multiple = 1;
  EXPECT_EQ(GPT(exact, &gen).count_params(), 124439808);
  EXPECT_EQ(model->wpe->W.shape(), (Shape{1024, 768}));
  // GPT-2's initialisation: N(0, 0.02), the residual projections N(0, 0.02 / sqrt(24)).
  auto stddev = [](const Array& a) { return std::sqrt(kusari::mean(kusari::square(a.astype(float64))).item<double>()); };
  EXPECT_NEAR(stddev(model->wte->W.data().at({Slice(0, 50257)})), 0.02, 0.001);
  auto& block = static_cast<links::TransformerBlock&>((*model->h)[0]);
  EXPECT_NEAR(stddev(block.c_proj->W.data()), 0.02 / std::sqrt(24.0), 0.0005);
  // 6 N + 12 L C T per token, N without the position table.
  EXPECT_DOUBLE_EQ(model->flops_per_token(1024), 6.0 * (124439808.0 - 1024 * 768) + 12.0 * 12 * 768 * 1024);
}

TEST(GPT, LogitsLossAndErrors) {
  Generator gen(1);
  GPT model(small_config(), &gen);
  Array idx = Array::from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, Shape{2, 4});
  Variable logits = model(Variable(idx));
  EXPECT_EQ(logits.shape(), (Shape{2, 4, 11}));
  Variable loss = model.forward_batch({Variable(idx), Variable(idx)});
  EXPECT_EQ(loss.ndim(), 0);
  // At initialisation the logits are small: the loss is near log(vocab).
  EXPECT_NEAR(loss.data().item<double>(), std::log(11.0), 0.3);
  Array too_long = Array::zeros({1, 17}, int32);
  try {
    model(Variable(too_long));
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("GPT: a sequence of 17 tokens is longer than the position table (block_size "
                                         "16)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(model(Variable(Array::zeros({2, 3}, float32))), DtypeError);
  EXPECT_THROW(model(Variable(Array::zeros({6}, int32))), ShapeError);
  GPTConfig bad = small_config();
  bad.n_head = 3;
  EXPECT_THROW(GPT{bad}, ValueError);
}

// The padded vocabulary (Note [Padded vocabulary]) computes what the unpadded model computes: with
// the same weights, the same logits, loss and gradients, the padding rows' gradient 0; ids in the
// padding are rejected.
TEST(GPT, PaddedVocabularyComputesWhatTheUnpaddedModelComputes) {
  GPTConfig c = small_config();  // vocabulary 11
  c.vocab_multiple = 8;
  GPTConfig exact = c;
  exact.vocab_multiple = 1;
  Generator g1(4), g2(4);
  GPT padded(c, &g1), plain(exact, &g2);
  padded.to_dtype(float64);
  plain.to_dtype(float64);
  EXPECT_EQ(padded.padded_vocab_size(), 16);
  EXPECT_EQ(plain.padded_vocab_size(), 11);
  ASSERT_EQ(padded.wte->W.shape(), (Shape{16, 8}));
  EXPECT_EQ(padded.wte->valid_ids(), 11);  // wte refuses the padding rows' ids
  // The same weights: wte's first 11 rows and every other parameter.
  auto pp = padded.namedparams(), qp = plain.namedparams();
  ASSERT_EQ(pp.size(), qp.size());
  for (size_t i = 0; i < pp.size(); ++i) {
    Array src =
        pp[i].first == "/wte/W" ? pp[i].second.data().at({Slice(0, 11)}) : pp[i].second.data();
    Array dst = qp[i].second.data();  // (shares the parameter's storage)
    dst.assign(src);
  }
  Array x = Array::from_vector(std::vector<int32_t>{1, 2, 3, 10, 5, 6, 0, 8}, Shape{2, 4});
  Array t = Array::from_vector(std::vector<int32_t>{2, 3, 10, -1, 6, 0, 8, 9}, Shape{2, 4});
  Variable lp = padded(Variable(x)), lq = plain(Variable(x));
  EXPECT_EQ(lp.shape(), (Shape{2, 4, 11}));
  EXPECT_TRUE(ArraysClose(lp.data(), lq.data(), 1e-12, 1e-14));
  padded.cleargrads();
  plain.cleargrads();
  Variable loss_p = padded.forward_batch({Variable(x), Variable(t)});
  Variable loss_q = plain.forward_batch({Variable(x), Variable(t)});
  EXPECT_NEAR(loss_p.data().item<double>(), loss_q.data().item<double>(), 1e-12);
  loss_p.backward();
  loss_q.backward();
  pp = padded.namedparams();
  qp = plain.namedparams();
  for (size_t i = 0; i < pp.size(); ++i) {
    Array gp = pp[i].second.grad();
    if (pp[i].first == "/wte/W") {
      EXPECT_EQ(kusari::amax(kusari::abs(gp.at({Slice(11, 16)}))).item<double>(), 0.0);
      gp = gp.at({Slice(0, 11)});
    }
    EXPECT_TRUE(ArraysClose(gp, qp[i].second.grad(), 1e-12, 1e-14)) << pp[i].first;
  }
  try {
    padded(Variable(Array::from_vector(std::vector<int32_t>{1, 12}, Shape{1, 2})));
    FAIL() << "no error";
  } catch (const IndexError& e) {
    // One check, by wte (its valid_ids is vocab_size), that names the id, the range and vocab_size.
    const std::string msg = e.what();
    EXPECT_NE(msg.find("GPT: token ids must lie in [0, vocab_size) = [0, 11)"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("embed_id: id 12"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected 0 <= id < 11 (the embedding's valid ids; W of shape (16, "),
              std::string::npos)
        << msg;
  }
  GPTConfig bad = c;
  bad.vocab_multiple = 0;
  EXPECT_THROW(GPT{bad}, ValueError);
}

// A tiny GPT memorises a periodic sequence: only learning takes the loss from log(11) to near 0.
TEST(GPT, LearnsASequenceAndGeneratesItWithAndWithoutTheCache) {
  Generator gen(2);
  GPT model(small_config(), &gen);
  auto opt = std::make_shared<optimizers::Adam>(3e-2);
  opt->setup(std::shared_ptr<Link>(&model, [](Link*) {}));
  std::vector<int32_t> seq;
  for (int i = 0; i < 17; ++i) seq.push_back((i * 3) % 11);
  Array x = Array::from_vector(std::vector<int32_t>(seq.begin(), seq.end() - 1), Shape{1, 16});
  Array t = Array::from_vector(std::vector<int32_t>(seq.begin() + 1, seq.end()), Shape{1, 16});
  double last = 0;
  for (int step = 0; step < 150; ++step) {
    opt->update([&] { return model.forward_batch({Variable(x), Variable(t)}); });
    last = model.forward_batch({Variable(x), Variable(t)}).data().item<double>();
  }
  EXPECT_LT(last, 0.05);
  // Greedy generation from the first 3 tokens continues the sequence.
  Array prompt = Array::from_vector(std::vector<int64_t>{0, 3, 6}, Shape{1, 3});
  Array out = model.generate(prompt, 10, 0.0);
  std::vector<int64_t> got = out.to_vector<int64_t>();
  for (int i = 0; i < 13; ++i) EXPECT_EQ(got[i], (i * 3) % 11) << "position " << i;
  // The cache changes nothing: the same tokens from full forwards, one more token each time.
  std::vector<int64_t> manual = {0, 3, 6};
  {
    NoBackpropMode no_graph;
    TrainMode test(false);
    for (int step = 0; step < 10; ++step) {
      Array ids = Array::from_vector(manual, Shape{1, static_cast<int64_t>(manual.size())});
      Array logits = model(Variable(ids)).data();
      std::vector<float> last_row = logits.at({0, -1}).to_vector<float>();
      manual.push_back(std::max_element(last_row.begin(), last_row.end()) - last_row.begin());
    }
  }
  EXPECT_EQ(got, manual);
  // Past the position table, generation goes on from the last block_size tokens.
  EXPECT_EQ(model.generate(prompt, 20, 0.0).shape(), (Shape{1, 23}));
  // Sampling with a temperature and top_k: reproducible with a seed, ids in range.
  Generator a(5), b(5);
  Array s1 = model.generate(prompt, 8, 1.0, 3, &a), s2 = model.generate(prompt, 8, 1.0, 3, &b);
  EXPECT_EQ(s1.to_vector<int64_t>(), s2.to_vector<int64_t>());
  for (int64_t v : s1.to_vector<int64_t>()) EXPECT_TRUE(v >= 0 && v < 11);
  EXPECT_THROW(model.generate(prompt, 1, -1.0), ValueError);
}

// Two micro-batches of 2 accumulate to the step one batch of 4 takes.
TEST(GPT, GradientAccumulationEqualsOneLargerBatch) {
  GPTConfig c = small_config();
  Generator g1(3), g2(3);
  auto m1 = std::make_shared<GPT>(c, &g1), m2 = std::make_shared<GPT>(c, &g2);
  m1->to_dtype(float64);
  m2->to_dtype(float64);
  auto o1 = std::make_shared<optimizers::SGD>(0.5), o2 = std::make_shared<optimizers::SGD>(0.5);
  o1->setup(m1);
  o2->setup(m2);
  std::vector<int32_t> ids;
  for (int i = 0; i < 4 * 6; ++i) ids.push_back((i * 7 + 1) % 11);
  std::vector<int32_t> next;
  for (int32_t v : ids) next.push_back((v + 1) % 11);
  Array x = Array::from_vector(ids, Shape{4, 6});
  Array t = Array::from_vector(next, Shape{4, 6});
  o1->update([&] { return m1->forward_batch({Variable(x), Variable(t)}); });
  o2->update_accumulated(2, [&](int64_t i) {
    Array xi = x.at({Slice(2 * i, 2 * i + 2)}), ti = t.at({Slice(2 * i, 2 * i + 2)});
    return m2->forward_batch({Variable(xi), Variable(ti)});
  });
  auto p1 = m1->namedparams(), p2 = m2->namedparams();
  ASSERT_EQ(p1.size(), p2.size());
  for (size_t i = 0; i < p1.size(); ++i) {
    EXPECT_TRUE(ArraysClose(p2[i].second.data(), p1[i].second.data(), 1e-12, 1e-14)) << p1[i].first;
  }
  EXPECT_THROW(o2->update_accumulated(0, [&](int64_t) { return Variable(); }), ValueError);
}

}  // namespace
}  // namespace kusari
