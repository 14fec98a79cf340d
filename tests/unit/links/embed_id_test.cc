// EmbedID: parameter name and shape, Chainer's Normal(1.0) default, forward equal to embed_id
// (int32 / int64 ids, ignore_label), gradients, npz round trip, to_device, valid_ids, errors.
#include <gtest/gtest.h>

#include <cmath>

#include "link_test_util.h"

namespace kusari {
namespace {

namespace F = functions;
namespace L = links;
using testing::ArraysClose;

class EmbedIDLinkTest : public testing::DeviceTest {
 protected:
  template <typename T = int32_t>
  Array ids(const std::vector<T>& v, std::optional<Shape> s = std::nullopt) {
    return Array::from_vector(v, s, device());
  }
  Generator gen_{11};
};

TEST_P(EmbedIDLinkTest, Parameters) {
  L::EmbedID embed(10, 4);
  EXPECT_EQ(testing::param_paths(embed), (std::vector<std::string>{"/W"}));
  EXPECT_EQ(embed.W.shape(), (Shape{10, 4}));
  EXPECT_EQ(embed.W.dtype(), float32);
  EXPECT_FALSE(embed.ignore_label.has_value());
  // Chainer's default initializer is Normal(1.0).
  L::EmbedID big(1000, 20);
  Array w = big.W.data().astype(float64);
  const double mean = kusari::mean(w).item<double>();
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(kusari::mean(kusari::square(w - mean)).item<double>()), 1.0, 0.03);
  L::EmbedID given(3, 2, std::make_shared<initializers::Constant>(0.25, float64), -1);
  EXPECT_EQ(given.W.dtype(), float64);
  EXPECT_TRUE(ArraysClose(given.W.data(), Array::full({3, 2}, 0.25, float64), 0, 0));
  EXPECT_EQ(given.ignore_label, -1);
}

TEST_P(EmbedIDLinkTest, ForwardIsTheFunction) {
  L::EmbedID embed(5, 3, nullptr, -1);
  embed.to_device(device());
  Array x = ids({0, 4, -1, 2, 2, 1}, Shape{2, 3});
  Variable y = embed(x);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 3}));
  EXPECT_TRUE(ArraysClose(y.data(), F::embed_id(x, embed.W, -1).data(), 0, 0));
  // The ignored id gives zeros; int64 ids work too.
  EXPECT_TRUE(ArraysClose(y.data().at({0, 2}), Array::zeros({3}, float32, device()), 0, 0));
  Variable y64 = embed(ids<int64_t>({3, 1}));
  EXPECT_TRUE(ArraysClose(y64.data(), F::embed_id(ids<int64_t>({3, 1}), embed.W).data(), 0, 0));
}

TEST_P(EmbedIDLinkTest, GradientsReachTheTable) {
  L::EmbedID embed(4, 3);
  embed.to_device(device());
  Variable y = embed(ids({0, 1, 2, 3, 3}));
  testing::backward_random_weighted(y, gen_);
  testing::expect_grads_on_every_param(embed);
  // Ids 0..3 all appear, so every row received something; an unused row gets zeros.
  embed.cleargrads();
  F::sum(embed(ids({1, 1}))).backward();
  EXPECT_TRUE(ArraysClose(
      embed.W.grad(),
      Array::from({0, 0, 0, 2, 2, 2, 0, 0, 0, 0, 0, 0}, Shape{4, 3}, float32, device()), 0, 0));
}

TEST_P(EmbedIDLinkTest, NpzRoundTrip) {
  L::EmbedID embed(6, 3);
  embed.to_device(device());
  const testing::TempFile file("embed.npz");
  const std::string& path = file.path;
  save_npz(path, embed);
  EXPECT_EQ(testing::npz_keys(path), (std::vector<std::string>{"W"}));
  L::EmbedID fresh(6, 3, std::make_shared<initializers::Zero>());
  fresh.to_device(device());
  load_npz(path, fresh);
  Array x = ids({5, 0, 3});
  EXPECT_TRUE(ArraysClose(fresh(x).data(), embed(x).data(), 0, 0));
  // A table of another size is refused, naming the key.
  L::EmbedID other(7, 3);
  KUSARI_EXPECT_THROW_WITH(load_npz(path, other), ShapeError, "W");
}

TEST_P(EmbedIDLinkTest, ToDevice) {
  L::EmbedID embed(4, 2);
  Array before = embed(Array::from_vector(std::vector<int32_t>{1, 3})).data();
  embed.to_device(Device::cpu());
  EXPECT_TRUE(
      ArraysClose(embed(Array::from_vector(std::vector<int32_t>{1, 3})).data(), before, 0, 0));
  embed.to_device(device());
  EXPECT_EQ(embed.W.device(), device());
  EXPECT_TRUE(ArraysClose(embed(ids({1, 3})).data(), before, 0, 0));
}

TEST_P(EmbedIDLinkTest, Errors) {
  KUSARI_EXPECT_THROW_WITH(L::EmbedID(0, 3), ValueError, "EmbedID", "in_size", "0");
  KUSARI_EXPECT_THROW_WITH(L::EmbedID(3, -2), ValueError, "EmbedID", "out_size", "-2");
  L::EmbedID embed(3, 2);
  embed.to_device(device());
  KUSARI_EXPECT_THROW_WITH(embed(Array::zeros({2}, float32, device())), DtypeError, "EmbedID",
                           "float32");
  EXPECT_THROW(embed(ids({0, 3})), IndexError);
}

// set_valid_ids bounds the ids (functions::embed_id's valid_ids): the rows beyond are refused.
TEST_P(EmbedIDLinkTest, ValidIds) {
  L::EmbedID embed(5, 2);
  embed.to_device(device());
  EXPECT_FALSE(embed.valid_ids().has_value());
  Array before = embed(ids({0, 4})).data();
  embed.set_valid_ids(3);
  EXPECT_EQ(embed.valid_ids(), 3);
  EXPECT_TRUE(
      ArraysClose(embed(ids({0, 2})).data(), F::embed_id(ids({0, 2}), embed.W).data(), 0, 0));
  KUSARI_EXPECT_THROW_WITH(embed(ids({0, 4})), IndexError, "embed_id", "4", "expected 0 <= id < 3");
  KUSARI_EXPECT_THROW_WITH(embed.set_valid_ids(6), ValueError, "EmbedID", "valid_ids", "5", "6");
  KUSARI_EXPECT_THROW_WITH(embed.set_valid_ids(0), ValueError, "EmbedID", "valid_ids", "0");
  EXPECT_EQ(embed.valid_ids(), 3);
  embed.set_valid_ids(std::nullopt);
  EXPECT_TRUE(ArraysClose(embed(ids({0, 4})).data(), before, 0, 0));
}

KUSARI_INSTANTIATE_DEVICE_TEST(EmbedIDLinkTest);

}  // namespace
}  // namespace kusari
