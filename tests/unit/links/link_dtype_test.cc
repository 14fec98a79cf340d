// Link::to_dtype (Note [Link dtype]): initialised parameters converted with their gradients, lazily
// sized ones created in the dtype at their first forward (with the values of the float32 model,
// rounded), BatchNormalization keeping float32 parameters and statistics under 16-bit dtypes,
// gradients in the parameters' dtype and close to float32's, npz loading into lazy instances,
// and errors for non-floating dtypes naming the link.
#include <gtest/gtest.h>

#include "link_test_util.h"

namespace kusari {
namespace {

namespace F = functions;
namespace L = links;
using testing::ArraysClose;

// conv (lazy in_channels) -> batch norm -> relu -> fc (lazy unless fc_in is given).
struct ConvNet : Chain {
  std::shared_ptr<L::Convolution2D> conv;
  std::shared_ptr<L::BatchNormalization> bn;
  std::shared_ptr<L::Linear> fc;
  explicit ConvNet(std::optional<int64_t> fc_in = std::nullopt) {
    conv = add_link("conv", std::make_shared<L::Convolution2D>(std::nullopt, 4, 3, 1, 1));
    bn = add_link("bn", std::make_shared<L::BatchNormalization>(4));
    fc = add_link("fc", std::make_shared<L::Linear>(fc_in, 3));
  }
  Variable forward(const Variable& x) override { return (*fc)(F::relu((*bn)((*conv)(x)))); }
};

// 6 -> 8 -> 4 with the first layer's input size inferred.
struct Mlp : Chain {
  std::shared_ptr<L::Linear> l1, l2;
  Mlp() {
    l1 = add_link("l1", std::make_shared<L::Linear>(8));
    l2 = add_link("l2", std::make_shared<L::Linear>(4));
  }
  Variable forward(const Variable& x) override { return (*l2)(F::relu((*l1)(x))); }
};

class LinkDtypeTest : public testing::DeviceTest {
 protected:
  Array input(const Shape& s, Dtype d = float32) { return Array::uniform(s, -1, 1, float32, device(), &gen_).astype(d); }
  Generator gen_{29};
};

TEST_P(LinkDtypeTest, ConvertsInitializedAndLazyParameters) {
  for (Dtype d : {float16, bfloat16, float64}) {
    SCOPED_TRACE(dtype_name(d));
    const Array x = input({2, 2, 5, 5});
    // The float32 reference and the converted model draw from the same generator state.
    manual_seed(7);
    ConvNet ref(4 * 5 * 5);
    ref.to_device(device());
    ref(x);
    manual_seed(7);
    ConvNet net(4 * 5 * 5);
    net.to_device(device());
    net.fc->W.set_grad(Array::ones({3, 100}, float32, device()));
    net.to_dtype(d);

    // Initialised now: converted, with the gradient.
    EXPECT_EQ(net.fc->W.data().dtype(), d);
    EXPECT_EQ(net.fc->W.grad().dtype(), d);
    EXPECT_EQ(net.fc->b.dtype(), d);
    EXPECT_TRUE(ArraysClose(net.fc->W.data(), ref.fc->W.data().astype(d), 0, 0));
    // Sized at the first forward: recorded now, created in the dtype with the rounded values.
    EXPECT_FALSE(net.conv->W.is_initialized());
    EXPECT_EQ(net.conv->W.dtype(), d);
    Variable y = net(x.astype(d));
    EXPECT_EQ(y.dtype(), d);
    ASSERT_TRUE(net.conv->W.is_initialized());
    EXPECT_EQ(net.conv->W.data().dtype(), d);
    EXPECT_EQ(net.conv->W.data().device(), device());
    // 16-bit draws are the float32 draws rounded (float64 ones are drawn in double precision).
    if (d != float64) EXPECT_TRUE(ArraysClose(net.conv->W.data(), ref.conv->W.data().astype(d), 0, 0));
  }
}

TEST_P(LinkDtypeTest, BatchNormalizationKeepsFloat32UnderSixteenBitDtypes) {
  for (Dtype d : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(d));
    ConvNet net;
    net.to_device(device());
    net.to_dtype(d);
    // Chainer's mixed16: the statistics and the batch norm's own parameters stay float32; the
    // counter N is not a floating-point value and keeps int64.
    EXPECT_EQ(net.bn->dtype(), float32);
    EXPECT_EQ(net.bn->gamma.dtype(), float32);
    EXPECT_EQ(net.bn->beta.dtype(), float32);
    EXPECT_EQ(net.bn->avg_mean().dtype(), float32);
    EXPECT_EQ(net.bn->avg_var().dtype(), float32);
    EXPECT_EQ(net.bn->persistent("N").dtype(), int64);
    // A 16-bit input is normalised with them; the running statistics are updated in float32 and
    // the gradients have their parameter's dtype.
    const Array before = net.bn->avg_mean().copy();
    testing::backward_random_weighted(net(input({2, 2, 5, 5}, d)), gen_);
    EXPECT_EQ(net.bn->avg_mean().dtype(), float32);
    EXPECT_FALSE(ArraysClose(net.bn->avg_mean(), before, 0, 0));
    for (const auto& [path, p] : net.namedparams()) {
      ASSERT_TRUE(p.grad().defined()) << path;
      EXPECT_EQ(p.grad().dtype(), p.dtype()) << path;
      EXPECT_EQ(p.dtype(), path.starts_with("/bn/") ? float32 : d) << path;
    }
  }
  // float32 and float64 are taken as they are; a lazily sized batch norm sizes its statistics in
  // the dtype it was given.
  L::BatchNormalization bn(3);
  bn.to_dtype(float64);
  EXPECT_EQ(bn.avg_var().dtype(), float64);
  EXPECT_EQ(bn.gamma.dtype(), float64);
  auto lazy = std::make_shared<L::BatchNormalization>(std::nullopt, 0.9, 2e-5, float64, true, true, nullptr,
                                                      nullptr, Axes{0});
  lazy->to_device(device());
  lazy->to_dtype(bfloat16);
  EXPECT_EQ(lazy->gamma.dtype(), float32);
  Variable y = (*lazy)(input({4, 3}, bfloat16));
  EXPECT_EQ(y.dtype(), bfloat16);
  EXPECT_EQ(lazy->avg_mean().dtype(), float32);
  EXPECT_EQ(lazy->gamma.data().dtype(), float32);
}

TEST_P(LinkDtypeTest, GradientsInTheDtypeCloseToFloat32) {
  // The same weights and input, exactly representable in each dtype, in float32 and converted.
  for (Dtype d : {float16, bfloat16}) {
    SCOPED_TRACE(dtype_name(d));
    Mlp low;
    low.to_device(device());
    low.to_dtype(d);
    const Array x = input({5, 6}, d);
    low(Variable(x));
    Mlp ref;
    ref.to_device(device());
    ref(Variable(x.astype(float32)));
    ref.copyparams(low);  // the low-precision weights, widened exactly
    const Array t = Array::from_vector(std::vector<int32_t>{0, 1, 2, 3, 1}, std::nullopt, device());
    F::softmax_cross_entropy(low(Variable(x)), t).backward();
    F::softmax_cross_entropy(ref(Variable(x.astype(float32))), t).backward();
    const auto lp = low.namedparams(), rp = ref.namedparams();
    ASSERT_EQ(lp.size(), 4u);
    // float16 keeps 11 significant bits, bfloat16 8: tolerances of a few units in the last place
    // of the largest gradient entry.
    const double tol = d == float16 ? 4e-3 : 3e-2;
    for (size_t i = 0; i < lp.size(); ++i) {
      const Array g = lp[i].second.grad();
      ASSERT_TRUE(g.defined()) << lp[i].first;
      EXPECT_EQ(g.dtype(), d) << lp[i].first;
      const Array expected = rp[i].second.grad();
      const double scale = kusari::amax(kusari::abs(expected)).item<double>();
      EXPECT_TRUE(ArraysClose(g.astype(float32), expected, 0, tol * scale)) << lp[i].first;
    }
  }
}

TEST_P(LinkDtypeTest, LoadingIntoALazyInstanceKeepsTheConvertedDtype) {
  testing::TempFile file("model.npz");
  const std::string& path = file.path;
  Mlp saved;
  saved.to_device(device());
  saved.to_dtype(bfloat16);
  saved(Variable(input({2, 6}, bfloat16)));
  save_npz(path, saved);
  // A converted lazy instance takes the file's shapes and its own dtype; a float32 one its
  // initializer's.
  Mlp converted;
  converted.to_device(device());
  converted.to_dtype(float16);
  load_npz(path, converted);
  EXPECT_EQ(converted.l1->W.data().dtype(), float16);
  EXPECT_EQ(converted.l1->W.shape(), (Shape{8, 6}));
  EXPECT_TRUE(ArraysClose(converted.l1->W.data().astype(float32), saved.l1->W.data().astype(float32), 1e-2, 0));
  Mlp plain;
  plain.to_device(device());
  load_npz(path, plain);
  EXPECT_EQ(plain.l1->W.data().dtype(), float32);
  EXPECT_TRUE(ArraysClose(plain.l1->W.data(), saved.l1->W.data().astype(float32), 0, 0));
}

TEST_P(LinkDtypeTest, NonFloatingDtypesAreRefusedNamingTheLink) {
  ConvNet net;
  KUSARI_EXPECT_THROW_WITH(net.to_dtype(int32), DtypeError, "Chain::to_dtype", "floating", "int32");
  KUSARI_EXPECT_THROW_WITH(net.fc->to_dtype(int64), DtypeError, "Linear 'fc'::to_dtype", "int64");
  KUSARI_EXPECT_THROW_WITH(net.bn->to_dtype(bool_), DtypeError, "BatchNormalization 'bn'::to_dtype", "bool");
  EXPECT_THROW(net.fc->W.to_dtype(uint8), DtypeError);
  // Nothing was converted.
  EXPECT_EQ(net.fc->b.dtype(), float32);
  EXPECT_EQ(net.conv->W.dtype(), float32);
}

KUSARI_INSTANTIATE_DEVICE_TEST(LinkDtypeTest);

}  // namespace
}  // namespace kusari
