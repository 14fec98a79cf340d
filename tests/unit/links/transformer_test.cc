// The transformer links: LayerNormalization and RMSNormalization (parameters, forward, float32
// parameters under 16-bit dtypes), MultiHeadAttention (shapes, GPT-2's parameter names, a KV
// cache giving what the full causal forward gives, cross-attention, gradients, errors) and
// TransformerBlock (the same cache equality, its names, its gradients).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "function_test_util.h"
#include "kusari/autograd/mode.h"
#include "link_test_util.h"

namespace kusari {
namespace {

namespace F = functions;
namespace L = links;
using testing::ArraysClose;

class TransformerLinkTest : public testing::FunctionTest {};

std::vector<std::string> sorted_paths(const Link& link) {
  std::vector<std::string> p = testing::param_paths(link);
  std::sort(p.begin(), p.end());
  return p;
}

TEST_P(TransformerLinkTest, NormalizationLinks) {
  L::LayerNormalization ln(6);
  EXPECT_EQ(sorted_paths(ln), (std::vector<std::string>{"/beta", "/gamma"}));
  ln.to_device(device());
  Array x = uniform({2, 3, 6}, float32, -2, 2);
  EXPECT_TRUE(ArraysClose(ln(Variable(x)).data(), F::layer_normalization(Variable(x), Variable(), Variable()).data(),
                          1e-6, 1e-6));
  L::LayerNormalization no_beta(6, 1e-5, false);
  EXPECT_EQ(sorted_paths(no_beta), (std::vector<std::string>{"/gamma"}));
  L::RMSNormalization rms(6);
  rms.to_device(device());
  EXPECT_TRUE(ArraysClose(rms(Variable(x)).data(), F::rms_normalization(Variable(x), Variable()).data(), 1e-6, 1e-6));
  // Mixed precision: the parameters stay float32 and take a bfloat16 input.
  ln.to_dtype(bfloat16);
  EXPECT_EQ(ln.gamma.dtype(), float32);
  EXPECT_EQ(ln(Variable(x.astype(bfloat16))).dtype(), bfloat16);
  EXPECT_THROW(L::LayerNormalization(0), ValueError);
}

TEST_P(TransformerLinkTest, MultiHeadAttentionNamesShapesAndGradients) {
  L::MultiHeadAttentionOptions o;
  o.causal = true;
  L::MultiHeadAttention mha(8, 2, o);
  EXPECT_EQ(sorted_paths(mha),
            (std::vector<std::string>{"/c_attn/W", "/c_attn/b", "/c_proj/W", "/c_proj/b"}));
  EXPECT_EQ(mha.c_attn->W.shape(), (Shape{24, 8}));
  mha.to_device(device());
  mha.to_dtype(float64);
  Array x = uniform({2, 5, 8}, float64);
  EXPECT_EQ(mha(Variable(x)).shape(), (Shape{2, 5, 8}));
  check([&](const Variable& v) { return mha(v); }, x, false);
  // Cross-attention: queries of 8 features, a memory of 3.
  L::MultiHeadAttentionOptions c;
  c.kv_size = 3;
  L::MultiHeadAttention cross(8, 4, c);
  EXPECT_EQ(sorted_paths(cross),
            (std::vector<std::string>{"/c_proj/W", "/c_proj/b", "/kv_proj/W", "/kv_proj/b", "/q_proj/W", "/q_proj/b"}));
  cross.to_device(device());
  cross.to_dtype(float64);
  Array memory = uniform({2, 7, 3}, float64);
  EXPECT_EQ(cross.forward(Variable(x), Variable(memory)).shape(), (Shape{2, 5, 8}));
  check([&](const std::vector<Variable>& v) { return std::vector<Variable>{cross.forward(v[0], v[1])}; },
        {x, memory}, false);
  EXPECT_THROW(cross(Variable(x)), ValueError);
  EXPECT_THROW(mha.forward(Variable(x), Variable(memory)), ValueError);
  EXPECT_THROW(mha(Variable(uniform({2, 5, 6}, float64))), ShapeError);
  EXPECT_THROW(L::MultiHeadAttention(10, 4), ValueError);
}

// Feeding a causal attention one position at a time through a KV cache gives, at each position,
// what the full forward gives there.
TEST_P(TransformerLinkTest, KVCacheEqualsTheFullForward) {
  L::TransformerBlockOptions o;
  o.causal = true;
  L::TransformerBlock block(16, 4, o);
  block.to_device(device());
  block.to_dtype(float64);
  Array x = uniform({2, 6, 16}, float64);
  NoBackpropMode no_graph;
  Array full = block(Variable(x)).data();
  L::KVCache cache;
  // Two positions, then one at a time.
  std::vector<Array> parts;
  parts.push_back(block.forward(Variable(x.at({Slice(), Slice(0, 2)})), &cache).data());
  for (int64_t t = 2; t < 6; ++t) {
    parts.push_back(block.forward(Variable(x.at({Slice(), Slice(t, t + 1)})), &cache).data());
    EXPECT_EQ(cache.length(), t + 1);
  }
  EXPECT_TRUE(ArraysClose(kusari::concatenate(parts, 1), full, 1e-10, 1e-12));
  cache.clear();
  EXPECT_EQ(cache.length(), 0);
}

TEST_P(TransformerLinkTest, TransformerBlockNamesAndGradients) {
  L::TransformerBlock block(8, 2);
  EXPECT_EQ(sorted_paths(block),
            (std::vector<std::string>{"/attn/c_attn/W", "/attn/c_attn/b", "/attn/c_proj/W", "/attn/c_proj/b",
                                      "/ln_1/beta", "/ln_1/gamma", "/ln_2/beta", "/ln_2/gamma", "/mlp/c_fc/W",
                                      "/mlp/c_fc/b", "/mlp/c_proj/W", "/mlp/c_proj/b"}));
  EXPECT_EQ(block.c_fc->W.shape(), (Shape{32, 8}));
  block.to_device(device());
  block.to_dtype(float64);
  check([&](const Variable& v) { return block(v); }, uniform({2, 3, 8}, float64), false);
}

KUSARI_INSTANTIATE_DEVICE_TEST(TransformerLinkTest);

}  // namespace
}  // namespace kusari
