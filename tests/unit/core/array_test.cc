#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kusari/core/array.h"
#include "kusari/core/cuda.h"
#include "kusari/core/random.h"
#include "kusari/core/routines.h"
#include "kusari/kusari.h"
#include "test_util.h"

namespace kusari {
namespace {

using testing::ArraysClose;

class ArrayTest : public testing::DeviceTest {};

TEST_P(ArrayTest, CreationFillsValues) {
  Array z = Array::zeros({2, 3}, float32, device());
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.dtype(), float32);
  EXPECT_EQ(z.device(), device());
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(Array::ones({4}, int64, device()).to_vector<int64_t>(), std::vector<int64_t>(4, 1));
  EXPECT_EQ(Array::full({2}, 2.5, float64, device()).to_vector<double>(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(Array::arange(0.0, 5.0, 2.0, float32, device()).to_vector<float>(), (std::vector<float>{0, 2, 4}));
  EXPECT_EQ(Array::arange(3, int32, device()).to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2}));
  Array v = Array::from({1, 2, 3, 4, 5, 6}, Shape{2, 3}, float32, device());
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  EXPECT_FLOAT_EQ(v.at({1, 2}).item<float>(), 6.0f);
  Array s = Array::scalar(7, int64, device());
  EXPECT_EQ(s.ndim(), 0);
  EXPECT_EQ(s.item<int64_t>(), 7);
}

TEST_P(ArrayTest, FromVectorChecksSize) {
  EXPECT_THROW(Array::from_vector(std::vector<float>{1, 2, 3}, Shape{2, 2}, device()), ShapeError);
  Array b = Array::from_vector(std::vector<bool>{true, false}, std::nullopt, device());
  EXPECT_EQ(b.dtype(), bool_);
  EXPECT_EQ(b.to_vector<bool>(), (std::vector<bool>{true, false}));
}

TEST_P(ArrayTest, ReshapeIsAViewWhenContiguous) {
  Array a = Array::arange(0.0, 12.0, 1.0, float32, device());
  Array r = a.reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 4}));
  EXPECT_TRUE(r.shares_memory_with(a));
  EXPECT_THROW(a.reshape({5, -1}), ShapeError);
  EXPECT_THROW(a.reshape({-1, -1}), ShapeError);
  // A transposed array reshaped to 1-d needs a copy; values follow C order of the view.
  Array t = r.transpose();
  Array flat = t.reshape({12});
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  // Splitting a contiguous axis of a transposed view stays a view.
  Array t2 = Array::arange(0.0, 24.0, 1.0, float32, device()).reshape({4, 6}).transpose();  // (6, 4)
  Array v = t2.reshape({2, 3, 4});
  EXPECT_TRUE(v.shares_memory_with(t2));
  EXPECT_TRUE(ArraysClose(v.copy().reshape({6, 4}), t2.copy()));
}

TEST_P(ArrayTest, TransposeSwapSqueezeExpand) {
  Array a = Array::arange(0.0, 6.0, 1.0, float64, device()).reshape({1, 2, 3});
  Array t = a.transpose({2, 0, 1});
  EXPECT_EQ(t.shape(), (Shape{3, 1, 2}));
  EXPECT_DOUBLE_EQ(t.at({2, 0, 1}).item<double>(), 5.0);
  EXPECT_EQ(a.swapaxes(0, 2).shape(), (Shape{3, 2, 1}));
  EXPECT_EQ(a.squeeze().shape(), (Shape{2, 3}));
  EXPECT_THROW(a.squeeze({1}), ShapeError);
  EXPECT_EQ(a.expand_dims(-1).shape(), (Shape{1, 2, 3, 1}));
  EXPECT_THROW(a.transpose({0, 0, 1}), ValueError);
  EXPECT_THROW(a.transpose({0, 1}), ValueError);
}

TEST_P(ArrayTest, BroadcastToUsesZeroStrides) {
  Array a = Array::from({1, 2, 3}, std::nullopt, float32, device());
  Array b = a.broadcast_to({2, 3});
  EXPECT_EQ(b.strides()[0], 0);
  EXPECT_EQ(b.copy().to_vector<float>(), (std::vector<float>{1, 2, 3, 1, 2, 3}));
  EXPECT_THROW(a.broadcast_to({2, 4}), ShapeError);
  EXPECT_THROW(a.broadcast_to({3}).broadcast_to({}), ShapeError);
}

TEST_P(ArrayTest, BasicIndexing) {
  Array a = Array::arange(0.0, 24.0, 1.0, float32, device()).reshape({2, 3, 4});
  EXPECT_EQ(a.at({1}).shape(), (Shape{3, 4}));
  EXPECT_FLOAT_EQ(a.at({1, 2, 3}).item<float>(), 23.0f);
  EXPECT_FLOAT_EQ(a.at({-1, -1, -1}).item<float>(), 23.0f);
  Array s = a.at({Slice(), Slice(1, std::nullopt), Slice(std::nullopt, std::nullopt, 2)});
  EXPECT_EQ(s.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(s.copy().to_vector<float>(), (std::vector<float>{4, 6, 8, 10, 16, 18, 20, 22}));
  Array rev = a.at({0, 0, Slice(std::nullopt, std::nullopt, -1)});
  EXPECT_EQ(rev.copy().to_vector<float>(), (std::vector<float>{3, 2, 1, 0}));
  EXPECT_EQ(a.at({Ellipsis{}, 0}).shape(), (Shape{2, 3}));
  EXPECT_EQ(a.at({NewAxis{}, 0}).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(a.at({Slice(5, 9)}).shape(), (Shape{0, 3, 4}));
  EXPECT_THROW(a.at({2}), IndexError);
  EXPECT_THROW(a.at({0, 0, 0, 0}), IndexError);
}

TEST_P(ArrayTest, AstypeRoundsAndTruncates) {
  Array a = Array::from({1.5, -2.7, 0.0, 3.99}, std::nullopt, float32, device());
  EXPECT_EQ(a.astype(int32).to_vector<int32_t>(), (std::vector<int32_t>{1, -2, 0, 3}));
  EXPECT_EQ(a.astype(bool_).to_vector<bool>(), (std::vector<bool>{true, true, false, true}));
  Array h = a.astype(float16);
  EXPECT_EQ(h.dtype(), float16);
  EXPECT_TRUE(ArraysClose(h.astype(float32), a, 1e-3, 0));
  Array bf = a.astype(bfloat16);
  EXPECT_TRUE(ArraysClose(bf.astype(float32), a, 1e-2, 0));
}

TEST_P(ArrayTest, AssignBroadcastsIntoAView) {
  Array a = Array::zeros({2, 3}, float32, device());
  Array row = a.at({1});
  row.assign(Array::from({1, 2, 3}, std::nullopt, float32, device()));
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 0, 0, 1, 2, 3}));
  a.at({Slice(), 0}).fill(9);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{9, 0, 0, 9, 2, 3}));
}

TEST_P(ArrayTest, RandomIsSeededAndReproducible) {
  Generator g1(42), g2(42), g3(43);
  Array a = Array::uniform({1000}, -1, 1, float32, device(), &g1);
  Array b = Array::uniform({1000}, -1, 1, float32, device(), &g2);
  Array c = Array::uniform({1000}, -1, 1, float32, device(), &g3);
  EXPECT_TRUE(array_equal(a, b));
  EXPECT_FALSE(array_equal(a, c));
  std::vector<float> v = a.to_vector<float>();
  for (float x : v) {
    EXPECT_GE(x, -1.0f);
    EXPECT_LT(x, 1.0f);
  }
  Array n = Array::normal({100000}, 2.0, 3.0, float64, device(), &g1);
  EXPECT_NEAR(mean(n).item<double>(), 2.0, 0.05);
  EXPECT_NEAR(std::sqrt(var(n).item<double>()), 3.0, 0.05);
  // Same seed, same numbers on every device (the CPU is the reference).
  Generator h1(7), h2(7);
  Array on_device = Array::normal({33}, 0, 1, float32, device(), &h1);
  Array on_cpu = Array::normal({33}, 0, 1, float32, Device::cpu(), &h2);
  EXPECT_TRUE(ArraysClose(on_device, on_cpu, 1e-6, 1e-6));
}

TEST_P(ArrayTest, PrintingLooksLikeNumPy) {
  Array a = Array::from({1, 2, 3, 4}, Shape{2, 2}, int64, device());
  std::string s = a.to_string();
  EXPECT_NE(s.find("[[1, 2],"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype=int64"), std::string::npos) << s;
  EXPECT_NE(Array::from({0.5}, std::nullopt, float32, device()).to_string().find("0.5"), std::string::npos);
  EXPECT_EQ(Array().to_string(), "array(undefined)");
}

TEST_P(ArrayTest, ToDeviceRoundTrip) {
  Array a = Array::arange(0.0, 10.0, 1.0, float32, device()).reshape({2, 5}).transpose();
  Array host = a.to_device(Device::cpu());
  EXPECT_EQ(host.device(), Device::cpu());
  EXPECT_TRUE(ArraysClose(host.to_device(device()), a));
}

KUSARI_INSTANTIATE_DEVICE_TEST(ArrayTest);

TEST(HalfTest, ConversionsRoundToNearestEven) {
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(Half(-2.0f).bits, 0xc000);
  EXPECT_EQ(Half(65504.0f).bits, 0x7bff);
  EXPECT_EQ(Half(1e6f).bits, 0x7c00);                  // overflow to infinity
  EXPECT_EQ(Half(5.9604645e-8f).bits, 0x0001);          // smallest subnormal
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(NAN))));
  EXPECT_FLOAT_EQ(static_cast<float>(Half::from_bits(0x3555)), 0.333251953125f);
  // 1 + 2^-11 is halfway between 1 and the next half; ties go to even (1.0).
  EXPECT_EQ(Half(1.0f + 1.0f / 2048).bits, 0x3c00);
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_FLOAT_EQ(static_cast<float>(BFloat16(3.140625f)), 3.140625f);
}

TEST(HalfTest, ArrayConversionsMatchTheScalarOnesBitForBit) {
  // astype converts contiguous rows with F16C where the CPU has it (Note [Half conversion on the
  // CPU]); it must agree with Half's own conversions on every float16 value ...
  std::vector<Half> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = Half::from_bits(static_cast<uint16_t>(b));
  const std::vector<float> widened = Array::from_vector(all).astype(float32).to_vector<float>();
  for (uint32_t b = 0; b < 65536; ++b) {
    const float expected = static_cast<float>(all[b]);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(widened[b])) << "bits " << b;
    } else {
      EXPECT_EQ(std::memcmp(&widened[b], &expected, sizeof(float)), 0) << "bits " << b;
    }
  }
  // ... and on floats around every rounding case: halfway points, subnormals, overflow, NaN.
  std::vector<float> floats{0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e6f, -1e6f, INFINITY, -INFINITY, NAN,
                            5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 1e-10f, 1.0f + 1.0f / 2048,
                            1.0f + 3.0f / 2048};
  Generator gen(3);
  const std::vector<float> random = Array::uniform({4096}, -70000.0, 70000.0, float32, Device::cpu(), &gen)
                                        .to_vector<float>();
  floats.insert(floats.end(), random.begin(), random.end());
  for (uint32_t b = 0; b < 65536; b += 7) floats.push_back(static_cast<float>(all[b]) * 1.0004883f);
  const Array narrowed = Array::from_vector(floats).astype(float16);
  const std::vector<Half> got = narrowed.to_vector<Half>();
  for (size_t i = 0; i < floats.size(); ++i) {
    const Half expected(floats[i]);
    if (std::isnan(floats[i])) {
      EXPECT_TRUE(std::isnan(static_cast<float>(got[i]))) << floats[i];
    } else {
      EXPECT_EQ(got[i].bits, expected.bits) << floats[i];
    }
  }
}

TEST(DeviceParseTest, ParseAndErrors) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::parse("@cupy:0"), Device::cuda(0));
  EXPECT_THROW(Device::parse("tpu"), ValueError);
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  if (!build_info().cuda) EXPECT_THROW(Array::zeros({2}, float32, Device::cuda(0)), DeviceError);
  {
    DeviceScope scope(Device::cpu());
    EXPECT_EQ(default_device(), Device::cpu());
  }
}

// kusari.h gives the headers' version as macros, and it is the version of the library that runs.
TEST(BuildInfoTest, TheVersionMacrosMatchTheLibrary) {
  EXPECT_EQ(std::string(KUSARI_VERSION), build_info().version);
  EXPECT_EQ(std::to_string(KUSARI_VERSION_MAJOR) + "." + std::to_string(KUSARI_VERSION_MINOR) + "." +
                std::to_string(KUSARI_VERSION_PATCH),
            build_info().version);
}

TEST(DtypeTest, NamesRoundTrip) {
  for (Dtype d : {bool_, uint8, int32, int64, float16, bfloat16, float32, float64}) {
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_THROW(dtype_from_name("complex64"), DtypeError);
  EXPECT_EQ(itemsize(bfloat16), 2u);
}

}  // namespace
}  // namespace kusari

namespace kusari {
namespace {

// Graphs record GPU work only; on the CPU (and in a build without CUDA) capture says so.
TEST(CudaGraphOnCpu, CaptureOnTheCpuIsADeviceError) {
  cuda::Graph graph;
  EXPECT_THROW(graph.capture(Device::cpu(), [] {}), DeviceError);
  EXPECT_FALSE(graph.captured());
  EXPECT_FALSE(cuda::is_capturing(Device::cpu()));
}

// Found by the IDX fuzzer under UBSan: an empty array whose other axes multiply past int64 (an
// IDX header of shape (0, 4294967295, ...)) overflowed while its strides were computed.
TEST(ArrayShapeTest, HugeAxesBesideAZeroAxisAreAnEmptyArray) {
  const int64_t huge = 4294967295;
  for (const Shape& shape : {Shape{0, huge, huge, huge}, Shape{huge, huge, huge, 0}}) {
    Array a = Array::empty(shape, uint8);
    EXPECT_EQ(a.size(), 0) << shape;
    EXPECT_EQ(a.shape(), shape);
  }
}

TEST(ArrayShapeTest, ShapesBeyondA64BitCountAreRefused) {
  const int64_t huge = 4294967295;
  try {
    Array::empty(Shape{huge, huge, huge}, uint8);
    ADD_FAILURE() << "expected a ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("more elements than a 64-bit count holds"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kusari
